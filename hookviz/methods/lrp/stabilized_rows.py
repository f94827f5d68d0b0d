r"""LRP-epsilon on the output layer in gradient-times-input form, over the rows and columns its gradient reaches.

The factor z / stab(z) on the output layer's gradient (`stabilizer`) is needed where g is non-zero only: z is computed
again there from the layer's input (on the CPU over the reached rows and columns, `output_rows.reached`; elsewhere
whole, one product as large as the backward's own), not kept: the logits, (T, V) per input, are the largest tensor of
a language model's pass."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .audit import AuditEntry
from .output_rows import reached
from .stabilizer import factor


def stabilized_rows(h: Tensor, layer: nn.Linear, y: Tensor, epsilon: float, entry: AuditEntry, n: int) -> Tensor:
    """`y` (= ``layer(h)``) whose backward pass to `h` is LRP-epsilon: ``(g z / stab(z)) W`` over g's non-zero rows
    and columns, z computed again there (see the module docstring); the audit's sums into `entry` (n inputs)."""
    return _StabilizedRows.apply(h, (y,), layer, epsilon, entry, n)


class _StabilizedRows(torch.autograd.Function):
    """Output: the layer's output (boxed); backward: LRP-epsilon over g's non-zero rows and columns."""

    @staticmethod
    def forward(
        ctx: Any, h: Tensor, ybox: tuple[Tensor], layer: nn.Linear, epsilon: float, entry: AuditEntry, n: int
    ) -> Tensor:
        ctx.h, ctx.version = h.detach(), h._version
        ctx.weight = layer.weight.detach()
        ctx.bias = None if layer.bias is None else layer.bias.detach()
        ctx.epsilon, ctx.entry, ctx.n = epsilon, entry, n
        return ybox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None, None, None]:
        h = ctx.h
        if h._version != ctx.version:
            raise RuntimeError(
                "LRP: the input of the output layer was modified in place after the layer read it, so its rule cannot "
                "be evaluated; make the in-place operation that follows it out of place"
            )
        w = ctx.weight.to(g.dtype)
        b = None if ctx.bias is None else ctx.bias.to(g.dtype)
        g2, h2 = g.reshape(-1, g.shape[-1]), h.reshape(-1, h.shape[-1]).to(g.dtype)
        # each row's input, for the audit's sums per input: rows are (input, position) in order
        owner = torch.arange(g2.shape[0], device=g.device) // max(1, g2.shape[0] // ctx.n)
        rows, cols = reached(g2)
        gs = g2 if rows is None else g2.index_select(0, rows)
        hs = h2 if rows is None else h2.index_select(0, rows)
        ws = w if cols is None else w.index_select(0, cols)
        bs = b if b is None or cols is None else b.index_select(0, cols)
        gs = gs if cols is None else gs.index_select(1, cols)
        z = hs @ ws.t() if bs is None else torch.addmm(bs, hs, ws.t())
        gp = gs * factor(z, ctx.epsilon)
        who = owner if rows is None else owner.index_select(0, rows)
        left_of = z if bs is None else z - bs
        entered = z.new_zeros(ctx.n).index_add_(0, who, torch.linalg.vecdot(z, gs))
        left = z.new_zeros(ctx.n).index_add_(0, who, torch.linalg.vecdot(left_of, gp))
        ctx.entry.add(entered, left)
        part = gp @ ws
        if rows is None:
            return part.view(h.shape), None, None, None, None, None
        out = g2.new_zeros(g2.shape[0], w.shape[1])
        out.index_copy_(0, rows, part)
        return out.view(h.shape), None, None, None, None, None
