"""Attribution methods, one file per family, all over the life cycle in `base`."""

from .attention import AttentionRollout, GradientRollout, RolloutAttribution
from .base import METHODS, Attribution, get_method, register, suggest_method
from .cam import (
    CAMAttribution,
    GradCAM,
    GradCAMPlusPlus,
    GuidedGradCAM,
    HiResCAM,
    LayerCAM,
    ScoreCAM,
    XGradCAM,
)
from .cam_layer import choose_layer
from .deeplift import DeepLift, DeepLiftShap
from .gradient import (
    InputGradientAttribution,
    InputXGradient,
    IntegratedGradients,
    Saliency,
)
from .guided import Deconvnet, GuidedBackprop, ReLUCoverage, ReLURuleAttribution
from .lrp import LRP, Composite, RelevanceAudit
from .noise import SmoothGrad, VarGrad
from .perturbation import RISE, Occlusion, PerturbationAttribution
from .shap import GradientShap
from .shapley import (
    Background,
    CoalitionAttribution,
    FeatureAblation,
    FeaturePermutation,
    KernelShap,
    Lime,
    PartitionShap,
    ShapleyValues,
    ShapleyValueSampling,
    grid_mask,
    superpixels,
)

__all__ = [
    "METHODS",
    "Attribution",
    "AttentionRollout",
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
    "CAMAttribution",
    "Deconvnet",
    "DeepLift",
    "DeepLiftShap",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientRollout",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "InputGradientAttribution",
    "InputXGradient",
    "IntegratedGradients",
    "LRP",
    "Composite",
    "RelevanceAudit",
    "LayerCAM",
    "Occlusion",
    "PerturbationAttribution",
    "RISE",
    "ReLUCoverage",
    "ReLURuleAttribution",
    "RolloutAttribution",
    "Saliency",
    "ScoreCAM",
    "SmoothGrad",
    "VarGrad",
    "XGradCAM",
    "choose_layer",
    "get_method",
    "register",
    "suggest_method",
]
