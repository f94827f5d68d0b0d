"""Input-gradient methods: the plain gradient of the target score w.r.t. the input."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..hooks import HookManager
from ..targets import Targets, batched_grad, resolve_targets
from .base import Attribution, register


class InputGradientAttribution(Attribution):
    """Differentiates the target score w.r.t. the input; subclasses place gradient rules in `_place_hooks`."""

    def _place_hooks(self, hooks: HookManager) -> None:
        """Place the method's hooks before the forward pass (none for the plain gradient)."""

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        self._place_hooks(hooks)
        # A fresh leaf over the caller's data: the caller's tensor is never given requires_grad or a .grad.
        inp = x.detach().requires_grad_(True)
        targets = resolve_targets(target, self.model(inp), x.shape[0])
        (grad,) = batched_grad(targets.scores, [inp], strategy=self.backward)
        return grad, targets


@register("saliency")
class Saliency(InputGradientAttribution):
    r"""Vanilla gradient (Simonyan et al., 2014, "Deep Inside Convolutional Networks", arXiv:1312.6034).

    $$ A = \partial y_c / \partial x $$, signed, shaped like the input (N, C, H, W); (N, K, C, H, W) with K
    targets per input. Take ``.abs()`` (or display with ``reduce="max-abs"``) for the paper's saliency map.

    Example::

        grads = hookviz.Saliency(model).attribute(x, target=281)
    """

    display_defaults = {"reduce": "max-abs", "mode": "minmax", "cmap": "gray", "overlay": False}
