"""KernelShap: Shapley values estimated by the Shapley-kernel weighted regression of Lundberg & Lee (2017)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor, nn

from ..._checks import bool_option, int_option
from ..._device import to_device
from ..base import register
from .coalitions import CoalitionAttribution, Coalitions, Reference, solve_host_matrix, varying_groups


def kernel_coalitions(m: int, n_samples: int, generator: torch.Generator, paired: bool = True) -> tuple[Tensor, Tensor]:
    """The coalitions (S, M) bool and their weights (S,) float64 of shap's `KernelExplainer` for M groups and a
    budget of `n_samples` coalitions (the empty and full ones excluded: the regression fixes them).

    As shap: subset sizes s and M - s are taken together with the Shapley kernel's weight (M - 1) / (s (M - s)) per
    size; from s = 1 up, a size is enumerated whole (every coalition of that size and its complement) while the
    budget left covers it at its share of the weight; the budget left then goes to coalitions drawn at random (a size
    from the remaining weights, then a uniformly random subset of that size, and its complement when `paired`), a
    coalition drawn again adding to its weight; the drawn coalitions share the remaining weight in proportion to
    their counts. Draws come from `generator`, so they differ from shap's numpy draws; enumeration is the same.
    """
    n_samples = min(n_samples, 2**m - 2) if m < 63 else n_samples
    n_sizes = math.ceil((m - 1) / 2)
    n_paired = math.floor((m - 1) / 2)
    weight = torch.tensor([(m - 1.0) / (s * (m - s)) for s in range(1, n_sizes + 1)], dtype=torch.float64)
    weight[:n_paired] *= 2
    weight /= weight.sum()
    masks: list[Tensor] = []
    weights: list[Tensor] = []
    left = n_samples
    remaining = weight.clone()
    full = 0
    for size in range(1, n_sizes + 1):
        count = math.comb(m, size) * (2 if size <= n_paired else 1)
        if left * float(remaining[size - 1]) / count < 1.0 - 1e-8:
            break
        full += 1
        left -= count
        if remaining[size - 1] < 1.0:
            remaining /= 1 - remaining[size - 1]
        w = float(weight[size - 1]) / math.comb(m, size) / (2 if size <= n_paired else 1)
        combos = torch.tensor(list(itertools.combinations(range(m), size)), dtype=torch.long)
        on = torch.zeros(combos.shape[0], m, dtype=torch.bool)
        on.scatter_(1, combos, True)
        # shap adds each subset followed by its complement: the same interleaved order
        rows = torch.stack([on, ~on], 1).flatten(0, 1) if size <= n_paired else on
        masks.append(rows)
        weights.append(torch.full((rows.shape[0],), w, dtype=torch.float64))
    if full < n_sizes and left > 0:
        rest = weight.clone()
        rest[:n_paired] /= 2  # two coalitions per draw below
        rest = rest[full:] / rest[full:].sum()
        draws = 4 * left
        sizes = torch.multinomial(rest, draws, replacement=True, generator=generator) + full + 1
        keys = torch.rand(draws, m, generator=generator, dtype=torch.float64)
        ranks = keys.argsort(1).argsort(1)
        drawn = ranks < sizes[:, None]  # (draws, M): `size` random groups each
        uniq, inverse = torch.unique(drawn, dim=0, return_inverse=True)
        first = torch.full((uniq.shape[0],), draws, dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(draws), "amin"
        )
        order = first.argsort()  # the unique coalitions in the order shap meets them
        is_paired = (uniq.sum(1) <= n_paired) & paired
        cost = 1 + is_paired[order].long()
        kept = order[torch.cumsum(cost, 0) - cost < left]  # shap stops once the budget is used (a pair may finish it)
        stop = int(first[kept].max()) + 1 if kept.numel() < uniq.shape[0] else draws  # draws made before it stopped
        counts = torch.bincount(inverse[:stop], minlength=uniq.shape[0]).double()[kept]
        # each kept coalition, then its complement where paired (shap's order), without a Python loop
        picked, pair = uniq[kept], is_paired[kept]
        present = torch.stack([torch.ones_like(pair), pair], 1).flatten()
        sampled = torch.stack([picked, ~picked], 1).flatten(0, 1)[present]
        sampled_w = counts.repeat_interleave(2)[present]
        sampled_w *= float(weight[full:].sum()) / sampled_w.sum()
        masks.append(sampled)
        weights.append(sampled_w)
    return torch.cat(masks), torch.cat(weights)


def eliminated_regression(z: Tensor, w: Tensor, y: Tensor, total: Tensor) -> Tensor:
    """shap's constrained least squares: phi (M, R) minimising sum_s w_s (y_s - z_s . phi)^2 subject to
    sum_i phi_i = total, by eliminating the last variable (phi_M = total - sum of the others).

    `z` (S, M) 0/1 and `w` (S,) on the host (as drawn: the normal matrix is built and factored there, without a
    wait, `solve_host_matrix`), `y` (S, R) (v(S) - v(empty)) and `total` (R,) (v(G) - v(empty)) on the model's
    device; float64 throughout, one solve for all R = N x K outputs."""
    m = z.shape[1]
    if m == 1:
        return total.unsqueeze(0)
    dev = y.device
    y2 = y - to_device(z[:, -1:], dev) * total[None, :]
    e = z[:, :-1] - z[:, -1:]
    we = w[:, None] * e
    a = e.T @ we  # on the host
    b = to_device(we, dev).T @ y2
    sol = solve_host_matrix(a, b)  # singular: the least-norm solution
    return torch.cat([sol, (total - sol.sum(0)).unsqueeze(0)])


def put(phi: Tensor, inputs: Tensor, groups: Tensor, values: Tensor) -> None:
    """``phi[inputs][:, :, groups] = values``: the (n, K, G) `values` written into the (N, K, M) `phi` in place."""
    k = torch.arange(phi.shape[1], device=phi.device)
    phi.index_put_((inputs[:, None, None], k[None, :, None], groups[None, None, :]), values)


@register("kernel-shap")
class KernelShap(CoalitionAttribution):
    r"""KernelSHAP (Lundberg & Lee, 2017, "A Unified Approach to Interpreting Model Predictions", NeurIPS): the
    Shapley values of the groups as the solution of a weighted linear regression of v(S) on the coalitions' 0/1
    vectors, with the Shapley kernel weight $\pi(S) = (M - 1) / (\binom{M}{|S|} |S| (M - |S|))$, as shap's
    `KernelExplainer` without its L1 feature selection (``l1_reg=False``).

    It estimates baseline (interventional) Shapley values: absent groups take the baseline (or, with a `Background`,
    are averaged over the background samples, as shap's background data), not values conditioned on the present ones.

    Coalitions: shap's scheme (`kernel_coalitions`): whole subset sizes enumerated from the smallest while the budget
    allows, the rest drawn, each draw paired with its complement (antithetic). Efficiency is exact: the empty and full
    coalitions are not regressed but imposed, $\sum_i \phi_i = f(x) - v(\emptyset)$, by eliminating one variable as
    shap does (captum's `KernelShap` approximates it with a weight of 1e6 on those two coalitions). The regression is
    solved in float64 in torch, one solve for all N x K outputs. With ``n_samples >= 2^M - 2`` every coalition is
    enumerated and the result is the exact Shapley values; it then equals shap's ``KernelExplainer(...,
    l1_reg=False)`` and `ShapleyValues` to float rounding.

    Varying groups (shap's ``varying_groups``, on by default): a group whose elements all equal the baseline's (with a
    `Background`: that element of every background row) changes no built input, so its Shapley value is exactly 0;
    it gets 0 and is left out of the regression, whose coalitions, kernel weights, enumeration of whole sizes and
    efficiency elimination are then over the M' groups that vary (M' per input; inputs that share their varying set
    share coalitions and one solve, and every set's coalitions are drawn from the generator's state at the call's
    start, so an input gets the same result in a batch as alone). With M' = 1 that group gets the whole gap f(x) -
    v(empty), with M' = 0 every group gets 0, as in shap. The budget then goes further: with ``n_samples >= 2^M' -
    2`` the result is exact. Equality is exact here (shap's ``np.allclose`` also skips groups within its
    tolerance). ``varying_only=False`` regresses over all M groups for every input (one coalition set for the
    batch).

    Args:
        n_samples: coalitions per input (besides the empty one), at most 2^M' - 2 are used; None: shap's default
            2 M' + 2048. Must exceed M (the regression's M - 1 unknowns need more coalitions than groups).
        paired: draw each random coalition with its complement (shap does).
        varying_only: skip the groups that do not vary, as shap does (which groups vary, an (N, M) bool, is read
            before the forward passes in the call's one wait, with the finite checks); False: every group is
            regressed.
        others: `CoalitionAttribution`.

    Cost: (n_samples + 1) x N (x B) rows forward, plus N (fewer where inputs have fewer varying groups).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        n_samples: int | None = None,
        paired: bool = True,
        varying_only: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(model, **options)
        self.n_samples = int_option(
            "n_samples", n_samples, "None (2 M + 2048) or an int >= 2", minimum=2, optional=True
        )
        self.paired = bool_option("paired", paired)
        self.varying_only = bool_option("varying_only", varying_only)

    def _budget(self, m: int) -> int:
        return 2 * m + 2048 if self.n_samples is None else self.n_samples

    def _check_groups(self, m: int) -> None:
        budget = self._budget(m)
        if m > 1 and budget <= m and budget < 2**m - 2:
            raise ValueError(
                f"KernelShap needs more coalitions than groups: n_samples={budget} for M = {m} groups; give "
                f"n_samples > {m} (shap's default is 2 M + 2048 = {2 * m + 2048})"
            )

    def _varying(self, xs: tuple[Tensor, ...], masks: tuple[Tensor, ...], m: int, ref: Reference) -> Tensor | None:
        return varying_groups(xs, masks, m, ref) if self.varying_only else None

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        m, n, dev = engine.m, engine.n, engine.device
        empty = engine.values(torch.zeros(1, m, dtype=torch.bool), "empty")[0]  # (N, K)
        total = clean - empty  # (N, K)
        varying = engine.varying if engine.varying is not None else torch.ones(n, m, dtype=torch.bool)
        # the inputs grouped by their set of varying groups: each set its own coalitions over its groups alone, all
        # evaluated by the same forward passes (`Coalitions.blocks`), then one regression per set for all its
        # inputs and targets. The Python loops below go over the distinct sets (one when every group varies, as on
        # images against a baseline), not over the inputs: each set has its own number of unknowns, its own
        # enumeration of whole sizes and kernel weights, so its own design matrix and solve.
        sets, which = torch.unique(varying, dim=0, return_inverse=True)
        order = torch.full((sets.shape[0],), n).scatter_reduce(0, which, torch.arange(n), "amin").argsort()
        phi = torch.zeros(n, *total.shape[1:], m, dtype=torch.float64, device=dev)  # (N, K, M)
        start = generator.get_state()
        after = start  # the generator's state after the call: the largest set's draw (the draw of every group)
        work = []
        for k in order.tolist():
            groups = sets[k].nonzero()[:, 0]
            inputs = (which == k).nonzero()[:, 0]
            inputs_d, groups_d = to_device(inputs, dev), to_device(groups, dev)
            if groups.numel() == 1:  # one group varies: it has the whole gap, as in shap
                put(phi, inputs_d, groups_d, total[inputs_d].unsqueeze(-1))
            if groups.numel() < 2:
                continue
            # every set draws from the generator's state at the call's start, so that an input gets the coalitions
            # it would get alone (a batch equals its single calls)
            draws = torch.Generator().set_state(start)
            zv, w = kernel_coalitions(groups.numel(), self._budget(groups.numel()), draws, self.paired)
            if groups.numel() == sets.sum(1).max():
                after = draws.get_state()
            z = torch.zeros(zv.shape[0], m, dtype=torch.bool)
            z[:, groups] = zv  # the groups that do not vary stay at the baseline: they change nothing
            work.append((z, zv, w, inputs, inputs_d, groups_d))
        generator.set_state(after)
        values = engine.blocks([(z, inputs) for z, _, _, inputs, _, _ in work], "coalitions")  # (S_b, n_b, K)
        for (_, zv, w, _, inputs_d, groups_d), v in zip(work, values, strict=True):
            y = (v - empty[inputs_d]).flatten(1)
            sol = eliminated_regression(zv.double(), w, y, total[inputs_d].flatten())  # (M_b, n_b K)
            put(phi, inputs_d, groups_d, sol.T.reshape(inputs_d.shape[0], total.shape[1], -1))
        return phi
