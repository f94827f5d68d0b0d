"""Several inputs and extra forward arguments: how a batch reaches ``forward``, and how it is expanded row by row.

A batch is a tuple of input tensors, the attributed arguments of ``forward``, which share the batch size N, followed
by ``additional_forward_args`` (captum's name): further arguments of ``forward`` (masks, lengths, flags) that are
passed on but not attributed, so the call is ``model(*inputs, *additional_forward_args)``. Methods that evaluate the
model on many rows per input (SmoothGrad's noisy copies, Integrated Gradients' path points) take rows ``i`` of every
input, and of every extra tensor whose first dimension is N, so the extra arguments stay aligned with their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class ForwardArgs:
    """The extra arguments of ``forward`` for a batch of `n` rows (empty: ``model(*inputs)``)."""

    extra: tuple[Any, ...] = ()
    n: int = 0

    def __call__(self, model: nn.Module, inputs: Sequence[Tensor]) -> Any:
        return model(*inputs, *self.extra)

    def rows(self, index: Tensor) -> ForwardArgs:
        """The arguments of an expanded batch whose row r belongs to input ``index[r]``: per-sample tensors (first
        dimension N) are indexed, everything else is passed on as it is."""
        if not self.extra:
            return ForwardArgs((), len(index))
        extra = tuple(a[index.to(a.device)] if _per_sample(a, self.n) else a for a in self.extra)
        return ForwardArgs(extra, len(index))


def _per_sample(a: object, n: int) -> bool:
    return isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == n


def check_forward_args(args: object, n: int, *, expanding: bool, method: str) -> ForwardArgs:
    """`ForwardArgs` from ``additional_forward_args`` (None, one argument, or a tuple of them) for a batch of `n`.

    A method that expands the batch (`expanding`) must know which rows every tensor belongs to: a tensor with a
    first dimension other than N raises `ValueError` before any work (0-d tensors and non-tensors are shared).
    """
    if args is None:
        return ForwardArgs((), n)
    extra = args if isinstance(args, tuple) else (args,)
    if expanding:
        for k, a in enumerate(extra):
            if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] != n:
                raise ValueError(
                    f"additional_forward_args[{k}] has shape {tuple(a.shape)}, but {method} evaluates the model on "
                    f"several rows per input and expands per-sample tensors with them, so tensors among "
                    f"additional_forward_args must have the batch's first dimension N = {n}; bind a tensor shared by "
                    "all inputs into the model instead (a wrapper module or functools.partial)"
                )
    return ForwardArgs(extra, n)


def as_tuple(x: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """A batch as a tuple of input tensors (one tensor: a 1-tuple)."""
    return x if isinstance(x, tuple) else (x,)


def take_rows(xs: tuple[Tensor, ...], index: Tensor) -> tuple[Tensor, ...]:
    """Rows ``index`` of every input tensor."""
    return tuple(t[index.to(t.device)] for t in xs)
