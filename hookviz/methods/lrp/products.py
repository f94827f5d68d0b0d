r"""The softmax and product rules of AttnLRP / CP-LRP as autograd Functions whose backward *is* the rule: softmax
$$ R_{s,i} = s_i (R_i - p_i \sum_j R_j) $$ (zero for held probabilities), the uniform rule on products of two
input-dependent tensors, and the sum rule on sums that broadcast (see `transformer` for the rules' definitions)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .rulecall import RuleCall, _audit
from .rules import stabilize


class _SoftmaxFn(torch.autograd.Function):
    """Output: softmax(s); backward: `Softmax` (zero for held probabilities)."""

    @staticmethod
    def forward(ctx: Any, s: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()  # computed for this call alone: no copy (changed in place later: recomputed)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None]:
        call = ctx.call
        (s,) = call.inputs()
        if call.rule.hold:
            r_in = torch.zeros_like(s)
        else:
            dim = call.extra
            p = call.output(lambda: torch.softmax(s.to(call.z.dtype), dim))
            logits = torch.where(torch.isfinite(s), s, torch.zeros((), dtype=s.dtype, device=s.device))
            r = r.to(p.dtype)
            r_in = (logits * (r - p * r.sum(dim, keepdim=True))).to(s.dtype)
        _audit(call, r, r_in)
        return r_in, None


def _product(kind: str, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """`kind`: "matmul", "mul", or "einsum:<equation>" (a two-operand einsum: bilinear in its operands)."""
    if kind.startswith("einsum:"):
        z = torch.einsum(kind[7:], a, b)
    else:
        z = torch.matmul(a, b) if kind == "matmul" else torch.mul(a, b)
    return z if scale == 1.0 else z * scale


def _product_vjp(kind: str, a: Tensor, b: Tensor, scale: float, g: Tensor, wa: float, wb: float) -> list[Tensor]:
    """The gradients of ``<_product(a, b), g>`` w.r.t. the factors with a nonzero share: written out for matrix
    products of 2-D or more operands and elementwise products (broadcast axes summed), autograd otherwise."""
    if scale != 1.0:
        g = g * scale
    if kind == "mul" or (kind == "matmul" and a.dim() >= 2 and b.dim() >= 2):
        out = []
        if wa != 0:
            ga = g * b if kind == "mul" else g @ b.transpose(-2, -1)
            out.append(ga.sum_to_size(a.shape) if ga.shape != a.shape else ga)
        if wb != 0:
            gb = g * a if kind == "mul" else a.transpose(-2, -1) @ g
            out.append(gb.sum_to_size(b.shape) if gb.shape != b.shape else gb)
        return out
    with torch.enable_grad():
        ad = a.detach().requires_grad_(wa != 0)
        bd = b.detach().requires_grad_(wb != 0)
        wrt = [t for t in (ad, bd) if t.requires_grad]
        return list(torch.autograd.grad(_product(kind, ad, bd, 1.0), wrt, g)) if wrt else []


class _ProductFn(torch.autograd.Function):
    """Output: ``a @ b`` or ``a * b`` (times a constant scale: q kᵀ / sqrt(d)); backward: each factor gets its share
    (``call.extra = (kind, scale, wa, wb)``) of ``factor * d<z, R / stab(z)>/d factor``."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()  # computed for this call alone: no copy (changed in place later: recomputed)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        call = ctx.call
        a, b = call.inputs()
        kind, scale, wa, wb = call.extra
        g = r / stabilize(call.output(lambda: _product(kind, a, b, scale)), call.rule.epsilon)
        grads = _product_vjp(kind, a, b, scale, g, wa, wb)
        ra = a * grads.pop(0) * wa if wa != 0 else None
        rb = b * grads.pop(0) * wb if wb != 0 else None
        _audit(call, r, *(t for t in (ra, rb) if t is not None))
        return ra, rb, None


class _BroadcastSumFn(torch.autograd.Function):
    """Output: ``a + b`` where one side broadcasts or is a constant (a position embedding added to a batch of
    tokens, a mask added to attention scores); backward: the sum rule (`rules.Norm`), ``R_a = a R / stab(a + b)``
    summed over the broadcast axes (same for b). A side that does not depend on the input (``call.extra``: which
    do) gets no relevance: its share is absorbed, as a bias's is, and the audit counts only what is passed on."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        call = ctx.call
        a, b = call.inputs()
        s = r / stabilize(call.output(lambda: a + b), call.rule.stabilizer)
        shares = [(t * s).sum_to_size(t.shape) if keep else None for t, keep in zip((a, b), call.extra, strict=True)]
        _audit(call, r, *(t for t in shares if t is not None))
        return shares[0], shares[1], None
