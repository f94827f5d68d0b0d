"""Class activation maps from gradients at a layer: Grad-CAM and its family."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks import HookError, HookManager, select_modules
from ..targets import BackwardStrategy, Targets, TargetSpec, batched_grad, resolve_targets
from .base import Attribution, register

# Modules whose output is never a useful CAM layer: pooling (adaptive pooling may even upsample: VGG's
# AdaptiveAvgPool2d((7, 7)) on a 2x2 map), and modules that pass their input through.
_NOT_CAM_LAYERS = (
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.Dropout,
    nn.Dropout2d,
    nn.Identity,
    nn.Flatten,
)


def resolve_layer(model: nn.Module, layer: str | nn.Module) -> tuple[str, nn.Module]:
    """(name, module) for a CAM layer given as a dotted name or a module instance of `model`."""
    if isinstance(layer, str) and any(c in layer for c in "*?["):
        raise ValueError(f"layer must name one module, got the glob {layer!r}")
    if not isinstance(layer, str | nn.Module):
        raise TypeError(
            f"layer must be a dotted module name, a module of the model, or None; got {type(layer).__name__}"
        )
    try:
        return select_modules(model, layer)[0]
    except ValueError as exc:
        raise ValueError(f"layer: {exc}") from None


def choose_layer(model: nn.Module, x: Tensor) -> tuple[str, nn.Module]:
    """The last module, in order of completion, whose output is a 4-D (N, C, h, w) map with more than one pixel.

    Pooling layers (and containers whose output is a pooling layer's output) and pass-through modules are skipped,
    so this finds ``layer4`` in a ResNet, ``features`` in DenseNet / MobileNet / EfficientNet / ConvNeXt, and the last
    ReLU of ``features`` in VGG / AlexNet (whose ``features`` end in a max pool). Costs one forward of one sample.
    """
    records: list[tuple[str, nn.Module, Tensor]] = []
    pooled: set[int] = set()

    def on_output(name: str, module: nn.Module, args: Any, out: Any) -> None:
        if isinstance(out, Tensor) and out.dim() == 4 and out.shape[-1] * out.shape[-2] > 1:
            if isinstance(module, _NOT_CAM_LAYERS):
                pooled.add(id(out))
            records.append((name, module, out))

    with torch.no_grad(), HookManager(model) as hooks:
        hooks.forward(lambda name, module: name != "", on_output, with_name=True)
        model(x[:1])
    candidates = [(n, m) for n, m, out in records if id(out) not in pooled and not isinstance(m, _NOT_CAM_LAYERS)]
    if not candidates:
        raise ValueError(
            f"could not choose a CAM layer: no module of {type(model).__name__} outputs a 4-D (N, C, h, w) map with "
            "more than one pixel for this input; pass layer= (a module or its dotted name)"
        )
    return candidates[-1]


class CAMAttribution(Attribution):
    """Shared life cycle of CAM methods: activations A and gradients dy/dA at one layer -> (N, 1, h, w) maps.

    The layer's output is recorded and the model continues on a copy of it, so the map uses the layer's true output
    even when the model later modifies it in place (DenseNet's ``F.relu(features, inplace=True)``); the backward
    pass stops at the layer.

    Args:
        layer: a module of the model, its dotted name, or None to choose the last module with a 4-D output on the
            first call (see `choose_layer`; `repr` says which).
        call: which call of a layer module that runs several times in one forward (default -1: the last); a
            warning names the module when it ran more than once.
    """

    display_defaults = {"reduce": None, "mode": "minmax", "cmap": "jet", "overlay": True}

    def __init__(
        self,
        model: nn.Module,
        layer: str | nn.Module | None = None,
        *,
        call: int = -1,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        if not isinstance(call, int) or isinstance(call, bool):
            raise TypeError(f"call must be an int (index of the layer's call in the forward), got {call!r}")
        self.call = call
        self._layer: tuple[str, nn.Module] | None = None if layer is None else resolve_layer(model, layer)
        self._auto = layer is None

    @property
    def layer(self) -> str | None:
        """Dotted name of the layer explained (None until the first call when it is chosen automatically)."""
        return None if self._layer is None else self._layer[0]

    def attribute(self, inputs: Tensor, target: TargetSpec = None, *, upsample: bool = False) -> Tensor:
        """Maps of shape (N, 1, h, w) at the layer's resolution ((N, K, 1, h, w) with K targets per input);
        ``upsample=True`` resizes them bilinearly to the input's (H, W)."""
        x = self._check_inputs(inputs)
        cam, _ = self._explain(x, target)
        if upsample:
            cam = upsample_maps(cam, tuple(x.shape[-2:]))
        return cam

    def __repr__(self) -> str:
        how = " (chosen automatically)" if self._auto else ""
        layer = repr(self.layer) if self._layer else "None (chosen on the first call)"
        return f"{type(self).__name__}({type(self.model).__name__}, layer={layer}{how})"

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        """Channel weights (N, K, C, 1, 1) from activations (N, 1, C, h, w) and gradients (N, K, C, h, w)."""
        raise NotImplementedError

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        if self._layer is None:
            self._layer = choose_layer(self.model, x)
        name, module = self._layer
        acts: list[Tensor] = []

        def on_layer(mod: nn.Module, args: Any, out: Any) -> Tensor:
            if not isinstance(out, Tensor):
                raise HookError(
                    f"layer {name!r} returns {type(out).__name__}, not a tensor; choose a layer whose output is one "
                    "(N, C, h, w) tensor"
                )
            # Without a graph behind it (input and parameters need no grad) the output becomes a leaf; with one
            # (a module that runs twice) it stays a node, so gradients still reach the earlier calls.
            act = out if out.requires_grad else out.detach().requires_grad_(True)
            acts.append(act)
            return act.clone()

        hooks.forward(module, on_layer)
        targets = resolve_targets(target, self.model(x.detach()), x.shape[0])
        if not acts:
            raise RuntimeError(f"layer {name!r} did not run in the forward pass; choose a layer the model uses")
        if len(acts) > 1:
            warnings.warn(
                f"layer {name!r} ran {len(acts)} times in one forward pass; explaining call {self.call} "
                f"(set call= to choose another)",
                stacklevel=4,
            )
        try:
            act = acts[self.call]
        except IndexError:
            raise ValueError(f"call={self.call} but layer {name!r} ran {len(acts)} time(s)") from None
        if act.dim() != 4:
            raise ValueError(
                f"layer {name!r} outputs shape {tuple(act.shape)}; CAM methods need a (N, C, h, w) map, choose a "
                "convolutional layer"
            )
        (grads,) = batched_grad(targets.scores, [act], strategy=self.backward)
        # CAM arithmetic in float32 whatever the autocast dtype of the forward pass
        a = act.detach().float().unsqueeze(1)
        weights = self._weights(a, grads.float())
        cam = F.relu((weights * a).sum(dim=2, keepdim=True))
        return cam, targets


def upsample_maps(maps: Tensor, size: tuple[int, ...]) -> Tensor:
    """Bilinear resize of (..., 1, h, w) maps to `size` (H, W)."""
    lead = maps.shape[:-2]
    flat = maps.reshape(-1, 1, *maps.shape[-2:])
    out = F.interpolate(flat, size=size, mode="bilinear", align_corners=False)
    return out.reshape(*lead, *out.shape[-2:])


@register("gradcam")
class GradCAM(CAMAttribution):
    r"""Grad-CAM (Selvaraju et al., 2017, "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", arXiv:1610.02391).

    Channel weights are the spatial mean of the target's gradient at the layer output A, and the map is the ReLU
    of the weighted channel sum: $$ L = \mathrm{ReLU}(\sum_k \alpha_k A^k), \quad
    \alpha_k = \frac{1}{hw} \sum_{ij} \partial y_c / \partial A^k_{ij} $$. Result (N, 1, h, w).

    Example::

        cam = GradCAM(model, layer="layer4").attribute(x, target=281, upsample=True)
    """

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        return grads.mean(dim=(-2, -1), keepdim=True)
