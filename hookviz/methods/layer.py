"""Layer attribution: read, or replace, one module's output (or input) during a forward pass.

Attribution "to a layer" differentiates the target score with respect to a module's output A instead of the
model's input (captum's ``Layer*`` methods). `LayerTap` places a forward hook (a forward-pre hook for the module's
input) through a `HookManager` of its own, for one forward pass: `capture` hands the model a fresh leaf holding A and
records it (the gradient of the score w.r.t. that leaf is the layer gradient; the graph before the layer is not
needed, so integer inputs such as token ids work), `replace` hands the model a given tensor instead of A (Integrated
Gradients walks its path in the layer's output space). The model gets a clone of the leaf, so a later in-place
operation on the layer's output cannot touch the leaf.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from .._checks import bool_option
from ..hooks import HookError, HookManager, Selector, select_modules


def resolve_one_module(model: nn.Module, layer: Selector) -> tuple[str, nn.Module]:
    """(name, module) of the one module of `model` that the HookManager selector `layer` names."""
    try:
        found = select_modules(model, layer)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"layer: {exc}") from None
    if len(found) > 1:
        names = ", ".join(repr(n) for n, _ in found[:5]) + (f", ... ({len(found)} in all)" if len(found) > 5 else "")
        raise ValueError(
            f"layer must name one module of {type(model).__name__}, but the selector matches {len(found)}: {names}; "
            "pass a dotted name or a module instance"
        )
    return found[0]


class LayerTap:
    """The output (``layer_input=False``) or first input (``layer_input=True``) of one module of `model`."""

    def __init__(self, model: nn.Module, layer: Selector, *, layer_input: bool = False) -> None:
        bool_option("layer_input", layer_input)
        self.model = model
        self.name, self.module = resolve_one_module(model, layer)
        self.layer_input = layer_input

    @property
    def what(self) -> str:
        return f"{'input' if self.layer_input else 'output'} of layer {self.name!r}"

    def __repr__(self) -> str:
        return f"layer={self.name!r}" + (", layer_input=True" if self.layer_input else "")

    @contextmanager
    def capture(self) -> Iterator[list[Tensor]]:
        """During the block, every call of the module records a leaf (requires grad) holding its tensor."""
        taken: list[Tensor] = []

        def swap(t: Any) -> Tensor:
            self._check_tensor(t)
            leaf = t.detach().requires_grad_(True)
            taken.append(leaf)
            return leaf.clone()

        with self._hooked(swap):
            yield taken

    @contextmanager
    def replace(self, value: Tensor) -> Iterator[list[Tensor]]:
        """During the block, the module's tensor is replaced by `value` (same shape); `value` is recorded."""
        taken: list[Tensor] = []

        def swap(t: Any) -> Tensor:
            self._check_tensor(t)
            if t.shape != value.shape:
                raise HookError(f"the {self.what} has shape {tuple(t.shape)}, expected {tuple(value.shape)}")
            taken.append(value)
            return value.clone()

        with self._hooked(swap):
            yield taken

    def one(self, taken: list[Tensor]) -> Tensor:
        """The single tensor recorded in one forward pass; an error if the module ran never or several times."""
        if len(taken) != 1:
            how = "did not run" if not taken else f"ran {len(taken)} times"
            raise ValueError(
                f"layer {self.name!r} {how} in the forward pass; layer attribution needs a module that runs exactly "
                "once (choose another layer)"
            )
        return taken[0]

    @contextmanager
    def _hooked(self, swap: Any) -> Iterator[None]:
        with HookManager(self.model) as hooks:
            if self.layer_input:
                hooks.forward_pre(self.module, lambda module, args: (swap(args[0] if args else None), *args[1:]))
            else:
                hooks.forward(self.module, lambda module, args, out: swap(out))
            yield

    def _check_tensor(self, t: Any) -> None:
        if not isinstance(t, Tensor):
            raise HookError(
                f"the {self.what} is {type(t).__name__}, not a tensor; layer attribution needs a module whose "
                f"{'first input' if self.layer_input else 'output'} is one tensor"
            )
        if not t.is_floating_point():
            raise HookError(
                f"the {self.what} is a {t.dtype} tensor; layer attribution needs floating-point values to "
                "differentiate (choose a layer after the embedding, or the embedding's output)"
            )
