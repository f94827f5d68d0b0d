"""Which hookviz call is running: a per-thread stack, so that nested explainers do not act on each other's passes.

Hooks are global state on a module, and a forward pass may run another one inside it: a user's forward hook that
explains an intermediate result, Guided Grad-CAM's guided pass, a CAM layer probe. Every call of a method pushes a
token here for its duration (`active_call`, undone in ``finally``), and every hook hookviz places on a model, and
the functional-activation mode of the ReLU rules, acts only while its own call is the innermost active one
(`acting`). So a rule applies only to its own call's forward pass. Tensor hooks need no check: they sit on
tensors of their own call's graph, which no other call's backward pass reaches.

A thread with no active call at all (the worker threads of ``nn.DataParallel``, which run the replicas' forward
hooks) counts as inside the call that started the work, as before this stack existed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


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
    """Whether hooks of the call `token` should act now: it is the innermost active call (or none is active)."""
    stack = _CALLS.stack
    return not stack or stack[-1] is token
