r"""The rules with modified weights in gradient-times-input form: z+, alpha-beta, gamma, z^B, flat, w² on a layer.

One autograd Function per layer call (`LayerRuleFn`), placed on the layer's output during the forward pass: it keeps
the input x and the output y (aliases: an in-place change downstream is noticed and y computed again from x) and its
backward is the rule (`rules.LinearRule.gradient`): from the gradient g at y (relevance ``y * g``) to the gradient at
x (relevance ``x * gradient``), the modified terms computed from x there; nothing runs a layer twice in the forward
pass. The audit's sums come from the same backward pass.

The rules whose input relevance is not a multiple of x (flat, w², z^B: they spread relevance over the inputs
whatever their values; `LinearRule.proportional` False) give their relevance R_x; the gradient passed on is
``R_x / x`` (0 where x is 0: relevance that a zero activation cannot carry in this form). On the explained input
itself (a first layer on the pixels) R_x goes to a `sink` instead, a zero tensor shaped like the input whose
gradient `LRP` adds to the input times its gradient: the map keeps every pixel's relevance, a black pixel's too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .audit import AuditEntry
from .rules import Affine, LinearRule
from .stabilizer import per_input, per_input_sum


class LayerCall:
    """One layer call kept for its rule's backward pass: the audit entry, the rule, the layer (a BatchNorm folded
    in), the input and output (aliases, with their versions), whether the input relevance goes to the sink, the
    batch size; ``graph_x``: the input as the graph has it, while a BatchNorm after the layer may still be folded."""

    __slots__ = ("entry", "rule", "layer", "x", "xversion", "y", "yversion", "sink", "n", "graph_x")

    def __init__(self, entry: AuditEntry, rule: LinearRule, layer: Affine, x: Tensor, y: Tensor, n: int) -> None:
        self.entry, self.rule, self.layer, self.n = entry, rule, layer, n
        self.x, self.xversion = x.detach(), x._version
        self.y, self.yversion = y.detach(), y._version
        self.sink = False
        self.graph_x: Tensor | None = None

    def input(self) -> Tensor:
        if self.x._version != self.xversion:
            raise RuntimeError(
                f"LRP: the input of {self.entry.name!r} was modified in place after the layer read it, so its rule "
                "cannot be evaluated; make the in-place operation that follows it out of place"
            )
        return self.x

    def output(self, x: Tensor) -> Tensor:
        """y as the forward pass computed it: from x again where the model changed it in place (``out += identity``)."""
        if self.y._version == self.yversion:
            return self.y
        return self.layer.forward(x, self.layer.weight, self.layer.bias)


class LayerRuleFn(torch.autograd.Function):
    """Output: the layer's output y (boxed, ``(y,)``: handed on without a copy; `x` links the graph, `sink` where
    the input relevance goes to it); backward: the layer's rule in gradient-times-input form, and the audit."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, sink: Tensor | None, ybox: tuple[Tensor], call: LayerCall) -> Tensor:
        ctx.call = call
        return ybox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor | None, None, None]:
        call: LayerCall = ctx.call
        x = call.input()
        y = call.output(x)
        rule = call.rule
        if rule.proportional:
            gx = rule.gradient(call.layer, x, y, g)
            call.entry.add(per_input(y, g, call.n), per_input(x, gx, call.n))
            return gx, None, None, None
        r_in = rule.relevance(call.layer, x, None, y * g)
        call.entry.add(per_input(y, g, call.n), per_input_sum(r_in, call.n))
        if call.sink:  # the explained input: its relevance whole, beside the input times its gradient
            return torch.zeros_like(x), r_in, None, None
        return torch.where(x == 0, 0.0, r_in / x), None, None, None
