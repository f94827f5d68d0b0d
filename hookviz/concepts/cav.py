"""Concept activation vectors (CAVs) trained in torch on the activations' device, many at once.

Kim et al. (2018), "Interpretability Beyond Feature Attribution: Quantitative Testing with Concept Activation Vectors
(TCAV)", ICML, section 3.1: the CAV of a concept at a layer is the normal of a linear classifier that separates the
concept's activations from those of a random set, pointing towards the concept. Two classifiers:

- ``"logistic"`` (default): L2-regularised logistic regression with an unpenalised intercept, minimising
  ``mean_i log(1 + exp(-y_i (w . x_i + b))) + l2 / 2 |w|^2`` (labels +-1) on activations centred on the layer's
  mean activation and divided by the root-mean-square norm of the centred activations (one scalar per layer: the
  direction of w does not depend on the shift, which the intercept absorbs; the scale only makes `l2` mean the
  same at every layer). It is solved by Newton's method in the span of the training activations (w = sum_i alpha_i
  x_i, the representer theorem: the minimiser of an L2-regularised linear loss lies there), full-batch steps until
  no coefficient moves (at most `steps`): (n + 1) unknowns per CAV for n examples, whatever the layer's width, all
  CAVs of one size solved as one batch. The Gram matrix comes from float32 products, the Newton systems are solved
  in float64. Deterministic: no sampling, no train/test split (captum's default holds a third of the examples out
  to report an accuracy; here every example trains the CAV).
- ``"mean"``: the difference of the concept's and the random set's mean activations (the "fast CAV" of captum
  issue #1619; the direction of a nearest-centroid classifier).

Either way the CAV is returned with unit Euclidean length (the sign count does not depend on its length; the
magnitude score neither, being a ratio).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    positives: Tensor | Sequence[Tensor],
    negatives: Tensor | Sequence[Tensor],
    *,
    kind: CAVKind = "logistic",
    l2: float = 0.01,
    steps: int = 25,
) -> Tensor:
    """P CAVs at one layer, as a (P, D) float32 tensor of unit rows on `acts`' device.

    acts: (M, D) the layer's activations of every example of every set (concepts and random sets), one row each.
    positives: each CAV's concept examples as int64 rows of `acts`, a (P, n_pos) tensor or P 1-D tensors (sizes may
    differ); negatives: those of its counter-examples (a row may appear in both: random sets drawn from one pool can
    overlap). CAV p points from the negatives towards the positives. For ``"logistic"``, `steps` Newton steps are
    taken (or fewer, once no coefficient of any problem moves by more than 1e-10 relative). The activations are
    centred and scaled once, the Gram matrix of all M rows computed once (float32 products, float64 solves), and
    problems of one size solved as one batch.
    """
    if kind not in CAV_KINDS:
        raise ValueError(f"cav must be one of {', '.join(repr(k) for k in CAV_KINDS)}, got {kind!r}")
    pos, neg = list(positives), list(negatives)
    if len(pos) != len(neg):
        raise ValueError(f"positives and negatives must describe as many CAVs, got {len(pos)} and {len(neg)}")
    work = _work_dtype(acts.device)
    x = acts if acts.dtype == torch.float64 else acts.float()
    x = x - x.mean(0)
    x = x / x.square().sum(1).mean().sqrt().clamp_min(_EPS)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (p, q) in enumerate(zip(pos, neg, strict=True)):
        groups.setdefault((p.shape[0], q.shape[0]), []).append(i)
    gram = (x @ x.T).to(work) if kind == "logistic" else None  # every problem's Gram matrix is a block of it
    # w = sum_i coef_i x_i for each problem: the coefficients scattered into (P, M) rows, then one matmul
    weights = torch.zeros(len(pos), x.shape[0], dtype=work, device=x.device)
    for (n_pos, n_neg), members in groups.items():
        rows = torch.stack([torch.cat([pos[i], neg[i]]) for i in members]).to(x.device)
        if gram is None:
            coef = torch.cat([torch.full((n_pos,), 1.0 / n_pos), torch.full((n_neg,), -1.0 / n_neg)])
            coef = coef.to(device=x.device, dtype=work).expand(len(members), -1).contiguous()
        else:
            coef = _logistic_coefficients(gram, rows, n_pos, l2, steps)
        index = torch.tensor(members, device=x.device)
        weights[index] = weights[index].scatter_add(1, rows, coef)
    cavs = weights.to(x.dtype) @ x
    return (cavs / cavs.norm(dim=1, keepdim=True).clamp_min(_EPS)).to(torch.float32)


def _logistic_coefficients(gram: Tensor, rows: Tensor, n_pos: int, l2: float, steps: int) -> Tensor:
    """Per problem, alpha (P, n) with w = sum_i alpha_i x_rows[i], minimising the regularised logistic loss.

    With K the problem's Gram matrix, z = K alpha + b, r = sigmoid(z) - y (labels 1 / 0), s = sigmoid'(z), the
    gradient in alpha is K (r / n + l2 alpha) and the Hessian K S K / n + l2 K; a Newton step solves the system
    without the common factor K (which may be singular: n examples in fewer dimensions), a valid Newton step for w.
    """
    p, n = rows.shape
    k = gram[rows[:, :, None], rows[:, None, :]]  # (P, n, n)
    y = torch.zeros(p, n, dtype=gram.dtype, device=gram.device)
    y[:, :n_pos] = 1.0
    alpha = torch.zeros(p, n, dtype=gram.dtype, device=gram.device)
    bias = torch.zeros(p, dtype=gram.dtype, device=gram.device)
    eye = torch.eye(n, dtype=gram.dtype, device=gram.device)
    system = torch.empty(p, n + 1, n + 1, dtype=gram.dtype, device=gram.device)
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
