"""Attribution methods, one file per family, all over the life cycle in `base`."""

from .base import METHODS, Attribution, get_method, register
from .cam import CAMAttribution, GradCAM, choose_layer
from .gradient import InputGradientAttribution, Saliency
from .guided import GuidedBackprop

__all__ = [
    "METHODS",
    "Attribution",
    "CAMAttribution",
    "GradCAM",
    "GuidedBackprop",
    "InputGradientAttribution",
    "Saliency",
    "choose_layer",
    "get_method",
    "register",
]
