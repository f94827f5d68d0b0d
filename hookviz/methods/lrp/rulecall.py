"""`RuleCall`: one application of a transformer rule (AttnLRP / CP-LRP) in the forward pass, kept for its
backward pass and the relevance audit; `_PassFn`, the identity rule's autograd Function; `NOT_HANDLED`, what a
transformer rule's handler returns for a call that is not its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .audit import AuditEntry
from .rules import Rule

NOT_HANDLED = object()  # a transformer rule's handler: not this rule's call (LRP's other entries, or none, take it)


class RuleCall:
    """One application of a transformer rule in the forward pass, kept for its backward pass and the audit."""

    __slots__ = ("entry", "rule", "tensors", "z", "extra", "version")

    def __init__(self, entry: AuditEntry, rule: Rule, tensors: tuple[Tensor, ...], z: Tensor, extra: Any) -> None:
        self.entry = entry
        self.rule = rule
        self.tensors = tensors
        self.z = z
        self.extra = extra
        self.version = tuple(t._version for t in (*tensors, z))

    def hand_on(self) -> Tensor:
        """The output, handed on as the Function's output without a copy; the call keeps an alias (sharing its
        version counter), not the output itself, which would hold the graph node that holds this call (a cycle)."""
        z = self.z
        self.z = z.detach()
        return z

    def hand_on_only(self) -> Tensor:
        """The output, handed on without keeping even an alias: for rules whose backward recomputes it."""
        z = self.z
        self.z = None  # type: ignore[assignment]
        return z

    def output(self, recompute: Callable[[], Tensor]) -> Tensor:
        """The output as the forward pass computed it; `recompute` (from the inputs) where the model changed it in
        place afterwards (``scores += mask``, ``masked_fill_``): the outputs are handed on without a copy."""
        return self.z if self.z._version == self.version[-1] else recompute()

    def inputs(self) -> tuple[Tensor, ...]:
        """The stored inputs; `RuntimeError` if they were modified in place since."""
        if tuple(t._version for t in self.tensors) != self.version[:-1]:
            raise RuntimeError(
                f"LRP: an input of {self.entry.name!r} was modified in place after it was read, so its rule cannot "
                "be evaluated; make the in-place operation that follows it out of place"
            )
        return self.tensors


def _per_input(t: Tensor, n: int) -> Tensor:
    t = t.detach()
    if t.dim() > 0 and t.shape[0] == n:
        return t.reshape(n, -1).sum(1)
    return t.sum().expand(n) / n  # a factor without the batch axis first: its total, spread evenly


def _audit(call: RuleCall, r: Tensor, *r_in: Tensor) -> None:
    audit_entry(call.entry, r, *r_in)


def audit_entry(entry: AuditEntry, r: Tensor, *r_in: Tensor) -> None:
    """Add the relevance that entered a rule call (`r`) and left it (`r_in`, per factor) to its audit `entry`."""
    n = r.shape[0] if r.dim() > 0 else 1
    entry.add(_per_input(r, n), sum(_per_input(t, n) for t in r_in))


class _PassFn(torch.autograd.Function):
    """Output: an elementwise op's output (boxed, ``(z,)``: handed on without a copy); backward: relevance
    unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, zbox: tuple[Tensor]) -> Tensor:
        return zbox[0]

    @staticmethod
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None]:
        return r, None
