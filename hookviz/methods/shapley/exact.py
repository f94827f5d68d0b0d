"""ShapleyValues: exact Shapley values over all 2^M coalitions of feature groups."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..._checks import positive_int
from ..._device import to_device
from ..base import register
from .coalitions import CoalitionAttribution, Coalitions


def all_coalitions(m: int, device: torch.device | None = None) -> Tensor:
    """The (2^M, M) coalitions, row r holding the bits of r (group i in coalition r iff bit i of r is set); built on
    `device` (the model's: nothing drawn, so nothing to copy)."""
    r = torch.arange(2**m, device=device)
    return (r[:, None] >> torch.arange(m, device=device)) & 1 == 1


def shapley_weights(m: int) -> Tensor:
    """w(s) = s! (M - s - 1)! / M!, s = 0..M-1, in float64 (the weight of a coalition of size s without i)."""
    return torch.tensor([1.0 / (m * math.comb(m - 1, s)) for s in range(m)], dtype=torch.float64)


@register("shapley-values")
class ShapleyValues(CoalitionAttribution):
    r"""Exact Shapley values (Shapley, 1953; for model explanations: Štrumbelj & Kononenko, 2014, "Explaining
    prediction models and individual predictions with feature contributions", KAIS 41) of the M feature groups,
    with the baseline as the absent value (baseline, or interventional, Shapley values):
    $$ \phi_i = \sum_{S \subseteq G \setminus \{i\}} \frac{|S|!\,(M-|S|-1)!}{M!} \,[v(S \cup \{i\}) - v(S)] $$,
    $v(S)$ the target score with the groups outside S at the baseline (averaged over a `Background`).

    All 2^M coalitions are evaluated once each (batched; captum enumerates M! permutations instead) and the sum is
    one float64 product, so the result equals captum's `ShapleyValues` up to float rounding, and efficiency holds to
    float64 rounding against the same passes: $\sum_i \phi_i = v(G) - v(\emptyset)$ = f(x) - f(b).

    Args:
        max_groups: the most groups accepted (default 20: 2^20 = 1,048,576 rows per input); more are refused before
            any forward pass, saying how many rows they would take. Images get a 3 x 3 grid by default.
        others: `CoalitionAttribution`.

    Cost: 2^M x N (x B) rows forward, plus N for the clean inputs.
    """

    grid_cells = 3

    def __init__(self, model: nn.Module, *, max_groups: int = 20, **options: Any) -> None:
        super().__init__(model, **options)
        self.max_groups = positive_int("max_groups", max_groups, "the most feature groups evaluated exactly")

    def _check_groups(self, m: int) -> None:
        if m > self.max_groups:
            raise ValueError(
                f"ShapleyValues evaluates all 2^M coalitions: M = {m} groups would take 2^{m} = {2**m:,} forward rows "
                f"per input, above max_groups={self.max_groups} (2^{self.max_groups} = {2**self.max_groups:,}); use "
                "fewer groups (a coarser feature_mask), raise max_groups, or estimate them with ShapleyValueSampling, "
                "KernelShap or PartitionShap"
            )

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        m = engine.m
        dev = engine.device
        coalitions = all_coalitions(m, dev)
        v = engine.values(coalitions, "all coalitions")  # (2^M, N, K)
        w = to_device(shapley_weights(m), dev)
        size = coalitions.sum(1)
        phi = torch.zeros(*v.shape[1:], m, dtype=torch.float64, device=dev)
        block = 2**16  # coalitions per step: 2^19 x N x K differences at once could be large
        q = torch.arange(2 ** (m - 1), device=dev)
        for i in range(m):
            # the coalitions without group i, in increasing order: q with a 0 bit put in at position i (arithmetic on
            # the device, where a boolean mask of 0..2^M-1 would read its count back)
            without = ((q >> i) << (i + 1)) | (q & ((1 << i) - 1))
            # the differences first: a group the model ignores gets exactly 0, whatever the rounding of the sum
            for start in range(0, without.numel(), block):
                s = without[start : start + block]
                gain = v[s | (1 << i)] - v[s]  # (S', N, K)
                phi[:, :, i] += torch.einsum("s,snk->nk", w[size[s]], gain)
        return phi
