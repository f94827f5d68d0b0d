"""GradientFlow's exports: the statistics in long format (CSV), as plain lists (JSON), and to TensorBoard."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from .data import FlowData
from .kernels import _dense
from .layout import _MODULE_STATS, _PARAM_STATS
from .locate import _finite


def records(stats: FlowData) -> Iterable[tuple[int, str, str, str, float]]:
    """`FlowStats.records`: row by row."""
    for r in range(len(stats.steps)):
        yield from row_records(stats, r)


def row_records(stats: FlowData, r: int) -> Iterable[tuple[int, str, str, str, float]]:
    step = int(stats.steps[r])
    for stat in _PARAM_STATS:
        values, has = stats.param_stats[stat][r], stats.param_present[stat][r]
        for i, name in enumerate(stats.params):
            if has[i]:
                yield step, "param", name, stat, float(values[i])
    for stat in _MODULE_STATS:
        values, has = stats.module_stats[stat][r], stats.module_present[stat][r]
        for j, name in enumerate(stats.modules):
            if has[j]:
                yield step, "module", name, stat, float(values[j])


def to_csv(stats: FlowData, path: str | os.PathLike[str]) -> Path:
    """`FlowStats.to_csv`."""
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "level", "name", "stat", "value"])
        for step, level, name, stat, value in records(stats):
            w.writerow([step, level, name, stat, repr(value) if _finite(value) else str(value)])
    return path


def to_dict(stats: FlowData) -> dict[str, Any]:
    """`FlowStats.to_dict`."""

    def clean(values: np.ndarray, has: np.ndarray) -> list[Any]:
        return [_json_number(v) if h else None for v, h in zip(values.tolist(), has.tolist(), strict=True)]

    params = {}
    for i, name in enumerate(stats.params):
        entry: dict[str, Any] = {"module": stats.param_modules[i], "numel": stats.param_numel[i]}
        for stat in _PARAM_STATS:
            entry[stat] = clean(stats.param_stats[stat][:, i], stats.param_present[stat][:, i])
        params[name] = entry
    modules = {}
    for j, name in enumerate(stats.modules):
        entry = {"type": stats.module_types[j]}
        for stat in _MODULE_STATS:
            entry[stat] = clean(stats.module_stats[stat][:, j], stats.module_present[stat][:, j])
        modules[name] = entry
    return {
        "steps": stats.steps.tolist(),
        "total_grad_norm": [_json_number(v) for v in stats.total_grad_norm.tolist()],
        "params": params,
        "modules": modules,
        "alarms": [asdict(a) | {"value": _json_number(a.value)} for a in stats.alarms],
    }


def to_json(stats: FlowData, path: str | os.PathLike[str]) -> Path:
    """`FlowStats.to_json`."""
    path = Path(path)
    path.write_text(json.dumps(to_dict(stats), allow_nan=False, indent=1))
    return path


def _json_number(v: float) -> float | str | None:
    if v is None:
        return None
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _summary_writer(writer: Any) -> Any:
    if writer is None or isinstance(writer, str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "GradientFlow.to_tensorboard needs the optional tensorboard package to create a writer: "
                "pip install tensorboard (or pip install 'hookviz[tensorboard]'); or pass any object with "
                "add_scalar and add_histogram methods"
            ) from exc
        return SummaryWriter(log_dir=None if writer is None else os.fspath(writer))
    if not (hasattr(writer, "add_scalar") and hasattr(writer, "add_histogram")):
        raise TypeError(
            f"writer must be a torch.utils.tensorboard.SummaryWriter (or have add_scalar and add_histogram), a log "
            f"directory or None, got {type(writer).__name__}"
        )
    return writer


def to_tensorboard(
    writer: Any,
    stats: FlowData,
    step: int | None,
    histograms: bool,
    params: Iterable[tuple[str, Tensor]],
    last: dict[int, int],
) -> Any:
    """Write `stats` to `writer` (see `GradientFlow.to_tensorboard`); `last`: the last step written to each writer."""
    if len(stats.steps) == 0:
        return writer
    if step is None:
        done = last.get(id(writer), -1)
        rows = [i for i, s in enumerate(stats.steps) if s > done]
        numbers = [int(stats.steps[i]) for i in rows]
    else:
        rows, numbers = [len(stats.steps) - 1], [int(step)]
    for i, number in zip(rows, numbers, strict=True):
        writer.add_scalar("grad_norm/total", float(stats.total_grad_norm[i]), number)
        for _, level, name, stat, value in row_records(stats, i):
            if level == "module":
                writer.add_scalar(f"{stat}/{name or '<model>'}", value, number)
    if histograms and numbers:
        for pname, p in params:
            if p.grad is not None:
                writer.add_histogram(f"grad/{pname}", _dense(p.grad).detach().float().cpu(), numbers[-1])
    if rows and step is None:
        last[id(writer)] = numbers[-1]
    return writer
