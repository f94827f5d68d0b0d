"""Slow textbook references for the perturbation methods, in float64.

RISE: the masks drawn from the documented random sequence, each upsampled by a hand-written bilinear
interpolation (``align_corners=False``: pixel centres, edges clamped) one output pixel at a time, and the saliency
summed one mask and one input at a time on a float64 copy of the model. Occlusion: every window position built
as an explicit mask, one input and one window at a time. Nothing is shared with `hookviz.methods.perturbation`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .relu_rules import double_copy


def bilinear(grid: Tensor, out_h: int, out_w: int) -> Tensor:
    """(h, w) -> (out_h, out_w), float64, like ``F.interpolate(mode="bilinear", align_corners=False)``."""
    h, w = grid.shape
    g = grid.double()
    out = torch.zeros(out_h, out_w, dtype=torch.float64)
    for i in range(out_h):
        sy = max((i + 0.5) * h / out_h - 0.5, 0.0)
        y0 = min(int(math.floor(sy)), h - 1)
        y1 = min(y0 + 1, h - 1)
        ly = sy - y0
        for j in range(out_w):
            sx = max((j + 0.5) * w / out_w - 0.5, 0.0)
            x0 = min(int(math.floor(sx)), w - 1)
            x1 = min(x0 + 1, w - 1)
            lx = sx - x0
            top = (1 - lx) * g[y0, x0] + lx * g[y0, x1]
            bottom = (1 - lx) * g[y1, x0] + lx * g[y1, x1]
            out[i, j] = (1 - ly) * top + ly * bottom
    return out


def rise_masks(n: int, cell: int, p: float, seed: int, size: tuple[int, int]) -> list[Tensor]:
    """The n (H, W) float64 masks of RISE(n_masks=n, cell=cell, p=p, seed=seed), from the documented sequence."""
    h, w = size
    g = torch.Generator().manual_seed(seed)
    grids = torch.rand(n, cell, cell, generator=g) < p
    ch, cw = math.ceil(h / cell), math.ceil(w / cell)
    dy = torch.randint(0, ch, (n,), generator=g)
    dx = torch.randint(0, cw, (n,), generator=g)
    masks = []
    for i in range(n):
        big = bilinear(grids[i].double(), (cell + 1) * ch, (cell + 1) * cw)
        masks.append(big[int(dy[i]) : int(dy[i]) + h, int(dx[i]) : int(dx[i]) + w])
    return masks


def rise(
    model: nn.Module, x: Tensor, targets: Tensor, n: int, cell: int, p: float, seed: int, softmax: bool = True
) -> Tensor:
    """S = sum_i f_c(x * M_i) M_i / (n p), (N, K, 1, H, W) float64; `targets` (N, K) class indices."""
    m = double_copy(model)
    masks = rise_masks(n, cell, p, seed, (x.shape[-2], x.shape[-1]))
    out = torch.zeros(x.shape[0], targets.shape[1], 1, *x.shape[-2:], dtype=torch.float64)
    with torch.no_grad():
        for mask in masks:
            for i in range(x.shape[0]):
                y = m(x[i : i + 1].double() * mask)[0]
                if softmax:
                    y = torch.softmax(y, dim=0)
                for k in range(targets.shape[1]):
                    out[i, k, 0] += y[int(targets[i, k])] * mask
    return out / (n * p)


def occlusion(model: nn.Module, x: Tensor, target: Tensor, window: tuple[int, int], stride: tuple[int, int]) -> Tensor:
    """Occlusion of (N, C, H, W) inputs with a zero baseline, (N, C, H, W) float64; `target` (N,) class indices."""
    m = double_copy(model)
    n, c, h, w = x.shape
    total = torch.zeros(n, c, h, w, dtype=torch.float64)
    count = torch.zeros(h, w, dtype=torch.float64)
    tops = range(0, max(h - window[0], 0) + stride[0], stride[0])
    lefts = range(0, max(w - window[1], 0) + stride[1], stride[1])
    with torch.no_grad():
        for top in tops:
            for left in lefts:
                mask = torch.zeros(h, w, dtype=torch.float64)
                mask[top : top + window[0], left : left + window[1]] = 1
                count += mask
                for i in range(n):
                    xi = x[i : i + 1].double()
                    drop = m(xi)[0, int(target[i])] - m(xi * (1 - mask))[0, int(target[i])]
                    total[i] += drop * mask
    return total / count
