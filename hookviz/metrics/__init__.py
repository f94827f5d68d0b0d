"""Metrics of attribution quality: localisation (pointing game, energy in the mask), faithfulness (RISE's deletion
and insertion), the sanity check of model randomisation, and `evaluate`, which tabulates them over a data set.

Every function is batched, runs on the model's (or the maps') device, and cites its paper and conventions.
"""

from .evaluate import METRICS, Evaluation, evaluate
from .faithfulness import auc, blur, deletion, insertion, perturbation_curves, rise_kernel
from .localisation import energy_in_mask, pointing_game
from .sanity import SanityReport, sanity_check, spearman

__all__ = [
    "METRICS",
    "Evaluation",
    "SanityReport",
    "auc",
    "blur",
    "deletion",
    "energy_in_mask",
    "evaluate",
    "insertion",
    "perturbation_curves",
    "pointing_game",
    "rise_kernel",
    "sanity_check",
    "spearman",
]
