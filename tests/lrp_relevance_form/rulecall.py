"""The relevance form's `RuleCall`: one application of a transformer rule (AttnLRP / CP-LRP) in the forward pass,
kept for its backward pass and the relevance audit; `Recompute`, a tensor a rule computes again instead of keeping
it; `_PassFn`, the identity rule's autograd Function. A transformer rule's handler returns
`hookviz.methods.lrp.attention.NOT_HANDLED` for a call that is not its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hookviz.methods.lrp.audit import AuditEntry
from hookviz.methods.lrp.rules import Rule


class Recompute:
    """A tensor that a rule's backward pass computes again from its source instead of keeping it from the forward
    pass: the output of an elementwise activation or a normalisation (transformer composites), cheap to compute and
    as large as its input, which the rules keep anyway (the output of the linear layer or sum before it). ``fn`` is
    the operation as the forward pass called it (the same numbers, bit for bit); ``source`` a tensor or, for a chain
    (a normalisation of an activation), another `Recompute`."""

    __slots__ = ("fn", "source", "version", "what", "cache", "cached")

    def __init__(self, fn: Callable[[Tensor], Tensor], source: Tensor | Recompute, what: str, cache: bool) -> None:
        self.fn = fn
        self.source = source
        self.version = source._version if isinstance(source, Tensor) else 0
        self.what = what
        self.cache = cache  # kept from the first reader's backward to the producer's (`release`), which runs last
        self.cached: Tensor | None = None

    def release(self) -> None:
        """Drop the value kept for the other readers (the producer's backward: every reader's has run)."""
        self.cached = None

    def __call__(self) -> Tensor:
        if self.cached is not None:
            return self.cached
        src = self.source
        if isinstance(src, Recompute):
            src = src()
        elif src._version != self.version:
            raise RuntimeError(
                f"LRP: the input of {self.what!r} was modified in place after it was read, so its output cannot be "
                "recomputed for the rules; make the in-place operation that follows it out of place"
            )
        with torch.no_grad():
            out = self.fn(src)
        if self.cache:
            self.cached = out
        return out


Kept = Tensor | Recompute  # what a rule call keeps for its backward pass


def value(t: Kept) -> Tensor:
    """The tensor a rule call kept (`Recompute`: computed now)."""
    return t() if isinstance(t, Recompute) else t


def _version(t: Kept) -> int:
    return t._version if isinstance(t, Tensor) else 0  # a Recompute checks its own source


class RuleCall:
    """One application of a transformer rule in the forward pass, kept for its backward pass and the audit."""

    __slots__ = ("entry", "rule", "tensors", "z", "extra", "version")

    def __init__(self, entry: AuditEntry, rule: Rule, tensors: tuple[Kept, ...], z: Kept, extra: Any) -> None:
        self.entry = entry
        self.rule = rule
        self.tensors = tensors
        self.z = z
        self.extra = extra
        self.version = tuple(_version(t) for t in (*tensors, z))

    def hand_on(self) -> Tensor:
        """The output, handed on as the Function's output without a copy; the call keeps an alias (sharing its
        version counter), not the output itself, which would hold the graph node that holds this call (a cycle)."""
        z = self.z
        assert isinstance(z, Tensor)
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
        z = self.z
        if isinstance(z, Recompute):
            return z()
        return z if z._version == self.version[-1] else recompute()

    def inputs(self) -> tuple[Tensor, ...]:
        """The stored inputs (`Recompute`: computed now); `RuntimeError` if they were modified in place since."""
        if tuple(_version(t) for t in self.tensors) != self.version[:-1]:
            raise RuntimeError(
                f"LRP: an input of {self.entry.name!r} was modified in place after it was read, so its rule cannot "
                "be evaluated; make the in-place operation that follows it out of place"
            )
        return tuple(value(t) for t in self.tensors)


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
