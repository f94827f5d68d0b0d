"""`InputReach`: whether a tensor in a rule engine's forward pass depends on the explained input, read from the
autograd graph, not from ``requires_grad``: a parameter is a constant to the rules whether or not the user trains it
(LRP gives a frozen position embedding and a trainable one the same relevance; DeepLift does not report an
operation on weights alone, such as a weight standardisation, as one without a rule)."""

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
        known = memo.get(root)
        if known is not None:
            return known
        # depth first with the path on a stack: when an input leaf is found, every node on the path reaches it; a node
        # whose search ends without finding one does not. So each node of the pass is searched once, whichever
        # tensor asks (memoising the root only, later questions walked the same nodes again).
        path, branches = [root], [iter(getattr(root, "next_functions", ()))]
        while path:
            for nxt, _ in branches[-1]:
                if nxt is None:
                    continue
                known = memo.get(nxt)
                if known is None:
                    var = getattr(nxt, "variable", None)
                    if var is not None:  # AccumulateGrad: a leaf, an input unless it is a parameter
                        known = memo[nxt] = not isinstance(var, nn.Parameter)
                if known is True:
                    for node in path:
                        memo[node] = True
                    return True
                if known is None:
                    path.append(nxt)
                    branches.append(iter(getattr(nxt, "next_functions", ())))
                    break
            else:  # every branch searched: nothing below reaches an input
                memo[path.pop()] = False
                branches.pop()
        return False
