"""DeepLift's rules, each against hand-computed values and by summation-to-delta in float64 (issue 34): the max-pool
rule for every pool (overlapping windows, padding, dilation, ceil_mode, 1-D / 2-D / 3-D, adaptive, functional),
max / min reductions, the two-factor split on products and quotients, the scaled split of normalisations, softmax
and fused attention written out.

Tolerances: float64 throughout. An exact rule leaves only rounding: each of the L operations of a model rounds each
term it adds once (relative 2^-53), so the sum of the attributions differs from f(x) - f(x') by at most about
L * 2^-53 * S, S the sum of the magnitudes involved (|A| summed, |f(x)|, |f(x')|): `exact_tol` takes L = 64 (more
than any model here) and a factor 4 for the products' and quotients' two roundings per term.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookviz as hv


@pytest.fixture(autouse=True)
def float64_default():
    """Every model and tensor of these tests in float64 (restored after each test)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def exact_tol(a: torch.Tensor, fx: torch.Tensor, fb: torch.Tensor) -> torch.Tensor:
    """(N,) rounding bound of sum(A) - (f(x) - f(x')) in float64 (module docstring)."""
    scale = a.abs().flatten(1).sum(1) + fx.abs() + fb.abs()
    return 4 * 64 * 2.0**-53 * scale


def check_sum(model: nn.Module, x: torch.Tensor, base: torch.Tensor | float = 0.0, target: int = 0) -> torch.Tensor:
    dl = hv.DeepLift(model, base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no summation-to-delta warning
        a = dl.attribute(x, target)
    b = torch.full_like(x, base) if not isinstance(base, torch.Tensor) else base.expand_as(x)
    with torch.no_grad():
        fx, fb = model(x)[:, target], model(b)[:, target]
    err = (a.flatten(1).sum(1) - (fx - fb)).abs()
    assert bool((err <= exact_tol(a, fx, fb)).all()), (err, exact_tol(a, fx, fb))
    assert dl.rule_coverage.uncovered == {}
    return a


class Pool(nn.Module):
    """conv -> ReLU -> pool -> conv -> ReLU -> mean -> linear, any pool (a module or a function of the input)."""

    def __init__(self, pool, dims: int = 2) -> None:
        super().__init__()
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
        self.a, self.b = conv(3, 4, 3, padding=1), conv(4, 5, 3, padding=1)
        self.pool = pool
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(F.relu(self.a(x)))
        return self.head(F.relu(self.b(h)).flatten(2).mean(2))


def test_overlapping_max_pool_by_hand() -> None:
    """t = [1, 3, 2] against t' = 0 through MaxPool1d(2, stride=1) and a sum: both windows select t_1 = 3 at the
    row (each routes its whole difference 3 there: the row's output is the larger) and nothing at the reference,
    so t_1 gets 6 = 3 + 3 and its multiplier is 6 / 3 = 2; t_0 and t_2 get 0. The old rule (max_unpool) kept one
    window's share: 3, half the delta."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = nn.MaxPool1d(2, stride=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pool(x).sum(2)

    x = torch.tensor([[[1.0, 3.0, 2.0]]])
    assert torch.equal(hv.DeepLift(Net(), 0.0).attribute(x, 0), torch.tensor([[[0.0, 6.0, 0.0]]]))
    multipliers = hv.DeepLift(Net(), 0.0, multiply_by_inputs=False).attribute(x, 0)
    assert torch.equal(multipliers, torch.tensor([[[0.0, 2.0, 0.0]]]))
    # t' = [4, 0, 0]: window (t_0, t_1) has y = 3 < y' = 4, so the reference decides and its difference -1 goes to
    # the reference's selection t_0; window (t_1, t_2) has y = 3 > y' = 0 and sends 3 to t_1. Multipliers -1 / -3
    # and 3 / 3; the attributions [-1, 3, 0] sum to (3 - 4) + (3 - 0) = 2, where the gradient gives [0, 6, 0]
    a = hv.DeepLift(Net(), torch.tensor([[[4.0, 0.0, 0.0]]])).attribute(x, 0)
    torch.testing.assert_close(a, torch.tensor([[[-1.0, 3.0, 0.0]]]), rtol=2.0**-52, atol=0)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation", "ceil"),
    [(2, 2, 0, 1, False), (3, 3, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 0, 1, False), (3, 1, 1, 1, False),
     (3, 2, 1, 2, False), (3, 2, 0, 1, True), (2, 1, 0, 2, True)],
)  # fmt: skip
def test_max_pool_2d_is_exact_for_any_window(kernel: int, stride: int, padding: int, dilation: int, ceil: bool) -> None:
    torch.manual_seed(0)
    model = Pool(nn.MaxPool2d(kernel, stride, padding, dilation, ceil_mode=ceil)).eval()
    x, base = torch.randn(3, 3, 9, 9), 0.3 * torch.randn(1, 3, 9, 9)
    check_sum(model, x)
    check_sum(model, x, base, target=2)


@pytest.mark.parametrize(
    "pool",
    [
        (nn.MaxPool1d(3, 2, 1), 1),
        (nn.MaxPool3d(3, 2, 1), 3),
        (nn.AdaptiveMaxPool1d(4), 1),
        (nn.AdaptiveMaxPool2d((3, 4)), 2),
        (nn.AdaptiveMaxPool3d(2), 3),
        (lambda t: F.max_pool2d(t, 3, 2, 1), 2),
        (lambda t: torch.max_pool2d(t, 3, 1), 2),
        (lambda t: F.adaptive_max_pool2d(t, 3), 2),
        (lambda t: t.amax(-1, keepdim=True) - t.amin(-2, keepdim=True), 2),
        (lambda t: torch.max(t, dim=-1, keepdim=True).values + torch.min(t, 1)[0].unsqueeze(1), 2),
        (lambda t: torch.maximum(t, t.flip(-1)) + torch.minimum(t, 0.5 * t.roll(1, -1)), 2),
    ],
    ids=["1d", "3d", "adaptive1d", "adaptive2d", "adaptive3d", "F", "torch", "F.adaptive", "amax-amin", "max-min",
         "maximum-minimum"],
)  # fmt: skip
def test_every_pool_and_selection_is_exact(pool) -> None:
    fn, dims = pool
    torch.manual_seed(0)
    model = Pool(fn, dims).eval() if isinstance(fn, nn.Module) else _Wrapped(fn, dims).eval()
    shape = (3, 3) + (7,) * dims
    check_sum(model, torch.randn(shape), 0.2 * torch.randn((1, *shape[1:])), target=1)


class _Wrapped(Pool):
    def __init__(self, fn, dims: int) -> None:
        super().__init__(nn.Identity(), dims)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fn(F.relu(self.a(x)))
        return self.head(F.relu(self.b(h)).flatten(2).mean(2))


def test_max_pool_rule_is_deterministic() -> None:
    torch.manual_seed(0)
    model = Pool(nn.MaxPool2d(3, 1, 1)).eval()
    x = torch.randn(2, 3, 8, 8)
    first = hv.DeepLift(model).attribute(x, 0)
    assert torch.equal(first, hv.DeepLift(model).attribute(x, 0))


def test_product_split_by_hand() -> None:
    """z = x_0 * x_1 at x = [2, 3] against x' = [0, 1]: z - z' = 6 - 0 = 6, split as ((x_1 + x'_1) / 2) Δx_0 = 2 * 2
    = 4 and ((x_0 + x'_0) / 2) Δx_1 = 1 * 2 = 2 (the two-player Shapley values); the plain gradient would give
    x_1 Δx_0 + x_0 Δx_1 = 6 + 4 = 10."""

    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x[:, :1] * x[:, 1:]).view(-1, 1)

    a = hv.DeepLift(Net(), torch.tensor([[0.0, 1.0]])).attribute(torch.tensor([[2.0, 3.0]]), 0)
    assert torch.equal(a, torch.tensor([[4.0, 2.0]]))
    # a quotient x_0 / x_1: the reciprocal's secant -1 / (x_1 x'_1) = -1/3 is exact; Δ = 2/3 - 0 splits as
    # ((1/3 + 1) / 2) * 2 = 4/3 to x_0 and ((2 + 0) / 2) * (-1/3) * 2 = -2/3 to x_1

    class Quotient(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x[:, :1] / x[:, 1:]).view(-1, 1)

    a = hv.DeepLift(Quotient(), torch.tensor([[0.0, 1.0]])).attribute(torch.tensor([[2.0, 3.0]]), 0)
    torch.testing.assert_close(a, torch.tensor([[4 / 3, -2 / 3]]), rtol=4 * 2.0**-53, atol=0)


class Gates(nn.Module):
    """A squeeze-and-excitation gate (x * sigmoid(s(x))), a gated MLP (silu(g(x)) * u(x)), x * sigmoid(x) written
    out, a division by an activation, an in-place product and torch.addcmul of two activations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.squeeze, self.excite = nn.Linear(8, 4), nn.Linear(4, 8)
        self.g, self.u, self.d = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x))
        s = torch.sigmoid(self.excite(F.relu(self.squeeze(h.mean((2, 3))))))
        h = h * s[:, :, None, None]  # squeeze-and-excitation
        v = h.amax((2, 3))
        v = F.silu(self.g(v)) * self.u(v)  # gated MLP
        v = v * torch.sigmoid(v)  # x * sigmoid(x) written out
        v = v / (1.5 + torch.sigmoid(self.d(v)))  # a quotient of two activations
        w = v.clone()
        w *= torch.tanh(v)  # in place
        return self.head(torch.addcmul(v, w, torch.sigmoid(v), value=0.5))


def test_products_and_gates_are_exact() -> None:
    torch.manual_seed(0)
    model = Gates().eval()
    x = torch.randn(3, 3, 6, 6)
    check_sum(model, x)
    check_sum(model, x, 0.5 * torch.randn(1, 3, 6, 6), target=2)


class Block(nn.Module):
    """A transformer block with every operation written as users write it: LayerNorm, softmax attention (matmul and
    F.scaled_dot_product_attention with a causal mask), GELU, RMSNorm written out (x * rsqrt(mean(x^2) + eps)),
    GroupNorm, log_softmax at the end."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(3, d)
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.gn = nn.GroupNorm(2, d)
        self.rms = nn.RMSNorm(d)
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.flatten(2).transpose(1, 2))  # (N, L, d) tokens
        q, k, v = self.qkv(self.ln(h)).chunk(3, -1)
        p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        h = h + p @ v
        q, k, v = (t.unflatten(-1, (2, -1)).transpose(1, 2) for t in self.qkv(h).chunk(3, -1))
        h = h + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSNorm as LLaMA writes it
        h = h + self.mlp(self.rms(h))
        h = self.gn(h.transpose(1, 2)).transpose(1, 2)
        return F.log_softmax(self.head(h.mean(1)), dim=-1)


def test_transformer_operations_are_exact() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(3, 3, 4, 4)
    check_sum(model, x)
    check_sum(model, x, 0.5 * torch.randn(1, 3, 4, 4), target=3)
    # the forward pass's values are the model's own (softmax, the normalisations): the targets' scores as called
    dl = hv.DeepLift(model)
    dl.attribute(x, 1)
    with torch.no_grad():
        expected = model(x)[:, 1] - model(torch.zeros_like(x))[:, 1]
    sums = dl.last_delta[:, 0] + expected
    torch.testing.assert_close(sums, expected, rtol=0, atol=float(exact_tol(sums[:, None], expected, expected).max()))


def test_normalisation_at_a_constant_baseline_by_hand() -> None:
    """A zero baseline makes a bias-free layer's output zero, so LayerNorm's reference scale is 1/sqrt(eps), 316 times
    the input's. The scaled split takes the order in which the scale changes first, at the reference's centred value
    0: the centred input's multiplier is the input's own scale r and the scale gets nothing, so the map is the
    gradient of the LayerNorm with r held (by hand below), not two halves of +-158 times the product that cancel."""
    torch.manual_seed(0)
    lin, norm, head = nn.Linear(5, 6, bias=False), nn.LayerNorm(6, eps=1e-5), nn.Linear(6, 2)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    model = nn.Sequential(lin, norm, head).eval()
    x = torch.randn(2, 5)
    a = check_sum(model, x, 0.0, target=1)
    h = lin(x).detach()
    r = (h.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    centring = torch.eye(6) - 1 / 6
    multiplier = (head.weight[1] * norm.weight).detach() @ centring  # (6,): d y / d (centred h) with r held
    expected = x * ((r * multiplier) @ lin.weight.detach())
    torch.testing.assert_close(a, expected, rtol=1e-12, atol=1e-12)
    assert float(a.abs().max()) < 10 * float(expected.abs().max())


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_and_einsum_are_exact(batch_first: bool) -> None:
    """nn.MultiheadAttention runs as one F.multi_head_attention_forward call (rows on axis 1 when not batch_first):
    written out, with a key padding mask and the averaged weights asked for; and attention written with einsum."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 2, batch_first=batch_first)
            self.head = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
            pad[:, -1] = True  # the last key masked for every query
            t = x if batch_first else x.transpose(0, 1)
            o, w = self.attn(t, t, t, key_padding_mask=pad, need_weights=True)
            o = o if batch_first else o.transpose(0, 1)
            s = torch.einsum("bqd,bkd->bqk", o, x).softmax(-1)
            return self.head(torch.einsum("bqk,bkd->bqd", s, o).mean(1) + w.square().sum((1, 2))[:, None])

    x = torch.randn(3, 5, 4)
    check_sum(Net().eval(), x)
    check_sum(Net().eval(), x, 0.5 * torch.randn(1, 5, 4), target=1)
