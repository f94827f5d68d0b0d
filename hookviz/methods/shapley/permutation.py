"""FeaturePermutation: the score drop when one group of features is shuffled across the batch."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._device import to_device
from ..base import register
from .ablation import one_out
from .coalitions import CoalitionAttribution, Coalitions, Reference


class _Shuffled(Reference):
    """Baselines of coalition s (group s shuffled): input ``perms[s, i]`` of the batch."""

    def __init__(self, xs: tuple[Tensor, ...], perms: Tensor) -> None:
        super().__init__(xs, 1)
        self.perms = perms  # (M, N) on the inputs' device

    def rows(self, t: int, s: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return self.tensors[t][self.perms[s, i]]


def draw_perms(m: int, n: int, generator: torch.Generator) -> Tensor:
    """(M, N) permutations of the batch, one per group, each redrawn while it is the identity (captum's
    `_permute_feature`, in the same order of draws: group 0 first)."""
    rows = []
    for _ in range(m):
        p = torch.randperm(n, generator=generator)
        while bool((p == torch.arange(n)).all()):
            p = torch.randperm(n, generator=generator)
        rows.append(p)
    return torch.stack(rows)


@register("feature-permutation")
class FeaturePermutation(CoalitionAttribution):
    r"""Permutation feature importance (Breiman, 2001, "Random Forests"; Fisher et al., 2019, "All Models are Wrong,
    but Many are Useful", arXiv:1801.01489), per input as captum's `FeaturePermutation`:
    $$ A_i(x_n) = f(x_n) - f(x_n \text{ with group } i \text{ taken from input } \pi_i(n)) $$, where $\pi_i$ is a
    random permutation of the batch (not the identity), one per group. Needs N >= 2 inputs; the baselines are the
    other inputs, so ``baselines`` is not used. Forward passes only.

    Result shaped like the inputs, (N, K, ...) with K targets. The permutations come from the generator by
    ``torch.randperm(N)`` per group in order, redrawn while the identity, as captum draws them from the global
    generator: with the same seed the two agree (up to float rounding).

    Example::

        attr = FeaturePermutation(model, seed=0).attribute(rows, target=0)   # rows (N, D), one group per column
    """

    def _check_batch(self, n: int) -> None:
        if n < 2:
            raise ValueError("FeaturePermutation shuffles groups across the batch: it needs N >= 2 inputs, got 1")

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        n = engine.n
        perms = to_device(draw_perms(engine.m, n, generator), engine.device)  # drawn on the host, copied once
        engine.ref = _Shuffled(engine.xs, perms)
        shuffled = engine.values(one_out(engine.m), "groups")  # (M, N, K)
        return (clean.unsqueeze(0) - shuffled).permute(1, 2, 0)
