"""`AttentionCheck`: every attention module of a transformer must run an attention the LRP rules see (softmax,
``F.scaled_dot_product_attention``, ``F.multi_head_attention_forward``); a custom kernel or a TorchScript function
would give its attention a plain gradient, silently. Both forms of the transformer rules count the attentions they
apply (`calls`) and place this check around the attention modules for the forward pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ...hooks import HookManager, Selection
from ..cam_layer import is_attention_module
from ..rules import RuleEngine


class AttentionCheck:
    """The attentions applied in one forward pass (`calls`, counted by the rules) and the attention modules running
    now (`where` names a rule call after the innermost one)."""

    def __init__(self) -> None:
        self.calls = 0
        self._open: list[tuple[str, int]] = []  # attention modules being run: (name, attention calls at entry)

    def clear(self) -> None:
        self._open.clear()

    def where(self, what: str) -> str:
        return f"{self._open[-1][0]}: {what}" if self._open else what

    def enter(self, name: str) -> None:
        self._open.append((name, self.calls))

    def leave(self, name: str, module: nn.Module, ran_on_input: bool) -> None:
        if not self._open:
            return
        _, before = self._open.pop()
        if ran_on_input and self.calls == before:
            raise RuntimeError(
                f"LRP: the attention module {name!r} ({type(module).__name__}) ran without any operation the engine "
                "sees (softmax, F.scaled_dot_product_attention, F.multi_head_attention_forward): a custom kernel or "
                "a TorchScript function computes its attention, which would get a plain gradient instead of the "
                "attention rules; use the module's eager (PyTorch) attention"
            )

    def place(
        self,
        model: nn.Module,
        hooks: HookManager,
        engine: RuleEngine,
        hooked: Callable[[nn.Module], bool],
        depends: Callable[[object], bool],
    ) -> None:
        """Hooks (through `hooks`, removed with the method's call) around the attention modules of `model` that the
        engine does not hook itself (`hooked`); `depends`: whether a module's output depends on the input."""

        def attention(name: str, module: nn.Module) -> bool:
            return module is not model and is_attention_module(module) and not hooked(module)

        def enter(name: str, module: nn.Module, args: tuple) -> None:
            if engine.acting() and engine.depth == 0:
                self.enter(name)

        def leave(name: str, module: nn.Module, args: tuple, output: Any) -> None:
            if engine.acting() and engine.depth == 0:
                first = output
                while isinstance(first, (tuple, list)) and first:
                    first = first[0]
                self.leave(name, module, depends(first))

        found = Selection([(n, m) for n, m in model.named_modules() if attention(n, m)])  # one walk for both hooks
        if found:
            hooks.forward_pre(found, enter, with_name=True)
            hooks.forward(found, leave, with_name=True)
