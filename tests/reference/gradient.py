"""Slow textbook references for the input-gradient family, in float64.

Each reference works on a float64 copy of the model (`double_copy`), loops over inputs, targets, noise samples and
path steps in Python, and differentiates one scalar at a time with `torch.autograd.grad`: nothing is batched, so
nothing can be mixed up between rows. They share no code with `hookviz.methods.gradient` or `hookviz.methods.noise`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .relu_rules import double_copy as double_copy  # re-exported: the tests use ref.double_copy
from .relu_rules import rule_copy

# attr_fn(model, x, cls): the attribution of class `cls` for one input x of shape (1, ...), in float64
AttrFn = Callable[[nn.Module, Tensor, int], Tensor]


def guided_copy(model: nn.Module) -> nn.Module:
    """A float64 copy with every nn.ReLU module replaced by the guided rule (functional relus are not covered)."""
    return rule_copy(model, "guided")


def gradient(model: nn.Module, x: Tensor, cls: int) -> Tensor:
    """d model(x)[0, cls] / dx for one input x (1, ...), float64."""
    xi = x.detach().double().requires_grad_(True)
    (g,) = torch.autograd.grad(model(xi)[0, cls], xi)
    return g


def input_x_gradient(model: nn.Module, x: Tensor, cls: int) -> Tensor:
    return x.double() * gradient(model, x, cls)


def per_input(model: nn.Module, x: Tensor, targets: Tensor, attr_fn: AttrFn) -> Tensor:
    """attr_fn for every input i and every target column k -> (N, K, ...), one input and one class at a time."""
    rows = []
    for i in range(x.shape[0]):
        rows.append(torch.stack([attr_fn(model, x[i : i + 1], int(c))[0] for c in targets[i]]))
    return torch.stack(rows)


def top_class(model: nn.Module, x: Tensor) -> Tensor:
    """(N, 1) argmax classes of model(x), computed one input at a time."""
    with torch.no_grad():
        return torch.tensor([[int(model(x[i : i + 1].double()).argmax())] for i in range(x.shape[0])])


def smoothgrad(
    model: nn.Module,
    x: Tensor,
    targets: Tensor,
    attr_fn: AttrFn,
    *,
    n: int,
    sigma: float,
    seed: int,
    squared: bool = False,
) -> Tensor:
    """SmoothGrad as hookviz documents its noise: n whole-batch draws ``randn(x.shape)`` in x's dtype from a cpu
    generator seeded with `seed`, copy s = x + sigma * (max - min per input) * eps_s; the attribution of each copy
    of each input (squared if asked) is averaged over the n copies. The noise is drawn in x's dtype (to replicate
    the draws of a float32 run) and used in float64."""
    g = torch.Generator().manual_seed(seed)
    x64 = x.double()
    total = torch.zeros(x.shape[0], targets.shape[1], *x.shape[1:], dtype=torch.float64)
    for _ in range(n):
        eps = torch.randn(x.shape, generator=g, dtype=x.dtype).double()
        for i in range(x.shape[0]):
            noise_level = sigma * float(x64[i].max() - x64[i].min())
            noisy = x64[i : i + 1] + noise_level * eps[i : i + 1]
            for k, c in enumerate(targets[i]):
                a = attr_fn(model, noisy, int(c))[0]
                total[i, k] += a * a if squared else a
    return total / n


def gauss_legendre(m: int) -> tuple[list[float], list[float]]:
    """Gauss-Legendre nodes and weights on [0, 1] by Golub-Welsch: the eigenvalues of the Jacobi matrix of the
    Legendre polynomials (off-diagonal k / sqrt(4k^2 - 1)) are the nodes on [-1, 1], and 2 v_0^2 the weights."""
    k = torch.arange(1, m, dtype=torch.float64)
    off = k / torch.sqrt(4 * k * k - 1)
    jacobi = torch.diag(off, 1) + torch.diag(off, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    weights = 2 * vectors[0] ** 2
    return ((nodes + 1) / 2).tolist(), (weights / 2).tolist()


def quadrature(method: str, m: int) -> tuple[list[float], list[float]]:
    """(alphas, weights) of each rule, written out by hand (the trapezoid rule is the true one, not captum's)."""
    if method == "riemann_left":
        return [j / m for j in range(m)], [1 / m] * m
    if method == "riemann_right":
        return [(j + 1) / m for j in range(m)], [1 / m] * m
    if method == "riemann_middle":
        return [(j + 0.5) / m for j in range(m)], [1 / m] * m
    if method == "riemann_trapezoid":  # the trapezoid rule on m points from 0 to 1
        return [j / (m - 1) for j in range(m)], [(0.5 if j in (0, m - 1) else 1.0) / (m - 1) for j in range(m)]
    if method == "gausslegendre":
        return gauss_legendre(m)
    raise ValueError(method)


def integrated_gradients(
    model: nn.Module, x: Tensor, targets: Tensor, baseline: Tensor, *, steps: int, method: str
) -> Tensor:
    """(x - x') * sum_j w_j grad(x' + alpha_j (x - x')), one input, one class and one step at a time."""
    alphas, weights = quadrature(method, steps)
    assert math.isclose(sum(weights), 1.0)
    x64, b64 = x.double(), baseline.double().expand_as(x)

    def ig(model: nn.Module, xi: Tensor, cls: int, i: int) -> Tensor:
        bi = b64[i : i + 1]
        total = torch.zeros_like(xi)
        for a, w in zip(alphas, weights, strict=True):
            total += w * gradient(model, bi + a * (xi - bi), cls)
        return (xi - bi) * total

    rows = []
    for i in range(x.shape[0]):
        rows.append(torch.stack([ig(model, x64[i : i + 1], int(c), i)[0] for c in targets[i]]))
    return torch.stack(rows)
