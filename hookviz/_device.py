"""Copies between the host and the device with as few waits as the work allows.

A copy from ordinary (pageable) host memory to a GPU waits for every kernel queued before it (CUDA synchronises the
stream first; ``torch.cuda.set_sync_debug_mode`` reports it), so an index tensor built on the host and moved after
the forward pass stalls the device's queue. `to_device` copies through pinned memory instead, without blocking: the
caching host allocator keeps the pinned copy alive until the transfer is done. On the CPU it is ``t.to(device)``.
A copy to the host must wait for the values; `to_host` brings several tensors with one wait.

Values that only a check after the work needs (is every map zero, do the attributions sum to the score's change) need
no wait: `after_work` copies them into pinned host memory without blocking, records an event behind the copy, and
runs the check once the event is complete (queued per thread, in order; `flush_checks` waits for them). On the CPU
the check runs at once.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeAlias

import torch
from torch import Tensor


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """`t` on `device`, copied without a host synchronisation where it comes from the host (module docstring); `t`
    itself where it is there already. A copy from a GPU to the host is an ordinary one: it must wait for the values."""
    device = torch.device(device)
    if device.type == "cpu" and t.device.type != "cpu":
        return t.to(device)
    if t.device.type == "cpu" and device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _pack(tensors: list[Tensor]) -> Tensor:
    """The `tensors` flattened into one buffer, on their device, in one dtype that holds each exactly (`to_host`)."""
    dtypes = {t.dtype for t in tensors}
    common = dtypes.pop() if len(dtypes) == 1 else torch.float64
    return torch.cat([t.detach().reshape(-1).to(common) for t in tensors])


def _specs(tensors: list[Tensor]) -> list[tuple[torch.Size, torch.dtype]]:
    return [(t.shape, t.dtype) for t in tensors]


def _unpack(flat: Tensor, specs: list[tuple[torch.Size, torch.dtype]]) -> list[Tensor]:
    """`_pack` undone on the host: each tensor back in its own dtype and shape (`specs`)."""
    parts = flat.split([s.numel() for s, _ in specs])
    return [p.view(shape).to(dtype) for p, (shape, dtype) in zip(parts, specs, strict=True)]


def to_host(tensors: list[Tensor]) -> list[Tensor]:
    """The `tensors` on the host, detached, with one wait: flattened into one buffer where they are (in one dtype
    that holds each exactly: theirs where they share it, else float64, exact for the floating-point types up to
    float32 and for integers below 2**53) and copied in one ``.cpu()``; each comes back in its own dtype and shape.
    The same steps on every device (on the CPU the copy costs one pass over the data), so that the host-read count
    of tests/test_host_reads.py, taken on the CPU, is a GPU's. The wait also brings the values of earlier calls'
    checks (`after_work`): those that have come run after the copy."""
    if not tensors:
        return []
    values = _unpack(_pack(tensors).cpu(), _specs(tensors))
    _run_pending(in_call=True)
    return values


# -- checks after the work (module docstring) -------------------------------------------------------------------------
# on an accelerator, reading a check's values at the end of a call would wait for every kernel queued before them

Check: TypeAlias = Callable[[list[Tensor]], str | None]


class _Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _Done:
    """The event of values already on the host (a device without events: they were read with a wait)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


@dataclass
class _Pending:
    """A check queued by `after_work`: its values' host buffer, the event behind their copy, and what the warning
    names if it comes late (the method, the caller's line, the thread's call count when it was queued)."""

    check: Check
    flat: Tensor
    specs: list[tuple[torch.Size, torch.dtype]]
    event: _Event
    what: str
    where: str
    call: int


class _Queue:
    """One thread's pending checks, in the order they were queued, and the thread's count of hookviz calls."""

    def __init__(self) -> None:
        self.pending: deque[_Pending] = deque()
        self.calls = 0


class _Local(threading.local):
    queue: _Queue | None = None


_LOCAL = _Local()
_QUEUES: list[_Queue] = []  # the threads' queues that hold checks: flushed at exit, even a finished thread's
_LOCK = threading.Lock()  # guards _QUEUES and the pop of a check (so that none runs twice, even at exit)
_INTERNAL = (str(Path(__file__).parent) + os.sep, str(Path(torch.__file__).parent) + os.sep)
_EXIT_HOOK: list[bool] = []  # atexit's handler registered (once, at the first check queued)


def _queue() -> _Queue:
    q = _LOCAL.queue
    if q is None:
        q = _LOCAL.queue = _Queue()
    return q


def _on_host(tensors: list[Tensor]) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def _check_on_host(tensors: list[Tensor], check: Check) -> str | None:
    """`check`'s message for `tensors` on the host: read now, which costs no wait (tests/host_reads.py `CPU_ONLY`)."""
    return check(to_host(tensors))


def _copy_later(flat: Tensor) -> tuple[Tensor, _Event]:
    """`flat` copied to the host without a wait where the device has events (CUDA): a pinned buffer that holds its
    values once the returned event is complete. Elsewhere read with a wait (an event that is already complete)."""
    if flat.device.type != "cuda":
        return flat.cpu(), _Done()
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    host.copy_(flat, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(flat.device))
    return host, event


def _caller() -> tuple[str, int]:
    """The innermost line outside hookviz and torch on the stack ("file:line"), and its `warnings.warn` stacklevel
    as seen from the function that called `_caller`: where a warning points, and which call a late one names."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    if frame is None:  # nothing of the user's on the stack (at exit)
        return "unknown line", 1
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}", level


def after_work(tensors: list[Tensor], check: Check, what: str) -> None:
    """Run ``check(values)`` on the values of `tensors` (a few small tensors computed by the work: flags, sums),
    given on the host in their dtypes and shapes, and warn with the message it returns (None: nothing to say).

    On the CPU the check runs now: its warning comes in this call. On an accelerator the values are copied to the
    host without a wait and the check runs once they have come, in the order checks were queued on this thread: now
    if they already have, else at hookviz's next wait (`to_host`), at the start of the next method call, at
    `flush_checks`, or at exit. A warning that comes after the call says so and names `what` (the method) and the
    caller's line. Every warning points at the innermost line outside hookviz and torch (the user's call)."""
    if _on_host(tensors):
        message = _check_on_host(tensors, check)
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=_caller()[1])
        return
    flat, event = _copy_later(_pack(tensors))
    q = _queue()
    where, _ = _caller()
    entry = _Pending(check, flat, _specs(tensors), event, what, where, q.calls)
    with _LOCK:
        if not q.pending:
            _QUEUES.append(q)
        if not _EXIT_HOOK:
            _EXIT_HOOK.append(True)
            atexit.register(_at_exit)
        q.pending.append(entry)
    _run_pending(in_call=True, current=entry)


def call_starts() -> None:
    """A hookviz method call starts on this thread: count it (a late warning says how many calls back it is from),
    and run the pending checks whose values have come, so that their warnings come before this call's."""
    q = _queue()
    q.calls += 1
    if q.pending:
        _run_pending(in_call=True)


def flush_checks() -> None:
    """Wait for the checks that hookviz methods queued after their work on an accelerator, and emit their warnings.

    On a GPU the checks that read values after a call's work (Grad-CAM's all-zero maps, Integrated Gradients'
    completeness, DeepLift's summation-to-delta) are read without waiting for the device, and their warnings come
    at a later wait: the next hookviz call, or at the latest when the interpreter exits. Call this where a script
    wants them (after a loop of calls, before reading ``last_delta``). On the CPU every check has run in its own
    call and this does nothing."""
    _run_pending(in_call=False, wait=True)


def _at_exit() -> None:
    """Every thread's pending checks, waited for at interpreter exit: none is lost."""
    with _LOCK:
        queues = list(_QUEUES)
    for q in queues:
        _run_queue(q, in_call=False, wait=True)


def _run_pending(*, in_call: bool, wait: bool = False, current: _Pending | None = None) -> None:
    """This thread's checks whose values have come (all of them with `wait`), run in order (`_run_queue`)."""
    q = _LOCAL.queue
    if q is not None and q.pending:
        _run_queue(q, in_call=in_call, wait=wait, current=current)


def _run_queue(q: _Queue, *, in_call: bool, wait: bool, current: _Pending | None = None) -> None:
    """Run `q`'s checks in order while their values have come (all of them with `wait`), each popped before it runs
    so that none runs twice. A warning other than `current`'s (the check of the call now ending) says which call it
    is about."""
    while True:
        with _LOCK:
            if not q.pending or not (wait or q.pending[0].event.query()):
                return
            entry = q.pending.popleft()
            if not q.pending:
                _QUEUES.remove(q)
        entry.event.synchronize()  # complete already unless `wait`
        message = entry.check(_unpack(entry.flat, entry.specs))
        if message is None:
            continue
        note = "" if entry is current else _late_note(entry, q.calls, in_call)
        warnings.warn(message + note, UserWarning, stacklevel=_caller()[1])


def _late_note(entry: _Pending, calls: int, in_call: bool) -> str:
    """Which call a late warning is about: counted back from now on its thread, and the caller's line."""
    since = calls - entry.call
    if since == 0:
        which = f"the last {entry.what} call"
    elif since == 1 and in_call:
        which = f"the {entry.what} call before this one"
    else:
        which = f"an earlier {entry.what} call ({since} hookviz calls since)"
    return f" (from {which}, at {entry.where}: checked after it, without waiting for the device)"
