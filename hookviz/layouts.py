"""A layer output's layout: how its axes map to (N, C, h, w), the form every map-reading method works on.

Layer outputs come in three layouts (and whatever a user's callable makes of them):

- ``"nchw"``: (N, C, h, w), PyTorch's convolutional maps;
- ``"nhwc"``: (N, h, w, C), channels-last stages (Swin v1/v2 in timm, torchvision ``swin_t``'s ``features``, ConvNeXt
  blocks inside);
- ``"tokens"``: (N, T, D), vision transformers and MLP token mixers: P prefix tokens (class, distillation, register
  tokens) followed by h * w patch tokens in row-major order.

`resolve_layout` infers the layout from the output's shape, the input's (H, W) and the model, or checks the one the
user gave (``layout=``, as pytorch-grad-cam's ``reshape_transform``). Where no layout can be told apart it raises an
error naming the layer, its output shape and ``layout=``: a map whose axes are not space is never returned. The
`Layout` it returns folds any tensor shaped like the output (activations, and gradients with a batch N * K) into
(M, C, h, w) by rearranging elements only.

Used by the CAM family (`hookviz.methods.cam`) and available to any code that reads a layer as a map.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from torch import Tensor, nn

__all__ = ["LAYOUTS", "Layout", "LayoutSpec", "check_layout", "resolve_layout"]

LayoutSpec: TypeAlias = "Literal['nchw', 'nhwc', 'tokens'] | Callable[[Tensor], Tensor] | None"
LAYOUTS: tuple[str, ...] = ("nchw", "nhwc", "tokens")
MAX_PREFIX_TOKENS = 8  # class, distillation and register tokens tried when folding tokens into a grid


def check_layout(layout: object) -> None:
    """Raise for a ``layout=`` argument that is none of None, "nchw", "nhwc", "tokens" or a callable."""
    if layout is None or callable(layout):
        return
    if isinstance(layout, str) and layout in LAYOUTS:
        return
    raise ValueError(
        f"layout must be None (inferred), 'nchw', 'nhwc', 'tokens' or a callable f(output) -> (N, C, h, w); "
        f"got {layout!r}"
    )


@dataclass(frozen=True)
class Layout:
    """How tensors shaped like one layer's output fold into (M, C, h, w) maps.

    kind: ``"nchw"``, ``"nhwc"``, ``"tokens"``, ``"tokens (Hiera reroll)"`` or ``"callable"``; prefix: the P
    tokens dropped before the grid; grid: (h, w) of the patch tokens; fn: the user's callable (or Hiera's reroll).
    """

    kind: str
    prefix: int = 0
    grid: tuple[int, int] | None = None
    fn: Callable[[Tensor], Tensor] | None = None

    def __call__(self, t: Tensor) -> Tensor:
        """(M, ...) shaped like the layer's output (any batch M) -> (M, C, h, w)."""
        if self.kind == "nchw":
            return t
        if self.kind == "nhwc":
            return t.permute(0, 3, 1, 2)
        if self.kind == "tokens":
            h, w = self.grid  # type: ignore[misc]
            return t[:, self.prefix :].transpose(1, 2).reshape(t.shape[0], t.shape[2], h, w)
        return self.fn(t)  # type: ignore[misc]  # a user's callable, or Hiera's reroll

    def __str__(self) -> str:
        if self.kind == "tokens":
            h, w = self.grid  # type: ignore[misc]
            return f"tokens ({self.prefix} prefix + {h}x{w})"
        if self.grid is not None:
            return f"{self.kind}, {self.grid[0]}x{self.grid[1]}"
        return self.kind


def _is_grid(h: int, w: int, size: tuple[int, int] | None) -> bool:
    """Whether (h, w) can be the spatial grid of an input of `size` (H, W): one stride along both axes.

    Either one integer stride s gives both sides up to border rounding (h in {floor(H / s), ceil(H / s)}, the same
    for w), or the two strides H / h and W / w agree within 10% (resizes by non-integer factors).
    """
    if size is None:
        return True
    big_h, big_w = size
    if h < 1 or w < 1 or h > big_h or w > big_w:
        return False
    sh, sw = big_h / h, big_w / w
    if max(sh, sw) / min(sh, sw) <= 1.1:
        return True
    for s in range(1, max(big_h, big_w) + 1):
        if h in (big_h // s, -(-big_h // s)) and w in (big_w // s, -(-big_w // s)):
            return True
    return False


def _channels_last_hint(module: nn.Module | None, model: nn.Module | None, shape: tuple[int, ...]) -> bool:
    """Whether the module or model says its 4-D output is channels-last, for shapes that fit both layouts."""
    if isinstance(module, nn.LayerNorm) and tuple(module.normalized_shape) == (shape[-1],):
        return True  # a LayerNorm normalizes the last axis: the channels
    for owner in (module, model):
        fmt = getattr(owner, "output_fmt", None)  # timm's feature format attribute
        if isinstance(fmt, str) or hasattr(fmt, "value"):
            return str(getattr(fmt, "value", fmt)).upper() == "NHWC"
    return False


def _four_d(name: str, shape: tuple[int, ...], size: tuple[int, int] | None, module: Any, model: Any) -> Layout:
    nchw = _is_grid(shape[2], shape[3], size)
    nhwc = _is_grid(shape[1], shape[2], size)
    if nchw and nhwc:
        return Layout("nhwc" if _channels_last_hint(module, model, shape) else "nchw")
    if nchw or nhwc:
        return Layout("nchw" if nchw else "nhwc")
    raise ValueError(
        f"layer {name!r} outputs shape {shape}, which is neither (N, C, h, w) nor (N, h, w, C) for an input of "
        f"{size[0]}x{size[1]} (no pair of axes is a grid of the image with one stride); pass layout= ('nchw', "  # type: ignore[index]
        "'nhwc', or a callable f(output) -> (N, C, h, w))"
    )


def _factor_grids(n: int, size: tuple[int, int] | None) -> list[tuple[int, int]]:
    """(h, w) with h * w = n: the square one without an input size, else those with one stride over the input."""
    if size is None or size[0] == size[1]:
        side = math.isqrt(n)
        return [(side, side)] if side * side == n else []
    return [(h, n // h) for h in range(1, n + 1) if n % h == 0 and _is_grid(h, n // h, size)]


def _token_grid(
    name: str,
    tokens: int,
    grid: tuple[int, int] | None,
    prefix: int | None,
    size: tuple[int, int] | None,
    model_prefix: int | None,
) -> tuple[int, int, int]:
    """(prefix tokens P, h, w) for a layer with `tokens` tokens (see `resolve_layout`)."""
    fix = "pass reshape=(h, w) and/or prefix_tokens= (the number of class/register tokens before the patches)"
    if grid is not None:
        p = tokens - grid[0] * grid[1] if prefix is None else prefix
        if p < 0 or tokens - p != grid[0] * grid[1]:
            raise ValueError(
                f"layer {name!r} outputs {tokens} tokens, which reshape={grid} with {p} prefix tokens cannot fold: "
                f"{tokens} - {p} != {grid[0]} * {grid[1]}; {fix}"
            )
        return p, *grid
    if prefix is not None:
        found = _factor_grids(tokens - prefix, size) if prefix < tokens else []
        if not found:
            shape = "square grid" if size is None or size[0] == size[1] else f"grid with the input's {size} aspect"
            raise ValueError(
                f"layer {name!r} outputs {tokens} tokens; with prefix_tokens={prefix} the other {tokens - prefix} "
                f"do not make a {shape}; pass reshape=(h, w) for another one"
            )
        return prefix, *found[0]
    if model_prefix is not None and 0 <= model_prefix < tokens:
        found = _factor_grids(tokens - model_prefix, size)  # the model's num_prefix_tokens (timm) is trusted
        if len(found) == 1:
            return model_prefix, *found[0]
    # a 1x1 grid is no map; with the layouts in use (P = 0, or 1 class token) grids of side >= 5 are unique
    candidates = [
        (p, *g) for p in range(min(MAX_PREFIX_TOKENS, tokens - 4) + 1) for g in _factor_grids(tokens - p, size)
    ]
    if not candidates:
        what = "square grid" if size is None or size[0] == size[1] else f"grid of the {size[0]}x{size[1]} input"
        raise ValueError(
            f"layer {name!r} outputs {tokens} tokens: no number of prefix tokens in 0..{MAX_PREFIX_TOKENS} "
            f"leaves a {what} of patches; {fix}"
        )
    if len(candidates) > 1 and (candidates[0][0] > 1 or candidates[1][0] == candidates[0][0]):
        grids = ", ".join(f"{p} prefix + {h}x{w}" for p, h, w in candidates)
        raise ValueError(f"layer {name!r} outputs {tokens} tokens, which is ambiguous ({grids}); {fix}")
    return candidates[0]


def _hiera_reroll(model: Any, tokens: int) -> Layout | None:
    """Hiera (timm) keeps its tokens "unrolled" (mask-unit order) until the last stage; its own ``reroll`` module
    puts them back in row-major order: the layout of a stage with `tokens` tokens, where one needs it."""
    reroll = getattr(model, "reroll", None)
    schedule = getattr(reroll, "schedule", None)
    if not isinstance(reroll, nn.Module) or not isinstance(schedule, dict):
        return None
    for block, (steps, size) in schedule.items():
        if len(size) == 2 and size[0] * size[1] == tokens:
            if not steps:
                return None  # already row-major: the plain token layout reads it
            return Layout(
                "tokens (Hiera reroll)", grid=(size[0], size[1]), fn=lambda t, b=block: reroll(t, b).permute(0, 3, 1, 2)
            )
    return None


def resolve_layout(
    name: str,
    output: Tensor,
    *,
    layout: LayoutSpec = None,
    grid: tuple[int, int] | None = None,
    prefix_tokens: int | None = None,
    input_size: tuple[int, int] | None = None,
    module: nn.Module | None = None,
    model: nn.Module | None = None,
    argname: str = "layout",
) -> Layout:
    """The `Layout` of layer `name`'s `output`, inferred or checked, before anything is computed from it.

    Inference: a 4-D output is (N, C, h, w) when its last two axes are a grid of the input (one stride along both,
    H / h ~ W / w), (N, h, w, C) when its middle two are; when both fit, (N, h, w, C) only where the module or model
    says so (a LayerNorm over the last axis, timm's ``output_fmt == "NHWC"``), else PyTorch's (N, C, h, w). A 3-D
    output (N, T, D) is tokens: P = `prefix_tokens`, else the model's ``num_prefix_tokens`` (timm) where the rest
    makes a grid, else the smallest P in 0..8 whose remaining T - P tokens make a grid of the input's aspect
    (square for square inputs; non-square grids from the input size; an error when two P in 0..8 fit, unless the
    smaller is 0 or 1). `grid` (h, w) fixes the token grid.

    `layout` overrides the inference: "nchw", "nhwc" (a 4-D output), "tokens" (a 3-D output), or a callable
    ``f(output) -> (N, C, h, w)`` (applied to gradients too, with batch N * K: it must only rearrange elements).
    `argname` names the argument that gave the callable in messages. Raises `ValueError` naming the layer, its shape
    and ``layout=`` when the layout does not match the shape or
    cannot be told.
    """
    check_layout(layout)
    shape = tuple(output.shape)
    if callable(layout):
        folded = layout(output.detach())
        if not isinstance(folded, Tensor) or folded.dim() != 4 or folded.shape[0] != shape[0]:
            got = tuple(folded.shape) if isinstance(folded, Tensor) else type(folded).__name__
            raise ValueError(
                f"{argname} must return an (N, C, h, w) tensor with N = {shape[0]} for layer {name!r}'s "
                f"output {shape}; got {got}"
            )
        return Layout("callable", fn=layout)
    if layout in ("nchw", "nhwc") and len(shape) != 4:
        raise ValueError(
            f"layout={layout!r} needs a 4-D output, but layer {name!r} outputs shape {shape}; pass layout='tokens' "
            "for (N, T, D) tokens, or a callable f(output) -> (N, C, h, w)"
        )
    if layout == "tokens" and len(shape) != 3:
        raise ValueError(
            f"layout='tokens' needs a 3-D (N, T, D) output, but layer {name!r} outputs shape {shape}; pass "
            "layout='nchw' or 'nhwc' for 4-D maps, or a callable f(output) -> (N, C, h, w)"
        )
    if len(shape) == 4:
        if grid is not None or prefix_tokens is not None:
            raise ValueError(
                f"layer {name!r} outputs a 4-D map {shape}; reshape=(h, w) and prefix_tokens= are for (N, T, D) "
                "token outputs (pass layout='nhwc' for channels-last maps, or a callable for other layouts)"
            )
        if layout is not None:
            return Layout(layout)  # type: ignore[arg-type]
        return _four_d(name, shape, input_size, module, model)
    if len(shape) == 3 and grid is None and prefix_tokens is None:
        rolled = _hiera_reroll(model, shape[1])
        if rolled is not None:
            return rolled
    if len(shape) == 3:
        model_prefix = getattr(model, "num_prefix_tokens", None)
        model_prefix = model_prefix if isinstance(model_prefix, int) and not isinstance(model_prefix, bool) else None
        p, h, w = _token_grid(name, shape[1], grid, prefix_tokens, input_size, model_prefix)
        return Layout("tokens", prefix=p, grid=(h, w))
    raise ValueError(
        f"layer {name!r} outputs shape {shape}; CAM methods need a (N, C, h, w) map or (N, T, D) tokens, "
        "choose a convolutional layer or a transformer block's LayerNorm (or pass layout= a callable "
        "f(output) -> (N, C, h, w), or reshape=)"
    )
