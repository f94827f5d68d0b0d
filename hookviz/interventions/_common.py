"""Shared by the interventions: intervention keys (``name`` / ``name#k``), feeding inputs, the model's modes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
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


class ChunkBuffers:
    """Storage that the chunks of one sweep reuse, one tensor per slot, sized by the first (largest) chunk.

    A chunk of k patched copies hands the model tensors of k x N rows (the inputs repeated, cached outputs repeated,
    the patched site); made fresh per chunk, each is a new block of megabytes that the C allocator (glibc) maps,
    zeroes and faults in page by page, and unmaps when the chunk ends, until a freed block has raised its mmap
    threshold past that size (`benchmarks/bench_patching.py`: a fresh process paid twice the warm time). Written
    into the same storage chunk after chunk, the values and the layout are those of the fresh tensors (contiguous,
    rows k x N), and the pages are touched once per sweep. A chunk's tensors are used up (its metric computed) before
    the next chunk overwrites them."""

    def __init__(self) -> None:
        self._store: dict[Any, Tensor] = {}

    def _rows(self, slot: Any, like: Tensor, rows: int) -> Tensor:
        """Contiguous uninitialised (rows, *like.shape[1:]) storage of slot, kept for the next chunk."""
        shape = (rows, *like.shape[1:])
        buf = self._store.get(slot)
        kind = (shape[1:], like.dtype, like.device)
        if buf is None or buf.shape[0] < rows or (buf.shape[1:], buf.dtype, buf.device) != kind:
            buf = self._store[slot] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buf if buf.shape[0] == rows else buf[:rows]

    def repeat(self, slot: Any, t: Tensor, k: int) -> Tensor:
        """``t.repeat(k, 1, ...)`` (site-major copies along the batch axis), written into slot's storage."""
        out = self._rows(slot, t, k * t.shape[0])
        out.view(k, *t.shape).copy_(t)
        return out

    def copy(self, slot: Any, t: Tensor) -> Tensor:
        """``t.clone()`` written into slot's storage (a tensor that is not contiguous is cloned: its layout kept)."""
        if t.dim() == 0 or not t.is_contiguous():
            return t.clone()
        return self._rows(slot, t, t.shape[0]).copy_(t)


def expand_inputs(inputs: Any, repeats: int, buffers: ChunkBuffers | None = None, slot: Any = ("input",)) -> Any:
    """Every batch tensor of `inputs` repeated `repeats` times along the batch axis (site-major: [x, x, x, ...]);
    with `buffers`, written into storage reused chunk after chunk."""
    if isinstance(inputs, Tensor):
        if not inputs.dim():
            return inputs
        if buffers is not None:
            return buffers.repeat(slot, inputs, repeats)
        return inputs.repeat(repeats, *([1] * (inputs.dim() - 1)))
    if isinstance(inputs, tuple):
        return tuple(expand_inputs(v, repeats, buffers, (slot, i)) for i, v in enumerate(inputs))
    if isinstance(inputs, dict):
        return {k: expand_inputs(v, repeats, buffers, (slot, k)) for k, v in inputs.items()}
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
