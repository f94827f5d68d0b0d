r"""The identity rule in gradient-times-input form: an elementwise operation y = f(x) whose relevance passes unchanged
(activations, an unfolded BatchNorm, an affine map by a constant) carries $$ g_x = g_y \, y / x $$, so that
$$ x \odot g_x = y \odot g_y $$. Where f is positively homogeneous (ReLU, leaky ReLU, scaling) y / x is its own
derivative and no rule is needed: the plain gradient is the rule. Where x is exactly 0 the relevance is 0 in this
form (x g = 0): a y that is not 0 there (a sigmoid's 0.5, a BatchNorm's shift) passes none, as a zero input
contributes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


class IdentityRuleFn(torch.autograd.Function):
    """Output: an elementwise op's output y; backward: ``g y / x`` (relevance passes unchanged: R_x = x g_x = y g_y;
    zero where x is 0, whose relevance is 0 either way).

    Without `again` the ratio y / x is taken here, in the forward pass, and kept instead of x (one tensor the size
    of x, as the floor keeps an activation's input): the backward pass is one product. With `again` (how to compute
    y from x) only x is kept and the ratio is taken in the backward pass, if one comes: for CP-LRP's gates, which
    the product holds constant, so that no backward pass ever reaches them."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ybox: tuple[Tensor], again: Callable[[Tensor], Tensor] | None) -> Tensor:
        y = ybox[0]
        ctx.again = again
        if again is None:
            ctx.save_for_backward(_ratio(y, x))
        else:
            ctx.save_for_backward(x)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        if ctx.again is None:
            (ratio,) = ctx.saved_tensors
        else:
            (x,) = ctx.saved_tensors
            with torch.no_grad():
                ratio = _ratio(ctx.again(x), x)
        return g * ratio, None, None


def _ratio(y: Tensor, x: Tensor) -> Tensor:
    """y / x, 0 where x is 0. Where x is 0 the quotient is not finite (0 / 0, or y / 0), so on the CPU a finite sum
    of the quotients says there is no such place and the mask is skipped: one read instead of a comparison and a
    fill over the activation (a third of the rule's time on a ViT-B MLP; the same values either way). On an
    accelerator the mask is always applied: reading the sum would wait for the device."""
    ratio = y / x
    if ratio.device.type == "cpu" and bool(ratio.sum().isfinite()):
        return ratio
    return ratio.masked_fill_(x == 0, 0)


def again_module(module: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """How to compute a module activation's output again from its input (None in training mode: random draws,
    running statistics; the ratio is then taken in the forward pass)."""
    if module.training or not callable(getattr(module, "forward", None)):  # RReLU, BatchNorm updating its stats
        return None
    inplace = bool(getattr(module, "inplace", False))
    return lambda x: module.forward(x.clone() if inplace else x)  # forward, not __call__: no hooks
