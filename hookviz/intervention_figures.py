"""Figures for the interventions: a heat map of a patching result, a grid of feature visualisations.

Presentation layer (matplotlib, no pyplot, `PAPER_RC` per figure as in `hookviz.figures`)::

    fig = hv.patching_figure(hv.patching(model, clean, corrupt, metric, {"features.4": "channel"}))
    fig = hv.feature_grid(images, titles=["circle", "square"], examples=top_images)   # rendered | data set
    hv.save_figure(fig, "features.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from typing import TYPE_CHECKING, Any

from torch import Tensor

from .figures import PAPER_RC, save_figure
from .interventions.patching import PatchingResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["feature_grid", "patching_figure"]


def _panel(value: Tensor, kind: str) -> Tensor:
    """A 2-D array to draw: (h, w) maps as they are, site vectors as one row, a whole layer as one cell."""
    if value.dim() == 0:
        return value.reshape(1, 1)
    if value.dim() == 1:
        return value.reshape(1, -1)
    return value


def patching_figure(
    result: PatchingResult,
    *,
    normalized: bool = True,
    sample: int | None = None,
    cmap: str = "RdBu_r",
    out: str | PathLike[str] | None = None,
) -> Figure:
    """One heat map per layer of `result`: the patching score of each site (the normalised fraction of the effect
    restored by default), averaged over the samples or for one `sample`; colours symmetric around 0, one colour bar
    per layer. Spatial sites draw as the (h, w) map, channel / token / head sites as a row."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    if not isinstance(result, PatchingResult):
        raise TypeError(f"result must be a PatchingResult (from hv.patching), got {type(result).__name__}")
    values = result.normalized() if normalized else result.values
    n = result.clean.shape[0]
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or not 0 <= sample < n):
        raise ValueError(f"sample must be None (the mean) or an int in 0..{n - 1}, got {sample!r}")
    keys = list(values)
    with rc_context(PAPER_RC):
        fig = Figure(figsize=(3.2 * len(keys), 2.6), layout="constrained")
        axes = fig.subplots(1, len(keys), squeeze=False)[0]
        for ax, key in zip(axes, keys, strict=True):
            v = values[key].float()
            v = v.mean(0) if sample is None else v[sample]
            grid = _panel(v.cpu(), result.kinds[key])
            lim = max(float(grid.abs().max()), 1e-8)
            im = ax.imshow(
                grid.numpy(), cmap=cmap, vmin=-lim, vmax=lim, aspect="auto" if grid.shape[0] == 1 else "equal"
            )
            kind = result.kinds[key]
            ax.set_title(f"{key} ({kind})")
            if grid.shape[0] == 1:
                ax.set_yticks([])
                ax.set_xlabel({"channel": "channel", "token": "token position", "head": "head"}.get(kind, ""))
            fig.colorbar(im, ax=ax, shrink=0.8, label="fraction restored" if normalized else "metric")
        what = "mean over samples" if sample is None else f"sample {sample}"
        fig.suptitle(f"activation patching ({result.method}, {result.direction}; {what})")
    fig._hookviz_rc = dict(PAPER_RC)  # type: ignore[attr-defined]
    if out is not None:
        save_figure(fig, out)
    return fig


def _hwc(image: Tensor) -> Any:
    return image.detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy()


def feature_grid(
    images: Tensor,
    *,
    titles: Sequence[str] | None = None,
    examples: Tensor | None = None,
    example_values: Tensor | None = None,
    values: Tensor | None = None,
    out: str | PathLike[str] | None = None,
) -> Figure:
    """Feature visualisations, one row per unit: the rendered image (K, 3, h, w) in [0, 1], then optionally that
    unit's top data-set examples (K, k, 3, h, w) (the "dataset examples" panel of Olah et al. 2017). `values` (K,)
    and `example_values` (K, k) are printed under the images (e.g. the unit's activation)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be a (K, 3, h, w) tensor, got {getattr(images, 'shape', type(images))}")
    k = images.shape[0]
    if titles is not None and len(titles) != k:
        raise ValueError(f"titles must have one entry per image ({k}), got {len(titles)}")
    if examples is not None and (examples.dim() != 5 or examples.shape[0] != k):
        raise ValueError(f"examples must be (K={k}, k, 3, h, w), got {tuple(examples.shape)}")
    cols = 1 + (examples.shape[1] if examples is not None else 0)
    with rc_context(PAPER_RC):
        fig = Figure(figsize=(1.1 * cols + 0.3, 1.25 * k), layout="constrained")
        axes = fig.subplots(k, cols, squeeze=False)
        for i in range(k):
            row = [images[i]] + (list(examples[i]) if examples is not None else [])
            for j, (ax, img) in enumerate(zip(axes[i], row, strict=True)):
                ax.imshow(_hwc(img))
                ax.set_xticks([])
                ax.set_yticks([])
                label = None
                if j == 0 and values is not None:
                    label = f"{float(values[i]):.1f}"
                elif j > 0 and example_values is not None:
                    label = f"{float(example_values[i, j - 1]):.1f}"
                if label:
                    ax.set_xlabel(label)
            if titles is not None:
                axes[i][0].set_ylabel(titles[i])
        axes[0][0].set_title("rendered")
        if examples is not None:
            for j in range(1, cols):
                axes[0][j].set_title(f"data set #{j}")
    fig._hookviz_rc = dict(PAPER_RC)  # type: ignore[attr-defined]
    if out is not None:
        save_figure(fig, out)
    return fig
