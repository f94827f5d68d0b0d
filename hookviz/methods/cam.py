"""Class activation maps at a layer: Grad-CAM and its family (Grad-CAM++, LayerCAM, XGradCAM, HiResCAM, Score-CAM,
Guided Grad-CAM), on convolutional maps and on the tokens of vision transformers."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._device import after_work
from ..hooks import HookError, HookManager, Selection
from ..layouts import Layout, LayoutSpec, check_layout, resolve_layout
from ..targets import (
    BackwardStrategy,
    TargetPlan,
    Targets,
    TargetSpec,
    aligned_scores,
    batched_grad,
    class_logits,
    resolve_targets,
)
from .base import Attribution, register
from .batch import acc_dtype
from .cam_layer import choose_layer, resolve_layer
from .forward import ForwardArgs, as_tuple
from .guided import GuidedBackprop
from .scope import acting, current_call

# (N, T, D) tokens -> (N, D, h, w); also applied to the gradients, so it must only rearrange
Reshape: TypeAlias = "tuple[int, int] | Callable[[Tensor], Tensor] | None"

UPSAMPLE_MODES: tuple[str, ...] = ("bilinear", "nearest", "bicubic")


def check_upsample(upsample: object, *, allow_off: bool = True) -> str | None:
    """The `F.interpolate` mode an ``upsample`` argument names: None for False, ``"bilinear"`` for True."""
    if isinstance(upsample, bool):
        if upsample or allow_off:
            return "bilinear" if upsample else None
    elif isinstance(upsample, str) and upsample in UPSAMPLE_MODES:
        return upsample
    allowed = ", ".join(map(repr, UPSAMPLE_MODES))
    raise ValueError(
        f"upsample must be {'False, ' if allow_off else ''}True (bilinear) or one of {allowed}; got {upsample!r}"
    )


def upsample_maps(maps: Tensor, size: tuple[int, ...], mode: str = "bilinear") -> Tensor:
    """Resize (..., 1, h, w) maps to `size` (H, W) with `F.interpolate`: ``mode`` "bilinear" (default) or "bicubic"
    with ``align_corners=False`` (bicubic may overshoot: values slightly below 0 or above the map's maximum are
    kept), or "nearest" (captum's default)."""
    mode = check_upsample(mode, allow_off=False)  # type: ignore[assignment]
    lead = maps.shape[:-2]
    flat = maps.reshape(-1, 1, *maps.shape[-2:])
    if mode == "nearest":
        out = F.interpolate(flat, size=size, mode="nearest")
    else:
        out = F.interpolate(flat, size=size, mode=mode, align_corners=False)
    return out.reshape(*lead, *out.shape[-2:])


class CAMAttribution(Attribution):
    r"""Shared life cycle of CAM methods: activations A and gradients dy/dA at one layer -> (N, 1, h, w) maps.

    The layer's output is recorded and the model continues on a copy of it, so the map uses the layer's true output
    even when the model later modifies it in place (DenseNet's ``F.relu(features, inplace=True)``); the backward
    pass stops at the layer. Subclasses give the weights (`_weights`); the map is
    $$ L = \mathrm{ReLU}(\sum_k w_k \odot A^k) $$, summed over channels, computed in float32 at least whatever the
    autocast dtype of the forward pass (results are float32; float64 for a float64 model).

    Layouts (`hookviz.layouts`): the layer's output is read as (N, C, h, w), as channels-last (N, h, w, C) (Swin
    stages), or as (N, T, D) tokens of dimension D whose first P (class / distillation / register tokens) are
    dropped and the other T - P, in row-major order, folded into an (h, w) grid; inferred from the output's shape,
    the input's size and the model (timm's ``num_prefix_tokens``, ``output_fmt``), or given by ``layout=``. A layer
    whose layout cannot be told raises an error naming ``layout=``; `layout_used` says what was read.

    A map that is zero for every sample gets a warning saying why (no gradient reaches the layer, or the weighted
    sum is negative everywhere) and which layer to try.

    Args:
        layer: a module of the model, its dotted name, or None to choose it on the first call (see `choose_layer`;
            `repr` says which).
        call: which call of a layer module that runs several times in one forward (default -1: the last); a
            warning names the module when it ran more than once.
        reshape: how to turn the layer's output into (N, C, h, w): None (4-D outputs as they are, 3-D token outputs
            folded into a square grid), ``(h, w)`` (token outputs folded into that grid), or a callable
            ``f(output) -> (M, C, h, w)`` applied to the layer's output (any layout, e.g. (N, H, W, C)) and to its
            gradients (batch N * K): it must only rearrange elements.
        prefix_tokens: the number P of tokens before the patch tokens; None: the model's ``num_prefix_tokens``
            where it has one, else the smallest P in 0..8 that leaves a grid of the input's aspect (square for a
            square input; ``ValueError`` when none does, or when several do and the smallest is not 0 or 1).
        layout: ``"nchw"``, ``"nhwc"``, ``"tokens"`` or a callable ``f(output) -> (N, C, h, w)`` (as
            pytorch-grad-cam's ``reshape_transform``); None (default) infers it. A callable `reshape` is the same
            as a callable `layout`.
    """

    display_defaults = {"reduce": None, "mode": "minmax", "cmap": "jet", "overlay": True}
    multi_input = True  # a tuple of inputs and additional_forward_args (not Score-CAM, Guided Grad-CAM)

    def __init__(
        self,
        model: nn.Module,
        layer: str | nn.Module | None = None,
        *,
        call: int = -1,
        reshape: Reshape = None,
        prefix_tokens: int | None = None,
        layout: LayoutSpec = None,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        check_layout(layout)
        if layout is not None and callable(reshape):
            raise ValueError("pass the callable as layout= or as reshape=, not both (they mean the same)")
        if not isinstance(call, int) or isinstance(call, bool):
            raise TypeError(f"call must be an int (index of the layer's call in the forward), got {call!r}")
        if reshape is not None and not callable(reshape):
            if not (
                isinstance(reshape, tuple)
                and len(reshape) == 2
                and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in reshape)
            ):
                raise TypeError(
                    f"reshape must be None, a (h, w) tuple of positive ints or a callable (N, T, D) -> (N, D, h, w); "
                    f"got {reshape!r}"
                )
        if prefix_tokens is not None and (
            not isinstance(prefix_tokens, int) or isinstance(prefix_tokens, bool) or prefix_tokens < 0
        ):
            raise ValueError(f"prefix_tokens must be None or an int >= 0, got {prefix_tokens!r}")
        self.call = call
        self.reshape = reshape
        self.prefix_tokens = prefix_tokens
        self.layout = layout
        self.layout_used: Layout | None = None  # the layout read on the last call
        self._layer: tuple[str, nn.Module] | None = None if layer is None else resolve_layer(model, layer)
        self._auto = layer is None

    @property
    def layer(self) -> str | None:
        """Dotted name of the layer explained (None until the first call when it is chosen automatically)."""
        return None if self._layer is None else self._layer[0]

    def attribute(  # type: ignore[override]
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetSpec = None,
        *,
        upsample: bool | str = False,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Tensor:
        """Maps of shape (N, 1, h, w) at the layer's resolution ((N, K, 1, h, w) with K targets per input).

        ``upsample`` resizes them to the input's (H, W) (the first input's, for a tuple): True or ``"bilinear"``
        (``align_corners=False``), ``"nearest"`` (as captum's ``LayerAttribution.interpolate`` default) or
        ``"bicubic"``; False keeps them. A tuple of inputs, `additional_forward_args` and `forward_kwargs` are passed
        to ``forward`` as in `Attribution.attribute`.
        """
        mode = check_upsample(upsample)
        x, kwargs, _ = self._call_args(inputs, additional_forward_args, forward_kwargs)
        cam, _ = self._explain(x, target, **kwargs)
        if mode is not None:
            cam = upsample_maps(cam, tuple(as_tuple(x)[0].shape[-2:]), mode)
        return cam

    def __repr__(self) -> str:
        how = " (chosen automatically)" if self._auto and self._layer else ""
        layer = repr(self.layer) if self._layer else "None (chosen on the first call)"
        return f"{type(self).__name__}({type(self.model).__name__}, layer={layer}{how})"

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        """Weights broadcastable to (N, K, C, h, w) from activations (N, 1, C, h, w) and gradients (N, K, C, h, w)."""
        raise NotImplementedError

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        act, targets, fold = self._record(x, target, kwargs.get("forward_args"))
        (grads,) = batched_grad(targets.scores, [act], strategy=self.backward)
        n, k = grads.shape[:2]
        # CAM arithmetic in float32 at least whatever the autocast dtype of the forward pass (float64 stays float64)
        acc = acc_dtype(act.dtype)
        a = fold(act.detach()).unsqueeze(1)
        g = fold(grads.flatten(0, 1)).unflatten(0, (n, k))
        cam = self._cam(a, g, acc)
        self._warn_if_empty(cam, g)
        return cam, targets

    def _cam(self, acts: Tensor, grads: Tensor, acc: torch.dtype) -> Tensor:
        """The maps (N, K, 1, h, w) in `acc` from activations (N, 1, C, h, w) and gradients (N, K, C, h, w) in the
        forward pass's dtype: both cast to `acc`, then `_weights` and the weighted sum."""
        a, g = acts.to(acc), grads.to(acc)
        return _weighted_sum(self._weights(a, g), a)

    def _warn_if_empty(self, cam: Tensor, grads: Tensor | None) -> None:
        """Warn when every map is exactly zero: a blank figure must not come without a reason. The flags are read
        after the work without a wait on an accelerator (`hookviz._device.after_work`)."""
        name, method = self.layer, type(self).__name__
        flags = torch.stack([cam.any(), grads.any() if grads is not None else cam.new_ones((), dtype=torch.bool)])

        def empty(values: list[Tensor]) -> str | None:
            any_map, any_grad = values[0].tolist()
            if any_map:
                return None
            if not any_grad:
                why = (
                    f"the target's gradient at layer {name!r} is zero for every sample: nothing from this layer's "
                    "spatial positions reaches the score (e.g. only the class token goes on to the head from here, or "
                    "the classifier's weights are zero, as in some untrained models)"
                )
                hint = "try an earlier layer, e.g. the LayerNorm before the last attention block"
            else:
                why = f"at layer {name!r} the weighted sum of the channels is <= 0 everywhere, so the ReLU "
                why += "leaves nothing"
                hint = "try another layer or target, or LayerCAM / HiResCAM"
            return f"{method}: every map is zero: {why}; {hint} (pass layer=)"

        after_work([flags], empty, method)

    def _record(
        self, x: Tensor | tuple[Tensor, ...], target: Any, forward_args: ForwardArgs | None = None
    ) -> tuple[Tensor, Targets, Layout]:
        """One forward pass of the input (or tuple of inputs) with the layer's output recorded.

        Returns the layer's output A (still attached to the graph), the resolved targets, and ``fold``, which maps
        A-shaped tensors with any batch size M to (M, C, h, w) maps (identity for convolutional layers).
        """
        xs = as_tuple(x)
        fwd = forward_args or ForwardArgs((), xs[0].shape[0])
        if self._layer is None:
            self._layer = choose_layer(self.model, xs, fwd)
        name, module = self._layer
        acts: list[Tensor] = []
        call = current_call()

        def on_layer(mod: nn.Module, args: Any, out: Any) -> Tensor | None:
            if not acting(call):
                return None  # the forward pass of another hookviz call nested inside this one
            if not isinstance(out, Tensor):
                raise HookError(
                    f"layer {name!r} returns {type(out).__name__}, not a tensor; choose a layer whose output is one "
                    "(N, C, h, w) or (N, T, D) tensor"
                )
            # Without a graph behind it (input and parameters need no grad) the output becomes a leaf; with one
            # (a module that runs twice) it stays a node, so gradients still reach the earlier calls.
            act = out if out.requires_grad else out.detach().requires_grad_(True)
            acts.append(act)
            return act.clone()

        # A manager of its own: the layer hook is gone before anything else runs the model (Score-CAM's masked
        # forwards, Guided Grad-CAM's guided pass).
        with HookManager(self.model) as layer_hooks:
            layer_hooks.forward(_placed(self.model, name, module), on_layer)
            output = fwd(self.model, [t.detach() for t in xs])
        targets = resolve_targets(target, output, xs[0].shape[0])
        if not acts:
            raise RuntimeError(f"layer {name!r} did not run in the forward pass; choose a layer the model uses")
        if len(acts) > 1:
            warnings.warn(
                f"layer {name!r} ran {len(acts)} times in one forward pass; explaining call {self.call} "
                f"(set call= to choose another)",
                stacklevel=5,
            )
        try:
            act = acts[self.call]
        except IndexError:
            raise ValueError(f"call={self.call} but layer {name!r} ran {len(acts)} time(s)") from None
        self.layout_used = self._fold(name, act, xs[0])
        return act, targets, self.layout_used

    def _fold(self, name: str, act: Tensor, x: Tensor) -> Layout:
        """The layer output's `Layout` (inferred, or checked against ``layout=`` / ``reshape=``)."""
        layout = self.layout if self.layout is not None else (self.reshape if callable(self.reshape) else None)
        grid = self.reshape if isinstance(self.reshape, tuple) else None
        module = self._layer[1] if self._layer is not None else None
        return resolve_layout(
            name,
            act,
            layout=layout,
            grid=grid,
            prefix_tokens=self.prefix_tokens,
            input_size=tuple(x.shape[-2:]) if x.dim() == 4 else None,  # type: ignore[arg-type]
            module=module,
            model=self.model,
            argname="layout" if self.layout is not None else "reshape",
        )


def _placed(model: nn.Module, name: str, module: nn.Module) -> Selection | nn.Module:
    """The layer as a resolved `Selection` where the model still holds it under its name (a look-up along the dotted
    name, not a walk of the whole model at every call); else the module, which `select_modules` looks for (and
    refuses with its message when the model no longer holds it)."""
    try:
        held = model.get_submodule(name) is module
    except AttributeError:
        held = False
    return Selection([(name, module)]) if held else module


def _weighted_sum(weights: Tensor, acts: Tensor) -> Tensor:
    r"""$$ \mathrm{ReLU}(\sum_k w_k A^k) $$: (N, K, 1, h, w) from weights and activations (N, 1, C, h, w)."""
    return F.relu((weights * acts).sum(dim=2, keepdim=True))


@register("gradcam")
class GradCAM(CAMAttribution):
    r"""Grad-CAM (Selvaraju et al., 2017, "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", https://arxiv.org/abs/1610.02391).

    Channel weights are the spatial mean of the target's gradient at the layer output A, and the map is the ReLU
    of the weighted channel sum: $$ L = \mathrm{ReLU}(\sum_k \alpha_k A^k), \quad
    \alpha_k = \frac{1}{hw} \sum_{ij} \partial y_c / \partial A^k_{ij} $$. Result (N, 1, h, w).

    Example::

        cam = GradCAM(model, layer="layer4").attribute(x, target=281, upsample=True)
    """

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        return grads.mean(dim=(-2, -1), keepdim=True)

    def _cam(self, acts: Tensor, grads: Tensor, acc: torch.dtype) -> Tensor:
        # Under autocast (bfloat16 / float16 activations) no float32 copy of either tensor: the mean accumulates in
        # `acc` and the product promotes to it elementwise, the same values as casting first (the cast is exact);
        # a subclass with weights of its own gets them from the cast tensors
        if type(self)._weights is not GradCAM._weights:
            return super()._cam(acts, grads, acc)
        weights = grads.mean(dim=(-2, -1), keepdim=True, dtype=acc)
        return _weighted_sum(weights, acts)


@register("gradcam++")
class GradCAMPlusPlus(CAMAttribution):
    r"""Grad-CAM++ (Chattopadhay et al., 2018, "Grad-CAM++: Improved Visual Explanations for Deep Convolutional
    Networks", https://arxiv.org/abs/1710.11063).

    With $g = \partial y_c / \partial A$ and the paper's exponential-score closed form (Eq. 19):
    $$ \alpha^k_{ij} = \frac{(g^k_{ij})^2}{2 (g^k_{ij})^2 + \sum_{ab} A^k_{ab} (g^k_{ij})^3}, \quad
    w_k = \sum_{ij} \alpha^k_{ij} \mathrm{ReLU}(g^k_{ij}), \quad L = \mathrm{ReLU}(\sum_k w_k A^k) $$
    with $\alpha = 0$ where $g = 0$ or the denominator is 0. Computed as the equal
    $\alpha = 1 / (2 + g \sum_{ab} A_{ab})$, which does not underflow for small gradients. As in most
    implementations, the positive factor $\exp(y_c)$ of the paper's weights is left out (it scales each map by
    one constant). Result (N, 1, h, w).

    Example::

        cam = GradCAMPlusPlus(model, layer="layer4").attribute(x, target=281)
    """

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        denom = 2 + grads * acts.sum(dim=(-2, -1), keepdim=True)  # (2 g^2 + sum(A) g^3) / g^2
        alpha = torch.where((grads != 0) & (denom != 0), 1 / denom, 0)
        return (alpha * F.relu(grads)).sum(dim=(-2, -1), keepdim=True)


@register("layercam")
class LayerCAM(CAMAttribution):
    r"""LayerCAM (Jiang et al., 2021, "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE Transactions on Image Processing 30, https://doi.org/10.1109/TIP.2021.3089943).

    Element-wise weights, the positive part of the gradient:
    $$ L = \mathrm{ReLU}(\sum_k \mathrm{ReLU}(\partial y_c / \partial A^k) \odot A^k) $$.
    Meant for shallow layers as well as deep ones. Result (N, 1, h, w).

    Example::

        cam = LayerCAM(model, layer="layer2").attribute(x, target=281, upsample=True)
    """

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        return F.relu(grads)


@register("xgradcam")
class XGradCAM(CAMAttribution):
    r"""XGrad-CAM (Fu et al., 2020, "Axiom-based Grad-CAM: Towards Accurate Visualization and Explanation of CNNs",
    https://arxiv.org/abs/2008.02312).

    Gradients weighted by the normalized activations:
    $$ w_k = \sum_{ij} \frac{A^k_{ij}}{\sum_{ab} A^k_{ab} + \epsilon} \frac{\partial y_c}{\partial A^k_{ij}},
    \quad L = \mathrm{ReLU}(\sum_k w_k A^k) $$, $\epsilon = 10^{-7}$. Result (N, 1, h, w).

    Example::

        cam = XGradCAM(model, layer="layer4").attribute(x, target=281)
    """

    eps = 1e-7

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        return (acts / (acts.sum(dim=(-2, -1), keepdim=True) + self.eps) * grads).sum(dim=(-2, -1), keepdim=True)


@register("hirescam")
class HiResCAM(CAMAttribution):
    r"""HiResCAM (Draelos & Carin, 2020, "Use HiResCAM instead of Grad-CAM for faithful explanations of
    convolutional neural networks", https://arxiv.org/abs/2011.08891).

    The gradient itself as element-wise weights: $$ L = \mathrm{ReLU}(\sum_k \partial y_c / \partial A^k \odot A^k)
    $$. Before the ReLU the map sums to $\sum_{kij} g^k_{ij} A^k_{ij}$, the layer's first-order contribution to
    the score; for a head that is global average pooling then linear it equals Grad-CAM. Result (N, 1, h, w).

    Example::

        cam = HiResCAM(model, layer="layer4").attribute(x, target=281)
    """

    def _weights(self, acts: Tensor, grads: Tensor) -> Tensor:
        return grads


@register("scorecam")
class ScoreCAM(CAMAttribution):
    r"""Score-CAM (Wang et al., 2020, "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural
    Networks", https://arxiv.org/abs/1910.01279). Forward passes only, no gradients.

    Each channel is upsampled (bilinear) to the input size and min-max normalized to [0, 1], masks the input, and
    its weight is the target's softmax probability on the masked input:
    $$ H^k = \frac{U(A^k) - \min U(A^k)}{\max U(A^k) - \min U(A^k)}, \quad
    w_k = \mathrm{softmax}(f(x \odot H^k))_c, \quad L = \mathrm{ReLU}(\sum_k w_k A^k) $$
    A constant channel gives $H^k = 0$ (the authors' code skips such channels instead). With a callable target the
    weight is the callable's score on the masked output, without softmax. Result (N, 1, h, w) at the layer's
    resolution like the rest of the family (the authors sum the upsampled maps, then apply the ReLU; ``upsample=True``
    applies it before upsampling), from N * C masked forward passes (C channels) for all K targets at once.

    Args:
        batch_size: masked inputs per forward pass (rows of all inputs and channels together); results do not
            depend on it (in eval mode). A callable target is called once per channel's masks, on an output whose
            row i belongs to input i (`hookviz.targets.aligned_scores`).

    Example::

        cam = ScoreCAM(model, layer="layer4", batch_size=32).attribute(x, target=281)
    """

    eps = 1e-8
    multi_input = False  # masks one image input

    def __init__(
        self, model: nn.Module, layer: str | nn.Module | None = None, *, batch_size: int = 64, **kwargs: Any
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (masked inputs per forward pass), got {batch_size!r}")
        super().__init__(model, layer, **kwargs)
        self.batch_size = batch_size

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        if x.dim() != 4:
            raise ValueError(
                f"{type(self).__name__} masks images: inputs must be (N, C, H, W), got shape {tuple(x.shape)}"
            )
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), x.shape[0])
        act, targets, fold = self._record(x, target, fwd)
        a = fold(act.detach()).to(acc_dtype(act.dtype))  # (N, C, h, w)
        weights = self._mask_scores(x.detach(), a, targets, target, fwd)  # (N, K, C)
        cam = _weighted_sum(weights[..., None, None], a.unsqueeze(1))
        self._warn_if_empty(cam, None)
        return cam, targets

    def _mask_scores(self, x: Tensor, a: Tensor, targets: Targets, plan: TargetPlan, fwd: ForwardArgs) -> Tensor:
        """(N, K, C) weights: the target's score on each of the N * C masked inputs, in chunks of `batch_size`."""
        n, c = a.shape[:2]
        k = targets.scores.shape[1]
        rows = a.flatten(0, 1).unsqueeze(1)  # (N * C, 1, h, w); row r is input r // C, channel r % C
        scores = torch.empty(n * c, k, dtype=a.dtype, device=a.device)
        with torch.no_grad():
            for start in range(0, n * c, self.batch_size):
                stop = min(start + self.batch_size, n * c)
                masks = F.interpolate(rows[start:stop], size=x.shape[-2:], mode="bilinear", align_corners=False)
                lo = masks.amin(dim=(-2, -1), keepdim=True)
                masks = (masks - lo) / (masks.amax(dim=(-2, -1), keepdim=True) - lo).clamp_min(self.eps)
                inputs = torch.arange(start, stop, device=x.device) // c
                out = fwd.rows(inputs)(self.model, (x[inputs] * masks,))
                if plan.fn is None:
                    idx = targets.indices[inputs]  # type: ignore[index]
                    scores[start:stop] = torch.softmax(class_logits(out).to(a.dtype), dim=1).gather(1, idx)
                else:
                    scores[start:stop] = _callable_rows(plan, out, inputs, k).to(a.dtype)
        return scores.view(n, c, k).transpose(1, 2)


def _callable_rows(plan: TargetPlan, out: Any, inputs: Tensor, k: int) -> Tensor:
    """(rows, k) scores of a callable target on the output of masked inputs (row j masks input ``inputs[j]``); the
    callable sees outputs of one row per user input (`aligned_scores`)."""
    rows = inputs.shape[0]
    s = aligned_scores(plan.take(inputs), out, rows, connected=False).scores
    if s.shape[1] != k:
        raise ValueError(
            f"the target callable returned {s.shape[1]} scores per input on the masked inputs but {k} on the inputs "
            "themselves; it must return the same (N,) or (N, K) each time"
        )
    return s


@register("guided-gradcam")
class GuidedGradCAM(GradCAM):
    r"""Guided Grad-CAM (Selvaraju et al., 2017, "Grad-CAM: Visual Explanations from Deep Networks via
    Gradient-based Localization", https://arxiv.org/abs/1610.02391, Sec. 3.1).

    Guided Backpropagation times the Grad-CAM map upsampled (U: bilinear, ``align_corners=False``, by default) to
    the input size: $$ G = \mathrm{GuidedBackprop}(x)_c \odot U(\mathrm{ReLU}(\sum_k \alpha_k A^k)) $$. Two passes
    (the guided ReLU rule would change the gradient that reaches the layer). Result shaped like the input,
    (N, C, H, W), or (N, K, C, H, W). Same conventions as captum's ``GuidedGradCam(model, layer).attribute(x,
    target, interpolate_mode="bilinear")`` (ReLU on the map, then upsampling); ``upsample="nearest"`` gives
    captum's default (``interpolate_mode="nearest"``).

    Args:
        upsample: how U resizes the map: ``"bilinear"`` (default; True means the same), ``"nearest"`` or
            ``"bicubic"``.

    Example::

        gg = GuidedGradCAM(model, layer="layer4").attribute(x, target=281)   # like x
    """

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False, "alpha_by_map": True}
    multi_input = False  # one image input, like its guided pass

    def __init__(
        self,
        model: nn.Module,
        layer: str | nn.Module | None = None,
        *,
        upsample: bool | str = "bilinear",
        **kwargs: Any,
    ) -> None:
        self.upsample: str = check_upsample(upsample, allow_off=False)  # type: ignore[assignment]
        super().__init__(model, layer, **kwargs)
        # the guided pass, through GuidedBackprop's public API (it raises ValueError for a model without ReLUs)
        self._guided = GuidedBackprop(model)

    attribute = Attribution.attribute  # already at the input's resolution: no upsample argument

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        if x.dim() != 4:
            raise ValueError(f"{type(self).__name__} needs image inputs (N, C, H, W), got shape {tuple(x.shape)}")
        cam, targets = super()._run(x, target, hooks, **kwargs)  # (N, K, 1, h, w)
        # the inputs are checked already and the classes are the output's: the guided pass takes them as they are
        plan = target if targets.indices is None else TargetPlan(targets.indices, None, targets.multi, from_output=True)
        self._guided.eval_mode, self._guided.backward = self.eval_mode, self.backward
        guided, _ = self._guided._explain(x, plan, **kwargs)
        guided = guided[0] if isinstance(guided, tuple) else guided  # one attribution per input tensor
        if not targets.multi:
            guided = guided.unsqueeze(1)
        return guided * upsample_maps(cam, tuple(x.shape[-2:]), self.upsample), targets
