"""The model's ``training`` flags, saved and restored: one snapshot-and-restore context for every hookviz call that
switches a model to eval mode (attribution methods, metrics, CAM layer choice)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def training_restored(model: nn.Module) -> Iterator[None]:
    """Every module's ``training`` flag put back as it was on any exit (``KeyboardInterrupt`` included), whatever
    the block sets: per module, so a model that mixes train and eval submodules gets the same mix back."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode for the block (no batch statistics mix the inputs), its flags restored on any exit."""
    with training_restored(model):
        model.eval()
        yield
