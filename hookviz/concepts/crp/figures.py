"""CRP's figures: conditional heat maps next to their inputs (`conditional_figure`, `heat_rgb`) and each channel's
share of a layer's relevance as bars (`concept_relevance_figure`). Relevance is signed: red positive, blue negative,
on a scale symmetric about zero that one input's maps share (so the channels of a row compare), saturated at the
99.5th percentile of |R| (LRP maps of a transformer put much of their mass on a few pixels, which a scale at the
largest value would leave as the only visible ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["concept_relevance_figure", "conditional_figure", "heat_rgb"]


#: the quantile of |R| drawn fully saturated
SATURATE = 0.995


def _scale(planes: Sequence[Tensor]) -> float:
    """The value drawn fully saturated for these maps: the SATURATE quantile of |R| over all of them (else their
    largest magnitude where that quantile is 0)."""
    flat = torch.cat([p.abs().flatten() for p in planes])
    q = float(torch.quantile(flat, SATURATE)) if flat.numel() <= 2**24 else float(flat.max())
    return q if q > 0 else float(flat.max())


def _image(x: Tensor) -> np.ndarray:
    """(C, H, W) as an (H, W, 3) float array in [0, 1]: as it is where it lies in [0, 1], else scaled to its range."""
    x = x.detach().float().cpu()
    if x.min() < 0 or x.max() > 1:
        x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
    return x.expand(3, -1, -1).permute(1, 2, 0).numpy() if x.shape[0] in (1, 3) else x[0, :, :, None].repeat(3, 2)


def _plane(heat: Tensor) -> Tensor:
    """A map (C, H, W) or (H, W) summed over its channels: (H, W) float on the CPU."""
    heat = heat.detach().float().cpu()
    return heat.sum(0) if heat.dim() == 3 else heat


def heat_rgb(heat: Tensor, scale: float | None = None) -> np.ndarray:
    """A relevance map (C, H, W) or (H, W) as (H, W, 3) uint8: red positive, blue negative, white zero; `scale` the
    value drawn fully saturated (default: the 99.5th percentile of |R|, `SATURATE`)."""
    import matplotlib

    plane = _plane(heat)
    m = _scale([plane]) if scale is None else scale
    rgba = matplotlib.colormaps["bwr"](((plane / (m if m > 0 else 1.0)).clamp(-1, 1) * 0.5 + 0.5).numpy())
    return (rgba[..., :3] * 255).round().astype(np.uint8)


def conditional_figure(
    inputs: Tensor,
    maps: Tensor,
    labels: Sequence[str],
    *,
    rows: Sequence[str] | None = None,
    title: str | None = None,
) -> Any:
    """A grid: one row per input, its image then its K maps (`maps` (N, K, C, H, W) or (N, K, H, W), as
    ``CRP.attribute`` returns for K condition sets) titled by `labels`; each row on one symmetric scale (saturated
    at the 99.5th percentile of the row's |R|), each map's total relevance printed under it. Returns a Figure."""
    import matplotlib.pyplot as plt

    if maps.dim() not in (4, 5) or maps.shape[0] != inputs.shape[0]:
        raise ValueError(f"maps must be (N, K, [C,] H, W) for the {inputs.shape[0]} inputs, got {tuple(maps.shape)}")
    n, k = maps.shape[:2]
    if len(labels) != k:
        raise ValueError(f"labels: {k} maps per input, got {len(labels)} labels")
    fig, axes = plt.subplots(n, k + 1, figsize=(1.5 * (k + 1) + 0.4, 1.6 * n + 0.5), squeeze=False)
    for i in range(n):
        planes = [_plane(maps[i, j]) for j in range(k)]
        scale = _scale(planes)
        axes[i, 0].imshow(_image(inputs[i]))
        axes[i, 0].set_ylabel(rows[i] if rows is not None else f"input {i}", fontsize=8)
        for j, p in enumerate(planes):
            ax = axes[i, j + 1]
            ax.imshow(heat_rgb(p, scale))
            if i == 0:
                ax.set_title(labels[j], fontsize=8)
            ax.set_xlabel(f"ΣR {float(p.sum()):.3g}", fontsize=7)
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0, 0].set_title("input", fontsize=8)
    fig.suptitle(title or "CRP: relevance through each condition (red +, blue -; one scale per row)", fontsize=9)
    fig.tight_layout()
    return fig


def concept_relevance_figure(
    shares: Tensor, *, top: int = 12, highlight: Sequence[int] = (), title: str | None = None
) -> Any:
    """Bars of each channel's relevance R_c at a layer (`shares` (C,) or (N, C), averaged over the inputs) as a
    fraction of the layer's total: the `top` largest by magnitude, channels in `highlight` drawn dark. Returns a
    Figure."""
    import matplotlib.pyplot as plt

    r = shares.detach().float().cpu()
    r = r.mean(0) if r.dim() == 2 else r
    if r.dim() != 1:
        raise ValueError(f"shares must be (C,) or (N, C), got {tuple(shares.shape)}")
    total = float(r.sum())
    frac = r / (total if total else 1.0)
    order = torch.argsort(frac.abs(), descending=True, stable=True)[: min(top, len(frac))].tolist()
    order += [c for c in highlight if c not in order]
    fig, ax = plt.subplots(figsize=(0.42 * len(order) + 1.4, 2.6))
    colors = ["#333333" if c in highlight else "#d9534f" if frac[c] >= 0 else "#4a74c9" for c in order]
    ax.bar(range(len(order)), [float(frac[c]) for c in order], color=colors)
    ax.set_xticks(range(len(order)), [str(c) for c in order], fontsize=7)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("channel", fontsize=8)
    ax.set_ylabel("share of the layer's R", fontsize=8)
    ax.set_title(title or "concept relevance R_c / Σ R (largest first; asked channels dark)", fontsize=9)
    fig.tight_layout()
    return fig
