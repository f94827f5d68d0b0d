"""The row layout DeepLift's rules share: the N inputs and their N baselines run as one batch of 2N rows, inputs
first, so that every intercepted operation sees each activation next to its reference activation.

A tensor "has rows" when its leading axis is that batch (or the batch merged with the axes after it: ``(2N * L,
d)`` after a flatten keeps the inputs' rows first). A tensor without them (a parameter, a constant, a tensor
broadcast over the batch) takes the same value in both halves: its difference to the reference is zero.
"""

from __future__ import annotations

from torch import Tensor


def differences(t: Tensor) -> Tensor:
    """``t[:n] - t[n:]`` repeated for both halves (2n, ...): each row's difference to its reference row."""
    a, b = t.chunk(2)
    d = a - b
    return d.repeat(2, *(1,) * (d.dim() - 1))


def has_rows(t: object, shape: tuple[int, ...]) -> bool:
    """Whether `t` carries the rows of an operation's output of `shape` (2N rows first): its leading axis is the
    output's, not broadcast (operands align their trailing axes, so one with fewer axes has no batch axis)."""
    return (
        isinstance(t, Tensor)
        and t.dim() == len(shape)
        and t.dim() >= 1
        and t.shape[0] == shape[0]
        and shape[0] % 2 == 0
    )


def midpoint(t: Tensor) -> Tensor:
    """``(t[:n] + t[n:]) / 2``, shaped (n, ...): the mean of each row and its reference row."""
    a, b = t.detach().chunk(2)
    return (a + b) * 0.5


def per_half(g: Tensor) -> Tensor:
    """``g`` (2n, ...) seen as (2, n, ...), so that an (n, ...) tensor applies to both halves alike."""
    return g.unflatten(0, (2, g.shape[0] // 2))
