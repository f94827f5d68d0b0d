"""Attribution patching: the first-order (gradient) estimate of activation patching for every site at once.

Nanda, "Attribution Patching: Activation Patching At Industrial Scale", 2023 (also Syed et al., "Attribution
Patching Outperforms Automated Circuit Discovery", 2023): the metric change of patching site s from the clean run
into the corrupted one is estimated by ``sum over the elements of s of (a_clean - a_corrupt) * dmetric/da`` at the
corrupted activation. One forward on the clean input (the cache), one forward and one backward on the corrupted
input for all sites and all layers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ._common import call_model, prepared
from .intervene import intervene
from .layout import edit_axes
from .patching import (
    Metric,
    PatchingResult,
    _check_metric_value,
    check_patching_args,
    layout_of,
    one_call,
    run_with_cache,
)
from .sites import site_index

__all__ = ["attribution_patching"]


def attribution_patching(
    model: nn.Module,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    sites: str | Sequence[str] | Mapping[str, str],
    *,
    heads: int | None = None,
    layout: str | Mapping[str, str] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    eval_mode: bool = True,
) -> PatchingResult:
    """The gradient estimate of `patching` (same arguments, same result layout, ``method="attribution"``).

    ``result[key]`` (N, *grid) is ``metric(target run) + sum_site (a_source - a_target) * grad``, the gradient of the
    metric w.r.t. the target run's activation, taken with ``torch.autograd.grad`` on a zero tensor added to each
    hooked output (so in-place operations after the layer are harmless and no parameter's ``.grad`` is touched).
    Exact for sites the metric depends on linearly; a ranking, not a measurement, where the model is far from
    linear between the two activations (large patches through saturated units).
    """
    kinds, n = check_patching_args(model, clean, corrupt, metric, sites, heads, layout, direction)
    source_in, target_in = (clean, corrupt) if direction == "denoise" else (corrupt, clean)
    with prepared(model, eval_mode, freeze=True):
        m_clean, acts_clean = run_with_cache(model, clean, list(kinds), metric)
        m_clean = _check_metric_value(m_clean, n)
        acts_target: dict[str, Tensor] = {}
        deltas: dict[str, Tensor] = {}

        def probe(key: str):  # noqa: ANN202
            def fn(a: Tensor) -> Tensor:
                acts_target[key] = a.detach().clone()
                deltas[key] = torch.zeros_like(a, requires_grad=True)
                return a + deltas[key]

            return fn

        with torch.enable_grad(), intervene(model, {one_call(k): probe(k) for k in kinds}):
            value = _check_metric_value(metric(call_model(model, target_in)), n)
        keys = list(kinds)
        grads = torch.autograd.grad(value.sum(), [deltas[k] for k in keys], allow_unused=True)
        m_target = value.detach()
        if direction == "noise":
            _, acts_source = run_with_cache(model, corrupt, keys, metric)
        else:
            acts_source = acts_clean
        with torch.no_grad():
            m_corrupt = (
                m_target if direction == "denoise" else _check_metric_value(metric(call_model(model, corrupt)), n)
            )
        values = {}
        for key, grad in zip(keys, grads, strict=True):
            kind = kinds[key]
            a_target = acts_target[key]
            if grad is None:
                grad = torch.zeros_like(a_target)
            axes = (
                None
                if kind == "layer"
                else edit_axes(a_target.dim(), layout_of(layout, key), where=f"layout for {key!r}")
            )
            index, grid = site_index(a_target.shape, axes, kind, heads, key)
            contrib = ((acts_source[key] - a_target) * grad).reshape(n, -1)
            flat = index.to(contrib.device).expand(1, *a_target.shape[1:]).reshape(1, -1).expand(n, -1)
            n_sites = int(torch.tensor(grid).prod().item()) if grid else 1
            per_site = torch.zeros(n, n_sites, dtype=contrib.dtype, device=contrib.device).scatter_add_(
                1, flat, contrib
            )
            values[key] = (m_target.unsqueeze(1) + per_site).reshape(n, *grid)
    return PatchingResult(values, m_clean, m_corrupt, kinds, direction, "attribution")
