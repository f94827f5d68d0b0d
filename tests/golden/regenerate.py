"""Golden images: fixed, hand-made explanations rendered to PNG; `tests/test_golden.py` compares against them.

No model is involved (a model's numerics may drift across torch versions and machines): the images and
attributions below are smooth closed-form patterns, so what is tested is hookviz's display path alone
(normalization, colour maps, resizing, overlays, the grid figure).

Run ``python tests/golden/regenerate.py`` to rewrite the PNGs on purpose, after a change to how things look; then
look at them before committing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hookviz import Explanation
from hookviz.figures import grid, save_figure

HERE = Path(__file__).resolve().parent
SIZE = 32  # image edge in pixels
GRID_DPI = 60
GRID_SIZE = (3.6, 2.7)  # inches
LABELS = ["cat", "dog", "tabby cat", "golden retriever"]


def _coords(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
    return torch.meshgrid(t, t, indexing="ij")  # (y, x)


def _blob(n: int, cy: float, cx: float, width: float) -> torch.Tensor:
    y, x = _coords(n)
    return torch.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * width**2))


def images() -> torch.Tensor:
    """(2, 3, SIZE, SIZE) in [0, 1]: colour gradients with a bright disc, its place differing per image."""
    y, x = _coords(SIZE)
    out = []
    for cy, cx in ((-0.3, -0.3), (0.35, 0.25)):
        disc = (((y - cy) ** 2 + (x - cx) ** 2) < 0.3**2).double()
        r = 0.25 + 0.5 * (x + 1) / 2 + 0.25 * disc
        g = 0.2 + 0.4 * (y + 1) / 2 + 0.3 * disc
        b = 0.6 - 0.3 * (x + 1) / 2 * (y + 1) / 2
        out.append(torch.stack([r, g, b]).clamp(0, 1))
    return torch.stack(out).float()


def cam_like() -> Explanation:
    """A Grad-CAM-like layer map: (2, 1, 8, 8), non-negative, the second image's map at 60% of the first's scale."""
    maps = torch.stack([_blob(8, -0.3, -0.3, 0.45), 0.6 * _blob(8, 0.35, 0.25, 0.35) + 0.05])[:, None].float()
    return _explanation(maps, "GradCAM", {"reduce": None, "mode": "minmax", "cmap": "jet", "overlay": True}, [0, 1])


def signed_input_map() -> Explanation:
    """A signed input-space map like Integrated Gradients: (2, 3, SIZE, SIZE), a positive and a negative lobe."""
    pos = _blob(SIZE, -0.3, -0.3, 0.3)
    neg = _blob(SIZE, 0.4, 0.4, 0.25)
    base = torch.stack([pos - 0.8 * neg, 0.6 * pos - neg])  # (2, H, W)
    channels = torch.tensor([1.0, 0.5, -0.2], dtype=torch.float64).view(1, 3, 1, 1)
    maps = (base[:, None] * channels).float()
    return _explanation(maps, "IntegratedGradients", {"reduce": "sum", "mode": "absmax", "cmap": "bwr"}, [2, 3])


def rgb_input_map() -> Explanation:
    """A 3-channel map shown as RGB (Guided Backprop's "seed" display)."""
    y, x = _coords(SIZE)
    maps = torch.stack(
        [torch.stack([torch.sin(3 * x) * _blob(SIZE, 0, 0, 0.5), torch.cos(2 * y), x * y]) * s for s in (1.0, 0.5)]
    ).float()
    return _explanation(maps, "GuidedBackprop", {"reduce": None, "mode": "seed", "overlay": False}, [0, 1])


def _explanation(maps: torch.Tensor, method: str, display: dict, targets: list[int]) -> Explanation:
    n = maps.shape[0]
    return Explanation(
        attribution=maps,
        images=images(),
        inputs=images(),
        targets=torch.tensor(targets).view(n, 1),
        scores=torch.zeros(n, 1),
        method=method,
        labels=LABELS,
        display=display,
    )


def _tile(t: torch.Tensor) -> np.ndarray:
    """(N, 3, H, W) in [0, 1] -> (H, N * W, 3) uint8, the N images side by side."""
    t = t.detach().clamp(0, 1).cpu()
    t = torch.cat(list(t), dim=-1)  # (3, H, N * W)
    return (t.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()


def torch_renders() -> dict[str, np.ndarray]:
    """Renders made by hookviz in torch (colour maps, resizing, overlay): name -> (H, W, 3) uint8."""
    cam, signed, rgb = cam_like(), signed_input_map(), rgb_input_map()
    return {
        "cam_heatmap": _tile(cam.heatmap()),
        "cam_overlay": _tile(cam.overlay()),
        "signed_heatmap": _tile(signed.heatmap()),
        "rgb_heatmap": _tile(rgb.heatmap()),
    }


def grid_figure():
    """The grid figure: input | Guided Backprop (RGB) | Integrated Gradients | Grad-CAM overlay, with colour bars."""
    return grid(
        [rgb_input_map(), signed_input_map(), cam_like()],
        overlay="auto",
        colorbar=True,
        size=GRID_SIZE,
        dpi=GRID_DPI,
        row_labels=["image one", "image two"],
        title="golden grid",
    )


def grid_render() -> np.ndarray:
    """The grid figure written by save_figure as PNG at GRID_DPI, read back: (H, W, 3) uint8."""
    with tempfile.TemporaryDirectory() as tmp:
        path = save_figure(grid_figure(), Path(tmp) / "grid.png")
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))


def grid_cells() -> np.ndarray:
    """What the grid's cells show, coloured by their own colour maps and tiled: (rows * H, cols * W, 3) uint8.

    Independent of fonts and layout, so it is compared as tightly as the torch renders.
    """
    fig = grid_figure()
    n_rows, n_cols = 2, 4
    cells = [ax.images[0] for ax in fig.axes[: n_rows * n_cols]]
    rgb = [np.asarray(im.to_rgba(im.get_array(), bytes=True))[..., :3] for im in cells]
    return np.concatenate([np.concatenate(rgb[r * n_cols : (r + 1) * n_cols], axis=1) for r in range(n_rows)])


def renders() -> dict[str, np.ndarray]:
    return {**torch_renders(), "grid_cells": grid_cells(), "grid": grid_render()}


def main() -> None:
    for name, pixels in renders().items():
        path = HERE / f"{name}.png"
        Image.fromarray(pixels).save(path, optimize=True)
        print(f"wrote {path} ({path.stat().st_size} bytes, {pixels.shape[1]}x{pixels.shape[0]})")


if __name__ == "__main__":
    main()
