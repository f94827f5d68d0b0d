"""`Call`: one intercepted operation, as a rule sees it during the forward pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from ...hooks import HookManager


@dataclass
class Call:
    """One call of an operation that a rule covers.

    Attributes:
        op: the module, or the functional callable as called (``torch.relu_``, ``Tensor.add``).
        name: the module's dotted name, or the callable's report name from the table (``"F.relu"``).
        kind: ``"module"`` or ``"functional"``.
        args, kwargs: the call's arguments (a module's positional inputs; kwargs of a module call are empty).
        output: what the operation returned (for an in-place call that the engine split, `Rule.needs_input`:
            the out-of-place result; the input still holds its old values).
        hooks: the method's `HookManager`, for tensor hooks the rule places on the output.
        inplace: the call was in place and runs out of place for this rule: the engine writes the rule's result
            back into the input (an autograd Function that saves the input must save a copy).
        count: which call of this operation this is in the forward pass (1 for the first), for per-call keys.
    """

    op: nn.Module | Callable[..., Any]
    name: str
    kind: Literal["module", "functional"]
    args: tuple
    kwargs: dict
    output: Any
    hooks: HookManager
    inplace: bool = False
    count: int = 1
    runs_as: Callable[..., Any] | None = field(default=None, repr=False)  # the callable that computed `output`

    @property
    def input(self) -> Any:
        """The first input: the first positional argument (or ``input=``)."""
        return self.args[0] if self.args else self.kwargs.get("input")

    def function(self) -> Callable[[Any], Any]:
        """The operation as a function of its first input, every other argument held: a module's ``forward``
        (without its hooks), a functional call's out-of-place variant. For rules that re-evaluate the operation in
        their backward pass (DeepLift's rescale rule falls back to the derivative, LRP's pooling rule)."""
        if isinstance(self.op, nn.Module):
            if len(self.args) <= 1 and not self.kwargs:
                return self.op.forward
            module, rest = self.op, self.args[1:]
            return lambda t: module.forward(t, *rest)
        base = self.runs_as or self.op
        rest = self.args[1:]
        kwargs = {k: v for k, v in self.kwargs.items() if k not in ("inplace", "input")}
        return lambda t: base(t, *rest, **kwargs)
