"""Automatic choice of the layer a CAM method explains (`choose_layer`), and layers named by the user
(`resolve_layer`).

The choice holds on the families users bring: convolutional networks (the last spatial map), channels-last stages
(Swin v1/v2 in timm, torchvision ``swin_t``: the map is read through `hookviz.layouts`), vision transformers (the
LayerNorm before the last self-attention), token models without attention modules (MLP-Mixer, ResMLP: the last
token block) and hierarchical token models (Hiera: the last stage, whose tokens are in row-major order).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor, nn

from .._modes import training_restored
from ..hooks import HookManager, select_modules
from ..layouts import resolve_layout
from .forward import ForwardArgs, as_tuple
from .scope import acting, active_call

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


def is_attention_name(class_name: str) -> bool:
    """Whether a module class named `class_name` is an attention module by its name: it contains "Attention"
    (timm's ``Attention``, Hugging Face's ``BertSelfAttention``, ``ViTSelfAttention``, ``GPT2Attention``, ...) or is
    timm's ``ClassAttn`` (any case)."""
    # timm's ClassAttn (XCiT's and CaiT's class-attention blocks, where only the class token attends) counts too;
    # other "...Attn" modules (Twins, HaloNet, ResNeSt) keep the choices the architecture sweep checked
    name = class_name.lower()
    return "attention" in name or "classattn" in name


def is_attention_module(module: nn.Module) -> bool:
    """Whether `module` is an attention module: ``nn.MultiheadAttention`` or a class `is_attention_name` accepts
    (used by the CAM layer choice and by the attention rollouts)."""
    return isinstance(module, nn.MultiheadAttention) or is_attention_name(type(module).__name__)


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
    token. Attention modules are ``nn.MultiheadAttention`` and modules whose class name contains "Attention", or
    timm's ``ClassAttn`` (XCiT's and CaiT's class-attention blocks: the LayerNorm before the last one is chosen for
    the same reason, since the patch tokens of its output no longer reach the head).

    Channels-last maps (N, h, w, C) count as maps (their layout is inferred by `hookviz.layouts.resolve_layout`
    from the input size: Swin's final ``norm``). Token blocks: when a module with submodules (a block) outputs
    (N, T, D) tokens that fold into a grid of the input, after the last map, and no LayerNorm feeding an attention
    module comes later, the last such block is chosen (MLP-Mixer, ResMLP: ``blocks.11``, not the patch embedding,
    whose map would be the first layer).

    The probe is one forward pass of `x` as given (the whole batch: what the explained forward pass sees, so a
    layout the model rejects fails as the model's own forward does, with a note), without gradients and with every
    module in eval mode, so the choice depends neither on the batch nor on the model's modes, and BatchNorm
    statistics are left alone; the modes are restored afterwards. The probe is an active call (`scope`): hooks of
    an enclosing hookviz call do not act on it.
    """
    first = as_tuple(x)[0]
    probe = _Probe(model, tuple(first.shape[-2:]) if first.dim() == 4 else None)
    with training_restored(model), active_call() as call, torch.no_grad(), HookManager(model) as hooks:
        probe.call = call
        model.eval()
        hooks.forward(lambda name, module: name != "", probe.on_output, with_name=True)
        if any(is_attention_module(m) for m in model.modules()):
            hooks.forward_pre(lambda name, module: is_attention_module(module), probe.on_attention, with_kwargs=True)
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
    return probe.choice()


def _known(table: dict[int, Any], t: Tensor) -> Any:
    # weak references: no activation is kept alive, and an id reused by a later tensor is not mistaken for it
    entry = table.get(id(t))
    ref = entry[-1] if isinstance(entry, tuple) else entry
    return entry if ref is not None and ref() is t else None


class _Probe:
    """What the probe forward pass of `choose_layer` saw, in order of completion: 4-D maps, token blocks whose
    outputs fold into a grid, and LayerNorms that feed attention modules; `choice` applies the rule."""

    def __init__(self, model: nn.Module, size: tuple[int, ...] | None) -> None:
        self.model, self.size = model, size
        self.call: Any = None  # the probe's active call: hooks of an enclosing hookviz call do not act on it
        self.maps: list[tuple[int, str, nn.Module]] = []
        self.blocks: list[tuple[int, str, nn.Module]] = []
        self.seen_blocks: dict[int, weakref.ref[Tensor]] = {}  # a container returning its last block's is skipped
        self.pooled: dict[int, weakref.ref[Tensor]] = {}  # outputs of pooling / pass-through modules, by id
        self.norms: dict[int, tuple[int, str, nn.Module, weakref.ref[Tensor]]] = {}  # 3-D LayerNorm outputs, by id
        self.attention_inputs: list[tuple[int, str, nn.Module]] = []  # LayerNorms feeding attention, in call order
        self.order = 0

    def on_output(self, name: str, module: nn.Module, args: Any, out: Any) -> None:
        if not acting(self.call):
            return
        self.order += 1
        if not isinstance(out, Tensor):
            return
        if out.dim() == 4 and _pixels(name, out, self.size, module, self.model) > 1:
            if isinstance(module, _NOT_CAM_LAYERS):
                self.pooled[id(out)] = weakref.ref(out)
            elif _known(self.pooled, out) is None:  # containers whose output is a pooling layer's are skipped
                self.maps.append((self.order, name, module))
        elif out.dim() == 3 and isinstance(module, nn.LayerNorm):
            self.norms[id(out)] = (self.order, name, module, weakref.ref(out))
        elif out.dim() == 3 and next(module.children(), None) is not None and _known(self.seen_blocks, out) is None:
            if _pixels(name, out, self.size, module, self.model) > 1:
                self.seen_blocks[id(out)] = weakref.ref(out)
                self.blocks.append((self.order, name, module))

    def on_attention(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not acting(self.call):
            return
        query = args[0] if args else kwargs.get("query", kwargs.get("hidden_states"))
        if isinstance(query, Tensor):
            norm = _known(self.norms, query)
            if norm is not None:
                self.attention_inputs.append(norm[:3])

    def choice(self) -> tuple[str, nn.Module]:
        """The LayerNorm feeding the last attention, else the last token block, if after the last map; else it."""
        maps, tokens, blocks = self.maps, self.attention_inputs, self.blocks
        if tokens and (not maps or tokens[-1][0] > maps[-1][0]):
            return tokens[-1][1:]
        if blocks and (not maps or blocks[-1][0] > maps[-1][0]):
            return blocks[-1][1:]
        if not maps:
            raise ValueError(
                f"could not choose a CAM layer: no module of {type(self.model).__name__} outputs a 4-D (N, C, h, w) "
                "map with more than one pixel for this input, no LayerNorm feeds a self-attention module and no block "
                "outputs tokens that fold into a grid; pass layer= (a module or its dotted name)"
            )
        return maps[-1][1:]


def _pixels(name: str, out: Tensor, size: Any, module: nn.Module, model: nn.Module) -> int:
    """h * w of the map an output folds into under its inferred layout; 0 where no layout fits."""
    try:
        layout = resolve_layout(name, out, input_size=size, module=module, model=model)
    except ValueError:
        return 0
    if layout.grid is not None:
        h, w = layout.grid  # type: ignore[misc]
        return h * w
    return out.shape[2] * out.shape[3] if layout.kind == "nchw" else out.shape[1] * out.shape[2]
