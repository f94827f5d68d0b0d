"""Baselines: the reference input that Integrated Gradients integrates from and Occlusion paints with.

A baseline spec is None (zeros), a number (a constant image) or a tensor that broadcasts to the inputs' shape
(Integrated Gradients also takes a tuple of those, one per input tensor). `check_baseline` checks a spec when a
method is built; `baseline_like` turns it into a tensor like the input at call time. DeepLiftShap and GradientShap
take a distribution of baselines instead (a number or a tensor (B, ...)): `check_distribution`,
`check_distribution_shape` and `distribution`.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .._checks import is_number
from .._device import to_device
from ..inputs import check_finite


def baseline_like(b: Tensor | float | None, x: Tensor) -> Tensor:
    """The baseline (N, ...) of the input `x` from a baseline spec (None, a number, a broadcasting tensor)."""
    if b is None:
        return torch.zeros_like(x)
    if not isinstance(b, Tensor):
        return torch.full_like(x, float(b))
    try:
        shape = torch.broadcast_shapes(b.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise ValueError(
            f"baseline of shape {tuple(b.shape)} does not broadcast to the inputs' shape {tuple(x.shape)}; give "
            "one baseline (C, H, W) / (1, C, H, W) or one per input (N, C, H, W)"
        )
    check_finite(b, "baseline")  # again at call time: the tensor may have changed in place since __init__
    return to_device(b.detach().to(x.dtype), x.device).expand_as(x)  # from the host without a wait


def check_baseline(baseline: object) -> None:
    """A baseline spec checked (type, dtype, finite values), or a clear TypeError/ValueError."""
    if isinstance(baseline, tuple):
        for b in baseline:
            check_baseline(b)
        return
    if baseline is not None and not isinstance(baseline, Tensor):
        if not is_number(baseline):
            raise TypeError(
                "baseline must be None (zeros), a number (a constant image), a tensor that broadcasts to the "
                f"inputs' shape, or a tuple of those (one per input tensor); got {type(baseline).__name__}"
            )
    if isinstance(baseline, Tensor) and (baseline.is_complex() or baseline.dtype == torch.bool):
        raise TypeError(f"baseline tensor must hold real numbers, got dtype {baseline.dtype}")
    if isinstance(baseline, Real) and not math.isfinite(baseline):
        raise ValueError(f"baseline must be a finite number (a constant image), got {baseline!r}")
    if isinstance(baseline, Tensor):
        check_finite(baseline, "baseline")


def check_distribution(baselines: object) -> None:
    """A distribution of baselines (DeepLiftShap, GradientShap) checked: a finite number, or a non-empty float tensor
    (B, ...) of finite values; else a clear TypeError/ValueError."""
    if isinstance(baselines, Real) and not isinstance(baselines, bool):
        if not math.isfinite(baselines):
            raise ValueError(f"baselines must be a finite number (one constant baseline), got {baselines!r}")
        return
    if not isinstance(baselines, Tensor):
        raise TypeError(
            f"baselines must be a tensor (B, ...) of B baselines or a number (one constant baseline), got "
            f"{type(baselines).__name__}"
        )
    if not baselines.is_floating_point():
        raise TypeError(f"baselines must hold floating-point values, got dtype {baselines.dtype}")
    if baselines.dim() < 1 or baselines.shape[0] == 0:
        raise ValueError(
            f"baselines is an empty distribution (shape {tuple(baselines.shape)}); give B >= 1 baselines (B, C, H, W)"
        )
    check_finite(baselines, "baselines")


def distribution(baselines: Tensor | float, x: Tensor) -> Tensor:
    """The baselines (B, ...) on `x`'s device and dtype; a number is one constant baseline shaped like one input."""
    if not isinstance(baselines, Tensor):
        return torch.full((1, *x.shape[1:]), float(baselines), device=x.device, dtype=x.dtype)
    return to_device(baselines.detach().to(x.dtype), x.device)  # from the host without a wait


def check_distribution_shape(baselines: Tensor | float, x: Tensor) -> None:
    """Baselines (B, ...) shaped like one input of `x` (N, ...), or a clear ValueError."""
    if isinstance(baselines, Tensor) and tuple(baselines.shape[1:]) != tuple(x.shape[1:]):
        raise ValueError(
            f"baselines of shape {tuple(baselines.shape)} do not match the inputs' shape {tuple(x.shape)}: give B "
            f"baselines shaped like one input, (B, {', '.join(map(str, x.shape[1:]))})"
        )
