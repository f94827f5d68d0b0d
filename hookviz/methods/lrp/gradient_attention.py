r"""AttnLRP's attention with its stabilizers in gradient-times-input form, as one autograd Function that keeps only
q, k, v (and the mask) and computes the scores and probabilities again in the backward pass.

``softmax(scale q kᵀ + bias) v`` decomposed (`attention.attend`) would keep the scores, the masked scores and the
probabilities, three (N, heads, L, S) tensors per layer, from the forward to the end of the backward pass. In the form
that carries $$ g = R / a $$ backward (`gradient_form`) the rules are (Achtibat et al., 2024, "AttnLRP", Sec. 3.3):

- p v by the uniform rule: $$ g_o' = g_o \odot o / \mathrm{stab}(o) $$, then $$ g_p = w_p\, g_o' v^\top $$ and
  $$ g_v = w_v\, p^\top g_o' $$;
- the softmax rule: the softmax's own gradient, $$ g_{s_m} = p \odot (g_p - \textstyle\sum_j p_j g_{p,j}) $$;
- the mask's sum by the sum rule (the mask absorbs its share): $$ g_s = g_{s_m} \odot s_m / \mathrm{stab}(s_m) $$,
  masked logits (-inf) none;
- q kᵀ by the uniform rule: $$ g_s' = g_s \odot s / \mathrm{stab}(s) $$, $$ g_q = w_q\, \mathrm{scale}\; g_s' k $$,
  $$ g_k = w_k\, \mathrm{scale}\; g_s'^\top q $$,

each call audited under its own entry (q kᵀ, mask, softmax, p v, in the order the decomposed calls make them). The
map equals the decomposed calls' (tests/test_lrp_gradient_form.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .audit import AuditEntry
from .products import attention_probabilities
from .stabilizer import factor, per_input


class AttentionCall:
    """What the backward pass of one attention needs: q, k, v (detached, with their versions), the additive mask
    (or None), the scale, the queries whose every key is masked (or None), the shares (wq, wk, wp, wv), the product
    epsilon and the sums' stabilizer, the audit entries (q@k, mask or None, softmax, p@v) and the batch size."""

    __slots__ = ("q", "k", "v", "versions", "bias", "scale", "dead", "shares", "eps", "stabilizer", "entries", "n")

    def __init__(
        self,
        qkv: tuple[Tensor, Tensor, Tensor],
        bias: Tensor | None,
        scale: float,
        dead: Tensor | None,
        shares: tuple[float, float, float, float],
        eps: float,
        stabilizer: float,
        entries: tuple[AuditEntry, AuditEntry | None, AuditEntry, AuditEntry],
        n: int,
    ) -> None:
        self.q, self.k, self.v = (t.detach() for t in qkv)
        self.versions = tuple(t._version for t in qkv)
        self.bias = None if bias is None else bias.detach()
        self.scale, self.dead, self.shares = scale, dead, shares
        self.eps, self.stabilizer, self.entries, self.n = eps, stabilizer, entries, n

    def inputs(self) -> tuple[Tensor, Tensor, Tensor]:
        if tuple(t._version for t in (self.q, self.k, self.v)) != self.versions:
            raise RuntimeError(
                "LRP: the query, key or value of an attention was modified in place after the attention read it, so "
                "its rules cannot be evaluated; make the in-place operation that follows it out of place"
            )
        return self.q, self.k, self.v

    def probabilities(self) -> tuple[Tensor, Tensor, Tensor]:
        """(scores, masked scores, probabilities), as the forward pass computed them (the same operations)."""
        q, k, _ = self.inputs()
        s, sm, p = attention_probabilities(q, k.transpose(-2, -1), self.bias, self.scale)
        if self.dead is not None:
            p.masked_fill_(self.dead, 0.0)
        return s, sm, p


def _scaled(g: Tensor, z: Tensor, eps: float) -> Tensor:
    return g if eps == 0 else g * factor(z.to(g.dtype), eps)


class StabilizedAttentionFn(torch.autograd.Function):
    """Output: ``softmax(scale q kᵀ + bias) v`` (computed, boxed); backward: the rules of the module docstring."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, obox: tuple[Tensor], call: AttentionCall) -> Tensor:
        ctx.call = call
        return obox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None]:
        call: AttentionCall = ctx.call
        n = call.n
        e_qk, e_mask, e_soft, e_pv = call.entries
        wq, wk, wp, wv = call.shares
        q, k, v = call.inputs()
        s, sm, p = call.probabilities()
        o = torch.matmul(p, v)
        go = _scaled(g, o, call.eps)
        e_pv.add(per_input(o, g, n), per_input(o, go, n))
        gv = None if wv == 0 else torch.matmul(p.transpose(-2, -1), go if wv == 1 else go * wv)
        gp = torch.matmul(go if wp == 1 else go * wp, v.transpose(-2, -1))
        del o, go
        gsm = torch._softmax_backward_data(gp, p, -1, p.dtype)
        logits = torch.nan_to_num(sm, nan=0.0, posinf=0.0, neginf=0.0) if call.bias is not None else sm
        e_soft.add(per_input(p, gp, n), per_input(logits, gsm, n))
        del p, gp
        gs = gsm
        if call.bias is not None:
            gs = _scaled(gsm, logits, call.stabilizer)
            assert e_mask is not None
            e_mask.add(per_input(logits, gsm, n), per_input(s, gs, n))
        del logits, sm, gsm
        gs2 = _scaled(gs, s, call.eps)
        e_qk.add(per_input(s, gs, n), per_input(s, gs2, n))
        del s, gs
        gq = None if wq == 0 else torch.matmul(gs2, k) * (call.scale * wq)
        gk = None if wk == 0 else torch.matmul(gs2.transpose(-2, -1), q) * (call.scale * wk)
        return gq, gk, gv, None, None
