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


@dataclass
class AuditEntry:
    """One layer call: ``name`` (module name, ``#k`` for its k-th call; a function name for functional ops),
    ``rule``, and the relevance summed over the layer's output (``entered``) and input (``left``), per input (N,)."""

    name: str
    rule: str
    entered: Tensor | None = None
    left: Tensor | None = None

    def add(self, entered: Tensor, left: Tensor) -> None:
        self.entered = entered if self.entered is None else self.entered + entered
        self.left = left if self.left is None else self.left + left

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
