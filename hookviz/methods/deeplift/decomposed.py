r"""Operations DeepLift writes out in its rules' own operations, so that summation-to-delta holds through them: the
softmax, the log-softmax, the normalisations (layer, group and RMS norm) and fused attention.

Each is a composition of linear maps, elementwise functions (the rescale rule) and products or quotients of two
activations (the two-factor split; a normalisation's product of a vector and its scale ``1 / std`` takes the
scaled split, `products.scaled`, which stays well conditioned where a baseline makes the vector constant), and the
multipliers of a composition compose by the chain rule (Shrikumar et al. 2017, section 3.3), so the written-out
operation is exact as each of its parts is:

- softmax: $$ p = u \cdot (\sum u)^{-1} $$ with $$ u = \exp(s - c) $$, where c is the larger of the row's and its
  reference row's maxima, one shift for both so that the exponential is one function of s at both rows (softmax
  does not depend on c); the row whose maximum is the lower has a small sum, so the product of u and its scale
  takes the scaled split too;
- log-softmax: $$ (s - c) - \log \sum \exp(s - c) $$;
- ``F.normalize``: $$ x / \max(\lVert x \rVert_p, \epsilon) $$;
- layer / group norm: $$ (x - \mu) \cdot (\mathrm{mean}((x - \mu)^2) + \epsilon)^{-1/2} \cdot w + b $$;
  RMS norm: $$ x \cdot (\mathrm{mean}(x^2) + \epsilon)^{-1/2} \cdot w $$;
- ``F.scaled_dot_product_attention``: ``softmax(q kᵀ * scale + mask) @ v``, both products split;
  ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``): its linear projections around that.

The forward values stay the operation's own (the softmax and normalisations return ``exact + (w - w.detach())``:
the written-out form w adds exactly zero to the exact value and carries the gradient); attention returns the
written-out value, which differs from a fused kernel's by float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..lrp.attention import mha_heads
from ..rules import Call, Rule, spellings
from ..rules.ops import bind_mha, bind_sdpa
from ..rules.sdpa import gqa_heads, sdpa_scores
from .products import scaled, split
from .rescale import elementwise

SOFTMAX_FUNCTIONS = {**spellings("softmax", inplace=False), **spellings("log_softmax", inplace=False)}
NORM_FUNCTIONS = {F.layer_norm: "F.layer_norm", F.group_norm: "F.group_norm", F.rms_norm: "F.rms_norm"}
SDPA_FUNCTIONS = {F.scaled_dot_product_attention: "F.scaled_dot_product_attention"}
MHA_FUNCTIONS = {F.multi_head_attention_forward: "F.multi_head_attention_forward"}
NORMALIZE_FUNCTIONS = {F.normalize: "F.normalize"}


def _carry(exact: Tensor, written: Tensor) -> Tensor:
    """`exact`'s values with `written`'s gradient (``written - written.detach()`` is exactly zero)."""
    return exact.detach() + (written - written.detach())


def _rows(t: object) -> bool:
    return isinstance(t, Tensor) and t.dim() >= 1 and t.shape[0] % 2 == 0 and t.requires_grad


def _shifted(s: Tensor, dim: int) -> Tensor:
    """``s - c``, c the larger of each row's and its reference row's maxima along `dim` (0 where both are -inf)."""
    m = s.detach().amax(dim, keepdim=True)
    m1, m2 = m.chunk(2)
    c = torch.maximum(m1, m2)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    return s - c.repeat(2, *(1,) * (c.dim() - 1))


def softmax(s: Tensor, dim: int, log: bool = False) -> Tensor:
    """The (log-)softmax of the rows `s` along `dim`, written out (module docstring); the written-out value."""
    t = _shifted(s, dim)
    u = elementwise(torch.exp, t)
    total = u.sum(dim, keepdim=True)
    return t - elementwise(torch.log, total) if log else scaled(u, elementwise(torch.reciprocal, total))


def _softmax(call: Call) -> Any:
    s = call.input
    names = ("dim", "_stacklevel", "dtype") if call.op in (F.softmax, F.log_softmax) else ("dim", "dtype")
    args = dict(zip(names, call.args[1:], strict=False)) | call.kwargs
    dim, dtype = args.get("dim"), args.get("dtype")
    if not _rows(s) or dim is None:
        return NotImplemented  # the implicit dim of old code: left as it is (and reported)
    if dtype is not None:
        s = s.to(dtype)
    log = "log_softmax" in call.name
    exact = (torch.log_softmax if log else torch.softmax)(s.detach(), dim)
    return _carry(exact, softmax(s, dim, log))


def normalized(x: Tensor, dims: Sequence[int], eps: float, centre: bool) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over `dims` (``x / sqrt(mean(x²) + eps)`` without `centre`), written out."""
    xc = x - x.mean(dims, keepdim=True) if centre else x
    var = elementwise(torch.square, xc).mean(dims, keepdim=True)
    return scaled(xc, elementwise(torch.rsqrt, var + eps))


def _norm(call: Call) -> Any:
    x = call.input
    if not _rows(x):
        return NotImplemented
    name = call.name
    if name == "F.group_norm":
        a = dict(zip(("input", "num_groups", "weight", "bias", "eps"), call.args, strict=False)) | call.kwargs
        groups, eps = a["num_groups"], a.get("eps", 1e-5)
        y = normalized(x.unflatten(1, (groups, -1)), tuple(range(2, x.dim() + 1)), eps, True).flatten(1, 2)
        shape = (1, -1) + (1,) * (x.dim() - 2)  # per channel
    else:
        names = ("input", "normalized_shape", "weight", "bias", "eps")
        if name == "F.rms_norm":
            names = ("input", "normalized_shape", "weight", "eps")
        a = dict(zip(names, call.args, strict=False)) | call.kwargs
        k = len(a["normalized_shape"])
        eps = a.get("eps")
        if eps is None:
            eps = 1e-5 if name == "F.layer_norm" else torch.finfo(x.dtype).eps
        y = normalized(x, tuple(range(x.dim() - k, x.dim())), eps, name == "F.layer_norm")
        shape = None
    weight, bias = a.get("weight"), a.get("bias")
    if weight is not None:
        y = y * (weight if shape is None else weight.view(shape))
    if bias is not None:
        y = y + (bias if shape is None else bias.view(shape))
    with torch.no_grad():
        exact = call.op(*call.args, **call.kwargs)
    return _carry(exact, y)


def _normalize(call: Call) -> Any:
    """``F.normalize``: ``x / max(||x||_p, eps)`` along `dim`, the norm written out elementwise (``|x|^p``, a sum,
    ``^(1/p)``, the floor at eps) and the division by the scaled split (`products.scaled`)."""
    a = dict(zip(("input", "p", "dim", "eps", "out"), call.args, strict=False)) | call.kwargs
    x, p, dim, eps = a["input"], float(a.get("p", 2.0)), a.get("dim", 1), a.get("eps", 1e-12)
    if not _rows(x) or a.get("out") is not None or not p > 0 or math.isinf(p):
        return NotImplemented
    powered = elementwise(lambda u: u.abs().pow(p), x).sum(dim, keepdim=True)
    norm = elementwise(lambda u: u.pow(1 / p).clamp_min(eps), powered)
    with torch.no_grad():
        exact = F.normalize(x.detach(), p, dim, eps)
    return _carry(exact, scaled(x, elementwise(torch.reciprocal, norm)))


def attention(a: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(output, probabilities) of an ``F.scaled_dot_product_attention`` call bound by name, written out: both
    products split, the softmax written out; a query whose every key is masked gets 0."""
    scores, dead = sdpa_scores(a, lambda x, y: split("matmul", x, y))
    p = softmax(scores, -1)
    if dead is not None:
        p = p.masked_fill(dead, 0.0)
    return split("matmul", p, gqa_heads(a, a["value"])), p


def _sdpa(call: Call) -> Any:
    a = bind_sdpa(call.args, call.kwargs)
    q, k, v = a["query"], a["key"], a["value"]
    if a["dropout_p"] != 0.0 or not all(isinstance(t, Tensor) and t.shape[0] % 2 == 0 for t in (q, k, v)):
        return NotImplemented  # dropout draws per row: not one function of the inputs
    return attention(a)[0]


def _mha(call: Call) -> Any:
    """``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` runs, rows on axis 1): the input
    projections (linear) and heads as PyTorch computes them (`lrp.attention.mha_heads`), the attention written out,
    the output projection; the averaged probabilities where the call asks for them."""
    a = bind_mha(call.args, call.kwargs)
    query = a["query"]
    if (a["training"] and a["dropout_p"] > 0) or a["static_k"] is not None or a["static_v"] is not None:
        return NotImplemented
    if not isinstance(query, Tensor) or query.dim() != 3 or query.shape[1] % 2:
        return NotImplemented  # unbatched: no rows to pair
    heads = mha_heads(a, lambda t, w, b, c: F.linear(t, w, b))
    bound = {"query": heads.q, "key": heads.k, "value": heads.v, "attn_mask": heads.mask, "dropout_p": 0.0,
             "is_causal": heads.causal, "scale": None, "enable_gqa": False}  # fmt: skip
    o, p = attention(bound)
    n_q, n, e = heads.shape
    out = F.linear(o.permute(2, 0, 1, 3).reshape(n_q, n, e), a["out_proj_weight"], a["out_proj_bias"])
    if not a["need_weights"]:
        return out, None
    return out, (p.mean(1) if a["average_attn_weights"] else p)


SOFTMAX = Rule("softmax", _softmax, owns_call=True)
NORM = Rule("normalisation", _norm, owns_call=True)
ATTENTION = Rule("attention", _sdpa, owns_call=True)
MHA = Rule("attention", _mha, owns_call=True)
NORMALIZE = Rule("normalisation", _normalize, owns_call=True)
