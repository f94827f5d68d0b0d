"""Per-item metric values for the report: the localisation metrics computed from the maps where the items have
object masks (`hookviz.metrics.pointing_game`, `energy_in_mask`), and any per-item values of an `Evaluation`
(deletion / insertion AUC) for methods of the same name; then the summary: method means and per-class means."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..metrics import METRICS, Evaluation, energy_in_mask, pointing_game
from .sources import Items
from .stores import Column

BLOCK = 1024


def item_scores(columns: list[Column], items: Items, evaluation: Evaluation | None) -> dict[str, dict[str, Tensor]]:
    """``{column name: {metric: (N,) float tensor}}``, NaN where unknown; only metrics known for some item."""
    out: dict[str, dict[str, Tensor]] = {c.name: {} for c in columns}
    if items.masks is not None:
        for c in columns:
            hits, energy = [], []
            for a in range(0, items.n, BLOCK):
                b = min(items.n, a + BLOCK)
                maps, masks = c.maps[a:b].float(), items.masks[a:b]
                hits.append(pointing_game(maps, masks).float())
                energy.append(energy_in_mask(maps, masks).float())
            out[c.name]["pointing game"] = torch.cat(hits).cpu()
            out[c.name]["energy in mask"] = torch.cat(energy).cpu()
    if evaluation is not None:
        if not isinstance(evaluation, Evaluation):
            raise TypeError(f"evaluation must be a hookviz.metrics.Evaluation or None, got {type(evaluation).__name__}")
        for name, values in evaluation.scores.items():
            if name not in out:
                continue
            for metric, v in values.items():
                if isinstance(v, Tensor) and v.shape == (items.n,):
                    out[name][metric] = v.detach().float().cpu()
    return out


def metric_names(scores: dict[str, dict[str, Tensor]], evaluation: Evaluation | None) -> list[str]:
    """The metrics to show, in `hookviz.metrics.METRICS` order, then any others."""
    found = {m for per in scores.values() for m in per}
    if evaluation is not None:
        found.update(evaluation.metrics)
    return [m for m in METRICS if m in found] + sorted(found - set(METRICS))


def summary(
    columns: list[Column],
    scores: dict[str, dict[str, Tensor]],
    metrics: list[str],
    labels: Tensor | None,
    evaluation: Evaluation | None,
) -> dict[str, Any]:
    """Means per method and metric (the evaluation's own table where it has the entry) and per class."""
    table: dict[str, dict[str, float | None]] = {}
    per_class: dict[str, dict[str, dict[int, float | None]]] = {}
    for c in columns:
        row: dict[str, float | None] = {}
        for m in metrics:
            v = scores[c.name].get(m)
            mean = _mean(v) if v is not None else None
            if evaluation is not None and c.name in evaluation.methods and m in evaluation.metrics:
                mean = _finite(evaluation.value(c.name, m))
            row[m] = mean
        table[c.name] = row
        if labels is not None:
            per_class[c.name] = {
                m: {int(k): _mean(v[labels == k]) for k in labels.unique().tolist()} for m, v in scores[c.name].items()
            }
    return {"table": table, "per_class": per_class, "higher_is_better": {m: METRICS.get(m, True) for m in metrics}}


def _mean(v: Tensor) -> float | None:
    return _finite(float(v.float().nanmean())) if v.numel() else None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
