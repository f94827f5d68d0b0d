"""Gradient-weighted attention rollout (Chefer et al., 2021): relevance through the attention layers, weighted by
the target's gradient at each attention."""

from __future__ import annotations

import torch
from torch import Tensor

from ...targets import Targets, batched_grad
from ..base import register
from .capture import Captured
from .readout import RolloutAttribution, fusion_dtype


def gradient_rollout_matrices(probs: list[Tensor], grads: list[Tensor]) -> Tensor:
    r"""(N, K, T, T) from per-layer probabilities (N, H, T, T) and the target's gradients at them (N, K, H, T, T),
    first layer first: $$ \bar A_l = \mathbb{E}_h[(\nabla A_l \odot A_l)^+], \quad R_0 = I, \quad
    R_l = R_{l-1} + \bar A_l R_{l-1} $$."""
    dtype = fusion_dtype(probs[0])
    n, k = grads[0].shape[:2]
    t = probs[0].shape[-1]
    result = torch.eye(t, dtype=dtype, device=probs[0].device).expand(n, k, t, t)
    for a, g in zip(probs, grads, strict=True):
        cam = (g.to(dtype) * a.detach().to(dtype).unsqueeze(1)).clamp(min=0).mean(dim=2)
        result = result + cam @ result
    return result


@register("gradient-rollout")
class GradientRollout(RolloutAttribution):
    r"""Gradient-weighted attention rollout (Chefer, Gur & Wolf, 2021, "Generic Attention-model Explainability for
    Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV, https://arxiv.org/abs/2103.15679, Eq. 5-6).

    Per attention layer, the probabilities $A_l$ (N, H, T, T) weighted by the target score's gradient at them,
    clamped at zero per head *before* the heads are averaged (as Chefer et al.'s code does), then accumulated from
    the identity, the first layer first:
    $$ \bar A_l = \mathbb{E}_h[(\nabla A_l \odot A_l)^+], \qquad R \leftarrow R + \bar A_l R, \quad R_0 = I $$
    The map is the explained token's row of R (see `RolloutAttribution`): (N, 1, h, w) over the patch grid for
    images, (N, T) for token ids. The identity's 1 on the read-out token itself is dropped with the prefix tokens of
    an image model, and kept in a token model's scores (the read-out token's score is 1 plus what the layers add).
    K targets per input come from one forward pass (the K backward passes batched by `hookviz.targets.batched_grad`).

    The gradient at $A_l$ is the total derivative of the score through every later layer (what a hook on the
    attention's softmax output gives in the authors' code); in fused attention calls A is computed from the
    call's q and k and the output from A (see `hookviz.methods.attention.capture`), so the gradient is the eager
    path's.

    Example::

        maps = hookviz.GradientRollout(vit).attribute(x, target=3)   # (N, 1, h, w)
    """

    def _rollout(self, captured: list[Captured], targets: Targets) -> Tensor:
        grads = batched_grad(targets.scores, [c.node for c in captured], strategy=self.backward)
        return gradient_rollout_matrices(
            [c.probs for c in captured], [c.gradient(g) for c, g in zip(captured, grads, strict=True)]
        )
