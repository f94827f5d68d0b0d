"""Mixed precision: the ``torch.amp.GradScaler`` scale that GradientFlow divides out of scaled gradients, and whether
the parameter gradients are still scaled when the step is taken (see "Mixed precision" in the `hookviz.flow` docs)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _scale(scaler: Any, device: torch.device) -> Tensor | None:
    """The scaler's current scale as a float32 0-d tensor on `device`, read without a sync; None when not scaling."""
    if scaler is None or not scaler.is_enabled():
        return None
    get_async = getattr(scaler, "_get_scale_async", None)  # the scale tensor, without the sync of get_scale()
    scale = get_async() if get_async is not None else torch.tensor(scaler.get_scale())
    if scale is None:
        return None
    return scale.to(device, torch.float32, non_blocking=True)


def _param_grads_scaled(scaler: Any, optimizer: Any) -> bool:
    """Whether the parameter gradients still carry the scaler's scale (not yet unscaled)."""
    if scaler is None or not scaler.is_enabled():
        return False
    states = getattr(scaler, "_per_optimizer_states", None)
    if states is None:  # unknown GradScaler internals: assume the documented order (after unscale_)
        return False
    if optimizer is not None:
        state = states.get(id(optimizer)) if id(optimizer) in states else None
        return state is None or getattr(state.get("stage"), "name", "READY") == "READY"
    return not any(getattr(s.get("stage"), "name", "READY") != "READY" for s in states.values())
