r"""The output layer's backward pass over the rows and columns its gradient reaches.

A language model's head maps every position's hidden state to V logits, (T, H) -> (T, V); a target at one position
and one token (the next token's logit: what `explain_generation` explains at every step) gives that layer a
gradient that is zero outside one row and one column. Plain autograd still forms the whole ``g W``, T x V x H
multiply-adds (on a 6-layer LLaMA of hidden 768 with a 32,000-token vocabulary at 128 tokens, 65 ms of a 390 ms
AttnLRP call on one CPU thread). In gradient-times-input form the layer's rule is its gradient, so the product
is taken over the rows and columns of g that hold a non-zero value: the same sums without their zero terms,
equal to the full product to float rounding (exactly where one column is non-zero). A NaN counts as non-zero;
an infinite weight met by a zero gradient gives 0 here where the full product gives NaN.

LRP-epsilon's stabilizer on this layer takes the same rows and columns (`stabilized_rows`); a rule that takes
the layer's vector-Jacobian product itself takes the same product (`rules.Affine.rows`: the relevance form, a test
reference in tests/lrp_relevance_form/).
On the CPU only: finding the rows reads g once (0.4 ms for 128 x 32,000), where on an accelerator the index of the
rows would wait for the device."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


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
