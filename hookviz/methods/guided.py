"""ReLU-rule methods: the backward pass through every ReLU is rewritten."""

from __future__ import annotations

from torch import Tensor, nn

from ..hooks import HookManager, select_modules
from .base import register
from .gradient import InputGradientAttribution


def _clamp_positive(grad: Tensor) -> Tensor:
    return grad.clamp(min=0)


@register("guided-backprop")
class GuidedBackprop(InputGradientAttribution):
    r"""Guided Backpropagation (Springenberg et al., 2015, "Striving for Simplicity: The All Convolutional Net",
    arXiv:1412.6806).

    At every ReLU the gradient passed back is the incoming gradient clamped at zero times the forward mask:
    $$ R_{in} = [x > 0] \cdot \max(R_{out}, 0) $$. Result shaped like the input, (N, C, H, W).

    How: a forward hook on each ReLU module places a tensor hook on that call's output, which clamps the incoming
    gradient; the ReLU's own backward then applies the mask. Tensor hooks on forward outputs, not full backward
    hooks, because those break on ``nn.ReLU(inplace=True)`` (pytorch#61519); a hook per call also handles one ReLU
    module called several times in a forward (torchvision ResNet blocks).

    Example::

        GuidedBackprop(model).visualize("cat.png")   # shows itself in Jupyter
    """

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False}

    def __init__(self, model: nn.Module, **kwargs: object) -> None:
        super().__init__(model, **kwargs)  # type: ignore[arg-type]
        self._check_relus()

    def _check_relus(self) -> None:
        try:
            select_modules(self.model, nn.ReLU)
        except ValueError:
            raise ValueError(
                f"{type(self).__name__} rewrites the gradient at ReLU modules, but {type(self.model).__name__} has "
                "no nn.ReLU module: the result would silently be the plain gradient; use Saliency instead"
            ) from None

    def _place_hooks(self, hooks: HookManager) -> None:
        self._check_relus()

        def on_relu(module: nn.Module, args: tuple[object, ...], output: object) -> None:
            if isinstance(output, Tensor) and output.requires_grad:
                hooks.tensor(output, _clamp_positive)

        hooks.forward(nn.ReLU, on_relu)
