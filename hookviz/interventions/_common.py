"""Shared by the interventions: intervention keys (``name`` / ``name#k``), feeding inputs, the model's modes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from ..hooks import select_modules


def parse_key(model: nn.Module, key: object, what: str) -> tuple[str, int | None]:
    """``"layer3"`` -> ("layer3", None); ``"relu#1"`` -> ("relu", 1) (the second call, as in `hookviz.record`).

    The module must exist (an unknown name raises `ValueError` listing the closest names)."""
    if not isinstance(key, str):
        raise TypeError(f"{what} keys must be module names (str) such as 'layer3' or 'relu#1', got {key!r}")
    name, call = key, None
    if "#" in key:
        name, _, index = key.rpartition("#")
        if not index.isdigit():
            raise ValueError(f"{what} key {key!r}: the call index after '#' must be an int, as in 'relu#1'")
        call = int(index)
    if any(c in name for c in "*?["):
        raise ValueError(f"{what} key {key!r} is a glob; name each module exactly (one key per module)")
    select_modules(model, name)  # an unknown name fails here, with the closest names
    return name, call


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(x)`` for a tensor, ``model(*x)`` for a tuple, ``model(**x)`` for a dict."""
    if isinstance(inputs, Tensor):
        return model(inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    raise TypeError(
        f"inputs must be a tensor, a tuple of positional arguments or a dict of keyword arguments, "
        f"got {type(inputs).__name__}"
    )


def batch_size_of(inputs: Any, what: str) -> int:
    first = inputs if isinstance(inputs, Tensor) else None
    if isinstance(inputs, tuple) and inputs and isinstance(inputs[0], Tensor):
        first = inputs[0]
    if isinstance(inputs, dict):
        first = next((v for v in inputs.values() if isinstance(v, Tensor)), None)
    if first is None or first.dim() == 0:
        raise TypeError(
            f"{what} must be a batch tensor (N, ...) (or a tuple / dict holding one), got {type(inputs).__name__}"
        )
    return first.shape[0]


def expand_inputs(inputs: Any, repeats: int) -> Any:
    """Every batch tensor of `inputs` repeated `repeats` times along the batch axis (site-major: [x, x, x, ...])."""
    if isinstance(inputs, Tensor):
        return inputs.repeat(repeats, *([1] * (inputs.dim() - 1))) if inputs.dim() else inputs
    if isinstance(inputs, tuple):
        return tuple(expand_inputs(v, repeats) for v in inputs)
    if isinstance(inputs, dict):
        return {k: expand_inputs(v, repeats) for k, v in inputs.items()}
    return inputs


def same_shapes(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_shapes(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_shapes(a[k], b[k]) for k in a)
    return type(a) is type(b)


def describe_shapes(a: Any) -> str:
    if isinstance(a, Tensor):
        return str(tuple(a.shape))
    if isinstance(a, tuple):
        return "(" + ", ".join(describe_shapes(v) for v in a) + ")"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k}: {describe_shapes(v)}" for k, v in a.items()) + "}"
    return type(a).__name__


@contextmanager
def prepared(model: nn.Module, eval_mode: bool, *, freeze: bool = False) -> Iterator[None]:
    """Eval mode (when asked) and frozen parameters (when asked) for the block; every flag restored in ``finally``."""
    if not isinstance(eval_mode, bool):
        raise TypeError(f"eval_mode must be True or False, got {eval_mode!r}")
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        if eval_mode:
            model.eval()
        if freeze:
            for p, _ in flags:
                p.requires_grad_(False)
        yield
    finally:
        for m, training in modes:
            m.training = training
        for p, requires_grad in flags:
            p.requires_grad_(requires_grad)
