"""Model-agnostic attribution on one coalition engine (`coalitions`): forward passes only, batched on the device.

Shapley values (exact, sampled permutations, KernelSHAP, Owen values over a hierarchy), LIME, feature ablation and
permutation over groups of features (`groups`: grid patches, superpixels, tokens). See docs/model-agnostic.md.
"""

from .ablation import FeatureAblation
from .coalitions import Background, CoalitionAttribution
from .exact import ShapleyValues
from .groups import grid_mask, superpixels
from .kernel import KernelShap
from .lime import Lime
from .partition import PartitionShap
from .permutation import FeaturePermutation
from .sampling import ShapleyValueSampling

__all__ = [
    "Background",
    "CoalitionAttribution",
    "FeatureAblation",
    "FeaturePermutation",
    "KernelShap",
    "Lime",
    "PartitionShap",
    "ShapleyValueSampling",
    "ShapleyValues",
    "grid_mask",
    "superpixels",
]
