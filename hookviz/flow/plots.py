"""GradientFlow's plots (matplotlib, imported only when a plot is drawn): the classic per-layer gradient bar chart, a
layers x steps heatmap, and statistics over the steps; each is a `FlowStats` method that calls the function here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from .data import FlowData
from .locate import _finite, _kind_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def plot_bars(
    stats: FlowData, step: int | None = None, *, level: Literal["module", "param"] = "module", ax: Axes | None = None
) -> Figure:
    """`FlowStats.plot_bars` (its docs say what is drawn)."""
    r = stats.row(step)
    if level == "module":
        cols = stats.owner_columns()
        names = [stats.modules[j] for j in cols]
        mx = stats.module_stats["grad_max_abs"][r, cols]
        mean = stats.module_stats["grad_mean_abs"][r, cols]
        has = stats.module_has_grad[r, cols]
        recorded = stats.module_present["grad_max_abs"][r, cols]
    elif level == "param":
        names = list(stats.params)
        mx = stats.param_stats["grad_max_abs"][r]
        mean = stats.param_stats["grad_mean_abs"][r]
        has = stats.param_has_grad[r]
        recorded = stats.param_present["grad_max_abs"][r]
    else:
        raise ValueError(f"level must be 'module' or 'param', got {level!r}")
    if has.any() and not recorded.any():
        raise ValueError(
            "mean and max |grad| were not recorded (GradientFlow(abs_stats=False)); plot the gradient norms with "
            "plot_norms() or plot_heatmap() instead"
        )
    fig, ax = _figure_axes(ax, (max(6.0, 0.28 * len(names) + 2), 4.2))
    x = np.arange(len(names))
    ok = has & np.isfinite(mx) & np.isfinite(mean) & (mx > 0)
    ax.bar(x[ok], mx[ok], width=0.8, color="tab:cyan", alpha=0.6, label="max |grad|")
    ok_mean = ok & (mean > 0)
    ax.bar(x[ok_mean], mean[ok_mean], width=0.8, color="tab:blue", alpha=0.9, label="mean |grad|")
    ax.set_yscale("log")
    positive = np.concatenate([mx[ok], mean[ok_mean]])
    if positive.size:
        ax.set_ylim(positive.min() / 3, positive.max() * 3)
    labels = []
    for i, name in enumerate(names):
        label = name or "<model>"
        if not has[i]:
            label += " (no grad)"
        elif not (_finite(mx[i]) and _finite(mean[i])):
            label += f" ({_kind_of([mx[i], mean[i]])})"
        elif mx[i] == 0:
            label += " (0)"
        labels.append(label)
    ax.set_xticks(x, labels, rotation=90, fontsize=7)
    for tick, i in zip(ax.get_xticklabels(), range(len(names)), strict=True):
        if not has[i]:
            tick.set_color("grey")
        elif not (_finite(mx[i]) and _finite(mean[i])):
            tick.set_color("red")
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel("|grad|")
    ax.set_title(f"gradient flow at step {int(stats.steps[r])}")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_heatmap(
    stats: FlowData,
    stat: str = "grad_norm",
    *,
    level: Literal["module", "param"] = "module",
    ax: Axes | None = None,
    log: bool = True,
) -> Figure:
    """`FlowStats.plot_heatmap` (its docs say what is drawn)."""
    from matplotlib.colors import LogNorm, Normalize

    stats.row(None)
    names, values = stats.matrix(stat, level)
    fig, ax = _figure_axes(ax, (max(6.0, 0.05 * len(stats.steps) + 4), max(3.0, 0.18 * len(names) + 1.5)))
    masked = np.ma.masked_invalid(values.T)
    if log:
        masked = np.ma.masked_less_equal(masked, 0)
    finite = masked.compressed()
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        norm = LogNorm(lo, hi if hi > lo else lo * 10) if log else Normalize(lo, hi if hi > lo else lo + 1)
    else:
        norm = None
    steps = stats.steps
    extent = (float(steps[0]) - 0.5, float(steps[-1]) + 0.5, len(names) - 0.5, -0.5)
    image = ax.imshow(masked, aspect="auto", interpolation="nearest", norm=norm, cmap="viridis", extent=extent)
    ax.set_yticks(np.arange(len(names)), [n or "<model>" for n in names], fontsize=7)
    ax.set_xlabel("step")
    ax.set_title(f"{stat} per {level}")
    _mark_first_nonfinite(stats, ax, values, (stats.module_present if level == "module" else stats.param_present)[stat])
    fig.colorbar(image, ax=ax, label=stat)
    fig.tight_layout()
    return fig


def plot_norms(
    stats: FlowData,
    names: Sequence[str] | None = None,
    stat: str = "grad_norm",
    *,
    level: Literal["module", "param"] = "module",
    ax: Axes | None = None,
    log: bool = True,
) -> Figure:
    """`FlowStats.plot_norms` (its docs say what is drawn)."""
    stats.row(None)
    all_names, values = stats.matrix(stat, level)
    if names is None:
        pool = [stats.modules[j] for j in stats.owner_columns()] if level == "module" else list(stats.params)
        pool = pool or all_names
        picks = np.unique(np.linspace(0, len(pool) - 1, num=min(8, len(pool))).round().astype(int))
        names = [pool[i] for i in picks]
    fig, ax = _figure_axes(ax, (7.0, 4.0))
    present = (stats.module_present if level == "module" else stats.param_present)[stat]
    zero_seen = False
    for name in names:
        j = stats.column(name, level)
        (line,) = ax.plot(
            stats.steps, values[:, j], marker="." if len(stats.steps) < 50 else None, label=name or "<model>"
        )
        bad = np.flatnonzero(present[:, j] & ~np.isfinite(values[:, j]))
        before = np.flatnonzero(np.isfinite(values[:, j]) & (values[:, j] > 0 if log else True))
        before = before[before < bad[0]] if bad.size else before[:0]
        if before.size:  # where the line ends: its last finite value before its first NaN/Inf
            r = before[-1]
            ax.plot(stats.steps[r], values[r, j], marker="X", ms=9, color=line.get_color(), mec="red", mew=1.2)
        zeros = np.flatnonzero(present[:, j] & (values[:, j] == 0))
        if log and zeros.size:  # a log axis has no 0: exact zeros (an underflow) as triangles on its bottom edge
            ax.plot(
                stats.steps[zeros],
                np.full(zeros.size, 0.02),
                transform=ax.get_xaxis_transform(),
                marker="v",
                ls="none",
                color=line.get_color(),
                clip_on=False,
            )
            zero_seen = True
    if log:
        ax.set_yscale("log")
        if zero_seen:
            ax.text(0.01, 0.05, "\u25bc exactly 0", transform=ax.transAxes, fontsize=7, color="0.3")
    _mark_first_nonfinite(stats, ax, values, present)
    ax.set_xlabel("step")
    ax.set_ylabel(stat)
    ax.set_title(f"{stat} over steps")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


_KIND_WORDS = {"nan": "NaN", "inf": "Inf"}


def first_nonfinite(stats: FlowData, values: np.ndarray, present: np.ndarray) -> tuple[int, str, str] | None:
    """(step, kind "nan"/"inf", where) of the first recorded NaN/Inf in `values` (S, M) where `present`; `where` names
    the module a non-finite alarm of that step blamed, else the first column with the value."""
    bad = present & ~np.isfinite(values)
    rows = np.flatnonzero(bad.any(1))
    if rows.size == 0:
        return None
    r = int(rows[0])
    step = int(stats.steps[r])
    kind = _kind_of(values[r][bad[r]].tolist())
    blamed = [a.name for a in stats.alarms if a.kind == "nonfinite" and a.step == step and a.name is not None]
    names = stats.matrix("grad_norm", "module")[0] if values.shape[1] == len(stats.modules) else list(stats.params)
    where = blamed[0] if blamed else names[int(np.flatnonzero(bad[r])[0])]
    return step, kind, where


def _mark_first_nonfinite(stats: FlowData, ax: Axes, values: np.ndarray, present: np.ndarray) -> None:
    """A dashed red line at the step of the first NaN/Inf, with a note saying which and where: lines that end there
    do not just stop."""
    found = first_nonfinite(stats, values, present)
    if found is None:
        return
    step, kind, where = found
    lo, hi = float(stats.steps[0]), float(stats.steps[-1])
    if ax.name == "rectilinear" and not ax.images:  # the lines' axis: every recorded step, also those after the NaN
        ax.set_xlim(lo - 0.03 * (hi - lo + 1), hi + 0.03 * (hi - lo + 1))
    x = step - 0.5 if ax.images else step  # a heatmap's cell spans the step: the line at its left edge
    ax.axvline(x, color="red", ls="--", lw=1.2, zorder=0.5)
    after = step < hi  # the note goes where the lines have ended, right of the line, when there is room
    ax.annotate(
        f"first {_KIND_WORDS.get(kind, kind)} at step {step}\nin {where or '<model>'!r}",
        xy=(x, 0.97),
        xycoords=("data", "axes fraction"),
        xytext=(4 if after else -4, 0),
        textcoords="offset points",
        ha="left" if after else "right",
        va="top",
        fontsize=8,
        color="red",
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "red", "alpha": 0.85},
    )


def _figure_axes(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, fig.add_subplot()
