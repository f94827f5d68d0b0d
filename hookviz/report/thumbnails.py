"""Thumbnails: every item's image, written as PNG files, and per method its map drawn as `Explanation` draws it (the
method's display defaults: overlaid on the image for the Grad-CAM family, beside it for gradients).

A method's thumbnails are drawn by the page itself from the detail view's map files (``report.js``: the same
normalisation, bilinear resize, colour map and overlay as `render`, which stays the reference the browser tests
compare with), so they cost no file of their own. The exception, `drawn_in_page` False, keeps its PNG files: an
overlay whose opacity follows the map (``alpha_by_map``) on images larger than a thumbnail (the page would need each
full-size image to blend it) and a method that displays with one scale shared by a batch (the thumbnail would
depend on which items were rendered together).

The thumbnails of `SPRITE` consecutive items go side by side into one PNG (a sprite sheet, ``img/B.png`` and
``m/J/B.png`` for block B; the page shows one tile with CSS ``object-position``): one file and one PNG encode per 64
thumbnails instead of one each, which is most of the build time for 10,000 small images (per-file overhead of the
encoder and the file system), and 64 times fewer files to copy to a static host. Images larger than a thumbnail are
also written at full size, one file each (``full/I.png``), for the detail view."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from torch import Tensor

from .. import display as _display
from ..display_options import resolve_options
from ..explanation import Explanation
from .sources import Items
from .stores import Column

#: the longest side of a thumbnail in pixels; images up to this size are their own thumbnails
THUMB_SIZE = 128
#: thumbnails per sprite sheet (the page loads a sheet when one of its tiles scrolls into view)
SPRITE = 64


def thumb_shape(height: int, width: int) -> tuple[int, int]:
    """(h, w) of a thumbnail of an image of (height, width): scaled down to fit `THUMB_SIZE`, never up."""
    scale = min(1.0, THUMB_SIZE / max(height, width))
    return max(1, round(height * scale)), max(1, round(width * scale))


def _png(pixels: Tensor) -> bytes:
    """(3, H, W) uint8 -> PNG bytes (zlib level 1: a third of the time of the default, about 10 % larger)."""
    buf = io.BytesIO()
    _display.to_pil(pixels).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _write_all(folder: Path, start: int, pixels: Tensor) -> None:
    for i, p in enumerate(pixels):
        (folder / f"{start + i}.png").write_bytes(_png(p))


def _write_sheets(folder: Path, start: int, pixels: Tensor) -> None:
    """(n, 3, h, w) uint8 tiles of items start.. -> one (3, h, k * w) PNG per `SPRITE` items, named by block."""
    for a in range(0, pixels.shape[0], SPRITE):
        tiles = pixels[a : a + SPRITE]
        (folder / f"{(start + a) // SPRITE}.png").write_bytes(_png(torch.cat(tiles.unbind(0), dim=-1)))


def drawn_in_page(column: Column, full: tuple[int, int], size: tuple[int, int]) -> bool:
    """Whether the page draws `column`'s thumbnails from its maps (else they are written as PNG files)."""
    o = resolve_options(column.display, "report", {})
    if o["scale"] != "sample":
        return False
    return not (o["overlay"] and o["alpha_by_map"] and tuple(full) != tuple(size))


def render(column: Column, images: Tensor, start: int, stop: int) -> Tensor:
    """Rows [start, stop) of `column` as (n, 3, H, W) in [0, 1], over `images` (n, 3, H, W) when the method overlays."""
    maps = column.maps[start:stop].float()
    exp = Explanation(
        attribution=maps,
        images=images,
        inputs=images,
        targets=None,
        scores=torch.zeros(maps.shape[0], 1),
        method=column.name,
        display=column.display,
    )
    return exp.overlay() if resolve_options(column.display, "report", {})["overlay"] else exp.heatmap()


def write_block(
    out: Path,
    columns: list[Column],
    items: Items,
    folders: list[str | None],
    start: int,
    stop: int,
    full: tuple[int, int],
    size: tuple[int, int],
) -> None:
    """Thumbnails of rows [start, stop) (`start` a multiple of `SPRITE`): the image (``img/``), at full size too
    (``full/``) when it is larger than a thumbnail, and each column's map (``folders[j]/``) unless its folder is None
    (the page draws those, `drawn_in_page`)."""
    if items.images is not None:
        images = items.images(start, stop).float()
    else:  # maps only: drawn on black
        images = torch.zeros(stop - start, 3, *full)
    small = _display.resize(images, size)
    _write_sheets(out / "img", start, _display.to_uint8(small))
    if size != tuple(images.shape[-2:]):
        _write_all(out / "full", start, _display.to_uint8(images))
    for column, folder in zip(columns, folders, strict=True):
        if folder is None:
            continue
        pixels = _display.resize(render(column, images, start, stop), size)
        _write_sheets(out / folder, start, _display.to_uint8(pixels))


def blocks(n: int, block: int) -> list[tuple[int, int]]:
    return [(a, min(n, a + block)) for a in range(0, n, block)]


def image_size(items: Items, columns: list[Column]) -> tuple[int, int]:
    """(H, W) of the items' images (without images: of the largest map)."""
    if items.images is not None:
        return tuple(items.images(0, 1).shape[-2:])  # type: ignore[return-value]
    h, w = max((tuple(c.maps[0:1].shape[-2:]) for c in columns), key=lambda s: s[0] * s[1])
    return int(h), int(w)
