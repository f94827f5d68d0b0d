"""The model parameter randomisation test (Adebayo et al. 2018), with the conventions of Quantus's ``MPRT``."""

from __future__ import annotations

import copy
import html
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from .._checks import int_at_least
from ..methods.base import Attribution
from ..targets import TargetSpec, check_target

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _ranks(x: Tensor) -> Tensor:
    """Ranks (1-based) along dim 1 of (N, F), ties given their average rank, batched."""
    n, f = x.shape
    values, order = x.sort(dim=1, stable=True)
    new = torch.ones_like(values, dtype=torch.bool)
    new[:, 1:] = values[:, 1:] != values[:, :-1]
    group = new.long().cumsum(dim=1) - 1  # tie group of each sorted position
    pos = torch.arange(1, f + 1, device=x.device, dtype=torch.float64 if x.device.type != "mps" else torch.float32)
    pos = pos.expand(n, f)
    sums = torch.zeros_like(pos).scatter_add_(1, group, pos)
    counts = torch.zeros_like(pos).scatter_add_(1, group, torch.ones_like(pos))
    return torch.empty_like(pos).scatter_(1, order, (sums / counts.clamp(min=1)).gather(1, group))


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman rank correlation of the rows of (N, F) `a` and `b` (average ranks for ties, as
    ``scipy.stats.spearmanr``): (N,), NaN where a row is constant."""
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"spearman needs two (N, F) tensors of the same shape, got {tuple(a.shape)}, {tuple(b.shape)}")
    ra, rb = _ranks(a), _ranks(b)
    ra = ra - ra.mean(dim=1, keepdim=True)
    rb = rb - rb.mean(dim=1, keepdim=True)
    return ((ra * rb).sum(dim=1) / ((ra * ra).sum(dim=1) * (rb * rb).sum(dim=1)).sqrt()).float()


def _flat_abs(attribution: Tensor) -> Tensor:
    """(N, F): the absolute value of the channel-summed map (maps as the method returns them)."""
    a = attribution.detach().float()
    if a.dim() >= 4:
        a = a.sum(dim=1)
    return a.abs().flatten(1)


@contextmanager
def _forked_rng() -> Iterator[bool]:
    """The global RNG state (cpu, and cuda when initialised) saved and restored on any exit; yields whether cuda's
    generators are included. Without cuda initialised, `torch.manual_seed` would queue a seed for cuda's
    generators that outlives this context, so only the cpu generator is seeded then."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices):
        yield cuda


@dataclass
class SanityReport:
    """Result of `sanity_check`: per-layer Spearman correlations between original and randomised maps.

    Attributes:
        method: the method's name (legend of plots).
        layers: the randomised modules' names, in randomisation order (from the output back to the input).
        correlation: (L, N) Spearman correlation per randomisation step and sample (NaN where a map is constant).
        order: ``"cascade"`` (layer l randomised together with all before it) or ``"independent"`` (only layer l).
    """

    method: str
    layers: list[str]
    correlation: Tensor
    order: str = "cascade"

    @property
    def mean(self) -> Tensor:
        """(L,) mean correlation over samples (NaN ignored)."""
        return self.correlation.nanmean(dim=1)

    @property
    def std(self) -> Tensor:
        """(L,) standard deviation over samples (NaN ignored; 0 with one sample)."""
        c = self.correlation
        dev = (c - self.mean[:, None]).pow(2).nanmean(dim=1)
        return dev.sqrt()

    @property
    def final(self) -> Tensor:
        """(N,) correlation after the last step (the fully randomised model under ``"cascade"``)."""
        return self.correlation[-1]

    def plot(self, ax: Axes | None = None, *, label: str | None = None, band: bool = True) -> Figure:
        """The classic curve: randomised layer on x ("original" first, at correlation 1), mean Spearman
        correlation on y with a +-1 std band. Call again with the same `ax` to add another method's line."""
        import matplotlib.pyplot as plt

        if ax is None:
            fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(self.layers) + 2.5), 3.8))
        else:
            fig = ax.figure
        xs = list(range(len(self.layers) + 1))
        mean = [1.0, *self.mean.tolist()]
        std = [0.0, *self.std.tolist()]
        (line,) = ax.plot(xs, mean, marker="o", markersize=3, label=label or self.method)
        if band:
            lo = [m - s for m, s in zip(mean, std, strict=True)]
            hi = [m + s for m, s in zip(mean, std, strict=True)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xticks(xs)
        ax.set_xticklabels(["original", *self.layers], rotation=60, ha="right", fontsize=7)
        ax.set_xlabel(f"randomised up to this layer ({self.order})" if self.order == "cascade" else "randomised layer")
        ax.set_ylabel("Spearman correlation")
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title("model parameter randomisation test")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    @staticmethod
    def plot_many(reports: Sequence[SanityReport], ax: Axes | None = None, *, band: bool = True) -> Figure:
        """One line per report (method) on shared axes; the reports should randomise the same layers."""
        if not reports:
            raise ValueError("reports is empty; pass one SanityReport per method")
        fig = None
        for r in reports:
            fig = r.plot(ax=ax, band=band)
            ax = fig.axes[0]
        return fig  # type: ignore[return-value]

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(name)}</td><td>{m:.3f}</td><td>{s:.3f}</td></tr>"
            for name, m, s in zip(self.layers, self.mean.tolist(), self.std.tolist(), strict=True)
        )
        caption = (
            f"Sanity check of {self.method} ({self.order} randomisation, {self.correlation.shape[1]} samples): "
            f"Spearman correlation with the original maps"
        )
        return (
            f'<table class="hookviz-sanity"><caption>{html.escape(caption)}</caption><thead><tr><th>layer</th>'
            f"<th>mean</th><th>std</th></tr></thead><tbody>{rows}</tbody></table>"
        )

    def __repr__(self) -> str:
        final = self.mean[-1].item() if self.layers else math.nan
        return (
            f"SanityReport({self.method}, {self.order}, {len(self.layers)} layers, {self.correlation.shape[1]} "
            f"samples, final mean correlation {final:.3f})"
        )


def sanity_check(
    method: Attribution,
    images: Tensor,
    target: TargetSpec = None,
    *,
    order: Literal["cascade", "independent"] = "cascade",
    seed: int = 42,
) -> SanityReport:
    """The model parameter randomisation test (Adebayo et al. 2018, "Sanity Checks for Saliency Maps", NeurIPS,
    https://arxiv.org/abs/1810.03292): maps that do not change when the weights are randomised do not explain the
    model. Conventions of Quantus's ``MPRT``:

    - the method is deep-copied together with its model (`copy.deepcopy`; the user's model and method are never
      changed; hooks already on the model are copied with it and also run on the copy), and the copy's modules
      that have ``reset_parameters`` are randomised in reverse ``named_modules()`` order (from the output back to
      the input): cumulatively (``"cascade"``, Quantus's ``"top_down"``) or one at a time from the original weights
      (``"independent"``; Quantus goes in forward order there, the per-layer values are the same);
    - ``torch.manual_seed(seed + 1)`` before each reset (the global RNG state is restored afterwards);
    - after each step the copied method (same options, same layer) explains the same images for the same targets
      (``None``: the original model's top classes, fixed for every step), and the Spearman rank correlation between
      the absolute values of the channel-summed maps of the original and the randomised model is computed per
      sample, on the maps as the method returns them (CAMs at the layer's resolution).

    Args:
        method: an `Attribution` instance (e.g. ``GradCAM(model)``).
        images: (N, C, H, W) batch.
        target: as for ``method.attribute``, one target per input (no K axis).
        order: ``"cascade"`` or ``"independent"``.
        seed: the randomisation seed.

    Returns:
        A `SanityReport` with ``correlation`` of shape (L, N) for the L randomised modules.
    """
    if not isinstance(method, Attribution):
        raise TypeError(f"method must be an Attribution instance (e.g. hookviz.GradCAM(model)), got {method!r}")
    if order not in ("cascade", "independent"):
        raise ValueError(f"order must be 'cascade' or 'independent', got {order!r}")
    seed = int_at_least("seed", seed, 0, "the randomisation seed")
    x = method._check_inputs(images)  # errors before any work; attribute_with_targets checks it again (cheap)
    if check_target(target, x.shape[0]).multi:
        raise ValueError("target must give one class per input for sanity_check, got an (N, K) target")
    resettable = [name for name, m in method.model.named_modules() if hasattr(m, "reset_parameters")]
    if not resettable:
        raise ValueError(
            f"method {type(method).__name__}'s model ({type(method.model).__name__}) has no module with "
            "reset_parameters(); the randomisation test needs layers it can re-initialise"
        )
    with _forked_rng() as cuda:
        reference, targets = method.attribute_with_targets(x, target)
        fixed: Any = targets.indices[:, 0] if targets.indices is not None else target
        ref = _flat_abs(reference)
        twin = copy.deepcopy(method)  # module references inside the method map to the copy's modules
        model = twin.model
        modules = [(name, m) for name, m in model.named_modules() if hasattr(m, "reset_parameters")][::-1]
        original = copy.deepcopy(model.state_dict()) if order == "independent" else None
        rows = []
        for _, module in modules:
            if original is not None:
                model.load_state_dict(original)
            if cuda:
                torch.manual_seed(seed + 1)
            else:
                torch.random.default_generator.manual_seed(seed + 1)
            module.reset_parameters()
            rows.append(spearman(ref, _flat_abs(twin.attribute_with_targets(x, fixed)[0])))
    return SanityReport(
        method=type(method).__name__,
        layers=[name for name, _ in modules],
        correlation=torch.stack(rows).cpu(),
        order=order,
    )
