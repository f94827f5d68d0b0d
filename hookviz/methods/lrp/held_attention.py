r"""CP-LRP's attention with q and k held constant, computed as the rule needs it on the CPU.

With q and k held (Ali et al., 2022, "XAI for Transformers: Better Explanations through Conservative Propagation";
the AttnLRP paper's CP-LRP baseline) the attention $$ o = P v $$, $$ P = \mathrm{softmax}(s\,q k^\top + M) $$, is
linear in v and its only gradient is $$ g_v = P^\top g_o $$. PyTorch's fused CPU kernel has no output mask: its
backward pass recomputes P and also forms the gradients of q and k, which the rule discards. Where the probabilities
take no more memory than the fused kernel keeps for its backward pass (q, k, v and the output: ``(H L + Hk S)(E + Ev)``
numbers against P's ``H L S``; with heads of 64, up to 256 keys), they are formed once in the forward pass and kept,
and the backward pass is one matrix product: 0.4x to 0.5x of the fused forward and backward time at 128 to 256
tokens on one CPU thread (docs/relevance.md). Longer sequences, other devices (their fused kernels, unmeasured
here), dropout, gradients into the mask, and anything else the explicit form does not reproduce keep the fused call.
The output equals the fused kernel's to float rounding (the kernel sums in another order)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def held_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Tensor | None:
    """``F.scaled_dot_product_attention(q, k, v, ...)`` with q and k constant, as one Function whose backward pass is
    ``Pᵀ g`` (the probabilities kept from the forward pass); None where the fused call is to be kept (see the module
    docstring). q: (N, H, L, E); k: (N, Hk, S, E); v: (N, Hk, S, Ev); H = Hk, or a multiple of it with `enable_gqa`;
    `attn_mask` broadcastable to (N, H, L, S), boolean (True takes part) or added; `is_causal`: the upper triangle
    of (L, S) masked, as the fused call does."""
    if not _explicit(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
        return None
    return _HeldAttention.apply(q.detach(), k.detach(), v, attn_mask, is_causal, scale)


def _explicit(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool, gqa: bool) -> bool:
    if not (q.device.type == k.device.type == v.device.type == "cpu" and q.dim() == k.dim() == v.dim() == 4):
        return False
    if q.dtype not in (torch.float32, torch.float64) or not (q.dtype == k.dtype == v.dtype):
        return False
    if dropout_p != 0.0 or (causal and mask is not None) or q.is_nested:
        return False
    (n, h, n_q, e), (nk, hk, n_k, ek) = q.shape, k.shape
    if not (nk == n and v.shape[:3] == k.shape[:3] and ek == e and n_k > 0):
        return False
    if not (hk == h or (gqa and h % hk == 0)):
        return False
    if mask is not None:
        if mask.requires_grad or mask.dim() > 4 or not (mask.dtype == torch.bool or mask.dtype == q.dtype):
            return False
        shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
        if any(m not in (1, full) for m, full in zip(shape, (n, h, n_q, n_k), strict=True)):
            return False
    # P (H L S numbers per sample) no larger than what the fused call keeps for its backward pass
    return h * n_q * n_k <= (h * n_q + hk * n_k) * (e + v.shape[-1])


class _HeldAttention(torch.autograd.Function):
    """Output: the attention; backward: ``Pᵀ g`` to v only (q and k are held)."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float | None
    ) -> Tensor:
        (n, h, n_q, e), hk, n_k = q.shape, k.shape[1], k.shape[2]
        group = h // hk
        s = torch.matmul(q.reshape(n, hk, group * n_q, e), k.transpose(-2, -1))
        s.mul_(1.0 / math.sqrt(e) if scale is None else float(scale))
        s5 = s.view(n, hk, group, n_q, n_k)
        if causal:
            upper = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu_(1)
            s5.masked_fill_(upper, float("-inf"))
        dead = None
        if mask is not None:
            m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            m = m.unflatten(1, (hk, group)) if m.shape[1] == h and h > 1 else m.unsqueeze(1)
            if m.dtype == torch.bool:
                s5.masked_fill_(~m, float("-inf"))
                allowed = m.any(-1, keepdim=True)
            else:
                s5.add_(m)
                allowed = (m != float("-inf")).any(-1, keepdim=True)
            # a query that may attend to no key gets 0 from the fused kernel, where a softmax over -inf gives NaN
            dead = None if bool(allowed.all()) else ~allowed
        p = torch.softmax(s, -1)
        if dead is not None:
            p.view(n, hk, group, n_q, n_k).masked_fill_(dead, 0.0)
        ctx.save_for_backward(p)
        ctx.shape = (n, h, n_q, v.shape[-1])
        return torch.matmul(p, v).view(n, hk, group, n_q, -1).reshape(ctx.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[None, None, Tensor, None, None, None]:
        (p,) = ctx.saved_tensors
        n, h, n_q, ev = ctx.shape
        hk = p.shape[1]
        gv = torch.matmul(p.transpose(-2, -1), g.reshape(n, hk, (h // hk) * n_q, ev))
        return None, None, gv, None, None, None
