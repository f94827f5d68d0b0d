r"""The output layer's backward pass over the rows and columns its gradient reaches.

A language model's head maps every position's hidden state to V logits, (T, H) -> (T, V); a target at one position
and one token (the next token's logit: what `explain_generation` explains at every step) gives that layer a
gradient that is zero outside one row and one column. Plain autograd still forms the whole ``g W``, T x V x H
multiply-adds (on a 6-layer LLaMA of hidden 768 with a 32,000-token vocabulary at 128 tokens, 65 ms of a 390 ms
AttnLRP call on one CPU thread). In gradient-times-input form the layer's rule is its gradient, so the product
is taken over the rows and columns of g that hold a non-zero value: the same sums without their zero terms,
equal to the full product to float rounding (exactly where one column is non-zero). A NaN counts as non-zero;
an infinite weight met by a zero gradient gives 0 here where the full product gives NaN.

With LRP-epsilon's stabilizer (`stabilized_rows`) the factor z / stab(z) is needed where g is non-zero only: z is
computed again there from the layer's input (on the CPU over the reached rows and columns; elsewhere whole, one
product as large as the backward's own), not kept: the logits, (T, V) per input, are the largest tensor of a language
model's pass. The relevance form takes the same product for the output layer's rule (`rules.Affine.rows`).
On the CPU only: finding the rows reads g once (0.4 ms for 128 x 32,000), where on an accelerator the index of the
rows would wait for the device."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .audit import AuditEntry


def output_layer(model: nn.Module) -> nn.Linear | None:
    """The layer whose gradient a target at one output reaches sparsely: the output embeddings a model declares
    (Hugging Face's ``get_output_embeddings()``), else None."""
    get = getattr(model, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    return layer if type(layer) is nn.Linear else None


def rows_reached(h: Tensor, layer: nn.Linear, y: Tensor) -> Tensor:
    """`y` (= ``layer(h)``, as computed) whose backward pass to `h` is `product`. h: (..., H); y: (..., V)."""
    return _OutputRows.apply(h, (y,), layer.weight)


class _OutputRows(torch.autograd.Function):
    """Output: the layer's output (boxed, not an input); backward: ``g W`` over g's non-zero rows and columns."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, ybox: tuple[Tensor], weight: Tensor) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.shape = h.shape
        return ybox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        (weight,) = ctx.saved_tensors
        return product(g, weight.detach().to(g.dtype)).view(ctx.shape), None, None


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
        from .stabilizer import factor  # `rules` imports this module, and `stabilizer` imports `rules`

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


def reached(g2: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The rows of 2-D `g2` that hold a non-zero value, and the columns among those rows (CPU only: elsewhere
    (None, None), the whole product, since the index would wait for the device)."""
    if g2.device.type != "cpu" or g2.numel() == 0:
        return None, None
    rows = _nonzero(g2, 1)
    return rows, _nonzero(g2.index_select(0, rows), 0)


def product(g: Tensor, w: Tensor) -> Tensor:
    """``g @ w`` over the rows and columns of `g` that hold a non-zero value (see the module docstring); the plain
    product off the CPU or where most rows and columns hold one. g: (..., V); w: (V, H); returns (..., H)."""
    g2 = g.reshape(-1, g.shape[-1])
    if g2.device.type != "cpu" or g2.numel() == 0:
        return g @ w
    rows = _nonzero(g2, 1)
    if rows.numel() == 0:
        return g2.new_zeros(*g.shape[:-1], w.shape[1])
    all_rows = rows.numel() > g2.shape[0] // 2  # most rows reached: all of them taken
    part = g2 if all_rows else g2.index_select(0, rows)
    cols = _nonzero(part, 0)
    if cols.numel() <= part.shape[1] // 2:
        part, w = part.index_select(1, cols), w.index_select(0, cols)
    elif all_rows:
        return g @ w
    if all_rows:
        return (part @ w).view(*g.shape[:-1], w.shape[1])
    out = g2.new_zeros(g2.shape[0], w.shape[1])
    out.index_copy_(0, rows, part @ w)
    return out.view(*g.shape[:-1], w.shape[1])


def _nonzero(t: Tensor, dim: int) -> Tensor:
    """Indices along the other axis of 2-D `t` whose slice holds a non-zero value (NaN included): one pass for the
    least and the largest value of each."""
    lo, hi = torch.aminmax(t, dim=dim)
    return ((lo != 0) | (hi != 0)).nonzero().squeeze(1)  # NaN != 0
