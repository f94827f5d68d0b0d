"""`InputReach`: whether a tensor in an LRP forward pass depends on the explained input, read from the autograd
graph, not from ``requires_grad``: a parameter is a constant to the rules whether or not the user trains it (a
frozen position embedding and a trainable one get the same relevance)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


class InputReach:
    """Memoised reachability from autograd nodes to the explained input (a leaf that is not an `nn.Parameter`).

    Per forward pass: `clear` drops the memo (nodes are not reused across passes)."""

    def __init__(self) -> None:
        self._reaches: dict[Any, bool] = {}  # autograd node -> whether it reaches an input (not a parameter)

    def clear(self) -> None:
        self._reaches.clear()

    def depends(self, t: object) -> bool:
        """Whether `t` depends on the explained input, not only on parameters and constants. A tensor that needs no
        gradient does not (the input is a leaf that needs one); a parameter never does, trainable or frozen."""
        if not isinstance(t, Tensor) or not t.requires_grad:
            return False
        if t.grad_fn is None:
            return not isinstance(t, nn.Parameter)
        return self._node_reaches(t.grad_fn)

    def _node_reaches(self, root: Any) -> bool:
        memo = self._reaches
        if root in memo:
            return memo[root]
        stack, seen, found = [root], [], False
        visited = {root}
        while stack and not found:
            node = stack.pop()
            seen.append(node)
            for nxt, _ in getattr(node, "next_functions", ()):
                if nxt is None or nxt in visited:
                    continue
                known = memo.get(nxt)
                if known is True:
                    found = True
                    break
                if known is False:
                    continue
                var = getattr(nxt, "variable", None)
                if var is not None:  # AccumulateGrad: a leaf
                    if not isinstance(var, nn.Parameter):
                        found = True
                        break
                    continue
                visited.add(nxt)
                stack.append(nxt)
        if found:
            memo[root] = True
        else:  # a full search: nothing below any visited node reaches an input
            for node in seen:
                memo[node] = False
        return found
