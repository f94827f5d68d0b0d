"""Attention rollouts on any transformer: the attention probabilities of each layer (also from fused kernels:
`capture`), rolled out (`rollout`: Abnar & Zuidema 2020) or weighted by the target's gradient
(`gradient_rollout`: Chefer et al. 2021), read out as maps or token scores (`readout`)."""

from .capture import AttentionCapture, AttentionNotVisible, Captured, attention_modules
from .gradient_rollout import GradientRollout, gradient_rollout_matrices
from .readout import RolloutAttribution
from .rollout import HEAD_FUSIONS, AttentionRollout, discard_lowest, fuse_heads, rollout_matrices

__all__ = [
    "HEAD_FUSIONS",
    "AttentionCapture",
    "AttentionNotVisible",
    "AttentionRollout",
    "Captured",
    "GradientRollout",
    "RolloutAttribution",
    "attention_modules",
    "discard_lowest",
    "fuse_heads",
    "gradient_rollout_matrices",
    "rollout_matrices",
]
