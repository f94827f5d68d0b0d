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

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..rules.sdpa import sdpa_probabilities


def held_attention(a: dict[str, Any]) -> Tensor | None:
    """``F.scaled_dot_product_attention`` bound by name (`ops.bind_sdpa`) with q and k constant, as one Function whose
    backward pass is ``Pᵀ g`` (the probabilities kept from the forward pass, `sdpa.sdpa_probabilities`); None where
    the fused call is to be kept (see the module docstring). q: (N, H, L, E); k: (N, Hk, S, E); v: (N, Hk, S, Ev);
    H = Hk, or a multiple of it with ``enable_gqa``; ``attn_mask`` broadcastable to (N, H, L, S), boolean (True takes
    part) or added; ``is_causal``: the upper triangle of (L, S) masked, as the fused call does."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not _explicit(q, k, v, mask, a["dropout_p"], a["is_causal"], a["enable_gqa"]):
        return None
    return _HeldAttention.apply({**a, "query": q.detach(), "key": k.detach()}, v)


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
    def forward(ctx: Any, a: dict[str, Any], v: Tensor) -> Tensor:
        # `a`: the bound call, q and k detached; v (also a["value"]) given apart: the Function's input with a gradient
        p = sdpa_probabilities(a)  # (N, H, L, S): key heads repeated for grouped-query attention
        ctx.save_for_backward(p)
        ctx.group = p.size(1) // v.size(1)
        return torch.matmul(p, v if ctx.group == 1 else v.repeat_interleave(ctx.group, 1))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[None, Tensor]:
        (p,) = ctx.saved_tensors
        gv = torch.matmul(p.transpose(-2, -1), g)
        return None, gv if ctx.group == 1 else gv.unflatten(1, (-1, ctx.group)).sum(2)
