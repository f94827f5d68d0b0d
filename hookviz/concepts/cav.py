"""Concept activation vectors (CAVs) trained in torch on the activations' device, many at once.

Kim et al. (2018), "Interpretability Beyond Feature Attribution: Quantitative Testing with Concept Activation Vectors
(TCAV)", ICML, section 3.1: the CAV of a concept at a layer is the normal of a linear classifier that separates the
concept's activations from those of a random set, pointing towards the concept. Two classifiers:

- ``"logistic"`` (default): L2-regularised logistic regression with an unpenalised intercept, minimising
  ``mean_i log(1 + exp(-y_i (w . x_i + b))) + l2 / 2 |w|^2`` (labels +-1) on activations centred on the layer's
  mean activation and divided by the root-mean-square norm of the centred activations (one scalar per layer: the
  direction of w does not depend on the shift, which the intercept absorbs; the scale only makes `l2` mean the
  same at every layer). It is solved exactly (to float64 rounding) by Newton's method in the span of the training
  activations (w = sum_i alpha_i x_i, the representer theorem: the minimiser of an L2-regularised linear loss lies
  there), a fixed number of full-batch steps: (n + 1) unknowns per CAV for n examples, whatever the layer's width,
  all CAVs of one size solved as one batch. Deterministic: no sampling, no train/test split.
- ``"mean"``: the difference of the concept's and the random set's mean activations (the "fast CAV" of captum
  issue #1619; the direction of a nearest-centroid classifier).

Either way the CAV is returned with unit Euclidean length (the sign count does not depend on its length; the
magnitude score neither, being a ratio).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import torch
from torch import Tensor

__all__ = ["CAV_KINDS", "CAVKind", "train_cavs"]

CAVKind: TypeAlias = Literal["logistic", "mean"]
CAV_KINDS: tuple[str, ...] = ("logistic", "mean")
_EPS = 1e-12


def _work_dtype(device: torch.device) -> torch.dtype:
    # Newton's linear systems are solved in float64 where the device has it (MPS has not)
    return torch.float32 if device.type == "mps" else torch.float64


def train_cavs(
    acts: Tensor,
    positives: Tensor,
    negatives: Tensor,
    *,
    kind: CAVKind = "logistic",
    l2: float = 0.01,
    steps: int = 25,
) -> Tensor:
    """P CAVs at one layer, as a (P, D) float32 tensor of unit rows on `acts`' device.

    acts: (M, D) the layer's activations of every example of every set (concepts and random sets), one row each.
    positives: (P, n_pos) int64 rows of `acts` of each CAV's concept examples; negatives: (P, n_neg) those of its
    counter-examples (a row may appear in both: random sets drawn from one pool can overlap). CAV p points from
    the negatives towards the positives. For ``"logistic"``, `steps` Newton steps are taken (or fewer, when every
    problem has converged: the step changes no coefficient by more than 1e-10 relative).
    """
    if kind not in CAV_KINDS:
        raise ValueError(f"cav must be one of {', '.join(repr(k) for k in CAV_KINDS)}, got {kind!r}")
    dtype = _work_dtype(acts.device)
    x = acts.to(dtype)
    x = x - x.mean(0)
    scale = x.square().sum(1).mean().sqrt().clamp_min(_EPS)
    x = x / scale
    n_pos, n_neg = positives.shape[1], negatives.shape[1]
    if kind == "mean":
        ones = torch.ones(positives.shape[0], n_pos + n_neg, dtype=dtype, device=x.device)
        coef = torch.cat([ones[:, :n_pos] / n_pos, -ones[:, n_pos:] / n_neg], dim=1)
    else:
        coef = _logistic_coefficients(x, torch.cat([positives, negatives], 1), n_pos, l2, steps)
    # w = sum_i coef_i x_i for each problem: the coefficients scattered into (P, M) rows, then one matmul
    rows = torch.cat([positives, negatives], 1)
    weights = torch.zeros(rows.shape[0], x.shape[0], dtype=dtype, device=x.device)
    weights.scatter_add_(1, rows, coef)
    cavs = weights @ x
    return (cavs / cavs.norm(dim=1, keepdim=True).clamp_min(_EPS)).to(torch.float32)


def _logistic_coefficients(x: Tensor, rows: Tensor, n_pos: int, l2: float, steps: int) -> Tensor:
    """Per problem, alpha (P, n) with w = sum_i alpha_i x_rows[i], minimising the regularised logistic loss.

    With K the problem's Gram matrix, z = K alpha + b, r = sigmoid(z) - y (labels 1 / 0), s = sigmoid'(z), the
    gradient in alpha is K (r / n + l2 alpha) and the Hessian K S K / n + l2 K; a Newton step solves the system
    without the common factor K (which may be singular: n examples in fewer dimensions), a valid Newton step for w.
    """
    p, n = rows.shape
    gram = x @ x.T  # (M, M): every problem's Gram matrix is a block of it
    k = gram[rows[:, :, None], rows[:, None, :]]  # (P, n, n)
    y = torch.zeros(p, n, dtype=x.dtype, device=x.device)
    y[:, :n_pos] = 1.0
    alpha = torch.zeros(p, n, dtype=x.dtype, device=x.device)
    bias = torch.zeros(p, dtype=x.dtype, device=x.device)
    eye = torch.eye(n, dtype=x.dtype, device=x.device)
    system = torch.empty(p, n + 1, n + 1, dtype=x.dtype, device=x.device)
    for _ in range(steps):
        z = (k @ alpha[:, :, None]).squeeze(2) + bias[:, None]
        prob = torch.sigmoid(z)
        r = prob - y
        s = prob * (1.0 - prob) / n
        system[:, :n, :n] = s[:, :, None] * k + l2 * eye
        system[:, :n, n] = s
        system[:, n, :n] = (s[:, None, :] @ k).squeeze(1)
        system[:, n, n] = s.sum(1)
        rhs = torch.cat([-(r / n + l2 * alpha), -(r.sum(1, keepdim=True) / n)], dim=1)
        delta = torch.linalg.solve(system, rhs)
        alpha = alpha + delta[:, :n]
        bias = bias + delta[:, n]
        # one host read per step, not per problem: stop once no coefficient moves any more
        if float(delta.abs().max()) <= 1e-10 * (1.0 + float(alpha.abs().max())):
            break
    return alpha
