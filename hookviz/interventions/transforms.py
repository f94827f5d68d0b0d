"""Random transforms applied to the image at every optimisation step (transformation robustness, Olah et al. 2017).

`standard_transforms` are lucent's: pad 12 pixels with 0.5, jitter by up to 8 pixels, scale by one of 0.90, 0.92,
..., 1.10, rotate by one of -10..10 degrees (0 weighted six times), jitter by up to 4. Every random choice is drawn
from the `torch.Generator` passed in, so a render is reproducible and the global random state is left alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Transform", "compose", "jitter", "pad", "random_rotate", "random_scale", "standard_transforms"]

Transform = Callable[[Tensor, torch.Generator], Tensor]


def _choice(values: Sequence[float], g: torch.Generator) -> float:
    return values[int(torch.randint(len(values), (1,), generator=g))]


def pad(width: int, value: float = 0.5) -> Transform:
    """Pad every side by `width` pixels of constant `value`."""
    return lambda x, g: F.pad(x, [width] * 4, value=value)


def jitter(d: int) -> Transform:
    """Translate by (dx, dy), each drawn from 0..d-1 pixels, filling with zeros (kornia's ``translate``, as lucent)."""
    if d < 2:
        raise ValueError(f"jitter needs d >= 2 pixels, got {d}")

    def fn(x: Tensor, g: torch.Generator) -> Tensor:
        dx, dy = (int(v) for v in torch.randint(d, (2,), generator=g))
        h, w = x.shape[-2:]
        out = torch.zeros_like(x)
        out[..., dy:, dx:] = x[..., : h - dy, : w - dx]
        return out

    return fn


def random_scale(scales: Sequence[float]) -> Transform:
    """Resize by one of `scales` (bilinear, corners aligned); a smaller image is padded back with zeros."""

    def fn(x: Tensor, g: torch.Generator) -> Tensor:
        s = _choice(scales, g)
        h, w = x.shape[-2:]
        size = (math.ceil(s * h), math.ceil(s * w))
        y = F.interpolate(x, size=size, mode="bilinear", align_corners=True)
        py, px = max(0, math.ceil((h - size[0]) / 2)), max(0, math.ceil((w - size[1]) / 2))
        return F.pad(y, [px, px, py, py])

    return fn


def random_rotate(angles: Sequence[float]) -> Transform:
    """Rotate about the centre by one of `angles` (degrees), bilinear, zeros outside."""

    def fn(x: Tensor, g: torch.Generator) -> Tensor:
        a = math.radians(_choice(angles, g))
        b, _, h, w = x.shape
        cos, sin = math.cos(a), math.sin(a)
        # normalised coordinates: correct for the aspect ratio so that the rotation is a rotation in pixels
        theta = torch.tensor([[cos, -sin * h / w, 0.0], [sin * w / h, cos, 0.0]], dtype=x.dtype, device=x.device)
        grid = F.affine_grid(theta.expand(b, 2, 3), list(x.shape), align_corners=True)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)

    return fn


def compose(transforms: Sequence[Transform]) -> Transform:
    def fn(x: Tensor, g: torch.Generator) -> Tensor:
        for t in transforms:
            x = t(x, g)
        return x

    return fn


def standard_transforms() -> list[Transform]:
    """lucent's ``standard_transforms``."""
    return [
        pad(12, 0.5),
        jitter(8),
        random_scale([1 + (i - 5) / 50.0 for i in range(11)]),
        random_rotate(list(range(-10, 11)) + 5 * [0]),
        jitter(4),
    ]
