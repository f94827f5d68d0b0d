"""The model's ``training`` flags, saved and restored: one snapshot-and-restore context for every hookviz call that
switches a model to eval mode (attribution methods, metrics, CAM layer choice)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


def _every_module(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model.modules()``, each once, breadth first: one list walk instead of a generator per level
    (the flags are saved at every call of every method)."""
    found = [model]
    seen = {id(model)}
    for module in found:  # grows while it is walked
        for child in module._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                found.append(child)
    return found


@contextmanager
def training_restored(model: nn.Module) -> Iterator[list[tuple[nn.Module, bool]]]:
    """Every module's ``training`` flag put back as it was on any exit (``KeyboardInterrupt`` included), whatever
    the block sets: per module, so a model that mixes train and eval submodules gets the same mix back. Yields the
    saved (module, flag) pairs."""
    modes = [(m, m.training) for m in _every_module(model)]
    try:
        yield modes
    finally:
        for m, training in modes:
            if m.training is not training:  # nn.Module.__setattr__ is slow; most flags come back unchanged
                m.training = training


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode for the block (no batch statistics mix the inputs), its flags restored on any exit."""
    with training_restored(model):
        model.eval()
        yield
