"""CP-LRP's held attention (hookviz.methods.lrp.held_attention) against F.scaled_dot_product_attention with q and k
detached: the same output and the same gradient to v, for every mask form the fused call takes, and the fused call
kept wherever the explicit form does not apply.

Tolerances: in float64 the two differ only by summation order (1e-12 relative); float32 results are compared at
1e-5 of the largest value (the fused kernel sums scores and products in tiles, a few float32 ulps on sums of 64 to
200 terms)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hookviz.methods.lrp.held_attention import held_attention
from hookviz.methods.rules.ops import bind_sdpa


def _qkv(n=2, h=4, hk=4, L=5, S=7, e=8, ev=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, h, L, e, generator=g, dtype=dtype)
    k = torch.randn(n, hk, S, e, generator=g, dtype=dtype)
    v = torch.randn(n, hk, S, ev, generator=g, dtype=dtype, requires_grad=True)
    return q, k, v


def _both(q, k, v, **kw):
    """(held output, held gradient of v, fused output, fused gradient of v) for the same upstream gradient."""
    args = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) | kw
    out = held_attention(bind_sdpa((q, k, v), args))
    assert out is not None, "the explicit form should apply"
    ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v, **args)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)
    (gv,) = torch.autograd.grad(out, v, g)
    (rv,) = torch.autograd.grad(ref, v, g)
    return out, gv, ref, rv


def _close(a, b, rel):
    a, b = a.detach(), b.detach()
    scale = b.abs().max().clamp_min(1e-300)
    assert a.shape == b.shape
    assert float((a - b).abs().max() / scale) <= rel


MASKS = {
    "none": lambda L, S, h, n: {},
    "causal": lambda L, S, h, n: {"is_causal": True},
    "bool (L, S)": lambda L, S, h, n: {"attn_mask": torch.rand(L, S, generator=torch.Generator().manual_seed(2)) > 0.3},
    "bool (N, 1, 1, S) key padding": lambda L, S, h, n: {
        "attn_mask": torch.arange(S).expand(n, 1, 1, S) < torch.tensor([S, S - 3]).view(n, 1, 1, 1)
    },
    "float (N, H, L, S)": lambda L, S, h, n: {
        "attn_mask": torch.randn(n, h, L, S, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    },
    "scale": lambda L, S, h, n: {"scale": 0.37},
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (6, 6)])
def test_equals_the_fused_call_with_q_and_k_detached(mask, shape) -> None:
    L, S = shape
    q, k, v = _qkv(L=L, S=S)
    kw = MASKS[mask](L, S, 4, 2)
    if kw.get("attn_mask") is not None and kw["attn_mask"].dtype == torch.bool:
        kw["attn_mask"][..., 0] = True  # every query keeps a key here; rows with none are tested below
    out, gv, ref, rv = _both(q, k, v, **kw)
    _close(out, ref, 1e-12)
    _close(gv, rv, 1e-12)


def test_grouped_query_attention() -> None:
    q, k, v = _qkv(h=6, hk=2)
    for kw in ({"enable_gqa": True}, {"enable_gqa": True, "is_causal": True},
               {"enable_gqa": True, "attn_mask": torch.randn(2, 6, 5, 7, dtype=torch.float64)}):  # fmt: skip
        out, gv, ref, rv = _both(q, k, v, **kw)
        _close(out, ref, 1e-12)
        _close(gv, rv, 1e-12)


def test_a_query_with_no_key_gets_zero_as_in_the_fused_call() -> None:
    q, k, v = _qkv()
    m = torch.ones(5, 7, dtype=torch.bool)
    m[2] = False
    out, gv, ref, rv = _both(q, k, v, attn_mask=m)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert not out.isnan().any() and not gv.isnan().any()
    _close(out, ref, 1e-12)
    _close(gv, rv, 1e-12)
    fm = torch.zeros(5, 7, dtype=torch.float64).masked_fill(~m, float("-inf"))
    out, gv, ref, rv = _both(q, k, v, attn_mask=fm)
    _close(out, ref, 1e-12)
    _close(gv, rv, 1e-12)


def test_float32_at_transformer_sizes() -> None:
    q, k, v = _qkv(n=1, h=12, hk=12, L=197, S=197, e=64, ev=64, dtype=torch.float32)
    out, gv, ref, rv = _both(q, k, v)
    _close(out, ref, 1e-5)
    _close(gv, rv, 1e-5)
    q, k, v = _qkv(n=1, h=12, hk=12, L=128, S=128, e=64, ev=64, dtype=torch.float32)
    out, gv, ref, rv = _both(q, k, v, is_causal=True)
    _close(out, ref, 1e-5)
    _close(gv, rv, 1e-5)


def test_only_v_gets_a_gradient() -> None:
    q, k, v = _qkv()
    q.requires_grad_(True)
    out = held_attention(bind_sdpa((q, k, v), {}))
    assert out is not None
    gq, gv = torch.autograd.grad(out.sum(), (q, v), allow_unused=True)
    assert gq is None and gv is not None


@pytest.mark.parametrize(
    "case",
    ["dropout", "long keys", "mask needs a gradient", "float16", "3-D", "causal and a mask", "mixed dtypes",
     "heads not a multiple"],
)  # fmt: skip
def test_the_fused_call_is_kept_where_the_explicit_form_does_not_apply(case) -> None:
    q, k, v = _qkv()
    args = [None, 0.0, False, None, False]
    if case == "dropout":
        args[1] = 0.1
    elif case == "long keys":  # P (H L S) larger than q, k, v and the output together
        q, k, v = _qkv(L=300, S=300, e=8, ev=8)
    elif case == "mask needs a gradient":
        args[0] = torch.zeros(5, 7, dtype=torch.float64, requires_grad=True)
    elif case == "float16":
        q, k, v = (t.detach().half() for t in (q, k, v))
    elif case == "3-D":
        q, k, v = q[0], k[0], v[0]
    elif case == "causal and a mask":
        args[0], args[2] = torch.ones(5, 7, dtype=torch.bool), True
    elif case == "mixed dtypes":
        v = v.detach().float()
    elif case == "heads not a multiple":
        q, k, v = _qkv(h=5, hk=2)
        args[4] = True
    assert held_attention(bind_sdpa((q, k, v, *args), {})) is None
