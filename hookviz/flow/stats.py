"""GradientFlow's results: `FlowStats` (every recorded statistic as numpy arrays over the recorded steps, assembled
from the host chunks of the buffer) and `FlowReport` (a per-module table at one step)."""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from . import export, plots
from .alarms import Alarm
from .data import FlowData
from .layout import (
    _MISSING,
    _MODULE_STATS,
    ACT_NORM,
    DEAD_FRACTION,
    KEY_BLOCKS,
    L1,
    L2,
    MAX_ABS,
    OUT_GRAD_NORM,
    PARAM_BLOCKS,
    UPDATE_NORM,
    WEIGHT_NORM,
    _base,
    _Chunk,
)
from .locate import _finite
from .watch import _Watched

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class FlowStats(FlowData):
    """Every statistic recorded by a `GradientFlow`, as numpy arrays over the recorded steps.

    ``param_stats[stat]`` is (S, P) over `params` for ``grad_norm`` (L2), ``grad_mean_abs``, ``grad_max_abs`` and
    ``update_ratio`` (``||w_after - w_before|| / ||w_before||``; none without an optimizer or for a zero weight).
    ``module_stats[stat]`` is (S, M) over `modules` for the same four (over the module's parameters; the root of the
    summed squares of the norms for ``grad_norm``), plus ``out_grad_norm`` (L2 norm of the gradient w.r.t. the
    module's output), ``act_norm`` (L2 norm of the output) and ``dead_fraction`` (ReLUs: the fraction of units whose
    output is 0 for the whole batch). `modules` lists the watched modules in model order, each followed by the call
    keys of its further calls (``"layer1.0.relu#1"``: see `hookviz.record`); parameter statistics belong to the first
    key. Where a statistic has no value (no gradient, module not run, statistic not recorded) the array holds NaN and
    ``param_present[stat]`` / ``module_present[stat]`` (same shapes, bool) are False; where they are True, a NaN is a
    NaN.
    """

    # -- report ---------------------------------------------------------------------------------------------------
    def report(self, step: int | None = None) -> FlowReport:
        """A per-module table at `step` (default: the last recorded step)."""
        r = self.row(step)
        numel: dict[str, int] = {}
        for m, n in zip(self.param_modules, self.param_numel, strict=True):
            numel[m] = numel.get(m, 0) + n
        flagged = self.active_alarms(int(self.steps[r]))  # every layer an alarm names, while its condition holds
        rows = []
        for j, name in enumerate(self.modules):
            values: dict[str, float | None] = {}
            for stat in _MODULE_STATS:
                values[stat] = float(self.module_stats[stat][r, j]) if self.module_present[stat][r, j] else None
            status = list(flagged.get(name, []))
            owns = name in numel and _base(name) == name
            if owns and not self.module_has_grad[r, j]:
                status.append("no grad")
            elif "nonfinite" not in status and any(v is not None and not _finite(v) for v in values.values()):
                status.append("nonfinite")
            row = {"module": name, "type": self.module_types[j], "params": numel[name] if owns else 0}
            rows.append(row | values | {"status": ", ".join(status)})
        return FlowReport(
            step=int(self.steps[r]),
            steps_recorded=len(self.steps),
            total_grad_norm=float(self.total_grad_norm[r]),
            rows=rows,
            alarms=list(self.alarms),
        )

    # -- plots ----------------------------------------------------------------------------------------------------
    def plot_bars(
        self, step: int | None = None, *, level: Literal["module", "param"] = "module", ax: Axes | None = None
    ) -> Figure:
        """The classic gradient-flow chart at `step`: max |grad| and mean |grad| per layer, on a log scale.

        One entry per module that owns parameters (``level="module"``) or per parameter (``level="param"``), in model
        order. Entries without a gradient get no bar and a grey ``(no grad)`` label; non-finite ones a red ``(nan)``
        or ``(inf)`` label; exact zeros a ``(0)`` label (a log axis has no 0). Returns the Figure.
        """
        return plots.plot_bars(self, step, level=level, ax=ax)

    def plot_heatmap(
        self,
        stat: str = "grad_norm",
        *,
        level: Literal["module", "param"] = "module",
        ax: Axes | None = None,
        log: bool = True,
    ) -> Figure:
        """A layers x steps heatmap of `stat` (log colour scale by default); missing values are blank. Returns the
        Figure (with a colour bar axis)."""
        return plots.plot_heatmap(self, stat, level=level, ax=ax, log=log)

    def plot_norms(
        self,
        names: Sequence[str] | None = None,
        stat: str = "grad_norm",
        *,
        level: Literal["module", "param"] = "module",
        ax: Axes | None = None,
        log: bool = True,
    ) -> Figure:
        """`stat` over the recorded steps, one line per name (default: up to 8 modules that own parameters, spread
        over the model). The first NaN/Inf is marked: a dashed red line at its step, a note naming the module (the
        non-finite alarm's culprit where there is one), and an X where each line ends. Returns the Figure."""
        return plots.plot_norms(self, names, stat, level=level, ax=ax, log=log)

    # -- exports --------------------------------------------------------------------------------------------------
    def records(self) -> Iterable[tuple[int, str, str, str, float]]:
        """Long format: (step, level, name, stat, value) for every statistic that has a value."""
        return export.records(self)

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write `records` as CSV (columns step, level, name, stat, value; non-finite values as nan/inf)."""
        return export.to_csv(self, path)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists: missing values as None, non-finite ones as the strings "NaN", "Infinity", "-Infinity"."""
        return export.to_dict(self)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write `to_dict` as JSON (strict: no bare NaN/Infinity tokens)."""
        return export.to_json(self, path)


def _assemble(
    chunks: list[_Chunk],
    keys: list[str],
    watched: _Watched,
    alarms: list[Alarm],
    cleared: list[tuple[str, str, int]] | None = None,
) -> FlowStats:
    """Host chunks -> FlowStats (parameter statistics per parameter and aggregated per module); `keys`: every call
    key in column order."""
    steps = np.concatenate([c.steps for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
    blocks, key_blocks = _stack(chunks, len(watched.params), len(keys))
    numel = np.array([p.numel() for p in watched.params], dtype=np.float64)
    modules = _module_order(keys, watched)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        present, param_present, param_stats = _param_stats(blocks, numel)
        mstats, mpresent = _module_stats(modules, keys, watched, blocks, key_blocks, present, numel)
        has = present["grad_norm"]
        total = np.where(has.any(1), _root_sum_sq(blocks[L2], has), np.nan)
    return FlowStats(
        steps=steps,
        params=list(watched.param_names),
        param_modules=list(watched.param_module),
        param_numel=[int(n) for n in numel],
        modules=modules,
        module_types=[watched.types.get(_base(m), "?") for m in modules],
        param_stats=param_stats,
        param_present=param_present,
        module_stats=mstats,
        module_present=mpresent,
        total_grad_norm=total,
        alarms=list(alarms),
        cleared=list(cleared or []),
    )


def _stack(chunks: list[_Chunk], n_params: int, n_keys: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The chunks' rows stacked: `PARAM_BLOCKS` (S, P) arrays and `KEY_BLOCKS` (S, keys) arrays, `_MISSING` where a
    chunk had no column yet (keys first seen later)."""
    S = sum(len(c.steps) for c in chunks)
    blocks = [np.full((S, n_params), _MISSING) for _ in range(PARAM_BLOCKS)]
    key_blocks = [np.full((S, n_keys), _MISSING) for _ in range(KEY_BLOCKS)]
    r = 0
    for c in chunks:
        n = len(c.steps)
        for b in range(PARAM_BLOCKS):
            blocks[b][r : r + n] = c.data[:, c.layout.block(b)]
        for b in range(KEY_BLOCKS):
            key_blocks[b][r : r + n, : len(c.layout.keys)] = c.data[:, c.layout.key_block(b)]
        r += n
    return blocks, key_blocks


def _param_stats(
    blocks: list[np.ndarray], numel: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(where each raw statistic is present, where each parameter statistic has a value, the statistics)."""
    l2, l1, mx, upd, w = (blocks[i] for i in (L2, L1, MAX_ABS, UPDATE_NORM, WEIGHT_NORM))
    has = l2 != _MISSING
    present = {
        "grad_norm": has,
        "grad_mean_abs": has & (l1 != _MISSING),
        "grad_max_abs": has & (mx != _MISSING),
        "update_ratio": has & (upd != _MISSING) & (w != _MISSING),
    }
    param_present = present | {"update_ratio": present["update_ratio"] & (w > 0)}
    param_stats = {
        "grad_norm": np.where(has, l2, np.nan),
        "grad_mean_abs": np.where(present["grad_mean_abs"], l1 / np.maximum(numel, 1), np.nan),
        "grad_max_abs": np.where(present["grad_max_abs"], mx, np.nan),
        "update_ratio": np.where(param_present["update_ratio"], upd / np.where(w > 0, w, 1), np.nan),
    }
    return present, param_present, param_stats


def _module_order(keys: list[str], watched: _Watched) -> list[str]:
    """Watched modules in model order, each followed by its further call keys (``name#1``, ``name#2``, ...)."""
    extra: dict[str, list[str]] = {}
    for k in keys:
        if _base(k) != k:
            extra.setdefault(_base(k), []).append(k)
    modules = []
    for name in watched.module_names:
        modules.append(name)
        modules.extend(sorted(extra.get(name, []), key=lambda k: int(k.rsplit("#", 1)[1])))
    return modules


def _root_sum_sq(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row, the root of the summed squares of `values` where `mask` holds."""
    return np.sqrt(np.where(mask, values.astype(np.float64) ** 2, 0.0).sum(1))


def _module_stats(
    modules: list[str],
    keys: list[str],
    watched: _Watched,
    blocks: list[np.ndarray],
    key_blocks: list[np.ndarray],
    present: dict[str, np.ndarray],
    numel: np.ndarray,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(S, M) module statistics: parameter statistics aggregated over each module's parameters (first call key
    only), and the per-call statistics of each call key."""
    S = len(present["grad_norm"])
    l2, l1, mx, upd, w = (blocks[i] for i in (L2, L1, MAX_ABS, UPDATE_NORM, WEIGHT_NORM))
    mstats = {stat: np.full((S, len(modules)), np.nan) for stat in _MODULE_STATS}
    mpresent = {stat: np.zeros((S, len(modules)), dtype=bool) for stat in _MODULE_STATS}
    key_pos = {k: i for i, k in enumerate(keys)}

    def put(stat: str, j: int, mask: np.ndarray, values: np.ndarray) -> None:
        mpresent[stat][:, j] = mask
        mstats[stat][:, j] = np.where(mask, values, np.nan)

    for j, name in enumerate(modules):
        cols = watched.params_of.get(name, []) if _base(name) == name else []
        if cols:
            p = present["grad_norm"][:, cols]
            put("grad_norm", j, p.any(1), _root_sum_sq(l2[:, cols], p))
            p = present["grad_mean_abs"][:, cols]
            mean = np.where(p, l1[:, cols], 0.0).sum(1) / np.maximum((p * numel[cols]).sum(1), 1)
            put("grad_mean_abs", j, p.any(1), mean)
            p = present["grad_max_abs"][:, cols]
            put("grad_max_abs", j, p.any(1), np.where(p, mx[:, cols], -np.inf).max(1))
            p = present["update_ratio"][:, cols]
            ws = _root_sum_sq(w[:, cols], p)
            put("update_ratio", j, p.any(1) & (ws > 0), _root_sum_sq(upd[:, cols], p) / np.where(ws > 0, ws, 1))
        i = key_pos.get(name)
        if i is not None:
            for b, stat in ((OUT_GRAD_NORM, "out_grad_norm"), (ACT_NORM, "act_norm"), (DEAD_FRACTION, "dead_fraction")):
                v = key_blocks[b][:, i]
                put(stat, j, v != _MISSING, v)
    return mstats, mpresent


# -- report ---------------------------------------------------------------------------------------------------------
_REPORT_COLUMNS = (
    ("module", "module"),
    ("type", "type"),
    ("params", "params"),
    ("grad_norm", "grad norm"),
    ("grad_mean_abs", "mean |grad|"),
    ("grad_max_abs", "max |grad|"),
    ("update_ratio", "update/weight"),
    ("out_grad_norm", "out-grad norm"),
    ("act_norm", "act norm"),
    ("dead_fraction", "dead"),
    ("status", "status"),
)


@dataclass
class FlowReport:
    """A per-module summary at one step: plain dicts in `rows` (keys: module, type, params, the statistics of
    `FlowStats` with None where there is no value, status: the alarm kinds at this step, "no grad" or "nonfinite"),
    the alarms so far, and an HTML table for notebooks."""

    step: int
    steps_recorded: int
    total_grad_norm: float
    rows: list[dict[str, Any]]
    alarms: list[Alarm]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _columns(self) -> list[tuple[str, str]]:
        """The report columns, without statistics that have no value in any row (not recorded in this run)."""
        fixed = ("module", "type", "params", "status")
        return [(k, t) for k, t in _REPORT_COLUMNS if k in fixed or any(r[k] is not None for r in self.rows)]

    def _cells(self, row: dict[str, Any], columns: list[tuple[str, str]]) -> list[str]:
        out = []
        for key, _ in columns:
            v = row[key]
            if key == "params":
                out.append(f"{v:,}" if v else "")
            elif v is None:
                out.append("–")
            elif isinstance(v, float):
                out.append(f"{v:.3g}")
            else:
                out.append(str(v))
        if not row["module"]:
            out[0] = "<model>"
        return out

    def __str__(self) -> str:
        columns = self._columns()
        table = [[title for _, title in columns]] + [self._cells(r, columns) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
        lines = [
            f"GradientFlow at step {self.step} ({self.steps_recorded} steps recorded), total grad norm "
            f"{self.total_grad_norm:.4g}"
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
        lines += [f"alarm: {a.message}" for a in self.alarms]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        columns = self._columns()
        head = "".join(f"<th>{html.escape(t)}</th>" for _, t in columns)
        body = []
        for row in self.rows:
            status = row["status"]
            style = ' style="color:#999"' if status == "no grad" else (' style="color:#c00"' if status else "")
            cells = "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(row, columns))
            body.append(f"<tr{style}>{cells}</tr>")
        caption = (
            f"GradientFlow at step {self.step} ({self.steps_recorded} steps recorded), total grad norm "
            f"{self.total_grad_norm:.4g}"
        )
        alarms = ""
        if self.alarms:
            items = "".join(f"<li>{html.escape(a.message)}</li>" for a in self.alarms)
            alarms = f"<p><b>{len(self.alarms)} alarm(s)</b></p><ul>{items}</ul>"
        return (
            f'<table class="hookviz-flow"><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>{alarms}"
        )
