"""ShapleyValueSampling: Shapley values estimated by sampled permutations of the feature groups."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..._checks import bool_option, positive_int
from ..._device import to_device
from ..base import register
from .coalitions import CoalitionAttribution, Coalitions, full_and_empty


@register("shapley-sampling")
class ShapleyValueSampling(CoalitionAttribution):
    r"""Shapley values estimated by permutation sampling (Castro et al., 2009, "Polynomial calculation of the
    Shapley value based on sampling", Computers & Operations Research 36; Štrumbelj & Kononenko, 2010): for each of
    `n_samples` random orders $\pi$ of the groups, group $\pi_k$ gets $v(\pi_{\le k}) - v(\pi_{< k})$, the change when
    it joins the groups before it; the estimate is the mean over the orders.

    Efficiency holds exactly for every permutation (the marginal contributions telescope to v(G) - v(∅)), hence for
    the mean. The orders are ``torch.randperm(M, generator=g)`` one after another, as captum's `ShapleyValueSampling`
    draws them from the global generator (``torch.randperm(M)``): with the same seed the two agree to float rounding.
    `antithetic`: the second half of the orders are the first half reversed (Mitchell et al., 2022, "Sampling
    Permutations for Shapley Value Estimation", JMLR 23), which cancels much of the variance.

    Cost: 2 + n_samples x (M - 1) coalitions x N (x B) rows forward (the empty and full coalitions once), plus N.
    """

    def __init__(self, model: nn.Module, *, n_samples: int = 25, antithetic: bool = False, **options: Any) -> None:
        super().__init__(model, **options)
        self.n_samples = positive_int("n_samples", n_samples, "number of sampled permutations")
        self.antithetic = bool_option("antithetic", antithetic)

    def permutations(self, m: int, generator: torch.Generator) -> Tensor:
        """The (n_samples, M) orders a call uses."""
        first = self.n_samples - self.n_samples // 2 if self.antithetic else self.n_samples
        perms = torch.stack([torch.randperm(m, generator=generator) for _ in range(first)])
        if self.antithetic:
            perms = torch.cat([perms, perms.flip(1)[: self.n_samples - first]])
        return perms

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        m = engine.m
        perms = self.permutations(m, generator)  # (P, M)
        p = perms.shape[0]
        rank = torch.empty_like(perms)
        rank.scatter_(1, perms, torch.arange(m).expand(p, m))  # rank[p, g]: position of group g in order p
        k = torch.arange(1, m)
        inner = rank[:, None, :] < k[None, :, None]  # (P, M - 1, M): the first k groups of each order
        ends = engine.values(full_and_empty(m), "full and empty")  # (2, N, K)
        v_inner = engine.values(inner.view(-1, m), "permutations").view(p, m - 1, *ends.shape[1:])
        v = torch.cat([ends[1].expand(p, 1, *ends.shape[1:]), v_inner, ends[0].expand(p, 1, *ends.shape[1:])], 1)
        delta = v[:, 1:] - v[:, :-1]  # (P, M, N, K): the change when group perms[p, k] joins
        phi = torch.zeros(m, *ends.shape[1:], dtype=torch.float64, device=v.device)
        phi.index_add_(0, to_device(perms.flatten(), v.device), delta.flatten(0, 1))  # drawn on the host
        return (phi / p).permute(1, 2, 0)
