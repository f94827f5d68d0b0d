r"""The softmax and product rules of AttnLRP / CP-LRP as autograd Functions whose backward *is* the rule: softmax
$$ R_{s,i} = s_i (R_i - p_i \sum_j R_j) $$ (zero for held probabilities), the uniform rule on products of two
input-dependent tensors, the sum rule on sums that broadcast (see `transformer` for the rules' definitions), and
attention without dropout as one Function that applies the three in turn from q, k and v alone."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from hookviz.methods.lrp.products import _product, attention_probabilities
from hookviz.methods.lrp.rules import stabilized_ratio

from .rulecall import RuleCall, _audit, _per_input, audit_entry


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
        dim = call.extra
        p = None if call.rule.hold else call.output(lambda: torch.softmax(s.to(call.z.dtype), dim))
        r, r_in = softmax_relevance(s, p, r, dim)
        _audit(call, r, r_in)
        return r_in, None


def softmax_relevance(s: Tensor, p: Tensor | None, r: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """`Softmax`'s rule: (the relevance `r` in `p`'s dtype, the relevance at the logits `s`); `p` None: held (zero)."""
    if p is None:
        return r, torch.zeros_like(s)
    logits = torch.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite logits get none: one kernel
    r = r.to(p.dtype)
    t = p * r.sum(dim, keepdim=True)
    torch.sub(r, t, out=t)  # in place: one (N, heads, L, S) temporary fewer at the backward pass's peak
    return r, t.mul_(logits).to(s.dtype)


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
        z = call.output(lambda: _product(kind, a, b, scale))
        ra, rb = product_relevance(kind, a, b, z, scale, wa, wb, call.rule.epsilon, r)
        _audit(call, r, *(t for t in (ra, rb) if t is not None))
        return ra, rb, None


def product_relevance(
    kind: str, a: Tensor, b: Tensor, z: Tensor, scale: float, wa: float, wb: float, epsilon: float, r: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """`Uniform`'s rule on ``z = scale * (a @ b)`` or ``scale * a * b``: each factor's share (`wa`, `wb`; None where
    zero) of ``factor * d<z, R / stab(z)>/d factor``."""
    g = stabilized_ratio(r, z, epsilon)
    grads = _product_vjp(kind, a, b, scale, g, wa, wb)
    del g
    ra = _times(a, grads.pop(0), wa) if wa != 0 else None
    rb = _times(b, grads.pop(0), wb) if wb != 0 else None
    return ra, rb


def _times(f: Tensor, g: Tensor, w: float) -> Tensor:
    """``f * g * w`` (the same numbers), in place on `g`, a fresh gradient, where its layout and dtype allow."""
    if g.shape == f.shape and g.dtype == f.dtype and g._base is None and g.is_contiguous():
        out = g.mul_(f)
    else:
        out = f * g
    return out if w == 1.0 else out.mul_(w)


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
        shares = sum_relevance(a, b, call.output(lambda: a + b), call.extra, call.rule.stabilizer, r)
        _audit(call, r, *(t for t in shares if t is not None))
        return shares[0], shares[1], None


def sum_relevance(
    a: Tensor, b: Tensor, z: Tensor, depend: tuple[bool, bool], stabilizer: float, r: Tensor
) -> list[Tensor | None]:
    """The sum rule on ``z = a + b`` (broadcasting): ``R_a = a R / stab(z)`` summed over a's broadcast axes (same
    for b); None for a side that does not depend on the input (`depend`)."""
    s = stabilized_ratio(r, z, stabilizer)
    return [(t * s).sum_to_size(t.shape) if keep else None for t, keep in zip((a, b), depend, strict=True)]


class _AttentionFn(torch.autograd.Function):
    """Output: ``softmax(scale q kᵀ + bias) v`` (attention without dropout); backward: the product rule on p v, the
    softmax rule, the sum rule on the mask (which absorbs its share) and the product rule on q kᵀ, in that order, each
    audited under its own entry, exactly as the decomposed calls (`_ProductFn`, `_BroadcastSumFn`, `_SoftmaxFn`) do.

    Only q, k, v (views of the projections' outputs, kept by those layers' rules anyway) and the mask are kept: the
    scores, probabilities and output are recomputed in the backward pass, as a fused kernel's backward does, instead of
    holding two (N, heads, L, S) tensors per layer from the forward to the end of the backward pass.
    ``call.extra``: (bias, scale, (q@k, mask, softmax, p@v entries), (wq, wk, wp, wv) shares, product epsilon, sum
    stabilizer, softmax held, the queries with every key masked or None: their probabilities are zero after the
    softmax, so their rows get no relevance)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on_only()  # recomputed in the backward pass

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        call = ctx.call
        q, k, v = call.inputs()
        bias, scale, (e_qk, e_mask, e_soft, e_pv), (wq, wk, wp, wv), eps, stabilizer, hold, dead = call.extra
        kt = k.transpose(-2, -1)
        s, sm, p = attention_probabilities(q, kt, bias, scale)
        if dead is not None:  # the softmax rule then gets p zeroed there too: a row of zero relevance gives zeros
            p.masked_fill_(dead, 0.0)
        rp, rv = product_relevance("matmul", p, v, torch.matmul(p, v), 1.0, wp, wv, eps, r)
        audit_entry(e_pv, r, *(t for t in (rp, rv) if t is not None))
        if rp is None or hold:  # nothing reaches the logits: q and k get none (zeros in the decomposed calls)
            n = r.shape[0] if r.dim() > 0 else 1
            zero = r.new_zeros(n)
            e_soft.add(zero if rp is None else _per_input(rp, n), zero)
            for e in (e_mask, e_qk):
                if e is not None:
                    e.add(zero, zero)
            return None, None, rv, None
        rp, rs = softmax_relevance(sm, p, rp, -1)
        audit_entry(e_soft, rp, rs)
        del p, rp
        if bias is not None:
            (share, _) = sum_relevance(s, bias, sm, (True, False), stabilizer, rs)
            assert share is not None
            audit_entry(e_mask, rs, share)
            rs = share
        del sm
        rq, rk = product_relevance("matmul", q, kt, s, scale, wq, wk, eps, rs)
        audit_entry(e_qk, rs, *(t for t in (rq, rk) if t is not None))
        return rq, None if rk is None else rk.transpose(-2, -1), rv, None
