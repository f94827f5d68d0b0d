"""Patched forwards that share the prefix: every module call that finishes before the site returns its output from
one unpatched run, so that a batch of patched copies computes only what comes after the site.

Why short-circuit module calls (and not torch.fx, nor re-entering a ``Sequential`` at the site): it is exact and
general. In a feed-forward pass a module call that finishes before the site starts cannot see the patch, so its output
in a patched run is its output in the unpatched run, here computed once at batch N (as in the one-forward-per-site
loop) and repeated once per patched copy. It needs nothing of the model but that it runs: control flow, keyword
inputs, tuple and dict outputs, residual streams and branches (a cached output goes wherever the model sends it,
also past the site), where torch.fx fails to trace many models (data-dependent control flow, Hugging Face models) and
slicing a chain covers only chains. Calls are skipped by giving the module an instance ``forward`` for the duration
of one patched run (restored in ``finally``); its hooks still run, in ``nn.Module.__call__``.

What module boundaries cannot see is checked before use, on the model itself (`plan_prefix`, `check_plan`): each
skipped output must be batch-invariant (at batch 2N, bit for bit its N rows repeated, or the same tensor when it has
no batch axis), and a short-circuited unpatched forward must return the model's own output bit for bit (this catches
side effects of a skipped module, such as a cache it appends to or an attribute it sets, and aliasing through
in-place edits). Where a call
fails the first check it runs as usual (its children may still be skipped); where the second fails, the caller runs
whole forwards.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .._calls import CallCounter
from ..hooks import HookManager
from ._common import ChunkBuffers, call_model, expand_inputs
from .intervene import first_tensor, rebuild

__all__ = [
    "Call",
    "PrefixPlan",
    "check_plan",
    "plan_prefix",
    "probe_calls",
    "record_calls",
    "short_circuited",
    "skippable_share",
]

_MISSING = object()


class _Unsupported(Exception):
    """A module output holding something other than tensors in tuples, lists and plain dicts."""


def _map(fn: Callable[[Tensor], Any], out: Any) -> Any:
    if isinstance(out, Tensor):
        return fn(out)
    if out is None or isinstance(out, bool | int | float | str):
        return out
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return type(out)(*(_map(fn, v) for v in out))
    if type(out) in (tuple, list):
        return type(out)(_map(fn, v) for v in out)
    if type(out) is dict:
        return {k: _map(fn, v) for k, v in out.items()}
    raise _Unsupported


def _leaves(out: Any) -> list[Tensor]:
    found: list[Tensor] = []
    _map(found.append, out)
    return found


def tensors_of(out: Any) -> list[Tensor] | None:
    """Every tensor of a model output (tensors, tuples, lists, any mapping such as a Hugging Face output), in order;
    None for other types."""
    if isinstance(out, Tensor):
        return [out]
    if out is None or isinstance(out, bool | int | float | str):
        return []
    items = out.values() if isinstance(out, Mapping) else out if isinstance(out, tuple | list) else None
    if items is None:
        return None
    found: list[Tensor] = []
    for v in items:
        sub = tensors_of(v)
        if sub is None:
            return None
        found.extend(sub)
    return found


def _repeat(t: Tensor, k: int) -> Tensor:
    return t.repeat(k, *([1] * (t.dim() - 1)))


class _Watched(Tensor):
    """A skipped call's output in the check run: any torch function or tensor method that touches it (``.shape``
    included) marks its call as read (``_hv_mark``: the set to add to and the call key), then runs as usual."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for t in _flat((args, kwargs)):
            if isinstance(t, _Watched):
                used, key = t._hv_mark
                used.add(key)
        with torch._C.DisableTorchFunctionSubclass():  # results are plain tensors: the watch does not spread
            return func(*args, **(kwargs or {}))


class _Unread(Tensor):
    """A skipped call's output that the check run showed is read by nothing but other skipped calls (a chain of
    modules before the site): a zero-copy view of the right shape, so that no patched run materialises it. Touching
    it is an error, never a wrong value."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(
            f"patching with a shared prefix: {getattr(func, '__name__', func)} read a module output that was unread "
            "when the prefix was checked (a forward whose control flow changes between patched runs); pass "
            "share_prefix=False"
        )


def _flat(obj: Any) -> Iterator[Any]:
    if isinstance(obj, tuple | list):
        for v in obj:
            yield from _flat(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _flat(v)
    else:
        yield obj


def _unread(t: Tensor, k: int, batch: bool) -> Tensor:
    if not batch or t.dim() == 0:
        return t.as_subclass(_Unread)
    return t.as_strided((k * t.shape[0], *t.shape[1:]), (0, *t.stride()[1:])).as_subclass(_Unread)


@dataclass
class Call:
    """One module call of a recorded forward: its order (``start`` when it was entered, ``end`` when it returned, on
    one clock), the seconds it took, and a detached copy of its output (None when the output is not tensors in
    tuples / lists / dicts). In a probe (`probe_calls`) ``batch`` holds, per output tensor, whether it has the batch
    axis (None: the call cannot be skipped)."""

    name: str
    start: int
    end: int = -1
    seconds: float = 0.0
    output: Any = None
    supported: bool = False
    batch: list[bool] | None = None

    def inside(self, other: Call) -> bool:
        return other.start < self.start and self.end < other.end


@contextmanager
def _as_the_loop_hooks(model: nn.Module, site_name: str) -> Iterator[None]:
    """The hooks the one-forward-per-site loop has: one forward hook on the site module (`intervene`'s), here a no-op.
    Some models look at hooks (``nn.TransformerEncoderLayer`` leaves its fused fast path when any of its modules has
    one), so every run here has exactly those, and records through ``forward`` wrappers, not hooks."""
    with HookManager(model) as hooks:
        hooks.forward(site_name, lambda module, args, output: None)
        yield


@contextmanager
def _forwards(
    model: nn.Module, wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]], names: Any
) -> Iterator[None]:
    """Each module of `names` with an instance ``forward`` made by ``wrap(name, its forward)`` for the block; every
    one restored in ``finally`` (also on KeyboardInterrupt), the model's own instance ``forward`` included."""
    modules = dict(model.named_modules())
    saved: list[tuple[nn.Module, Any]] = []
    try:
        for name in sorted(names):
            module = modules[name]
            saved.append((module, module.__dict__.get("forward", _MISSING)))
            module.__dict__["forward"] = wrap(name, module.forward)
        yield
    finally:
        for module, previous in reversed(saved):
            if previous is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = previous


def _record(
    model: nn.Module, inputs: Any, site_name: str, on_output: Callable[[str, Call, Any], None]
) -> tuple[Any, dict[str, Call]]:
    calls: dict[str, Call] = {}
    counter = CallCounter()
    clock = itertools.count()

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            key = counter.key(name)
            call = calls[key] = Call(name, next(clock))
            started = time.perf_counter()
            output = original(*args, **kwargs)
            call.seconds = time.perf_counter() - started
            call.end = next(clock)
            on_output(key, call, output)
            return output

        return forward

    names = [n for n, _ in model.named_modules() if n]
    with torch.no_grad(), _as_the_loop_hooks(model, site_name), _forwards(model, wrap, names):
        started = time.perf_counter()
        out = call_model(model, inputs)
        calls[""] = Call("", -1, next(clock), time.perf_counter() - started)  # the whole forward
    return out, calls


def skippable_share(calls: Mapping[str, Call], site: str) -> float:
    """The share of the recorded forward's time (``calls[""]``, the whole forward) spent in calls a patched forward at
    `site` could skip (the outermost ones that finish before it, and the site itself): an upper bound of what sharing
    the prefix saves per patched row, known before the probe is paid for."""
    target, total = calls.get(site), calls[""].seconds
    if target is None or total <= 0:
        return 0.0
    kept: list[Call] = []
    for call in sorted((c for k, c in calls.items() if k and c.end < target.start), key=lambda c: c.start):
        if call.supported and not any(call.inside(k) for k in kept):
            kept.append(call)
    return (sum(c.seconds for c in kept) + (target.seconds if target.supported else 0.0)) / total


def record_calls(model: nn.Module, inputs: Any, site_name: str) -> tuple[Any, dict[str, Call]]:
    """One forward under no_grad, with the hooks of the loop patching `site_name`: the model's output and every module
    call by key (``name``, ``name#1``, ... as in `hookviz.record`), with a copy of its output as it was returned (a
    later in-place edit does not reach it)."""

    def keep(key: str, call: Call, output: Any) -> None:
        try:
            call.output, call.supported = _map(lambda t: t.detach().clone(), output), True
        except _Unsupported:
            call.output = None

    return _record(model, inputs, site_name, keep)


def probe_calls(
    model: nn.Module, inputs: Any, site_name: str, reference: Mapping[str, Call]
) -> tuple[Any, dict[str, Call]]:
    """The forward of `inputs` repeated twice (batch 2N), each call compared, as it returns, with its `reference`
    (batch N): ``batch`` is set where every output tensor is, bit for bit, its reference repeated twice (batch axis
    first) or its reference itself (no batch axis). Outputs are not kept: memory stays that of one forward."""

    def compare(key: str, call: Call, output: Any) -> None:
        ref = reference.get(key)
        if ref is None or not ref.supported:
            return
        try:
            leaves = _leaves(output)
        except _Unsupported:
            return
        ref_leaves = _leaves(ref.output)
        if len(leaves) != len(ref_leaves):
            return
        flags = []
        for t, r in zip(leaves, ref_leaves, strict=True):
            if t.dtype != r.dtype or t.device != r.device:
                return
            if t.shape == r.shape and torch.equal(t, r):
                flags.append(False)
            elif r.dim() and t.shape == (2 * r.shape[0], *r.shape[1:]) and torch.equal(t, _repeat(r, 2)):
                flags.append(True)
            else:
                return
        call.batch = flags

    return _record(model, expand_inputs(inputs, 2), site_name, compare)


@dataclass
class PrefixPlan:
    """What a patched forward at one site skips: the outermost calls that finish before the site (their outputs
    repeated k times where they have the batch axis), and, per skipped call, the calls of wrapped modules it would
    have made (so that call keys after it still count right). ``site_cached``: the site's own output is taken from
    the unpatched run too (it is batch-invariant), so the site module does not run either."""

    site: str
    site_name: str
    calls: dict[str, Call]
    skip: list[str]
    site_cached: bool
    batch: dict[str, list[bool]]
    bumps: dict[str, Counter[str]] = field(default_factory=dict)
    unread: set[str] = field(default_factory=set)

    @property
    def wrapped(self) -> set[str]:
        return {self.calls[k].name for k in self.skip} | {self.site_name}

    def output(self, key: str, k: int, watch: set[str] | None = None, buffers: ChunkBuffers | None = None) -> Any:
        """The output of skipped call `key` in a forward of k copies: cached tensors repeated k times along the batch
        axis (copies: the model may edit them in place; with `buffers`, written into storage reused chunk after
        chunk), a zero-copy `_Unread` view where nothing reads it, or, in the check run (`watch`), `_Watched` tensors
        that add `key` to `watch` when read."""
        flags = iter(self.batch[key])
        leaf = itertools.count()

        def one(t: Tensor) -> Tensor:
            batch, slot = next(flags), ("output", key, next(leaf))
            if key in self.unread and watch is None:
                return _unread(t, k, batch)
            if not batch:
                out = t.clone()
            else:
                out = _repeat(t, k) if buffers is None else buffers.repeat(slot, t, k)
            if watch is not None:
                out = out.as_subclass(_Watched)
                out._hv_mark = (watch, key)
            return out

        return _map(one, self.calls[key].output)


def plan_prefix(calls: Mapping[str, Call], probe: Mapping[str, Call], site: str) -> PrefixPlan | str:
    """The calls a patched forward at `site` may skip, from the unpatched run at batch N (`calls`, `record_calls`) and
    the probe at 2N (`probe_calls`); a string says why none can be (the two runs made different calls)."""
    if set(calls) != set(probe):
        return "the forward at batch 2N makes other module calls than at batch N"
    calls = {k: c for k, c in calls.items() if k}  # "" is the whole forward's time
    if site not in calls:
        return "the site does not run in a forward that records module calls through their forward"
    target = calls[site]

    def skippable(key: str) -> bool:
        return calls[key].supported and probe[key].batch is not None

    skip: list[str] = []
    for key in sorted((k for k, c in calls.items() if c.end < target.start), key=lambda k: calls[k].start):
        if skippable(key) and not any(calls[key].inside(calls[s]) for s in skip):
            skip.append(key)
    site_cached = skippable(site)
    batch = {k: probe[k].batch for k in [*skip, site] if probe[k].batch is not None}
    plan = PrefixPlan(site, target.name, dict(calls), skip, site_cached, batch)  # type: ignore[arg-type]
    wrapped = plan.wrapped
    for key in [*skip, site] if site_cached else skip:
        plan.bumps[key] = Counter(c.name for c in calls.values() if c.name in wrapped and c.inside(calls[key]))
    return plan


@contextmanager
def short_circuited(
    model: nn.Module,
    plan: PrefixPlan,
    k: int,
    edit: Callable[[Tensor], Tensor],
    watch: set[str] | None = None,
    buffers: ChunkBuffers | None = None,
) -> Iterator[list[str]]:
    """For one forward of `model` on its inputs repeated `k` times: the skipped calls of `plan` return their cached
    outputs (repeated into `buffers` where given), the site returns ``edit(its output)`` (for a tuple output, its
    first tensor edited). Yields the list of the site calls that ran (empty: the site never ran, nothing was
    patched). Every module's ``forward`` is restored when the block ends, also when it raises or is interrupted."""
    counts = dict.fromkeys(plan.wrapped, 0)
    skip = set(plan.skip)
    fired: list[str] = []

    def bump(key: str) -> None:
        for name, n in plan.bumps.get(key, {}).items():
            counts[name] += n

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            i = counts[name]
            counts[name] = i + 1
            key = name if i == 0 else f"{name}#{i}"
            if key == plan.site:
                fired.append(key)
                if plan.site_cached:
                    bump(key)
                    out = plan.output(key, k, watch, buffers)
                else:
                    out = original(*args, **kwargs)
                tensor = first_tensor(out)
                if tensor is None:
                    raise TypeError(
                        f"module {name!r} returned {type(out).__name__}: patching edits a tensor output or the first "
                        "tensor of a tuple / list output"
                    )
                return rebuild(out, edit(tensor))
            if key in skip:
                bump(key)
                return plan.output(key, k, watch, buffers)
            return original(*args, **kwargs)

        return forward

    with _as_the_loop_hooks(model, plan.site_name), _forwards(model, wrap, plan.wrapped):
        yield fired


def check_plan(model: nn.Module, inputs: Any, plan: PrefixPlan, expected: Any) -> str | None:
    """None when an unpatched short-circuited forward of `inputs` gives `expected` (the output of `record_calls`) bit
    for bit; else why not. It runs at batch N, right after the probe at 2N: state a skipped module should have left
    for a later one (a cache, an attribute) is then stale and of the wrong batch, which shows. On success,
    ``plan.unread`` holds the skipped calls whose outputs nothing in that forward read (other than skipped calls,
    which ignore their inputs): later runs do not materialise them."""
    read: set[str] = set()
    try:
        with torch.no_grad(), short_circuited(model, plan, 1, lambda a: a, watch=read) as fired:
            out = call_model(model, expand_inputs(inputs, 1))
    except Exception as exc:  # the model failed without the skipped calls: run it whole (KeyboardInterrupt goes on)
        return f"a forward with the calls before the site skipped raised {type(exc).__name__}: {exc}"
    if not fired:
        return "the site does not run when the calls before it are skipped"
    got, want = tensors_of(out), tensors_of(expected)
    if got is None or want is None:
        return f"the model returns {type(out).__name__}, which cannot be compared tensor by tensor"
    for t in got:  # a cached output handed back as part of the model's output is read by whoever reads that
        if isinstance(t, _Watched):
            read.add(t._hv_mark[1])
    if len(got) != len(want) or any(
        a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b) for a, b in zip(got, want, strict=True)
    ):
        return (
            "a forward with the calls before the site replaced by their cached outputs does not give the model's own "
            "output bit for bit (a skipped module with side effects, or an in-place edit the model relies on)"
        )
    plan.unread = set(plan.skip) - read
    return None
