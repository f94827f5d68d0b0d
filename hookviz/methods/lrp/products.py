"""The products the transformer rules see, computed as the model's calls compute them: a product of two activations
by kind (a matrix product, an elementwise product, a two-operand einsum), times a constant scale, and attention's
scores and probabilities from q, k and a mask (`gradient_ops`, `gradient_attention`)."""

from __future__ import annotations

import torch
from torch import Tensor


def _product(kind: str, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """`kind`: "matmul", "mul", or "einsum:<equation>" (a two-operand einsum: bilinear in its operands)."""
    if kind.startswith("einsum:"):
        z = torch.einsum(kind[7:], a, b)
    else:
        z = torch.matmul(a, b) if kind == "matmul" else torch.mul(a, b)
    return z if scale == 1.0 else z * scale


def attention_probabilities(q: Tensor, kt: Tensor, bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(scores ``scale q kᵀ``, masked scores, probabilities) computed as the decomposed calls compute them."""
    s = _product("matmul", q, kt, scale)
    sm = s if bias is None else s + bias
    return s, sm, torch.softmax(sm, -1)
