r"""DeepLift through products of two activations: the exact two-factor split.

For a bilinear operation f (an elementwise product, a matrix product) of two activations a and b, whose rows
differ from their reference rows by $$ \Delta a = a - a' $$ and $$ \Delta b = b - b' $$,

$$ f(a, b) - f(a', b') = f(\tfrac{a + a'}{2}, \Delta b) + f(\Delta a, \tfrac{b + b'}{2}) $$

exactly: the two-player Shapley value of the two factors (the same split as AttnLRP's uniform rule on products).
So the multiplier of a is the gradient of f with its partner held at the midpoint of its row and reference row, and
summation-to-delta holds through squeeze-and-excitation gates (``x * sigmoid(s(x))``), gated MLPs (``silu(g(x)) *
u(x)``), ``x * sigmoid(x)`` written out and attention's ``q @ k.T`` and ``p @ v`` (as matrix products or two-operand
einsums).

A quotient ``a / b`` is ``a * (1 / b)``, and the reciprocal's secant slope is exactly
$$ (1/b - 1/b') / (b - b') = -1 / (b b') $$ (the derivative where b = b'): one closed form, no threshold.

A product whose second factor takes the same value at every row (a weight, a constant, a layer scale) is linear in
the other: its gradient is already exact and the call is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..rules import Call, Rule
from .rows import has_rows, midpoint, per_half

MUL_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.mul: "torch.mul",
    torch.multiply: "torch.multiply",
    Tensor.mul: "*",
    Tensor.multiply: "Tensor.multiply",
    Tensor.__mul__: "*",
    Tensor.__rmul__: "*",
    Tensor.mul_: "*=",
    Tensor.__imul__: "*=",
}
DIV_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.div: "torch.div",
    torch.divide: "torch.divide",
    torch.true_divide: "torch.true_divide",
    Tensor.div: "/",
    Tensor.divide: "Tensor.divide",
    Tensor.true_divide: "Tensor.true_divide",
    Tensor.__truediv__: "/",
    Tensor.__rtruediv__: "/",
    Tensor.__rdiv__: "/",
    Tensor.div_: "/=",
    Tensor.__itruediv__: "/=",
}
EINSUM_FUNCTIONS: dict[Callable[..., Any], str] = {torch.einsum: "torch.einsum"}
ADDCMUL_FUNCTIONS: dict[Callable[..., Any], str] = {torch.addcmul: "torch.addcmul", Tensor.addcmul: "Tensor.addcmul"}
_REVERSED = {Tensor.__rmul__, Tensor.__rmatmul__, Tensor.__rtruediv__, Tensor.__rdiv__}  # (self, other) = other op self
_INPLACE = {Tensor.mul_, Tensor.__imul__, Tensor.div_, Tensor.__itruediv__}


def _compute(kind: str, a: Tensor | float, b: Tensor) -> Tensor:
    if kind == "mul":
        return a * b
    if kind == "div":
        return a / b
    return torch.matmul(a, b)  # type: ignore[arg-type]


class _SplitFn(torch.autograd.Function):
    """Output: ``a * b``, ``a @ b`` or ``a / b``; backward: the two-factor split (each factor's gradient with its
    partner at the midpoint of row and reference row; a quotient's divisor through ``-1 / (b b')``)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor | float, b: Tensor, kind: str, rows_a: bool, rows_b: bool) -> Tensor:
        ctx.kind = kind
        ctx.shapes = (a.shape if isinstance(a, Tensor) else None, b.shape)
        ctx.wants = (isinstance(a, Tensor) and a.requires_grad, b.requires_grad)
        ma = midpoint(a) if rows_a else (a.detach() if isinstance(a, Tensor) else a)
        if kind == "scale":  # a * b, b a scale: a's multiplier the smaller scale, b's the other row's a (`scaled`)
            a1, a2 = a.detach().chunk(2)
            b1, b2 = b.detach().chunk(2)
            first = b1.abs() <= b2.abs()  # the row's scale is the smaller: b changes first, at the reference's a
            ctx.kind = "mul"
            ctx.ma, ctx.mb = torch.where(first, a2, a1), torch.where(first, b1, b2)
            return a * b
        if kind == "div":
            b1, b2 = b.detach().chunk(2) if rows_b else (b.detach(), b.detach())
            mb = (b1.reciprocal() + b2.reciprocal()) * 0.5  # the midpoint of 1/b: a's multiplier
            slope = -(b1 * b2).reciprocal()  # the reciprocal's secant slope, exact
            ctx.extra = slope
        else:
            mb = midpoint(b) if rows_b else b.detach()
        ctx.ma, ctx.mb = ma, mb
        return _compute(kind, a, b)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        kind, (shape_a, shape_b), (want_a, want_b) = ctx.kind, ctx.shapes, ctx.wants
        ma, mb = ctx.ma, ctx.mb
        gh = per_half(g)  # (2, n, ...): one midpoint applies to both halves
        ga = gb = None
        if kind == "matmul":
            if want_a:
                ga = gh @ mb.transpose(-2, -1)
            if want_b:
                gb = ma.transpose(-2, -1) @ gh
        else:
            if want_a:
                ga = gh * mb
            if want_b:
                gb = gh * ma if kind == "mul" else gh * ma * ctx.extra
        return _fit(ga, shape_a), _fit(gb, shape_b), None, None, None


def _fit(grad: Tensor | None, shape: torch.Size | None) -> Tensor | None:
    """A (2, n, ...) gradient as the operand's (2n, ...), summed over the axes it was broadcast along."""
    if grad is None or shape is None:
        return None
    grad = grad.flatten(0, 1)
    return grad if grad.shape == shape else grad.sum_to_size(shape)


def scaled(a: Tensor, b: Tensor) -> Tensor:
    r"""``a * b`` of two activations where b is a scale (a normalisation's ``1 / std``), with an exact split that
    never multiplies a difference by the larger of the two rows' scales. Of the two orders in which the factors can
    change, $$ \Delta(ab) = \Delta a \, b' + a \, \Delta b = a' \Delta b + \Delta a \, b $$, the one is taken
    whose multiplier of a is the smaller scale: a's multiplier is ``min(|b|, |b'|)``'s b, and b's is a at the row with
    the larger scale. Both orders are exact; the symmetric (Shapley) split averages them, and where one row's scale is
    orders of magnitude above the other's (a zero baseline makes a normalised vector constant: ``1 / sqrt(eps)``),
    its two halves are each that much larger than the product and cancel at the input, leaving maps of huge
    opposite values and losing the sum to rounding. Both factors must carry the rows."""
    return _SplitFn.apply(a, b, "scale", True, True)


def split(kind: str, a: Tensor, b: Tensor) -> Tensor:
    """``a * b`` ("mul"), ``a @ b`` ("matmul") or ``a / b`` ("div") of two activations with the two-factor split
    as its backward (for operations written out: `decomposed`); the plain operation where a factor has no rows."""
    shape = _output_shape(kind, a, b)
    rows_a, rows_b = shape is not None and has_rows(a, shape), shape is not None and has_rows(b, shape)
    if rows_b and (rows_a or kind == "div"):
        return _SplitFn.apply(a, b, kind, rows_a, rows_b)
    return _compute(kind, a, b)


def _operands(call: Call) -> tuple[Any, Any] | None:
    args = call.args
    if len(args) != 2 or any(k not in ("input", "other") for k in call.kwargs):
        if len(args) == 1 and set(call.kwargs) == {"other"}:
            args = (args[0], call.kwargs["other"])
        else:
            return None  # out=, rounding_mode=, or an unusual spelling: left as it is (and reported)
    a, b = args
    return (b, a) if call.op in _REVERSED else (a, b)


def _output_shape(kind: str, a: Any, b: Tensor) -> tuple[int, ...] | None:
    """The output's shape (None: a matrix product this rule leaves alone: 2-D operands are a weight's product)."""
    if kind != "matmul":
        return tuple(torch.broadcast_shapes(a.shape if isinstance(a, Tensor) else (), b.shape))
    if a.dim() < 3 or b.dim() < 3:
        return None
    return (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])


def _rule(kind: str) -> Callable[[Call], Any]:
    def apply(call: Call) -> Any:
        operands = _operands(call)
        if operands is None:
            return NotImplemented
        a, b = operands
        if not isinstance(b, Tensor) or not (isinstance(a, Tensor) or kind == "div"):
            return NotImplemented  # a product with a number: linear
        try:
            shape = _output_shape(kind, a, b)
        except RuntimeError:
            return NotImplemented  # shapes that do not broadcast: the call raises its own error as called
        if shape is None:
            return NotImplemented
        rows_a, rows_b = has_rows(a, shape), has_rows(b, shape)
        if not rows_b or not (rows_a or kind == "div"):
            return NotImplemented  # a factor (or divisor) the same at every row: linear in the other
        out = _SplitFn.apply(a, b, kind, rows_a, rows_b)
        return call.args[0].copy_(out) if call.op in _INPLACE else out

    return apply


def _addcmul(call: Call) -> Any:
    """``input + value * t1 * t2``: the split on ``t1 * t2`` where both carry the rows (else linear: as called)."""
    names = ("input", "tensor1", "tensor2")
    a = dict(zip(names, call.args, strict=False)) | call.kwargs
    t1, t2, value = a.get("tensor1"), a.get("tensor2"), a.get("value", 1)
    if not (isinstance(t1, Tensor) and isinstance(t2, Tensor)) or set(a) - {*names, "value"}:
        return NotImplemented
    try:
        shape = tuple(torch.broadcast_shapes(t1.shape, t2.shape))
    except RuntimeError:
        return NotImplemented
    if not (has_rows(t1, shape) and has_rows(t2, shape)):
        return NotImplemented
    product = _SplitFn.apply(t1, t2, "mul", True, True)
    return a["input"] + (product if value == 1 else value * product)


class _BilinearFn(torch.autograd.Function):
    """Output: ``fn(a, b)`` for a bilinear `fn` (a two-operand einsum); backward: the two-factor split, each
    operand's gradient with its partner at the midpoint of row and reference row (taken through autograd: `fn`'s
    vector-Jacobian product in one operand does not depend on that operand's value)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, fn: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        ctx.fn = fn
        ctx.save_for_backward(midpoint(a), midpoint(b))
        ctx.shapes = (a.shape, b.shape)
        return fn(a, b)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor, None]:
        ma, mb = (m.repeat(2, *(1,) * (m.dim() - 1)) for m in ctx.saved_tensors)
        with torch.enable_grad():
            a = torch.zeros(ctx.shapes[0], dtype=ma.dtype, device=ma.device, requires_grad=True)
            b = torch.zeros(ctx.shapes[1], dtype=mb.dtype, device=mb.device, requires_grad=True)
            (ga,) = torch.autograd.grad(ctx.fn(a, mb), a, g)
            (gb,) = torch.autograd.grad(ctx.fn(ma, b), b, g)
        return ga, gb, None


def _einsum(call: Call) -> Any:
    """A two-operand einsum whose operands and output all start with the rows' subscript (``"bhqd,bhkd->bhqk"``):
    bilinear, the two-factor split; anything else as called (reported where two activations meet)."""
    args = call.args
    if not args or not isinstance(args[0], str) or call.kwargs:
        return NotImplemented
    operands = tuple(args[1] if len(args) == 2 and isinstance(args[1], list | tuple) else args[1:])
    equation = args[0].replace(" ", "")
    if len(operands) != 2 or "->" not in equation or "..." in equation:
        return NotImplemented
    a, b = operands
    (left, right), out = equation.split("->")[0].split(","), equation.split("->")[1]
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or not (left and right and out):
        return NotImplemented
    rows = left[0] == right[0] == out[0] and a.shape[0] == b.shape[0] and a.shape[0] % 2 == 0
    if not rows or not (a.requires_grad and b.requires_grad):
        return NotImplemented
    return _BilinearFn.apply(a, b, lambda x, y: torch.einsum(equation, x, y))


PRODUCT = Rule("product", _rule("mul"), owns_call=True)
EINSUM = Rule("product", _einsum, owns_call=True)
MATRIX_PRODUCT = Rule("product", _rule("matmul"), owns_call=True)
QUOTIENT = Rule("quotient", _rule("div"), owns_call=True)
ADDCMUL = Rule("product", _addcmul, owns_call=True)
