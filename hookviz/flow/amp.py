"""Mixed precision: the ``torch.amp.GradScaler`` scale that GradientFlow divides out of the gradients w.r.t. module
outputs (observed during the backward pass, where the loss, hence every gradient, is scaled).

Only the scaler's public API is used (``is_enabled``, ``get_scale``). Parameter gradients are never divided: they are
read where the documented order makes them unscaled (after ``scaler.unscale_(optimizer)``; ``scaler.step`` unscales
before it calls ``optimizer.step()``, so the optimizer's step pre-hook sees unscaled gradients; Lightning's and the
Hugging Face Trainer's pre-optimizer-step callbacks run after the unscale). Whether a manual ``flow.step()`` came
before or after ``unscale_`` cannot be told through the public API: see "Mixed precision" in the `hookviz.flow` docs.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor


def _check_scaler(scaler: Any) -> None:
    """Bad `scaler` fails at construction: a GradScaler (or an object with its public ``is_enabled`` and
    ``get_scale``), or None."""
    if scaler is None:
        return
    if not callable(getattr(scaler, "is_enabled", None)):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if not callable(getattr(scaler, "get_scale", None)):
        warnings.warn(
            f"GradientFlow: the scaler {type(scaler).__name__} has no get_scale(); the gradients w.r.t. module "
            "outputs (out_grad_norm) will be reported scaled by the loss scale",
            RuntimeWarning,
            stacklevel=3,
        )


def _scale(scaler: Any, device: torch.device) -> Tensor | None:
    """The scaler's current scale as a float32 0-d tensor on `device`; None when not scaling or when it cannot be
    known (a warning was given at construction). ``get_scale()`` reads the scale to the host: one sync, paid only on
    recorded steps that observed output gradients."""
    if scaler is None or not scaler.is_enabled():
        return None
    get_scale = getattr(scaler, "get_scale", None)
    if get_scale is None:
        return None
    return torch.tensor(float(get_scale()), dtype=torch.float32, device=device)
