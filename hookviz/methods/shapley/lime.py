"""Lime: a weighted linear surrogate of the model over random coalitions of feature groups."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..._checks import number_at_least, positive_int
from ..._device import to_device
from ..base import register
from .coalitions import CoalitionAttribution, Coalitions, solve_host_matrix


def weighted_ridge(z: Tensor, w: Tensor, y: Tensor, alpha: float) -> Tensor:
    """Coefficients (M, R) of sum_s w_s (y_s - b - z_s . beta)^2 + alpha |beta|^2 with an unpenalised intercept b
    (scikit-learn's ``Ridge(alpha).fit(z, y, sample_weight=w)``), float64, one solve for all R outputs.

    `z` (S, M) and `w` (S,) on the host (as drawn: the normal matrix is built and factored there, without a wait,
    `solve_host_matrix`), `y` (S, R) on the model's device."""
    dev = y.device
    wn = w / w.sum()
    zc = z - wn @ z
    yc = y - to_device(wn, dev) @ y
    wz = w[:, None] * zc
    a = zc.T @ wz + alpha * torch.eye(z.shape[1], dtype=z.dtype)  # on the host, as z
    b = to_device(wz, dev).T @ yc
    return solve_host_matrix(a, b)  # alpha = 0 and too few distinct coalitions: the least-norm solution


@register("lime")
class Lime(CoalitionAttribution):
    r"""LIME (Ribeiro et al., 2016, "'Why Should I Trust You?': Explaining the Predictions of Any Classifier", KDD):
    the coefficients of a linear model fitted to the target score on random coalitions of the groups (the
    interpretable binary features), weighted by their closeness to the input.

    Samples: the input itself (all groups on) and ``n_samples - 1`` coalitions with each group on with probability
    1/2 (captum's and lime's default sampling). Weights: the exponential kernel $\exp(-d^2 / (2 w^2))$ (lime's
    ``sqrt(exp(-d^2 / w^2))``, captum's default kernel) of the distance d between a coalition's 0/1 vector z and the
    all-ones vector: ``"cosine"`` (default, lime's image explainer: $d = 1 - \sqrt{|z| / M}$, width 0.25) or
    ``"euclidean"`` ($d = \sqrt{M - |z|}$, width $0.75 \sqrt{M}$, lime's tabular default). captum measures the cosine
    distance between the inputs themselves instead, and fits a Lasso by default. Fit: ridge regression with an
    unpenalised intercept (``alpha``, lime's default 1; 0: least squares), solved in float64 in torch for all N x K
    outputs at once. An estimate of a local surrogate, neither Shapley values nor efficient.

    Args:
        n_samples: coalitions per input (the input itself included).
        distance: ``"cosine"`` or ``"euclidean"`` (on the 0/1 coalition vectors).
        kernel_width: the kernel's width w; None: 0.25 (cosine) or 0.75 sqrt(M) (euclidean).
        alpha: the ridge penalty (>= 0).
        others: `CoalitionAttribution`.

    Cost: n_samples x N (x B) rows forward, plus N.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        n_samples: int = 1000,
        distance: str = "cosine",
        kernel_width: float | None = None,
        alpha: float = 1.0,
        **options: Any,
    ) -> None:
        super().__init__(model, **options)
        self.n_samples = positive_int("n_samples", n_samples, "coalitions per input")
        if distance not in ("cosine", "euclidean"):
            raise ValueError(f"distance must be 'cosine' or 'euclidean', got {distance!r}")
        self.distance = distance
        self.kernel_width = (
            None if kernel_width is None else number_at_least("kernel_width", kernel_width, 1e-12, "the kernel width")
        )
        self.alpha = number_at_least("alpha", alpha, 0.0, "the ridge penalty")

    def coalitions(self, m: int, generator: torch.Generator) -> Tensor:
        """The (n_samples, M) coalitions a call uses: all ones first, then Bernoulli(1/2) draws."""
        drawn = torch.rand(self.n_samples - 1, m, generator=generator) < 0.5
        return torch.cat([torch.ones(1, m, dtype=torch.bool), drawn])

    def kernel(self, z: Tensor) -> Tensor:
        """The (S,) similarity weights of the coalitions `z` (S, M)."""
        m = z.shape[1]
        on = z.double().sum(1)
        if self.distance == "cosine":
            d = 1 - torch.sqrt(on / m)
            width = 0.25 if self.kernel_width is None else self.kernel_width
        else:
            d = torch.sqrt(m - on)
            width = 0.75 * math.sqrt(m) if self.kernel_width is None else self.kernel_width
        return torch.exp(-(d**2) / (2 * width**2))

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        z = self.coalitions(engine.m, generator)
        v = engine.values(z, "samples")  # (S, N, K)
        zd = z.double()  # the design on the host, where it was drawn (`weighted_ridge`)
        beta = weighted_ridge(zd, self.kernel(zd), v.flatten(1), self.alpha)  # (M, N K)
        return beta.T.reshape(*clean.shape, engine.m)
