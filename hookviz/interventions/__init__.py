"""Interventions on the same hooks as attribution: edit module outputs (`intervene`), cache activations (`cache`),
activation patching (`patching`) and its gradient estimate (`attribution_patching`), and feature visualisation
(`FeatureVisualization`).

The provided edits of `intervene` are `zero`, `mean_ablate`, `scale`, `add` (steering) and `replace` (patching).
"""

from .attribution_patching import attribution_patching
from .cache import cache
from .edits import CallSite, Edit, add, mean_ablate, replace, scale, zero
from .featurevis import FeatureVisualization
from .intervene import Intervention, intervene
from .layout import edit_axes
from .patching import PatchingResult, patching

__all__ = [
    "CallSite",
    "Edit",
    "FeatureVisualization",
    "Intervention",
    "PatchingResult",
    "add",
    "attribution_patching",
    "cache",
    "edit_axes",
    "intervene",
    "mean_ablate",
    "patching",
    "replace",
    "scale",
    "zero",
]
