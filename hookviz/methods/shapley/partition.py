"""PartitionShap: Owen values over a binary hierarchy of feature groups (shap's PartitionExplainer)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch
from torch import Tensor, nn

from ..._checks import int_option
from ..._device import to_device
from ..base import register
from .coalitions import CoalitionAttribution, Coalitions, full_and_empty
from .groups import Tree, check_tree, hierarchy, layouts, leaves_of


def _nodes(tree: Tree, m: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The tree as arrays: (nodes, M) leaf sets, left and right child ids (-1 at leaves), leaf group ids (-1 inside);
    node 0 is the root."""
    sets: list[list[int]] = []
    left: list[int] = []
    right: list[int] = []
    leaf: list[int] = []

    def add(t: Tree) -> int:
        k = len(sets)
        sets.append(leaves_of(t))
        left.append(-1)
        right.append(-1)
        leaf.append(t if isinstance(t, int) else -1)
        if not isinstance(t, int):
            left[k] = add(t[0])
            right[k] = add(t[1])
        return k

    add(tree)
    members = torch.zeros(len(sets), m, dtype=torch.bool)
    for k, s in enumerate(sets):
        members[k, s] = True
    return members, torch.tensor(left), torch.tensor(right), torch.tensor(leaf)


def owen_evaluations(tree: Tree) -> int:
    """Coalitions the exact Owen values take: 2 (empty, full) + 2 per internal node per context, a node at depth d
    having 2^d contexts."""

    def walk(t: Tree, depth: int) -> int:
        return 0 if isinstance(t, int) else 2 * 2**depth + walk(t[0], depth + 1) + walk(t[1], depth + 1)

    return 2 + walk(tree, 0)


@register("partition-shap")
class PartitionShap(CoalitionAttribution):
    r"""Owen values (Owen, 1977, "Values of games with a priori unions") over a binary hierarchy of the feature
    groups, computed as shap's `PartitionExplainer` does: from the root, each node's credit $v(C \cup N) - v(C)$ in its
    context C is split between its two children L, R by their Shapley values in the two-player game, each child taking
    half of its gain with the sibling absent (context C) and half with it present (C with the sibling), recursively,
    down to the groups.

    Efficiency holds exactly at every step: $\sum_i \phi_i = v(G) - v(\emptyset)$ = f(x) - f(b). With budget for the
    whole tree (`owen_evaluations`: 2 + 2 per internal node per context, about M^2 for a balanced tree) the result is
    the exact Owen value; Owen values equal Shapley values for additive models and for M = 2. With less budget the
    levels are expanded breadth first, and where a level does not fit, the nodes of largest credit times weight (shap's
    priority, here the largest over the inputs and targets that share the hierarchy, so the choice is shared by
    them) are expanded and the others' credit is spread evenly over their groups.

    Hierarchy: `hierarchy` (nested tuples of group ids, e.g. ``((0, 1), (2, (3, 4)))``; nodes of more than two
    children are split in halves), one for the whole batch; or by default `hookviz.methods.shapley.groups.hierarchy`
    per input: the groups present in the input's mask split in halves at the median of their centroids along the
    widest axis, recursively (spatial halves for image patches and superpixels, contiguous halves for tabular columns
    and tokens). Inputs whose masks are equal (a mask shared by the batch: all of them) share one hierarchy and one
    traversal; per-input masks that differ (superpixels of each image) get a hierarchy and a traversal each
    (`groups.layouts`), the traversals advancing together so that each level's coalitions of all of them are scored
    by the same forward passes. An input then gets the same values in a batch as alone. The hierarchies are built
    from the masks on the host: no value is read from the device.

    Args:
        max_evals: coalitions per input at most (shap's default 500); None: the whole tree (exact Owen values).
        hierarchy: an explicit binary hierarchy, or None.
        others: `CoalitionAttribution`.
    """

    def __init__(self, model: nn.Module, *, max_evals: int | None = 500, hierarchy: Any = None, **options: Any) -> None:
        super().__init__(model, **options)
        self.max_evals = int_option(
            "max_evals", max_evals, "None (the whole tree) or an int >= 2", minimum=2, optional=True
        )
        self.hierarchy = hierarchy

    def _trees(self, engine: Coalitions) -> list[tuple[Tree, Tensor]]:
        """The hierarchies of a call and the (host) indices of the inputs each serves: the explicit one for all, or
        by default one per layout of the groups (`layouts`: inputs with equal masks share one), built from it."""
        if self.hierarchy is not None:
            return [(check_tree(self.hierarchy, engine.m), torch.arange(engine.n))]
        return [
            (hierarchy(engine.mask_tensors, engine.m, int(rows[0])), rows)
            for rows in layouts(engine.mask_tensors, engine.n)
        ]

    def _check_groups(self, m: int) -> None:
        if self.hierarchy is not None:
            check_tree(self.hierarchy, m)

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        # One traversal per hierarchy (`_walk`), over the inputs that share it; the traversals advance level by level
        # together and each level's coalitions of all of them are scored by the same forward passes
        # (`Coalitions.blocks`). The loops below go over the hierarchies (one unless the masks are per input and
        # differ), each with its own tree, so its own contexts and nodes: their bookkeeping is on the host, the
        # values stay on the device.
        m, dev = engine.m, engine.device
        ends = engine.values(full_and_empty(m), "full and empty")  # (2, N, K)
        phi = torch.zeros(m, *ends.shape[1:], dtype=torch.float64, device=dev)
        walks, rows = [], []
        for tree, inputs in self._trees(engine):
            rows_d = to_device(inputs, dev)
            walks.append(self._walk(tree, m, dev, ends[:, rows_d]))
            rows.append((inputs, rows_d))
        asked: dict[int, Tensor] = {}  # the coalitions each unfinished traversal asks for next

        def advance(k: int, values: Tensor | None) -> None:
            try:
                asked[k] = next(walks[k]) if values is None else walks[k].send(values)
            except StopIteration as done:  # finished: its Owen values
                phi.index_copy_(1, rows[k][1], done.value)
                asked.pop(k, None)

        for k in range(len(walks)):
            advance(k, None)
        while asked:
            keys = list(asked)
            values = engine.blocks([(asked[k], rows[k][0]) for k in keys], "hierarchy")
            for k, v in zip(keys, values, strict=True):
                advance(k, v)
        return phi.permute(1, 2, 0)

    def _walk(self, tree: Tree, m: int, dev: torch.device, ends: Tensor) -> Generator[Tensor, Tensor, Tensor]:
        """The Owen values (M, n, K) of the n inputs that share `tree`, whose v(full) and v(empty) are `ends`
        (2, n, K): a generator that yields each level's coalitions (host, or device once the budget cuts) and is
        sent their values (S, n, K).

        No value is read on the host, budget or not. The traversal follows the tree alone (contexts, nodes, weights
        and which of them are leaves, all on the host, their indices copied without a wait) until the budget cuts a
        level: how many nodes fit is known from the counts alone, which ones (the largest credit over these inputs
        and targets) is chosen on the device by argsort, and after the cut there is one step left, in which every
        node, leaf or not, has its credit spread evenly over its groups (a leaf's all to its group), with no choice
        to make."""
        tables = _nodes(tree, m)  # members, left, right, leaf: on the host while the traversal is structural
        members_d = to_device(tables[0], dev)
        budget = (2**62 if self.max_evals is None else self.max_evals) - 2
        phi = torch.zeros(m, *ends.shape[1:], dtype=torch.float64, device=dev)
        ctx = torch.zeros(1, m, dtype=torch.bool)
        node = torch.zeros(1, dtype=torch.long)
        weight = 1.0  # every node of a level has the same weight, 2^-depth
        f00, f11 = ends[1:2], ends[0:1]  # (F, n, K)
        cut = False  # whether the budget has cut a level (ctx and node then on the device, chosen by the values)
        while node.numel():
            credit = (f11 - f00) * weight  # (F, n, K)
            if cut:  # the last step: each node's credit spread evenly over its groups
                share = members_d[node].double()
                phi += torch.einsum("fm,fnk->mnk", share / share.sum(1, keepdim=True), credit)
                break
            members, left, right, leaf = tables
            at_leaf = leaf[node] >= 0  # on the host: the tree's structure
            leaves = to_device(at_leaf.nonzero()[:, 0], dev)
            phi.index_add_(0, to_device(leaf[node][at_leaf], dev), credit.index_select(0, leaves))
            inner = (~at_leaf).nonzero()[:, 0]
            ctx, node = ctx[inner], node[inner]
            inner_d = to_device(inner, dev)
            f00, f11, credit = (t.index_select(0, inner_d) for t in (f00, f11, credit))
            if not node.numel():
                break
            fit = min(node.numel(), max(budget, 0) // 2)
            if fit < node.numel():  # shap's priority: the largest credit first; the rest spread evenly
                order = credit.abs().flatten(1).max(1).values.argsort(descending=True)  # on the device
                rest = order[fit:]
                node_d = to_device(node, dev)
                share = members_d[node_d[rest]].double()
                share = share / share.sum(1, keepdim=True)
                phi += torch.einsum("fm,fnk->mnk", share, credit[rest])
                if not fit:
                    break
                keep = order[:fit]
                ctx, node = to_device(ctx, dev)[keep], node_d[keep]
                f00, f11 = f00[keep], f11[keep]
                members, left, right = members_d, to_device(left, dev), to_device(right, dev)  # node on the device
                cut = True
            budget -= 2 * fit
            lo, hi = left[node], right[node]
            m10 = ctx | members[lo]
            m01 = ctx | members[hi]
            v = yield torch.cat([m10, m01])  # host coalitions: copied without a wait
            f10, f01 = v[:fit], v[fit:]
            weight /= 2
            # each child: half its gain with the sibling absent, half with it present (the two-player Shapley value)
            ctx = torch.cat([ctx, ctx, m01, m10])
            node = torch.cat([lo, hi, lo, hi])
            f00, f11 = torch.cat([f00, f00, f01, f10]), torch.cat([f10, f01, f11, f11])
        return phi
