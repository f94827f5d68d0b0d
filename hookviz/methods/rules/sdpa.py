"""``F.scaled_dot_product_attention``'s scores and probabilities, as PyTorch's documented reference computes them:
for the methods that need what a fused call keeps inside (the attention rollouts record them; CP-LRP's held
attention keeps them for its backward pass; DeepLift writes the call out in its rules' operations)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def sdpa_scores(
    a: dict[str, Any], product: Callable[[Tensor, Tensor], Tensor] = torch.matmul
) -> tuple[Tensor, Tensor | None]:
    """The scores ``q kᵀ * scale + mask`` of a call bound by name (`ops.bind_sdpa`), (..., H, L, S), and its dead
    queries (those whose every key is masked, (..., H, L, 1); None without a mask). Key heads repeated for
    ``enable_gqa``; -inf where a boolean mask or the causal mask is False (upper triangle of (L, S), as the fused
    call does); a dead query's scores are 0, so that a gradient through its probabilities is 0. `product` forms
    ``q kᵀ`` (DeepLift passes its two-factor split); its result is changed in place."""
    query, key, scale, mask, causal = a["query"], a["key"], a["scale"], a["attn_mask"], a["is_causal"]
    t, s = query.size(-2), key.size(-2)
    key = gqa_heads(a, key)
    scores = product(query, key.transpose(-2, -1))  # a new tensor: changed in place below (its backward keeps q, k)
    scores.mul_(1 / math.sqrt(query.size(-1)) if scale is None else scale)
    if causal:
        scores.masked_fill_(torch.ones(t, s, dtype=torch.bool, device=query.device).triu_(1), -math.inf)
    dead = None
    if mask is not None:
        # where the mask has more batch axes than the scores, the result is a new tensor of the broadcast shape
        inplace = torch.broadcast_shapes(scores.shape, mask.shape) == scores.shape
        if mask.dtype == torch.bool:
            blocked = ~mask
            scores = scores.masked_fill_(blocked, -math.inf) if inplace else scores.masked_fill(blocked, -math.inf)
            dead = blocked.all(-1, keepdim=True)
        else:
            scores = scores.add_(mask) if inplace else scores + mask
            dead = torch.isneginf(mask).all(-1, keepdim=True)
        if causal:  # both (the fused call refuses that, the reference allows it): the rows themselves say
            dead = torch.isneginf(scores).all(-1, keepdim=True)
        scores.masked_fill_(dead, 0.0)
    return scores, dead


def gqa_heads(a: dict[str, Any], t: Tensor) -> Tensor:
    """A key or value tensor of a bound call with its heads repeated to the query's (``enable_gqa``)."""
    query = a["query"]
    if a["enable_gqa"] and query.dim() >= 3 and t.size(-3) != query.size(-3):
        return t.repeat_interleave(query.size(-3) // t.size(-3), -3)
    return t


def sdpa_probabilities(a: dict[str, Any]) -> Tensor:
    """The probabilities ``softmax(q kᵀ * scale + mask)`` of a call bound by name (`ops.bind_sdpa`), before dropout
    (what an eager softmax returns): (..., H, L, S), from `sdpa_scores`. A query whose every key is masked (a left
    pad of a batch of prompts) gets 0, as the fused kernel gives it, where a softmax over -inf everywhere gives NaN,
    which matrix products would spread to every row. Differentiable in q, k and a float mask."""
    scores, dead = sdpa_scores(a)
    p = torch.softmax(scores, dim=-1)
    return p if dead is None else p.masked_fill(dead, 0.0)
