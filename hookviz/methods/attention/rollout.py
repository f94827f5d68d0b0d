"""Attention rollout (Abnar & Zuidema, 2020): the attention of every layer, with the residual, multiplied through."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import torch
from torch import Tensor, nn

from ...targets import Targets
from ..base import register
from .capture import Captured
from .readout import RolloutAttribution, fusion_dtype

HeadFusion: TypeAlias = Literal["mean", "max", "min"]
HEAD_FUSIONS: tuple[str, ...] = ("mean", "max", "min")


def fuse_heads(probs: Tensor, head_fusion: str) -> Tensor:
    """(N, H, T, T) -> (N, T, T): the mean, max or min over the heads."""
    if head_fusion == "mean":
        return probs.mean(dim=1)
    if head_fusion == "max":
        return probs.amax(dim=1)
    return probs.amin(dim=1)


def discard_lowest(fused: Tensor, ratio: float) -> Tensor:
    """(N, T, T) with the lowest ``int(T * T * ratio)`` weights of each matrix set to zero, except entry (0, 0), the
    class token's weight on itself (spared, not replaced by the next lowest: as the reference implementation does)."""
    flat = fused.flatten(1)
    count = int(flat.shape[1] * ratio)
    if count == 0:
        return fused
    idx = flat.topk(count, dim=1, largest=False).indices
    kept = torch.where(idx == 0, flat.gather(1, idx), torch.zeros((), dtype=flat.dtype, device=flat.device))
    return flat.scatter(1, idx, kept).view_as(fused)


def rollout_matrices(probs: list[Tensor], head_fusion: str = "mean", discard_ratio: float = 0.0) -> Tensor:
    r"""(N, T, T) rollout of per-layer attention probabilities (N, H, T, T), first layer first in the list:
    $$ \tilde A_l = \mathrm{rows}(0.5 \, \mathrm{drop}(\mathrm{fuse}_h A_l) + 0.5 I), \quad
    R = \tilde A_L \cdots \tilde A_1 $$ (rows: each row divided by its sum)."""
    dtype = fusion_dtype(probs[0])
    n, _, t, _ = probs[0].shape
    eye = torch.eye(t, dtype=dtype, device=probs[0].device)
    result = eye.expand(n, t, t)
    for a in probs:
        fused = discard_lowest(fuse_heads(a.detach().to(dtype), head_fusion), discard_ratio)
        step = 0.5 * fused + 0.5 * eye
        step = step / step.sum(dim=-1, keepdim=True)
        result = step @ result
    return result


@register("attention-rollout")
class AttentionRollout(RolloutAttribution):
    r"""Attention rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers", ACL,
    https://arxiv.org/abs/2005.00928).

    Per attention layer l, the heads' probabilities $A_l$ (N, H, T, T) are fused (``head_fusion``: mean, max or min
    over the heads), the lowest ``discard_ratio`` fraction of the fused weights set to zero, the residual added as
    the identity and the rows normalised; the layers are multiplied, the first rightmost:
    $$ \tilde A_l = \mathrm{rows}(0.5\,\mathrm{drop}(\mathrm{fuse}_h A_l) + 0.5\,I), \qquad
    R = \tilde A_L \cdots \tilde A_2 \tilde A_1 $$
    The map is the explained token's row of R (see `RolloutAttribution`): (N, 1, h, w) over the patch grid for
    images, (N, T) for token ids. It does not depend on the target (an (N, K) target repeats it K times).

    Conventions, against the common reference implementation (jacobgil/vit-explain, ``vit_rollout.py``), and why:

    - discarding: per input, the ``int(T * T * discard_ratio)`` lowest fused weights are zeroed, except the class
      token's weight on itself (entry (0, 0)), which the reference spares (it drops index 0 from the chosen ones
      without choosing another): zeroing it would cut the class token's own residual path, which the paper's
      rollout keeps; the reference's choice is followed so maps compare with the ones people know. Unlike the
      reference, every input of the batch is discarded on its own (the reference discards on the first only);
    - normalisation: each row of ``0.5 A + 0.5 I`` is divided by its own sum, as the paper says (the reference's
      ``a / a.sum(dim=-1)`` broadcasts the row sums along the wrong axis, which leaves rows that do not sum to 1).

    Args:
        head_fusion: ``"mean"`` (default, the paper's), ``"max"`` or ``"min"``.
        discard_ratio: the fraction in [0, 1) of the lowest fused weights zeroed per layer (default 0: none).
        token, eval_mode, backward: as in `RolloutAttribution` and `Attribution`.

    Example::

        maps = hookviz.AttentionRollout(vit, discard_ratio=0.9).attribute(x)   # (N, 1, h, w)
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        head_fusion: HeadFusion = "mean",
        discard_ratio: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(head_fusion, str) or head_fusion not in HEAD_FUSIONS:
            raise ValueError(f"head_fusion must be one of {', '.join(map(repr, HEAD_FUSIONS))}; got {head_fusion!r}")
        if (
            isinstance(discard_ratio, bool)
            or not isinstance(discard_ratio, int | float)
            or not 0.0 <= float(discard_ratio) < 1.0
        ):
            raise ValueError(
                f"discard_ratio must be a number in [0, 1) (the fraction of the lowest attention weights zeroed per "
                f"layer), got {discard_ratio!r}"
            )
        super().__init__(model, **kwargs)
        self.head_fusion = head_fusion
        self.discard_ratio = float(discard_ratio)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({type(self.model).__name__}, head_fusion={self.head_fusion!r}, "
            f"discard_ratio={self.discard_ratio})"
        )

    def _rollout(self, captured: list[Captured], targets: Targets) -> Tensor:
        r = rollout_matrices([c.probs for c in captured], self.head_fusion, self.discard_ratio)
        return r.unsqueeze(1).expand(-1, targets.scores.shape[1], -1, -1)
