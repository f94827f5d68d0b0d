"""The synthetic shapes data set: `shapes(n, seed=...)` draws a labelled data set on the fly (no downloads).

One object of one of eight classes per image, at a random position, scale, rotation and colour, on a textured
background cluttered with distractors that belong to no class, with its pixel mask and box.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import Tensor
from torch.utils.data import Dataset

from .._checks import int_option, is_int

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring", "crescent", "heart")

# Images are drawn in chunks of this many, each from its own generator seeded by (seed, chunk index): image i
# depends on (seed, i, size) only, so shapes(10, seed=s) is the first ten images of shapes(1000, seed=s).
_CHUNK = 256
_DISTRACTORS = 5  # slots per image, each drawn with probability 0.7: _BARS thin bars, then soft blobs
_BARS = 3


def shapes_image(size: int = 224, seed: int = 0) -> Image.Image:
    """An RGB image of a few filled shapes (circle, square, triangle) on a soft gradient background.

    Deterministic for a given `seed`; used by `hookviz demo` and the tests as a sample image that needs no file.
    """
    if size < 16:
        raise ValueError(f"size must be at least 16 pixels, got {size}")
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    for y in range(size):  # vertical gradient so the background is not flat
        shade = 40 + int(60 * y / size)
        draw.line([(0, y), (size, y)], fill=(shade, shade + 20, shade + 40))
    s = size / 224
    jitter = lambda: rng.randint(-8, 8) * s  # noqa: E731
    cx, cy, r = 60 * s + jitter(), 70 * s + jitter(), 38 * s
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(220, 40, 40))
    x0, y0 = 125 * s + jitter(), 40 * s + jitter()
    draw.rectangle([x0, y0, x0 + 70 * s, y0 + 70 * s], fill=(40, 90, 220))
    tx, ty = 110 * s + jitter(), 200 * s
    draw.polygon([(tx - 55 * s, ty), (tx + 55 * s, ty), (tx, ty - 80 * s)], fill=(240, 210, 40))
    return img


# ---------------------------------------------------------------------------------------------------- the data set


@dataclass(frozen=True)
class Shapes:
    """A batch of the shapes data set (see `shapes`).

    Attributes:
        images: (N, 3, size, size) float32 in [0, 1].
        labels: (N,) int64, indices into `classes`.
        masks: (N, size, size) bool, the object's pixels (never empty; distractors are drawn under the object, so
            every object pixel is visible).
        boxes: (N, 4) int64 ``(x0, y0, x1, y1)``, the mask's bounding box with inclusive corners (the convention of
            ``torchvision.ops.masks_to_boxes``): ``masks[i, y0:y1 + 1, x0:x1 + 1]`` holds every object pixel.
        classes: the class names.
    """

    images: Tensor
    labels: Tensor
    masks: Tensor
    boxes: Tensor
    classes: tuple[str, ...] = CLASSES

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int | slice | Sequence[int] | Tensor) -> Shapes:
        """The items at `index` as a `Shapes`; an int gives a `Shapes` of length 1 (the batch axis is kept)."""
        if isinstance(index, int):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"index {index} is out of range for Shapes of length {n}")
            index = slice(index, index + 1 if index != -1 else None)
        return Shapes(self.images[index], self.labels[index], self.masks[index], self.boxes[index], self.classes)


class ShapesDataset(Dataset):
    """`shapes(n, seed=seed, size=size)` as a ``torch.utils.data.Dataset`` of ``(image, label)`` pairs.

    ``image`` is a (3, size, size) float32 tensor in [0, 1], ``label`` a 0-d int64 tensor; the whole `Shapes` (masks
    and boxes included) is ``dataset.shapes``.
    """

    def __init__(self, n: int, *, seed: int = 0, size: int = 64) -> None:
        self.shapes = shapes(n, seed=seed, size=size)
        self.seed, self.size = seed, size  # recorded by explain_dataset, so a report can redraw the images
        self.classes = self.shapes.classes

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.shapes.images[index], self.shapes.labels[index]


def shapes(n: int, *, seed: int, size: int = 64) -> Shapes:
    """`n` synthetic images, each with one object of one of `CLASSES`, its class, its pixel mask and its box.

    Each object has a random position (fully inside the image), scale (diameter about 30 % to 50 % of `size`),
    rotation, slight anisotropy, colour (contrasting with the background) and a linear shading; it sits on a
    textured background (a colour gradient, blotches, a grating, pixel noise) with up to five distractors under it
    (up to three thin bars and two soft blobs, which belong to no class), so a classifier has to find the object.
    Edges are antialiased; the mask holds the pixels at least half covered by the object.

    Deterministic: image i depends on (`seed`, i, `size`) only (a prefix of a longer set is the shorter set), and
    different seeds give different images. Drawn batch-wise with torch ops on the CPU: 10,000 images of 64x64 cost
    about 4.4 s of one core.

    Returns:
        a `Shapes`: images (n, 3, size, size) float32 in [0, 1], labels (n,) int64, masks (n, size, size) bool,
        boxes (n, 4) int64 (x0, y0, x1, y1) inclusive.
    """
    int_option("n", n, "a non-negative int", minimum=0)
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    int_option("size", size, "an int of at least 16 pixels", minimum=16)
    images = torch.empty(n, 3, size, size)
    labels = torch.empty(n, dtype=torch.long)
    masks = torch.empty(n, size, size, dtype=torch.bool)
    for c in range(math.ceil(n / _CHUNK)):
        part = slice(c * _CHUNK, min(n, (c + 1) * _CHUNK))
        images[part], labels[part], masks[part] = _draw_chunk(seed, c, part.stop - part.start, size)
    return Shapes(images, labels, masks, _boxes(masks))


def _generator(seed: int, chunk: int) -> torch.Generator:
    digest = hashlib.sha256(f"hookviz.shapes:{seed}:{chunk}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _boxes(masks: Tensor) -> Tensor:
    """(N, 4) inclusive (x0, y0, x1, y1) of non-empty (N, H, W) masks."""
    cols, rows = masks.any(dim=1), masks.any(dim=2)  # (N, W), (N, H)
    w, h = cols.shape[1], rows.shape[1]
    xs, ys = torch.arange(w), torch.arange(h)
    big = max(w, h)
    return torch.stack(
        [
            torch.where(cols, xs, big).amin(1),
            torch.where(rows, ys, big).amin(1),
            torch.where(cols, xs, -1).amax(1),
            torch.where(rows, ys, -1).amax(1),
        ],
        dim=1,
    )


def _uniform(g: torch.Generator, shape: tuple[int, ...], low: float, high: float) -> Tensor:
    return torch.rand(shape, generator=g) * (high - low) + low


def _draw_chunk(seed: int, chunk: int, m: int, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """The `m` first images of chunk `chunk`: every random number of the full chunk is drawn (in a fixed order),
    so that an image does not depend on how many images are drawn after it."""
    d = _draws(_generator(seed, chunk), m, size)
    coords = torch.arange(size, dtype=torch.float32) + 0.5  # pixel centres
    img = _background(d, coords, m, size)
    background_mean = img.mean(dim=(2, 3))  # (m, 3): the object's colour is chosen against it
    _distractors(img, d, coords, m)  # drawn under the object
    masks = _object(img, d, coords, background_mean, m, size)
    img = img.add_(d["noise"].sub_(0.5).mul_(d["noise_sd"] * math.sqrt(12))).clamp_(0, 1)  # noise_sd: its std
    return img, d["labels"], masks


def _draws(g: torch.Generator, m: int, size: int) -> dict[str, Tensor]:
    """Every random number of a chunk of `_CHUNK` images, drawn in a fixed order; the first `m` images' kept."""
    c, k = _CHUNK, _DISTRACTORS
    s = size / 64  # lengths below are in pixels of a 64x64 image
    d = {
        "labels": torch.randint(len(CLASSES), (c,), generator=g),
        "radius": _uniform(g, (c,), 9.5, 16.0) * s,
        "aniso": _uniform(g, (c,), 0.88, 1.12),
        "angle": _uniform(g, (c,), 0.0, 2 * math.pi),
        "centre": torch.rand(c, 2, generator=g),  # mapped into the free margin by _object
        "delta": _uniform(g, (c, 3), 0.2, 0.6),
        "shade": _uniform(g, (c,), -0.15, 0.15),
        "field": _uniform(g, (c, 3, 3), 0.15, 0.85),  # per channel: the colour at the centre, its x and y slopes
        "blotch": torch.randn(c, 1, 8, 8, generator=g) * _uniform(g, (c, 1, 1, 1), 0.0, 0.08),
        "grating": _uniform(g, (c, 4), 0.0, 1.0),  # amplitude, frequency, orientation, phase
        "noise_sd": _uniform(g, (c, 1, 1, 1), 0.0, 0.04),
        "d_on": torch.rand(c, k, generator=g) < 0.7,
        "d_pos": torch.rand(c, k, 2, generator=g) * size,
        "d_len": _uniform(g, (c, k), 6.0, 20.0) * s,  # bars: half-length
        "d_width": _uniform(g, (c, k), 0.6, 1.6) * s,  # bars: half-width
        "d_angle": _uniform(g, (c, k), 0.0, math.pi),
        "d_reach": _uniform(g, (c, k), 3.0, 8.0) * s,  # blobs: radius where they fade out
        "d_colour": torch.rand(c, k, 3, generator=g),
        "noise": torch.rand(c, 3, size, size, generator=g),  # uniform: cheaper to draw than normal
    }
    return {name: t[:m] for name, t in d.items()}


def _background(d: dict[str, Tensor], coords: Tensor, m: int, size: int) -> Tensor:
    """(m, 3, size, size): a linear colour gradient + monochrome blotches + a grating."""
    py, px = coords.view(1, size, 1), coords.view(1, 1, size)
    centred = (coords - size / 2) / size
    field = d["field"]
    slope = (field[:, :, 1:] - 0.5) * 0.8
    img = (field[:, :, :1, None] + slope[:, :, :1, None] * centred.view(1, 1, 1, size)) + slope[:, :, 1:, None] * (
        centred.view(1, 1, size, 1)
    )
    img += F.interpolate(d["blotch"], size=(size, size), mode="bilinear", align_corners=False)
    amp, freq, ori, phase = (d["grating"][:, i].view(m, 1, 1) for i in range(4))
    ori = ori * math.pi
    wave = torch.sin((px * torch.cos(ori) + py * torch.sin(ori)) * (freq * 6 + 2) * (2 * math.pi / size) + phase * 6.3)
    img += (amp * 0.12 * wave).unsqueeze(1)
    return img


def _distractors(img: Tensor, d: dict[str, Tensor], coords: Tensor, m: int) -> None:
    """Distractors blended into `img` in place: thin bars (hard edges) in the first slots, soft blobs in the others."""
    size = img.shape[-1]
    py, px = coords.view(1, size, 1), coords.view(1, 1, size)
    for j in range(_DISTRACTORS):
        dx = px - d["d_pos"][:, j, 0].view(m, 1, 1)  # (m, 1, size): the broadcasts stay cheap until combined
        dy = py - d["d_pos"][:, j, 1].view(m, 1, 1)  # (m, size, 1)
        if j < _BARS:
            cos, sin = torch.cos(d["d_angle"][:, j]).view(m, 1, 1), torch.sin(d["d_angle"][:, j]).view(m, 1, 1)
            along = (dx * cos + dy * sin).abs_().sub_(d["d_len"][:, j].view(m, 1, 1))
            across = (dy * cos - dx * sin).abs_().sub_(d["d_width"][:, j].view(m, 1, 1))
            alpha = torch.maximum(along, across).neg_().add_(0.5).clamp_(0, 1)
        else:  # 0.85 (1 - d^2 / reach^2)^2 inside the reach: a soft disc with no edge
            reach2 = d["d_reach"][:, j].view(m, 1, 1) ** 2
            alpha = (dx * dx / reach2 + dy * dy / reach2).neg_().add_(1).clamp_(min=0).square_().mul_(0.85)
        alpha = alpha.mul_(d["d_on"][:, j].view(m, 1, 1)).unsqueeze(1)
        img.lerp_(d["d_colour"][:, j].view(m, 3, 1, 1).expand_as(img), alpha)


def _object(img: Tensor, d: dict[str, Tensor], coords: Tensor, background_mean: Tensor, m: int, size: int) -> Tensor:
    """The object drawn into `img` in place, at a position in the margin that keeps it inside the image, in a colour
    set off from the background; returns its (m, size, size) masks."""
    py, px = coords.view(1, size, 1), coords.view(1, 1, size)
    radius, delta, labels = d["radius"], d["delta"], d["labels"]
    margin = radius * 1.12 + 1
    cxy = margin.unsqueeze(1) + d["centre"] * (size - 2 * margin).unsqueeze(1)
    colour = torch.where(background_mean > 0.5, background_mean - delta, background_mean + delta).clamp(0, 1)
    masks = torch.zeros(m, size, size, dtype=torch.bool)
    for label in range(len(CLASSES)):
        idx = (labels == label).nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        r, a, th = radius[idx].view(-1, 1, 1), d["aniso"][idx].view(-1, 1, 1), d["angle"][idx].view(-1, 1, 1)
        dx, dy = px - cxy[idx, 0].view(-1, 1, 1), py - cxy[idx, 1].view(-1, 1, 1)
        cos, sin = torch.cos(th), torch.sin(th)
        u = (dx * cos + dy * sin) / (r * a)
        v = (dy * cos - dx * sin) * a / r
        dist = _SHAPES[label](u, v) * r  # about the signed distance in pixels
        alpha = (0.5 - dist).clamp(0, 1).unsqueeze(1)
        tint = colour[idx].view(-1, 3, 1, 1) + (d["shade"][idx].view(-1, 1, 1) * u).unsqueeze(1)
        img[idx] = img[idx].lerp_(tint.clamp_(0, 1), alpha)
        masks[idx] = dist <= 0
    return masks


# Signed-distance-like functions of the classes in unit coordinates (the object fits in the unit disc, up to the
# anisotropy): negative inside, about the Euclidean distance near the edge, so `0.5 - d * radius` antialiases.
def _circle(u: Tensor, v: Tensor) -> Tensor:
    return torch.sqrt(u * u + v * v) - 0.9


def _square(u: Tensor, v: Tensor) -> Tensor:
    return torch.maximum(u.abs(), v.abs()) - 0.72


def _triangle(u: Tensor, v: Tensor) -> Tensor:
    # equilateral, circumradius 1.05 (inradius 0.525), centred on its centroid
    d = v
    for t in (math.pi / 2 + 2 * math.pi / 3, math.pi / 2 + 4 * math.pi / 3):
        d = torch.maximum(d, u * math.cos(t) + v * math.sin(t))
    return d - 0.525


def _star(u: Tensor, v: Tensor) -> Tensor:
    # five points: the boundary radius goes from 1.05 at a tip to 0.45 between tips
    r, phi = torch.sqrt(u * u + v * v), torch.atan2(v, u)
    sector = 2 * math.pi / 5
    t = 1 - (torch.remainder(phi, sector) - sector / 2).abs() / (sector / 2)  # 1 at a tip, 0 between
    return (r - (0.45 + 0.6 * t)) * 0.8


def _cross(u: Tensor, v: Tensor) -> Tensor:
    au, av = u.abs(), v.abs()
    return torch.minimum(torch.maximum(au - 0.95, av - 0.3), torch.maximum(au - 0.3, av - 0.95))


def _ring(u: Tensor, v: Tensor) -> Tensor:
    return (torch.sqrt(u * u + v * v) - 0.72).abs() - 0.28  # outer radius 1.0, inner 0.44


def _crescent(u: Tensor, v: Tensor) -> Tensor:
    outer = torch.sqrt(u * u + v * v) - 0.95
    bite = 0.72 - torch.sqrt((u - 0.5) ** 2 + v * v)
    return torch.maximum(outer, bite)


def _heart(u: Tensor, v: Tensor) -> Tensor:
    # two discs over a downward-pointing triangle, recentred and scaled to the unit disc (the notch between the discs
    # and the long tip keep it apart from a square or a circle)
    k = 0.86
    x, y = u * k, v * k + 0.135
    ax = x.abs()
    lobe = torch.sqrt((ax - 0.36) ** 2 + (y + 0.28) ** 2) - 0.40
    wedge = torch.maximum(0.836 * ax + 0.548 * y - 0.520, -y - 0.18)
    return torch.minimum(lobe, wedge) / k


_SHAPES = (_circle, _square, _triangle, _star, _cross, _ring, _crescent, _heart)
