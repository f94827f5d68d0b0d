"""`cache`: the activations of named layers on one input, keyed like the recorders, to patch from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..record import ActivationRecorder
from ._common import call_model, parse_key, prepared

__all__ = ["cache"]


def cache(model: nn.Module, inputs: Any, layers: str | Sequence[str], *, eval_mode: bool = True) -> dict[str, Tensor]:
    """The outputs of `layers` in one forward of ``model(inputs)`` under ``torch.no_grad()``.

    Args:
        model: the model; it comes back exactly as it was.
        inputs: a batch tensor, a tuple of positional arguments or a dict of keyword arguments.
        layers: a module name or a list of them (``"name#k"`` accepted: its module is cached).
        eval_mode: run in eval mode (the default; restored after), as `patching` does, so that the cache matches
            the runs it is patched into.

    Returns ``{key: tensor}`` for every call of each layer: ``"relu"`` (first call), ``"relu#1"`` (second call),
    ... as in `hookviz.record`; tuple outputs by their first tensor; copies taken before any later in-place
    operation. Pass it to ``hookviz.interventions.replace`` to patch it into another run. A layer that never runs in
    the forward is a `ValueError`.
    """
    if isinstance(layers, str):
        layers = [layers]
    if not isinstance(layers, Sequence) or not layers:
        raise TypeError(f"layers must be a module name or a non-empty list of them, got {layers!r}")
    names = {parse_key(model, layer, "layers")[0] for layer in layers}
    recorder = ActivationRecorder(model, lambda n, m: n in names, accumulate=False)
    with prepared(model, eval_mode), torch.no_grad(), recorder:
        call_model(model, inputs)
    out = recorder.results
    missing = [n for n in names if n not in out]
    if missing:
        raise ValueError(
            f"layers {', '.join(map(repr, sorted(missing)))} never ran in the forward (or returned no tensor): "
            "nothing to cache"
        )
    for layer in layers:
        if layer not in out:
            ran = sum(k.partition("#")[0] == layer.partition("#")[0] for k in out)
            raise ValueError(f"layers names {layer!r}, but that module ran only {ran} time(s) in the forward")
    return out
