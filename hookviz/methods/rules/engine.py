"""`RuleEngine`: the one interception of a modified backward pass, active only during the method's forward pass.

Two ways in, one dispatch (`RuleTable`):

- module calls through forward hooks placed through the method's `HookManager` (a forward-pre hook counts the depth,
  a forward hook with ``always_call`` applies the rule): a hook per call, so a module run twice gets its rule twice,
  and no full backward hook (they break on ``nn.ReLU(inplace=True)``, pytorch#61519);
- functional calls inside a ``forward`` (``F.relu``, ``torch.add``, ``x.relu_()``, ``a += b``, ...) through a
  `torch.overrides.TorchFunctionMode` entered around the forward pass only: nothing process-wide is patched, and
  code running outside the pass (or in another thread: the mode stack is per thread) is not touched.

Scope. The engine acts only while its own hookviz call is the innermost active call of its thread (`scope.acting`):
a nested explainer's forward pass, or another thread's forward pass of the same model, passes untouched. Functional
calls made inside a hooked module (``nn.GELU`` calls ``F.gelu``) are not seen twice: while a hooked module runs,
and while a rule runs, the depth is above zero and the mode lets calls pass. Everything (module hooks, the mode, the
depth) is undone in ``finally``, for any exception and for ``KeyboardInterrupt``; tensor hooks that rules place on
the graph stay with the method's `HookManager` until the method's call ends, since the backward pass needs them.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from ...hooks import HookManager, Selection
from ..scope import acting, current_call
from .call import Call
from .coverage import Coverage, Recorder
from .ops import out_of_place
from .table import Rule, RuleTable

# the thread's torch function mode stack (C functions: no Python context manager per module call)
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_stack_pop = torch._C._pop_torch_function_stack
_stack_push = torch._C._push_on_torch_function_stack

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # .../hookviz


class RuleEngine:
    """Applies `table` to the forward pass of `model` run inside `forward_pass`; `coverage` reports what it did.

    Build one per forward pass, inside the method's call (its hookviz call token is taken here), with the
    method's `HookManager`:

    Example::

        engine = RuleEngine(model, hooks, table, method="GuidedBackprop")
        with engine.forward_pass():
            output = model(x)
        engine.coverage      # a Coverage, also when the pass raised
    """

    def __init__(self, model: nn.Module, hooks: HookManager, table: RuleTable, *, method: str) -> None:
        if not isinstance(table, RuleTable):
            raise TypeError(f"table must be a RuleTable, got {type(table).__name__}")
        self.model = model
        self.hooks = hooks
        self.table = table
        self.method = method
        self.call = current_call()  # the method's own call: the engine acts only while it is the innermost
        self.coverage: Coverage | None = None
        self.depth = 0
        self._in_forward = False
        self._handles: list[RemovableHandle] = []
        self._rules: dict[int, Rule | None] = {}  # id(module) -> its rule, resolved once per pass
        self._counts: Counter[str] = Counter()
        self._recorder = Recorder()
        self._mode: _Interceptor | None = None  # the function mode, while the forward pass runs
        self._popped: list[bool] = []  # per running watched module: whether its call took the mode off the stack
        self._open: list[Rule] = []  # the rules of the open modules running now (`Rule.enter`), innermost last

    def acting(self) -> bool:
        """Whether the engine's module hooks act now: inside its forward pass and its own call (hooked modules inside
        hooked modules get their rules too; only functional calls inside them pass, see `depth`)."""
        return self._in_forward and acting(self.call)

    @contextmanager
    def forward_pass(self) -> Iterator[RuleEngine]:
        """Hooks and the function mode for the block (the model's forward pass), undone in ``finally``; then
        `coverage`, and one warning if operations the table watches ran without a rule (``table.warn``)."""
        if self._in_forward:
            raise RuntimeError(f"{self.method}: this RuleEngine is already in a forward pass; build one per pass")
        self._recorder = Recorder()
        self._counts.clear()
        try:
            self._place_hooks()
            self._in_forward = True
            self._mode = _Interceptor(self)
            with self._mode:
                try:
                    yield self
                finally:  # a module call that never ended (an exception between the hooks): the mode goes back
                    while self._popped:
                        if self._popped.pop():
                            _stack_push(self._mode)
        finally:
            self._in_forward = False
            self._mode = None
            self.depth = 0
            self._open.clear()
            for handle in self._handles:
                handle.remove()  # idempotent: the HookManager removes them again at the end of the call
            self._handles.clear()
            self._rules.clear()
            self.coverage = self._recorder.report(self.method, type(self.model).__name__)
        if self.table.warn and self.coverage.uncovered:
            warnings.warn(self.coverage.warning(), stacklevel=_user_stacklevel())

    # -- modules ------------------------------------------------------------------------------------------------
    def _place_hooks(self) -> None:
        watched: list[tuple[str, nn.Module]] = []
        open_: list[tuple[str, nn.Module]] = []  # modules whose rule has `enter`: their functional calls intercepted
        needs_input: list[nn.Module] = []
        for name, module in self.model.named_modules():  # a module shared under two names: its first name only
            hit, rule = self.table.module_entry(name, module)
            if hit:
                self._rules[id(module)] = rule
                (open_ if rule is not None and rule.enter is not None else watched).append((name, module))
                if rule is not None and rule.needs_input:
                    needs_input.append(module)
        if open_:
            self._place_open_hooks(open_)
        if not watched:
            return
        # in-place modules run out of place while the method's hooks live, so that the rule sees the input
        self.hooks.out_of_place(needs_input)

        # While a watched module runs, its functional calls pass untouched (`depth`): the function mode is taken
        # off the stack for it (when it is the innermost mode), so that they do not go through it at all (ReLU's
        # F.relu is a Python-level torch function: its round trip through the mode cost more than the relu), and
        # put back when the module's call ends (the hook runs also when the forward raises: ``always_call``)
        popped = self._popped

        def enter(module: nn.Module, args: tuple) -> None:
            if self.acting():
                self.depth += 1
                popped.append(self._pop_mode())

        def leave(name: str, module: nn.Module, args: tuple, output: Any) -> Any:
            if not self.acting():
                return None
            self.depth -= 1
            if not popped or not popped.pop():
                return self._module_call(name, module, args, output)
            try:  # the mode is off the stack already
                return self._module_call_body(name, module, args, output)
            finally:
                _stack_push(self._mode)

        selection = Selection(watched)  # resolved here: the hooks go on without walking the model twice more
        self._handles += self.hooks.forward_pre(selection, enter)
        self._handles += self.hooks.forward(selection, leave, with_name=True, always_call=True)

    def _place_open_hooks(self, modules: list[tuple[str, nn.Module]]) -> None:
        def enter(module: nn.Module, args: tuple) -> None:
            if self.acting():
                rule = self._rules[id(module)]
                assert rule is not None and rule.enter is not None
                rule.enter(module)
                self._open.append(rule)

        def leave(name: str, module: nn.Module, args: tuple, output: Any) -> Any:
            if not self.acting():
                return None
            if self._open:  # its own call is the open module's rule's, outside it (also when the forward raised)
                self._open.pop()
            return self._module_call(name, module, args, output)

        selection = Selection(modules)
        self._handles += self.hooks.forward_pre(selection, enter)
        self._handles += self.hooks.forward(selection, leave, with_name=True, always_call=True)

    def _pop_mode(self) -> bool:
        """Take the engine's function mode off the thread's stack if it is the innermost mode; whether it was."""
        depth = _stack_len()
        if self._mode is None or not depth or _stack_at(depth - 1) is not self._mode:
            return False
        _stack_pop()
        return True

    def _module_call(self, name: str, module: nn.Module, args: tuple, output: Any) -> Any:
        # The rule and the engine's own reads (requires_grad, register_hook) run with the engine's function mode off
        # the stack when it is the innermost mode (as it is in a module hook of the pass): with it on, each of them
        # went through the mode's __torch_function__, which lets it pass anyway (`depth` is above zero while a rule
        # runs): three round trips per ReLU call for GuidedBackprop, none of them doing anything
        if not self._pop_mode():
            return self._module_call_body(name, module, args, output)
        try:
            return self._module_call_body(name, module, args, output)
        finally:
            _stack_push(self._mode)

    def _module_call_body(self, name: str, module: nn.Module, args: tuple, output: Any) -> Any:
        self._recorder.module_calls[name] += 1
        rule = self._rules.get(id(module))
        if rule is None:
            self._recorder.not_covered("module", name)
            return None
        if not rule.owns_call and (not isinstance(output, Tensor) or not _needs_grad(args, {})):
            self._recorder.declined_by(rule.name, "module", name)
            return None
        self._counts[name] += 1
        call = Call(module, name, "module", args, {}, output, self.hooks, count=self._counts[name])
        self.depth += 1  # what the rule computes is not intercepted
        try:
            result = rule.apply(call)
        finally:
            self.depth -= 1
        if result is NotImplemented and not rule.owns_call:  # the rule cannot take this call: it keeps its output
            self._recorder.not_covered("module", name)
            return None
        if rule.owns_call and (result is None or result is NotImplemented):
            self._recorder.declined_by(rule.name, "module", name)
            return None
        self._recorder.rewritten(rule.name, "module", name)
        return result

    # -- functional calls -----------------------------------------------------------------------------------------
    def _function_call(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self.depth > 0 or not acting(self.call):
            return func(*args, **kwargs)
        if self._open:
            inside = self._open[-1].inside
            if inside is not None and not inside(func):  # covered whole by the open module's rule
                return func(*args, **kwargs)
        entry = self.table.function_entry(func)
        if entry is None:
            return self._unnamed(func, args, kwargs)
        name, rule = entry
        if rule is None:
            self._recorder.not_covered("functional", name)
            return func(*args, **kwargs)
        if not _needs_grad(args, kwargs):
            self._recorder.declined_by(rule.name, "functional", name)
            return func(*args, **kwargs)
        if rule.owns_call:
            return self._owned_call(func, name, rule, args, kwargs)
        base = out_of_place(func)
        inplace = base is not None or bool(kwargs.get("inplace", False))
        split = inplace and rule.needs_input
        runs_as = base or func
        if split:
            # the out-of-place variant keeps the input's values for the rule; the result is written back below
            output = runs_as(*args, **{k: v for k, v in kwargs.items() if k != "inplace"})
        else:
            output = func(*args, **kwargs)
        if not isinstance(output, Tensor):
            self._recorder.declined_by(rule.name, "functional", name)
            return output
        self._counts[name] += 1
        call = Call(func, name, "functional", args, kwargs, output, self.hooks, split, self._counts[name], runs_as)
        result = rule.apply(call)  # runs inside __torch_function__, where the mode is off: nothing is intercepted
        if result is NotImplemented:  # the rule cannot take this call (DeepLift's rescale with a second input)
            self._recorder.not_covered("functional", name)
            return call.input.copy_(output) if split else output
        self._recorder.rewritten(rule.name, "functional", name)
        if result is None or result is output:
            return call.input.copy_(output) if split else output
        return call.input.copy_(result) if inplace else result

    def _unnamed(self, func: Callable[..., Any], args: tuple, kwargs: dict, output: Any = NotImplemented) -> Any:
        """A functional call no entry names (or one an owning rule left): run as called (`output` if the rule ran
        it), reported if the table's ``uncovered`` predicate names it."""
        if self.table.uncovered is not None:
            name = self.table.uncovered(func, args, kwargs)
            if name is not None:
                self._recorder.not_covered("functional", name)
        return func(*args, **kwargs) if output is NotImplemented else output

    def _owned_call(self, func: Callable[..., Any], name: str, rule: Rule, args: tuple, kwargs: dict) -> Any:
        inplace = out_of_place(func) is not None or bool(kwargs.get("inplace", False))
        call = Call(func, name, "functional", args, kwargs, None, self.hooks, inplace, self._counts[name] + 1)
        result = rule.apply(call)  # runs inside __torch_function__, where the mode is off: nothing is intercepted
        if result is NotImplemented:
            return self._unnamed(func, args, kwargs, NotImplemented if call.output is None else call.output)
        self._counts[name] += 1
        self._recorder.rewritten(rule.name, "functional", name)
        return result


class _Interceptor(TorchFunctionMode):
    """The engine's function mode: every functional call of the forward pass goes to `RuleEngine._function_call`,
    except calls that no entry names where the table reports no unnamed call (no ``uncovered`` predicate) or never
    reports this callable (``passes``): they run as called after one set look-up (a LLaMA forward makes about 450
    calls, most of them reshapes and linear layers; `_function_call` would run them as called too, after its scope
    and depth checks and the ``uncovered`` predicate)."""

    def __init__(self, engine: RuleEngine) -> None:
        super().__init__()
        self.engine = engine
        self.named = engine.table.function_keys()
        self.quiet = engine.table.uncovered is None
        self.passing = engine.table.passing

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func not in self.named and (self.quiet or self.passing(func)):
            return func(*args, **kwargs) if kwargs else func(*args)
        return self.engine._function_call(func, args, kwargs or {})


def _needs_grad(args: tuple, kwargs: dict) -> bool:
    # loops, not any() over a generator of a new tuple: this runs on every call a rule names
    for a in args:
        if isinstance(a, Tensor) and a.requires_grad:
            return True
    for a in kwargs.values():
        if isinstance(a, Tensor) and a.requires_grad:
            return True
    if args and isinstance(args[0], list | tuple):  # a sequence of tensors first: torch.cat's
        for a in args[0]:
            if isinstance(a, Tensor) and a.requires_grad:
                return True
    return False


def _user_stacklevel() -> int:
    """The stack level of the first frame outside hookviz and contextlib: the user's line that called the method."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE + os.sep) and os.path.basename(path) != "contextlib.py":
            return level
        frame, level = frame.f_back, level + 1
    return 1
