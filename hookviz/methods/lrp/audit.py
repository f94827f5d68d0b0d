"""The relevance audit: how much relevance entered and left each layer in an LRP backward pass.

LRP rules conserve relevance only approximately: biases absorb some (LRP-epsilon on a layer with a bias), the
stabilizer absorbs a little, and an operation with no rule passes its plain gradient, which conserves nothing in
general. The audit lists, per layer call in execution order, the relevance that came in at its output and went out
at its input, so a user sees where it leaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


class AuditBook:
    """The sums of every entry of one pass in one (entries, 2, N) buffer, made at the first sum of the backward pass:
    one small tensor per entry and sum, kept to the end of the pass between the large ones a backward pass frees,
    would hold the heap apart (on a CPU, a third more resident memory on a ViT-Small)."""

    def __init__(self, entries: list[AuditEntry]) -> None:
        self.entries = entries  # complete when the backward pass starts
        self.buffer: Tensor | None = None

    def rows(self, row: int, like: Tensor) -> tuple[Tensor, Tensor] | None:
        """Row `row`'s (entered, left) views, zero at first; None where `like`, a sum, does not fit the buffer."""
        if like.dim() != 1:
            return None
        return self.rows_of(row, like.shape[0], like.dtype, like.device)

    def rows_of(self, row: int, n: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """`rows` for sums of `n` inputs in `dtype` on `device`."""
        if self.buffer is None:
            self.buffer = torch.zeros(len(self.entries), 2, n, dtype=dtype, device=device)
        buf = self.buffer
        if row >= buf.shape[0] or buf.shape[2] != n or buf.dtype != dtype or buf.device != device:
            return None
        return buf[row, 0], buf[row, 1]


@dataclass
class AuditEntry:
    """One layer call: ``name`` (module name, ``#k`` for its k-th call; a function name for functional ops),
    ``rule``, and the relevance summed over the layer's output (``entered``) and input (``left``), per input (N,)."""

    name: str
    rule: str
    entered: Tensor | None = None
    left: Tensor | None = None
    book: AuditBook | None = field(default=None, repr=False, compare=False)  # where the sums go, if anywhere
    row: int = field(default=0, repr=False, compare=False)

    def add(self, entered: Tensor, left: Tensor) -> None:
        if self.entered is None and self.book is not None:
            rows = self.book.rows(self.row, entered)
            if rows is not None and left.shape == entered.shape and left.dtype == entered.dtype:
                self.entered, self.left = rows
        if self.book is not None and self.book.buffer is not None and self.entered is not None:
            if self.entered._base is self.book.buffer and entered.dtype == left.dtype == self.entered.dtype:
                self.entered.add_(entered)  # the same numbers as a sum out of place: 0 + a = a
                self.left.add_(left)  # type: ignore[union-attr]
                return
        self.entered = entered if self.entered is None else self.entered + entered
        self.left = left if self.left is None else self.left + left

    def add_dots(self, z: Tensor, g: Tensor, left_of: Tensor, gp: Tensor, n: int) -> bool:
        """The sums ``sum z g`` (entered) and ``sum left_of gp`` (left) per input written straight into the pass's
        buffer, where this is the entry's first sum and the four tensors are (n, ...) of one shape and dtype (a
        stabilized call's usual case: two kernels, no temporaries); False where not (the caller then `add`s)."""
        book = self.book
        if (
            self.entered is not None
            or book is None
            or z.dim() == 0
            or z.shape[0] != n
            or not (z.shape == g.shape == left_of.shape == gp.shape)
            or not (z.dtype == g.dtype == left_of.dtype == gp.dtype)
        ):
            return False
        rows = book.rows_of(self.row, n, z.dtype, z.device)
        if rows is None:
            return False
        # the same numbers as `add`'s 0 + sum (a zero's sign aside)
        torch.linalg.vecdot(z.reshape(n, -1), g.reshape(n, -1), out=rows[0])
        torch.linalg.vecdot(left_of.reshape(n, -1), gp.reshape(n, -1), out=rows[1])
        self.entered, self.left = rows
        return True

    @property
    def leak(self) -> Tensor:
        """``entered - left`` per input (N,): relevance absorbed (positive) or created (negative) here."""
        if self.entered is None or self.left is None:
            return torch.zeros(0)
        return self.entered - self.left


@dataclass
class RelevanceAudit:
    """Relevance per layer of the last `LRP.attribute` call (summed over the K targets when there are several).

    ``start``: the relevance put in at the output, f_c(x) per input (N,); ``total``: the input relevance summed per
    input (N,); ``conservation``: total / start (1.0 where every rule conserves); ``entries``: one `AuditEntry` per
    layer call that the backward pass reached, in execution order.
    """

    start: Tensor
    total: Tensor
    entries: list[AuditEntry] = field(default_factory=list)

    @property
    def conservation(self) -> Tensor:
        return self.total / self.start.where(self.start != 0, torch.ones_like(self.start))

    def leaks(self, top: int = 10) -> list[AuditEntry]:
        """The `top` layer calls with the largest ``|entered - left|`` (summed over inputs)."""
        seen = [e for e in self.entries if e.entered is not None]
        return sorted(seen, key=lambda e: -float(e.leak.abs().sum()))[:top]

    def __str__(self) -> str:
        lines = [
            "relevance audit: input relevance / f_c(x) = "
            + ", ".join(f"{float(c):.4f}" for c in self.conservation.flatten()[:8])
            + (" ..." if self.conservation.numel() > 8 else ""),
            f"{'layer':<32} {'rule':<12} {'entered':>12} {'left':>12} {'leak':>10}",
        ]
        for e in self.leaks():
            assert e.entered is not None and e.left is not None
            ent, lef = float(e.entered.sum()), float(e.left.sum())
            lines.append(f"{e.name[:32]:<32} {e.rule:<12} {ent:>12.5g} {lef:>12.5g} {ent - lef:>10.3g}")
        return "\n".join(lines)
