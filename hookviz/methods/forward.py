"""Several inputs and extra forward arguments: how a batch reaches ``forward``, and how it is expanded row by row.

A batch is a tuple of input tensors, the attributed arguments of ``forward``, which share the batch size N, followed
by ``additional_forward_args`` (captum's name): further arguments of ``forward`` (masks, lengths, flags) that are
passed on but not attributed, and ``forward_kwargs`` (keyword arguments such as Hugging Face's ``attention_mask``),
so the call is ``model(*inputs, *additional_forward_args, **forward_kwargs)``. Methods that evaluate the
model on many rows per input (SmoothGrad's noisy copies, Integrated Gradients' path points) take rows ``i`` of every
input, and of every extra tensor (positional or keyword) whose first dimension is N, so the extra arguments stay
aligned with their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class ForwardArgs:
    """The extra arguments of ``forward`` for a batch of `n` rows (empty: ``model(*inputs)``)."""

    extra: tuple[Any, ...] = ()
    n: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, model: nn.Module, inputs: Sequence[Tensor]) -> Any:
        return model(*inputs, *self.extra, **self.kwargs)

    def rows(self, index: Tensor) -> ForwardArgs:
        """The arguments of an expanded batch whose row r belongs to input ``index[r]``: per-sample tensors (first
        dimension N) are indexed, everything else is passed on as it is."""
        if not self.extra and not self.kwargs:
            return ForwardArgs((), len(index))

        def take(a: Any) -> Any:
            return a[index.to(a.device)] if _per_sample(a, self.n) else a

        return ForwardArgs(tuple(take(a) for a in self.extra), len(index), {k: take(v) for k, v in self.kwargs.items()})


def _per_sample(a: object, n: int) -> bool:
    return isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == n


def check_forward_args(
    args: object, n: int, *, expanding: bool, method: str, forward_kwargs: object = None
) -> ForwardArgs:
    """`ForwardArgs` from ``additional_forward_args`` (None, one argument, or a tuple of them) and ``forward_kwargs``
    (None or a dict of keyword arguments of ``forward``) for a batch of `n`, checked before any work.

    A method that expands the batch (`expanding`) must know which rows every tensor belongs to: a positional tensor
    with a first dimension other than N raises `ValueError`. Tensors among ``forward_kwargs`` must have the batch's
    first dimension N for every method (Hugging Face's ``attention_mask``, ``token_type_ids``); 0-d tensors and
    non-tensors are passed on as they are.
    """
    kwargs: dict[str, Any] = {}
    if forward_kwargs is not None:
        if not isinstance(forward_kwargs, dict) or not all(isinstance(k, str) for k in forward_kwargs):
            raise TypeError(
                f"forward_kwargs must be a dict of keyword arguments of forward (str keys), e.g. "
                f"{{'attention_mask': mask}}; got {type(forward_kwargs).__name__}"
            )
        for key, value in forward_kwargs.items():
            if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] != n:
                raise ValueError(
                    f"forward_kwargs[{key!r}] has shape {tuple(value.shape)}, but tensors among forward_kwargs must "
                    f"have the batch's first dimension N = {n} (they are expanded with the inputs' rows); bind a "
                    "tensor shared by all inputs into the model instead (a wrapper module or functools.partial)"
                )
        kwargs = dict(forward_kwargs)
    if args is None:
        return ForwardArgs((), n, kwargs)
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
    return ForwardArgs(extra, n, kwargs)


def as_tuple(x: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """A batch as a tuple of input tensors (one tensor: a 1-tuple)."""
    return x if isinstance(x, tuple) else (x,)


def take_rows(xs: tuple[Tensor, ...], index: Tensor) -> tuple[Tensor, ...]:
    """Rows ``index`` of every input tensor."""
    return tuple(t[index.to(t.device)] for t in xs)
