"""HookManager: the one owner of every hook hookviz places on a model.

Hooks are global state on a module: a hook that outlives its purpose changes every later forward or backward
pass of that model. So every hook goes through a `HookManager`, whose handles sit in one list that `remove()`
empties, and whose context manager removes them on exit, also when the block raises.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeAlias

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

Predicate: TypeAlias = Callable[[str, nn.Module], bool]
Selector: TypeAlias = "str | type[nn.Module] | tuple[type[nn.Module], ...] | nn.Module | Predicate"

_GLOB_CHARS = "*?["
# PyTorch's message when a module hooked with a full backward hook has its output modified in place later
# (https://github.com/pytorch/pytorch/issues/61519).
_INPLACE_VIEW_ERROR = "BackwardHookFunction"


class HookError(RuntimeError):
    """A hook could not do its work on this model; the message says which module and why."""


def _describe(selector: object) -> str:
    if isinstance(selector, type):
        return selector.__name__
    if isinstance(selector, tuple):
        return "(" + ", ".join(_describe(s) for s in selector) + ")"
    if isinstance(selector, nn.Module):
        return f"module instance {type(selector).__name__}"
    if isinstance(selector, str):
        return repr(selector)
    return getattr(selector, "__name__", repr(selector))


def _is_module_type(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, nn.Module)


class Selection(tuple):
    """(dotted name, module) pairs of a model, already resolved: a selector that `select_modules` hands back as it
    is, without walking the model again (one `named_modules` walk shared by several registrations, as the rule
    engine's hooks are placed at every call). Whoever builds one vouches that the modules are the model's."""


def select_modules(model: nn.Module, selector: Selector | Selection) -> list[tuple[str, nn.Module]]:
    """Resolve `selector` to the (dotted name, module) pairs of `model` it names, in `named_modules()` order.

    Selector forms: an exact dotted name (``"layer4.1.conv2"``; ``""`` is the model itself), a glob over dotted
    names (``"features.*"``, ``"layer*"``: ``*`` also crosses dots), a module class or tuple of classes (subclasses
    match), a module instance, or a predicate ``(name, module) -> bool``. A module shared under several names
    appears once, under its first name. A selector that matches nothing raises `ValueError` naming the closest
    module names.
    """
    if isinstance(selector, Selection):
        if not selector:
            raise ValueError(f"selector Selection() is empty: it names no module of {type(model).__name__}")
        return list(selector)
    named = list(model.named_modules())
    if isinstance(selector, str):
        if any(c in selector for c in _GLOB_CHARS):
            matches = [(n, m) for n, m in named if fnmatch.fnmatchcase(n, selector)]
        else:
            matches = [(n, m) for n, m in named if n == selector]
    elif isinstance(selector, nn.Module):
        matches = [(n, m) for n, m in named if m is selector]
    elif _is_module_type(selector) or (
        isinstance(selector, tuple) and selector and all(_is_module_type(t) for t in selector)
    ):
        matches = [(n, m) for n, m in named if isinstance(m, selector)]  # type: ignore[arg-type]
    elif isinstance(selector, tuple) and not selector:
        raise TypeError("selector () is an empty tuple; pass module classes such as nn.ReLU or (nn.Conv2d, nn.Linear)")
    elif isinstance(selector, type | tuple):
        raise TypeError(
            f"selector {_describe(selector)} is a class (or tuple) that is not an nn.Module subclass; "
            "pass module classes such as nn.ReLU or (nn.Conv2d, nn.Linear)"
        )
    elif isinstance(selector, list | set | frozenset):
        raise TypeError(
            f"selector got a {type(selector).__name__} {selector!r}; pass one selector per call, a tuple of module "
            "classes, or a predicate such as lambda name, module: name in {'layer1', 'layer2'}"
        )
    elif callable(selector):
        matches = [(n, m) for n, m in named if selector(n, m)]
    else:
        raise TypeError(
            f"selector must be a module name or glob (str), a module class or tuple of classes, a module instance, "
            f"or a predicate (name, module) -> bool; got {type(selector).__name__}"
        )
    if not matches:
        raise ValueError(_no_match_message(model, selector, named))
    return matches


def _no_match_message(model: nn.Module, selector: object, named: list[tuple[str, nn.Module]]) -> str:
    names = [n for n, _ in named if n]
    head = f"selector {_describe(selector)} matches no module of {type(model).__name__}"
    if isinstance(selector, str):
        pattern = selector.replace("*", "").replace("?", "").replace("[", "").replace("]", "")
        close = difflib.get_close_matches(pattern, names, n=5, cutoff=0.4)
        if not close:
            close = [n for n in names if pattern and pattern.split(".")[0] in n][:5]
        hint = f"; closest module names: {', '.join(repr(c) for c in close)}" if close else ""
        return f"{head}{hint} (list them all with [n for n, _ in model.named_modules()])"
    if isinstance(selector, nn.Module):
        return f"{head}: the instance is not a submodule of this model"
    types = sorted({type(m).__name__ for _, m in named})
    return f"{head}; module types present: {', '.join(types)}"


class HookManager:
    """Places forward, forward-pre, full backward and tensor hooks, and removes every one of them.

    Use it as a context manager (hooks removed on exit, also when the block raises; nested managers remove only
    their own hooks) or as a plain object with `remove()`. Each registering method takes a selector (see
    `select_modules`), resolves it before registering anything, and returns the handles it created.

    Example::

        with HookManager(model) as hooks:
            hooks.forward("features.*", lambda m, args, out: print(m, out.shape))
            hooks.backward(nn.ReLU, lambda m, grad_in, grad_out: None)
            model(x).sum().backward()

    Footgun handled here: full backward hooks on a module that works in place (``nn.ReLU(inplace=True)``) make
    PyTorch raise an autograd error (pytorch#61519). The manager switches ``inplace`` off on such modules while its
    hooks live and restores it on removal (when several managers hold one module's flag, on the removal of the last
    of them, in whatever order they go). When a hooked module's output is modified in place *later* (e.g.
    ``F.relu(x, inplace=True)`` in the parent's forward), leaving the ``with`` block re-raises PyTorch's error as
    a `HookError` that names the hooked modules.
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._handles: list[RemovableHandle] = []
        # modules whose inplace flag this manager switched off (or holds switched off with other managers)
        self._inplace_saved: list[nn.Module] = []
        self._backward_names: list[str] = []

    # -- registration -------------------------------------------------------------------------------------------
    def forward(
        self,
        selector: Selector | Selection,
        fn: Callable[..., Any],
        *,
        with_name: bool = False,
        with_kwargs: bool = False,
        prepend: bool = False,
        always_call: bool = False,
    ) -> list[RemovableHandle]:
        """Forward hooks ``fn(module, args, output)`` (``fn(name, module, args, output)`` with `with_name`).

        A non-None return value replaces the module's output, as in `nn.Module.register_forward_hook`.
        """
        modules = self._resolve(selector, fn)
        return self._add(
            m.register_forward_hook(
                self._named(fn, n, with_name), with_kwargs=with_kwargs, prepend=prepend, always_call=always_call
            )
            for n, m in modules
        )

    def forward_pre(
        self,
        selector: Selector | Selection,
        fn: Callable[..., Any],
        *,
        with_name: bool = False,
        with_kwargs: bool = False,
        prepend: bool = False,
    ) -> list[RemovableHandle]:
        """Forward-pre hooks ``fn(module, args)``; a non-None return value replaces the module's inputs."""
        modules = self._resolve(selector, fn)
        return self._add(
            m.register_forward_pre_hook(self._named(fn, n, with_name), with_kwargs=with_kwargs, prepend=prepend)
            for n, m in modules
        )

    def backward(
        self, selector: Selector, fn: Callable[..., Any], *, with_name: bool = False, prepend: bool = False
    ) -> list[RemovableHandle]:
        """Full backward hooks ``fn(module, grad_input, grad_output)`` (`register_full_backward_hook`).

        A non-None return value replaces ``grad_input``. Modules with ``inplace=True`` are switched to out of place
        while the hook lives (pytorch#61519), then restored.
        """
        modules = self._resolve(selector, fn)
        self._disable_inplace(modules)
        self._backward_names.extend(n for n, _ in modules)
        return self._add(
            m.register_full_backward_hook(self._named(fn, n, with_name), prepend=prepend) for n, m in modules
        )

    def backward_pre(
        self, selector: Selector, fn: Callable[..., Any], *, with_name: bool = False, prepend: bool = False
    ) -> list[RemovableHandle]:
        """Full backward-pre hooks ``fn(module, grad_output)``; a non-None return value replaces ``grad_output``."""
        modules = self._resolve(selector, fn)
        self._disable_inplace(modules)
        self._backward_names.extend(n for n, _ in modules)
        return self._add(
            m.register_full_backward_pre_hook(self._named(fn, n, with_name), prepend=prepend) for n, m in modules
        )

    def tensor(self, tensor: Tensor, fn: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """A tensor hook ``fn(grad) -> Tensor | None`` on `tensor` (a non-None return replaces the gradient)."""
        if not isinstance(tensor, Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        if not callable(fn):
            raise TypeError(f"hook fn must be callable, got {type(fn).__name__}")
        if not tensor.requires_grad:
            raise ValueError(
                "cannot place a tensor hook on a tensor that does not require grad: no gradient will ever reach it; "
                "call .requires_grad_() on the input, or hook a tensor that is computed from one that requires grad"
            )
        handle = tensor.register_hook(fn)
        self._handles.append(handle)
        return handle

    # -- removal ------------------------------------------------------------------------------------------------
    def remove(self) -> None:
        """Remove every hook placed through this manager and restore the ``inplace`` flags it changed. Idempotent."""
        try:
            for handle in self._handles:
                handle.remove()
        finally:
            self._handles.clear()
            for module in reversed(self._inplace_saved):
                _release_inplace(module)
            self._inplace_saved.clear()
            self._backward_names.clear()

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[RemovableHandle]:
        return iter(list(self._handles))

    def __enter__(self) -> HookManager:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        names = list(self._backward_names)
        self.remove()
        if isinstance(exc, RuntimeError) and _INPLACE_VIEW_ERROR in str(exc) and names:
            raise HookError(
                "a module hooked with a full backward hook had its output modified in place afterwards (for example "
                "by F.relu(..., inplace=True) in its parent's forward), which PyTorch's full backward hooks cannot "
                f"support (pytorch#61519). Hooked modules: {', '.join(repr(n) for n in names[:10])}. Fix: hook the "
                "module whose output is not modified in place, or read gradients with a tensor hook on the output "
                "(HookManager.forward + HookManager.tensor)"
            ) from exc
        return False

    def __repr__(self) -> str:
        return f"HookManager({type(self.model).__name__}, hooks={len(self._handles)})"

    # -- helpers ------------------------------------------------------------------------------------------------
    def _resolve(self, selector: Selector | Selection, fn: Callable[..., Any]) -> list[tuple[str, nn.Module]]:
        if not callable(fn):
            raise TypeError(f"hook fn must be callable, got {type(fn).__name__}")
        return select_modules(self.model, selector)

    def _add(self, handles: Any) -> list[RemovableHandle]:
        created = []
        try:
            for handle in handles:
                created.append(handle)
        finally:
            # even if one registration fails, the ones that succeeded are owned and will be removed
            self._handles.extend(created)
        return created

    def out_of_place(self, modules: Iterable[nn.Module]) -> None:
        """Switch ``inplace`` off on those of `modules` that work in place, until this manager removes its hooks.

        Several managers may hold the same module's flag: it comes back on when the last of them is removed, in any
        order.
        """
        for module in modules:
            if _hold_inplace(module):
                self._inplace_saved.append(module)

    def _disable_inplace(self, modules: list[tuple[str, nn.Module]]) -> None:
        self.out_of_place(m for _, m in modules)

    @staticmethod
    def _named(fn: Callable[..., Any], name: str, with_name: bool) -> Callable[..., Any]:
        # a partial, not a closure: no Python frame of its own per hook call
        return functools.partial(fn, name) if with_name else fn


# module -> [its original inplace flag, number of managers holding it off]. A flag is global state of the module, so
# managers share one count: with a flag per manager, removing two managers out of LIFO order switched inplace back on
# while the other's backward hook still lived, and PyTorch raised the pytorch#61519 error.
_INPLACE_HOLDS: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()
_INPLACE_LOCK = threading.Lock()


def _hold_inplace(module: nn.Module) -> bool:
    """Switch `module` out of place (if it works in place or is already held); whether a hold was taken."""
    with _INPLACE_LOCK:
        hold = _INPLACE_HOLDS.get(module)
        if hold is not None:
            hold[1] += 1
            return True
        if getattr(module, "inplace", False) is not True:
            return False
        _INPLACE_HOLDS[module] = [True, 1]
        module.inplace = False
        return True


def _release_inplace(module: nn.Module) -> None:
    with _INPLACE_LOCK:
        hold = _INPLACE_HOLDS.get(module)
        if hold is None:
            return
        hold[1] -= 1
        if hold[1] == 0:
            del _INPLACE_HOLDS[module]
            module.inplace = hold[0]


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Number of hooks of each kind on all modules of `model` (for checking that nothing was left behind)."""
    counts = {"forward": 0, "forward_pre": 0, "backward": 0, "backward_pre": 0}
    for m in model.modules():
        counts["forward"] += len(m._forward_hooks)
        counts["forward_pre"] += len(m._forward_pre_hooks)
        counts["backward"] += len(m._backward_hooks)
        counts["backward_pre"] += len(m._backward_pre_hooks)
    return counts
