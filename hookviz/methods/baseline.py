"""Baselines: the reference input that Integrated Gradients integrates from and Occlusion paints with.

A baseline spec is None (zeros), a number (a constant image) or a tensor that broadcasts to the inputs' shape
(Integrated Gradients also takes a tuple of those, one per input tensor). `check_baseline` checks a spec when a
method is built; `baseline_like` turns it into a tensor like the input at call time.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .._checks import is_number
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
    return b.detach().to(device=x.device, dtype=x.dtype).expand_as(x)


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
