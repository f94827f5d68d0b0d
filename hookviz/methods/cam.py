"""Class activation maps at a layer: Grad-CAM and its family (Grad-CAM++, LayerCAM, XGradCAM, HiResCAM, Score-CAM,
Guided Grad-CAM), on convolutional maps and on the tokens of vision transformers."""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks import HookError, HookManager, select_modules
from ..targets import BackwardStrategy, TargetPlan, Targets, TargetSpec, batched_grad, resolve_targets
from .base import Attribution, register
from .forward import ForwardArgs, as_tuple
from .guided import GuidedBackprop
from .scope import acting, active_call, current_call

# (N, T, D) tokens -> (N, D, h, w); also applied to the gradients, so it must only rearrange
Reshape: TypeAlias = "tuple[int, int] | Callable[[Tensor], Tensor] | None"

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
_MAX_PREFIX_TOKENS = 8  # class, distillation and register tokens tried when folding tokens into a grid


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


def _is_attention(module: nn.Module) -> bool:
    return isinstance(module, nn.MultiheadAttention) or "attention" in type(module).__name__.lower()


def choose_layer(
    model: nn.Module, x: Tensor | tuple[Tensor, ...], forward_args: ForwardArgs | None = None
) -> tuple[str, nn.Module]:
    """The CAM layer of `model` for inputs like `x`: the last convolutional map, or the last attention block's input.

    Convolutional maps: the last module, in order of completion, whose output is a 4-D (N, C, h, w) map with more
    than one pixel. Pooling layers (and containers whose output is a pooling layer's output) and pass-through
    modules are skipped, so this finds ``layer4`` in a ResNet, ``features`` in DenseNet / MobileNet / EfficientNet /
    ConvNeXt, and the last ReLU of ``features`` in VGG / AlexNet (whose ``features`` end in a max pool).

    Tokens: when a LayerNorm whose (N, T, D) output feeds a self-attention module runs after the last such map (a
    vision transformer, whose patch embedding is the only 4-D map), the LayerNorm feeding the last self-attention
    is chosen (torchvision ``VisionTransformer``: ``encoder.layers.encoder_layer_{L-1}.ln_1``). Not the final
    ``encoder.ln``: only the class token goes on from there to the head, so the gradient at every patch token is
    zero there and every map would be empty; before the last attention, the patch tokens still reach the class
    token. Attention modules are ``nn.MultiheadAttention`` and modules whose class name contains "Attention".

    The probe is one forward pass of `x` as given (the whole batch: what the explained forward pass sees, so a
    layout the model rejects fails as the model's own forward does, with a note), without gradients and with every
    module in eval mode, so the choice depends neither on the batch nor on the model's modes, and BatchNorm
    statistics are left alone; the modes are restored afterwards. The probe is an active call (`scope`): hooks of
    an enclosing hookviz call do not act on it.
    """
    records: list[tuple[int, str, nn.Module]] = []  # 4-D maps, with their completion order
    pooled: dict[int, weakref.ref[Tensor]] = {}  # outputs of pooling / pass-through modules, by id
    norms: dict[int, tuple[int, str, nn.Module, weakref.ref[Tensor]]] = {}  # LayerNorms with a 3-D output, by id
    attention_inputs: list[int] = []  # ids of the inputs of attention modules, in call order
    order = [0]

    def known(table: dict[int, Any], t: Tensor) -> Any:
        # weak references: no activation is kept alive, and an id reused by a later tensor is not mistaken for it
        entry = table.get(id(t))
        ref = entry[-1] if isinstance(entry, tuple) else entry
        return entry if ref is not None and ref() is t else None

    def on_output(name: str, module: nn.Module, args: Any, out: Any) -> None:
        if not acting(call):
            return
        order[0] += 1
        if not isinstance(out, Tensor):
            return
        if out.dim() == 4 and out.shape[-1] * out.shape[-2] > 1:
            if isinstance(module, _NOT_CAM_LAYERS):
                pooled[id(out)] = weakref.ref(out)
            elif known(pooled, out) is None:  # containers whose output is a pooling layer's are skipped
                records.append((order[0], name, module))
        elif out.dim() == 3 and isinstance(module, nn.LayerNorm):
            norms[id(out)] = (order[0], name, module, weakref.ref(out))

    def on_attention(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not acting(call):
            return
        query = args[0] if args else kwargs.get("query", kwargs.get("hidden_states"))
        if isinstance(query, Tensor):
            norm = known(norms, query)
            if norm is not None:
                attention_inputs.append(norm[:3])

    modes = [(m, m.training) for m in model.modules()]
    try:
        with active_call() as call, torch.no_grad(), HookManager(model) as hooks:
            model.eval()
            hooks.forward(lambda name, module: name != "", on_output, with_name=True)
            if any(_is_attention(m) for m in model.modules()):
                hooks.forward_pre(lambda name, module: _is_attention(module), on_attention, with_kwargs=True)
            xs = as_tuple(x)
            try:
                (forward_args or ForwardArgs((), xs[0].shape[0]))(model, xs)
            except Exception as exc:
                exc.add_note(
                    f"hookviz: raised while choosing a CAM layer automatically (one forward pass of the inputs as "
                    f"given, shape {', '.join(str(tuple(t.shape)) for t in xs)}); the model's forward must accept "
                    "them as a batch (N, ...)"
                )
                raise
    finally:
        for m, training in modes:
            m.training = training
    maps = records
    tokens = attention_inputs
    if tokens and (not maps or tokens[-1][0] > maps[-1][0]):
        return tokens[-1][1:]
    if not maps:
        raise ValueError(
            f"could not choose a CAM layer: no module of {type(model).__name__} outputs a 4-D (N, C, h, w) map with "
            "more than one pixel for this input, and no LayerNorm feeds a self-attention module; pass layer= (a "
            "module or its dotted name)"
        )
    return maps[-1][1:]


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


def _fold_tokens(tokens: Tensor, prefix: int, h: int, w: int) -> Tensor:
    """(M, T, D) row-major patch tokens after `prefix` class/register tokens -> (M, D, h, w)."""
    return tokens[:, prefix:].transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)


def _token_grid(name: str, tokens: int, size: tuple[int, int] | None, prefix: int | None) -> tuple[int, int, int]:
    """(prefix tokens P, h, w) for a layer with `tokens` tokens; see `CAMAttribution` (reshape, prefix_tokens)."""
    fix = "pass reshape=(h, w) and/or prefix_tokens= (the number of class/register tokens before the patches)"
    if size is not None:
        p = tokens - size[0] * size[1] if prefix is None else prefix
        if p < 0 or tokens - p != size[0] * size[1]:
            raise ValueError(
                f"layer {name!r} outputs {tokens} tokens, which reshape={size} with {p} prefix tokens cannot fold: "
                f"{tokens} - {p} != {size[0]} * {size[1]}; {fix}"
            )
        return p, *size
    if prefix is not None:
        candidates = [prefix] if prefix < tokens and math.isqrt(tokens - prefix) ** 2 == tokens - prefix else []
        if not candidates:
            raise ValueError(
                f"layer {name!r} outputs {tokens} tokens; with prefix_tokens={prefix} the other {tokens - prefix} "
                f"do not make a square grid; pass reshape=(h, w) for a rectangular one"
            )
    else:
        # a 1x1 grid is no map; with the layouts in use (P = 0, or 1 class token) grids of side >= 5 are unique
        candidates = [
            p for p in range(min(_MAX_PREFIX_TOKENS, tokens - 4) + 1) if math.isqrt(tokens - p) ** 2 == tokens - p
        ]
        if not candidates:
            raise ValueError(
                f"layer {name!r} outputs {tokens} tokens: no number of prefix tokens in 0..{_MAX_PREFIX_TOKENS} "
                f"leaves a square grid of patches; {fix}"
            )
        if len(candidates) > 1 and candidates[0] > 1:
            grids = ", ".join(f"{p} prefix + {math.isqrt(tokens - p)}x{math.isqrt(tokens - p)}" for p in candidates)
            raise ValueError(f"layer {name!r} outputs {tokens} tokens, which is ambiguous ({grids}); {fix}")
    p = candidates[0]
    side = math.isqrt(tokens - p)
    return p, side, side


class CAMAttribution(Attribution):
    r"""Shared life cycle of CAM methods: activations A and gradients dy/dA at one layer -> (N, 1, h, w) maps.

    The layer's output is recorded and the model continues on a copy of it, so the map uses the layer's true output
    even when the model later modifies it in place (DenseNet's ``F.relu(features, inplace=True)``); the backward
    pass stops at the layer. Subclasses give the weights (`_weights`); the map is
    $$ L = \mathrm{ReLU}(\sum_k w_k \odot A^k) $$, summed over channels, computed in float32 whatever the
    autocast dtype of the forward pass (results are float32).

    Token layers (vision transformers): a layer whose output is (N, T, D) is read as T tokens of dimension D; the
    first P (class / register tokens) are dropped and the other T - P, in row-major order, are folded into an
    (h, w) grid, giving activations and gradients of shape (N, D, h, w).

    Args:
        layer: a module of the model, its dotted name, or None to choose it on the first call (see `choose_layer`;
            `repr` says which).
        call: which call of a layer module that runs several times in one forward (default -1: the last); a
            warning names the module when it ran more than once.
        reshape: how to turn the layer's output into (N, C, h, w): None (4-D outputs as they are, 3-D token outputs
            folded into a square grid), ``(h, w)`` (token outputs folded into that grid), or a callable
            ``f(output) -> (M, C, h, w)`` applied to the layer's output (any layout, e.g. (N, H, W, C)) and to its
            gradients (batch N * K): it must only rearrange elements.
        prefix_tokens: the number P of tokens before the patch tokens; None: the smallest P in 0..8 that leaves a
            square grid (``ValueError`` when none does, or when several do and the smallest is not 0 or 1).
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
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        super().__init__(model, eval_mode=eval_mode, backward=backward)
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
    ) -> Tensor:
        """Maps of shape (N, 1, h, w) at the layer's resolution ((N, K, 1, h, w) with K targets per input).

        ``upsample`` resizes them to the input's (H, W) (the first input's, for a tuple): True or ``"bilinear"``
        (``align_corners=False``), ``"nearest"`` (as captum's ``LayerAttribution.interpolate`` default) or
        ``"bicubic"``; False keeps them. A tuple of inputs and `additional_forward_args` are passed to ``forward`` as
        in `Attribution.attribute`.
        """
        mode = check_upsample(upsample)
        x, kwargs, _ = self._call_args(inputs, additional_forward_args)
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
        # CAM arithmetic in float32 whatever the autocast dtype of the forward pass
        a = fold(act.detach()).float().unsqueeze(1)
        g = fold(grads.flatten(0, 1)).float().unflatten(0, (n, k))
        return _weighted_sum(self._weights(a, g), a), targets

    def _record(
        self, x: Tensor | tuple[Tensor, ...], target: Any, forward_args: ForwardArgs | None = None
    ) -> tuple[Tensor, Targets, Callable[[Tensor], Tensor]]:
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
            layer_hooks.forward(module, on_layer)
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
        return act, targets, self._fold(name, act)

    def _fold(self, name: str, act: Tensor) -> Callable[[Tensor], Tensor]:
        shape = tuple(act.shape)
        if callable(self.reshape):
            fn = self.reshape
            folded = fn(act.detach())
            if not isinstance(folded, Tensor) or folded.dim() != 4 or folded.shape[0] != shape[0]:
                got = tuple(folded.shape) if isinstance(folded, Tensor) else type(folded).__name__
                raise ValueError(
                    f"reshape must return an (N, C, h, w) tensor with N = {shape[0]} for layer {name!r}'s output "
                    f"{shape}; got {got}"
                )
            return fn
        if act.dim() == 4 and self.reshape is None and self.prefix_tokens is None:
            return _identity
        if act.dim() == 3:
            p, h, w = _token_grid(name, shape[1], self.reshape, self.prefix_tokens)
            return lambda t: _fold_tokens(t, p, h, w)
        if act.dim() == 4:
            raise ValueError(
                f"layer {name!r} outputs a 4-D map {shape}; reshape=(h, w) and prefix_tokens= are for (N, T, D) "
                "token outputs (pass a callable reshape for other layouts)"
            )
        raise ValueError(
            f"layer {name!r} outputs shape {shape}; CAM methods need a (N, C, h, w) map or (N, T, D) tokens, "
            "choose a convolutional layer or a transformer block's LayerNorm (or pass a callable reshape=)"
        )


def _identity(t: Tensor) -> Tensor:
    return t


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
            depend on it (in eval mode). A callable target gets the output of such a batch and must act row-wise.

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
        act, targets, fold = self._record(x, target)
        a = fold(act.detach()).float()  # (N, C, h, w)
        weights = self._mask_scores(x.detach(), a, targets, target)  # (N, K, C)
        return _weighted_sum(weights[..., None, None], a.unsqueeze(1)), targets

    def _mask_scores(self, x: Tensor, a: Tensor, targets: Targets, plan: TargetPlan) -> Tensor:
        """(N, K, C) weights: the target's score on each of the N * C masked inputs, in chunks of `batch_size`."""
        n, c = a.shape[:2]
        k = targets.scores.shape[1]
        rows = a.flatten(0, 1).unsqueeze(1)  # (N * C, 1, h, w); row r is input r // C, channel r % C
        scores = torch.empty(n * c, k, dtype=torch.float32, device=a.device)
        with torch.no_grad():
            for start in range(0, n * c, self.batch_size):
                stop = min(start + self.batch_size, n * c)
                masks = F.interpolate(rows[start:stop], size=x.shape[-2:], mode="bilinear", align_corners=False)
                lo = masks.amin(dim=(-2, -1), keepdim=True)
                masks = (masks - lo) / (masks.amax(dim=(-2, -1), keepdim=True) - lo).clamp_min(self.eps)
                inputs = torch.arange(start, stop, device=x.device) // c
                out = self.model(x[inputs] * masks)
                if plan.fn is None:
                    idx = targets.indices[inputs]  # type: ignore[index]
                    scores[start:stop] = torch.softmax(out.float(), dim=1).gather(1, idx)
                else:
                    scores[start:stop] = _callable_rows(plan.fn, out, stop - start, k, targets.multi)
        return scores.view(n, c, k).transpose(1, 2)


def _callable_rows(fn: Callable[[Any], Tensor], out: Any, rows: int, k: int, multi: bool) -> Tensor:
    try:
        s = fn(out)
    except Exception as exc:
        raise RuntimeError(
            f"the target callable {getattr(fn, '__name__', fn)!r} failed on the output of a batch of masked inputs"
        ) from exc
    expected = (rows, k) if multi else (rows,)
    if not isinstance(s, Tensor) or tuple(s.shape) != expected:
        got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
        raise ValueError(
            f"on a batch of {rows} masked inputs the target callable must return shape {expected} (it must act row "
            f"by row on the output), got {got}"
        )
    return s.float().reshape(rows, k)


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

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False}
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
        cam, targets = super()._run(x, target, hooks)  # (N, K, 1, h, w)
        if targets.indices is None:
            spec: Any = target.fn
        else:
            spec = targets.indices if targets.multi else targets.indices[:, 0]
        self._guided.eval_mode, self._guided.backward = self.eval_mode, self.backward
        guided = self._guided.attribute(x, spec)
        if not targets.multi:
            guided = guided.unsqueeze(1)
        return guided * upsample_maps(cam, tuple(x.shape[-2:]), self.upsample), targets
