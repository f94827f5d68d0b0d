"""hookviz: interpretability for PyTorch, built on hooks.

One `HookManager` owns every hook the library places on a model; attribution methods (Saliency, Guided
Backpropagation, Deconvnet, Integrated Gradients, SmoothGrad, the Grad-CAM family) are built on it and return raw
tensors (`attribute`) or `Explanation` objects that show themselves in Jupyter (`visualize`).
"""

from importlib.metadata import PackageNotFoundError, version

from ._device import flush_checks
from .concepts import CRP, TCAV, TCAVResult
from .dataset import ExplanationStore, explain_dataset, load_explanations
from .explanation import Explanation
from .features import SAE, evaluate_sae, latent_attribution, latent_edges, splice, train_sae
from .figures import grid, save_figure
from .flow import Alarm, Alarms, FlowReport, FlowStats, GradientFlow, GradientFlowError, GradientFlowWarning
from .generation import GenerationExplanation, explain_generation, explain_generation_latents
from .hooks import HookError, HookManager, hook_counts, select_modules
from .images import IMAGENET, Batch, Preset, auto_preprocess, load_images
from .integrations.tracker import ExplanationTracker
from .intervention_figures import feature_grid, patching_figure
from .interventions import FeatureVisualization, attribution_patching, cache, intervene, patching
from .methods import (
    LRP,
    METHODS,
    RISE,
    AttentionRollout,
    Attribution,
    Background,
    Composite,
    Deconvnet,
    DeepLift,
    DeepLiftShap,
    FeatureAblation,
    FeaturePermutation,
    GradCAM,
    GradCAMPlusPlus,
    GradientRollout,
    GradientShap,
    GuidedBackprop,
    GuidedGradCAM,
    HiResCAM,
    InputXGradient,
    IntegratedGradients,
    KernelShap,
    LayerCAM,
    Lime,
    Occlusion,
    PartitionShap,
    RelevanceAudit,
    ReLUCoverage,
    Saliency,
    ScoreCAM,
    ShapleyValues,
    ShapleyValueSampling,
    SmoothGrad,
    VarGrad,
    XGradCAM,
    get_method,
    grid_mask,
    superpixels,
)
from .metrics import (
    Evaluation,
    SanityReport,
    deletion,
    energy_in_mask,
    evaluate,
    insertion,
    pointing_game,
    sanity_check,
)
from .record import ActivationRecorder, GradientRecorder

# the function shadows its subpackage on purpose: hv.report(...) is the API; `from hookviz.report import x` works
from .report import report, report_generation
from .targets import RowTarget, Targets, batched_grad
from .text import TokenExplanation

try:
    __version__ = version("hookviz")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "IMAGENET",
    "ActivationRecorder",
    "METHODS",
    "AttentionRollout",
    "Attribution",
    "Batch",
    "Alarm",
    "Alarms",
    "Evaluation",
    "Explanation",
    "FeatureVisualization",
    "ExplanationStore",
    "ExplanationTracker",
    "SAE",
    "FlowReport",
    "FlowStats",
    "Deconvnet",
    "DeepLift",
    "DeepLiftShap",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientRollout",
    "GenerationExplanation",
    "GradientShap",
    "GradientFlow",
    "GradientFlowError",
    "GradientFlowWarning",
    "GradientRecorder",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "InputXGradient",
    "IntegratedGradients",
    "LayerCAM",
    "LRP",
    "Composite",
    "RelevanceAudit",
    "Occlusion",
    "RISE",
    "Background",
    "FeatureAblation",
    "FeaturePermutation",
    "KernelShap",
    "Lime",
    "PartitionShap",
    "ShapleyValues",
    "ShapleyValueSampling",
    "grid_mask",
    "superpixels",
    "ReLUCoverage",
    "RowTarget",
    "HookError",
    "HookManager",
    "Preset",
    "Saliency",
    "SanityReport",
    "ScoreCAM",
    "SmoothGrad",
    "CRP",
    "TCAV",
    "TCAVResult",
    "Targets",
    "TokenExplanation",
    "VarGrad",
    "XGradCAM",
    "auto_preprocess",
    "attribution_patching",
    "batched_grad",
    "cache",
    "deletion",
    "energy_in_mask",
    "evaluate",
    "explain_dataset",
    "explain_generation",
    "explain_generation_latents",
    "flush_checks",
    "evaluate_sae",
    "latent_attribution",
    "latent_edges",
    "splice",
    "train_sae",
    "feature_grid",
    "grid",
    "get_method",
    "hook_counts",
    "insertion",
    "intervene",
    "load_explanations",
    "load_images",
    "report",
    "report_generation",
    "metrics",
    "patching",
    "patching_figure",
    "pointing_game",
    "sanity_check",
    "save_figure",
    "select_modules",
    "__version__",
]
