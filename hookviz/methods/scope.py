"""Which hookviz call is running: a per-thread stack, so that nested explainers do not act on each other's passes.

Hooks are global state on a module, and a forward pass may run another one inside it: a user's forward hook that
explains an intermediate result, Guided Grad-CAM's guided pass, a CAM layer probe. Every call of a method pushes a
token here for its duration (`active_call`, undone in ``finally``), and every hook hookviz places on a model, and
the functional-activation mode of the ReLU rules, acts only while its own call is the innermost active one
(`acting`). So a rule applies only to its own call's forward pass. Tensor hooks need no check: they sit on
tensors of their own call's graph, which no other call's backward pass reaches.

Threads. Hooks act only for their own call's thread: a forward pass that another thread runs on the same model
meanwhile (a training step, a second explainer) finds its own stack empty and the hooks leave it alone. The one
exception are the worker threads of ``nn.DataParallel`` (its ``parallel_apply`` runs the replicas' forward passes,
with the hooks copied onto them, in threads of its ``_worker`` function): they count as inside the call that started
them. Calls on the same model from several threads run one at a time (`model_lock`, taken by the methods' shared
life cycle), so their preparation and restoration of the model never interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakKeyDictionary

from torch import nn


class _Calls(threading.local):
    def __init__(self) -> None:
        self.stack: list[object] = []


_CALLS = _Calls()


@contextmanager
def active_call() -> Iterator[object]:
    """Mark a hookviz call as running on this thread for the duration of the block; yields its token."""
    token = object()
    _CALLS.stack.append(token)
    try:
        yield token
    finally:
        stack = _CALLS.stack
        for i in range(len(stack) - 1, -1, -1):  # normally the top; a call left unfinished must not stay behind
            if stack[i] is token:
                del stack[i:]
                break


def current_call() -> object | None:
    """The token of the innermost active call on this thread (None outside any call)."""
    stack = _CALLS.stack
    return stack[-1] if stack else None


def acting(token: object | None) -> bool:
    """Whether hooks of the call `token` should act now: it is the innermost active call of this thread (or this
    thread is one of ``nn.DataParallel``'s replica workers, or no call placed the hooks and none is active)."""
    stack = _CALLS.stack
    if stack:
        return stack[-1] is token
    return token is None or _parallel_worker()


def _parallel_worker() -> bool:
    # torch.nn.parallel.parallel_apply starts threading.Thread(target=_worker): named "Thread-N (_worker)"
    return threading.current_thread().name.endswith("(_worker)")


_LOCKS: WeakKeyDictionary[nn.Module, threading.RLock] = WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The re-entrant lock of `model`: hookviz calls on one model from several threads run one at a time (a call
    nested in another on the same thread, Guided Grad-CAM's guided pass, re-enters it)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock
