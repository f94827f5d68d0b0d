"""Fused attention calls decomposed during the call into the explicit form with the same semantics, so that the
AttnLRP / CP-LRP rules apply to their parts: ``F.scaled_dot_product_attention`` (mask, causal, scale, GQA) and
``F.multi_head_attention_forward`` (which ``nn.MultiheadAttention`` calls when autograd is on; masks, key padding):
q kᵀ by the product rule, the softmax rule, attention · v by the product rule, projections by the linear rule."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rules.ops import bind_mha

NOT_HANDLED = object()  # what `mha` returns for a call whose query, key and value depend on no input


class TransformerOps(Protocol):
    """What the decompositions here call on the rules' operations they are given (`gradient_ops.GradientOps`, whose
    table entries run them: named by their methods, not imported)."""

    @property
    def linear(self) -> Callable[[Tensor, Tensor, Tensor | None, str], Tensor]: ...
    def depends(self, t: object) -> bool: ...
    def tag(self, t: Tensor) -> Tensor: ...
    def _where(self, what: str) -> str: ...
    def sum(self, what: str, a: Tensor, b: Tensor, depend: tuple[bool, bool], link: Tensor | None = None) -> Tensor: ...
    def product(self, what: str, a: Tensor, b: Tensor, kind: str, scale: float = 1.0) -> Tensor: ...
    def softmax(self, what: str, s: Tensor, dim: int, fn: Callable[[Tensor], Tensor]) -> Tensor: ...
    def attention(
        self,
        what: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        scale: float,
        need_p: bool,
        dead: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None] | None: ...


SDPA = F.scaled_dot_product_attention
MHA = F.multi_head_attention_forward


def attend(
    ops: TransformerOps,
    what: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    causal: bool,
    scale: float | None,
    gqa: bool,
    need_p: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention with F.scaled_dot_product_attention's semantics (boolean masks: True
    takes part; float masks are added; `causal`: the upper triangle masked; `gqa`: key/value heads repeated),
    decomposed into the product, softmax and product rules (without dropout: as one Function that recomputes the
    scores and probabilities in the backward pass, `TransformerOps.attention`). Returns (output, attention
    probabilities, or None where not `need_p` and the one Function computed the output)."""
    n_q, n_k = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    if gqa and q.dim() >= 3 and k.size(-3) != q.size(-3):
        rep = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    bias = None
    if causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        bias = torch.zeros(n_q, n_k, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))
    if mask is not None:
        m = mask
        if m.dtype == torch.bool:
            m = torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        bias = m if bias is None else bias + m
    dead = None
    if bias is not None:
        # a query whose every key is masked (a left pad of a batch of prompts) attends to nothing: the fused kernel
        # gives it 0, where a softmax over -inf everywhere gives NaN, which 0-probability products carry into the
        # other positions; its row is computed unmasked and zeroed after the softmax. Whether there is such a row is
        # not asked (on a GPU, a wait): the masks are applied whatever they hold (an all-False mask changes nothing)
        dead = torch.isneginf(bias).all(-1, keepdim=True)
        bias = bias.masked_fill(dead, 0.0)
    if dropout_p == 0:
        fused = ops.attention(what, q, k, v, bias, scale, need_p, dead)
        if fused is not None:
            return fused
    s = ops.product(f"{what} q@k", q, k.transpose(-2, -1), "matmul", scale)
    if bias is not None:
        s = ops.sum(f"{what} mask", s, bias, (True, False))  # the mask absorbs its share, as in an eager model
    p = ops.softmax(f"{what} softmax", s, -1, lambda t: torch.softmax(t, -1))
    if dead is not None:
        p = ops.tag(p.masked_fill(dead, 0.0))
    if dropout_p > 0:
        p = ops.tag(F.dropout(p, dropout_p))
    return ops.product(f"{what} p@v", p, v, "matmul"), p


class MHAHeads(NamedTuple):
    """``F.multi_head_attention_forward``'s call split into heads: q (N, h, L, d), k and v (N, h, S, d) after the input
    projections (and any add_bias_kv / add_zero_attn keys), one additive mask (N, h, L, S) or None, whether causal."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    causal: bool
    unbatched: bool
    shape: tuple[int, int, int]  # (L, N, E) of the query


def mha_heads(a: dict[str, Any], project: Callable[[Tensor, Tensor, Tensor | None, str], Tensor]) -> MHAHeads:
    """The bound call `a` (`bind_mha`) as PyTorch computes it up to the attention: `project(t, w, b, "q"|"k"|"v")`
    applies the input projections (the rules' linear layer, or plain ``F.linear``). `TypeError` for static_k / v."""
    query, key, value = a["query"], a["key"], a["value"]
    if a["static_k"] is not None or a["static_v"] is not None:
        raise TypeError("LRP: F.multi_head_attention_forward with static_k / static_v is not supported")
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    n_q, n, e = query.shape
    n_k = key.shape[0]
    h = a["num_heads"]
    d = e // h
    if a["use_separate_proj_weight"]:
        ws = (a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"])
    else:
        ws = tuple(a["in_proj_weight"].chunk(3))
    bs = (None, None, None) if a["in_proj_bias"] is None else tuple(a["in_proj_bias"].chunk(3))
    q, k, v = (project(t, w, b, c) for t, w, b, c in zip((query, key, value), ws, bs, "qkv", strict=True))
    attn_mask, padding = a["attn_mask"], a["key_padding_mask"]
    if a["bias_k"] is not None and a["bias_v"] is not None:  # add_bias_kv: one more key and value, constants
        k = torch.cat([k, a["bias_k"].repeat(1, n, 1)])
        v = torch.cat([v, a["bias_v"].repeat(1, n, 1)])
        attn_mask, padding, n_k = _pad_key(attn_mask), _pad_key(padding), n_k + 1
    q = q.reshape(n_q, n, h, d).permute(1, 2, 0, 3)  # (N, h, L, d)
    k = k.reshape(n_k, n, h, d).permute(1, 2, 0, 3)
    v = v.reshape(n_k, n, h, d).permute(1, 2, 0, 3)
    if a["add_zero_attn"]:  # a zero key and value at the end (after the biases, as PyTorch appends them)
        zero = torch.zeros(n, h, 1, d, dtype=k.dtype, device=k.device)
        k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2)
        attn_mask, padding, n_k = _pad_key(attn_mask), _pad_key(padding), n_k + 1
    mask = _mha_mask(attn_mask, padding, n, h, n_q, n_k, q.dtype, q.device)
    causal = bool(a["is_causal"]) and attn_mask is None
    return MHAHeads(q, k, v, mask, causal, unbatched, (n_q, n, e))


def mha(ops: TransformerOps, args: tuple, kwargs: dict) -> Any:
    a = bind_mha(args, kwargs)
    if not any(ops.depends(a[t]) for t in ("query", "key", "value")):
        return NOT_HANDLED
    where = ops._where("multi_head_attention")
    heads = mha_heads(a, lambda t, w, b, c: ops.linear(t, w, b, f"{where} in_proj {c}"))
    q, k, v, mask, causal, unbatched = heads.q, heads.k, heads.v, heads.mask, heads.causal, heads.unbatched
    n_q, n, e = heads.shape
    dropout = a["dropout_p"] if a["training"] else 0.0
    o, p = attend(ops, where, q, k, v, mask, dropout, causal, None, False, bool(a["need_weights"]))
    o = o.permute(2, 0, 1, 3).reshape(n_q, n, e)
    out = ops.linear(o, a["out_proj_weight"], a["out_proj_bias"], f"{where} out_proj")
    weights = None
    if a["need_weights"]:
        assert p is not None
        weights = p.detach().mean(1) if a["average_attn_weights"] else p.detach()
        weights = weights.squeeze(0) if unbatched else weights
    return (out.squeeze(1) if unbatched else out), weights


def _pad_key(mask: Tensor | None) -> Tensor | None:
    """A mask over keys with one more key at the end, which takes part (False: not masked; 0.0: nothing added)."""
    return None if mask is None else F.pad(mask, (0, 1))


def _mha_mask(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    n: int,
    h: int,
    n_q: int,
    n_k: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor | None:
    """nn.MultiheadAttention's masks (boolean: True is *masked out*; float: added) as one additive (N, h, L, S)."""

    def additive(m: Tensor) -> Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    out = None
    if attn_mask is not None:
        m = additive(attn_mask)
        out = m.reshape(n, h, n_q, n_k) if m.dim() == 3 else m
    if key_padding_mask is not None:
        kp = additive(key_padding_mask).reshape(n, 1, 1, n_k)
        out = kp if out is None else out + kp
    return out
