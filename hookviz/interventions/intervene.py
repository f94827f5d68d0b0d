"""`intervene`: run every forward inside a ``with`` block with module outputs edited (ablation, steering, patching).

Built on one `HookManager`: a forward hook per edited module replaces its output by the edit's result; the hooks go
when the block ends, also when it raises or is interrupted. Keys follow `hookviz.record`: ``"relu"`` edits every
call of a module (the edit function may take the call index), ``"relu#1"`` only its second call in each forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from .._calls import CallCounter
from ..hooks import HookManager
from ._common import parse_key
from .edits import CallSite, Edit
from .layout import check_layout, edit_axes

__all__ = ["Intervention", "intervene"]

EditFn = Callable[..., Tensor]


@dataclass
class Intervention:
    """What an `intervene` block did: how many times each edit fired (``fired[key]``)."""

    edits: dict[str, EditFn]
    fired: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    key: str
    call: int | None
    fn: Callable[[Tensor, CallSite], Any]
    layout: str | None


def _adapt(fn: Any, key: str) -> Callable[[Tensor, CallSite], Any]:
    """Call a provided `Edit` with the call site, a user function with (activation) or (activation, call index)."""
    if isinstance(fn, Edit):
        return fn
    if not callable(fn):
        raise TypeError(
            f"edits[{key!r}] must be a callable activation -> tensor (or (activation, call) -> tensor), or a provided "
            f"edit such as hookviz.interventions.zero(channels=[3]); got {type(fn).__name__}"
        )
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):  # a builtin without a signature: one argument
        params = []
    if not params:
        try:
            inspect.signature(fn)
        except (TypeError, ValueError):
            return lambda a, site: fn(a)
        raise TypeError(
            f"edits[{key!r}] takes no positional argument; it must take the activation (and the call index)"
        )
    if len(params) >= 2 or params[0].kind == params[0].VAR_POSITIONAL:
        return lambda a, site: fn(a, site.call)
    return lambda a, site: fn(a)


def first_tensor(output: Any) -> Tensor | None:
    """A module's output tensor: the output itself, or the first element of a tuple / list output."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def rebuild(output: Any, tensor: Tensor) -> Any:
    """`output` with its tensor (or first element) replaced by `tensor`, its other elements kept."""
    if isinstance(output, Tensor):
        return tensor
    rest = list(output[1:])
    if isinstance(output, list):
        return [tensor, *rest]
    if hasattr(output, "_fields"):  # a namedtuple
        return type(output)(tensor, *rest)
    return type(output)((tensor, *rest))


def _check_result(result: Any, tensor: Tensor, key: str) -> None:
    if not isinstance(result, Tensor):
        raise TypeError(f"the edit for {key!r} returned {type(result).__name__}; an edit must return a tensor")
    if result.shape != tensor.shape or result.dtype != tensor.dtype or result.device != tensor.device:
        raise ValueError(
            f"the edit for {key!r} returned a {result.dtype} tensor of shape {tuple(result.shape)} on {result.device}; "
            f"the activation is {tensor.dtype} of shape {tuple(tensor.shape)} on {tensor.device}: an edit must keep "
            "its shape, dtype and device"
        )


def plan_edits(
    model: nn.Module, edits: Mapping[str, Any], layout: str | Mapping[str, str] | None
) -> dict[str, list[_Plan]]:
    """Validate `edits` and `layout` (before any hook exists) and group the edits by module name."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(edits, Mapping) or not edits:
        raise TypeError(
            "edits must be a non-empty dict {module name: edit}, e.g. "
            f"{{'layer3': hookviz.interventions.zero(channels=[3])}}; got {edits!r}"
        )
    if isinstance(layout, Mapping):
        unknown = set(layout) - set(edits)
        if unknown:
            raise ValueError(f"layout names keys that are not edited: {sorted(unknown)}; edited: {sorted(edits)}")
        for k, v in layout.items():
            check_layout(v, f"layout[{k!r}]")
    else:
        check_layout(layout)
    plans: dict[str, list[_Plan]] = {}
    for key, fn in edits.items():
        name, call = parse_key(model, key, "edits")
        lay = layout.get(key) if isinstance(layout, Mapping) else layout
        plans.setdefault(name, []).append(_Plan(key, call, _adapt(fn, key), lay))
    return plans


@contextmanager
def intervene(
    model: nn.Module,
    edits: Mapping[str, EditFn | Edit],
    *,
    layout: str | Mapping[str, str] | None = None,
    strict: bool = True,
) -> Iterator[Intervention]:
    """Run every forward of `model` inside the ``with`` block with the outputs of the named modules edited.

    Args:
        model: any module; it comes back exactly as it was (the hooks live only inside the block).
        edits: ``{key: edit}``. A key is a module name (``"layer3"``: every call of that module) or a call key
            (``"relu#1"``: only the second call in each forward of the model, as in `hookviz.record`). An edit is a
            provided one from `hookviz.interventions` (`zero`, `mean_ablate`, `scale`, `add`, `replace`), or a
            function ``f(activation) -> tensor`` or ``f(activation, call) -> tensor`` (``call``: 0, 1, ... for a
            module run several times per forward). It must return a tensor of the activation's shape, dtype and
            device. For a module returning a tuple (``nn.MultiheadAttention``, transformer blocks), the first
            element is edited and the rest kept.
        layout: how to read 4-D / 3-D outputs for ``channels`` / ``tokens`` / ``region`` selections: ``"nchw"``,
            ``"nhwc"`` or ``"tokens"`` (N, T, D), for all edits or per key (a dict); None infers 4-D as NCHW, 3-D
            as tokens.
        strict: an edit that never fired in the block (its module never ran, or ran fewer times than its call
            index) is a `ValueError` at the end of the block, naming it (True, the default), never a silent no-op.

    Yields an `Intervention` whose ``fired`` counts the calls each edit acted on. Example::

        from hookviz.interventions import zero
        with hv.intervene(model, {"layer3": zero(channels=[4, 7]), "layer4": lambda a: a * 0.5}):
            ablated = model(x)
    """
    plans = plan_edits(model, edits, layout)
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {strict!r}")
    state = Intervention(dict(edits), {k: 0 for k in edits})
    counter = CallCounter()

    def on_forward(name: str, module: nn.Module, args: Any, output: Any) -> Any:
        key = counter.key(name)
        call = int(key.rpartition("#")[2]) if key != name else 0
        tensor = first_tensor(output)
        todo = [p for p in plans[name] if p.call is None or p.call == call]
        if not todo:
            return None
        if tensor is None:
            raise TypeError(
                f"module {name!r} returned {type(output).__name__}: intervene edits a tensor output or the first "
                "tensor of a tuple / list output"
            )
        for plan in todo:
            # only the provided edits (selections) need the axes; a function gets any activation, e.g. 5-D
            axes = None
            if isinstance(plan.fn, Edit) or plan.layout is not None:
                axes = edit_axes(tensor.dim(), plan.layout, where=f"layout for {plan.key!r}")
            site = CallSite(name, call, key, axes)
            result = plan.fn(tensor, site)
            _check_result(result, tensor, plan.key)
            tensor = result
            state.fired[plan.key] += 1
        return rebuild(output, tensor)

    with HookManager(model) as hooks:
        hooks.forward_pre(model, counter.reset)
        hooks.forward(lambda n, m: n in plans, on_forward, with_name=True)
        yield state
    if strict:
        never = [k for k, n in state.fired.items() if n == 0]
        if never:
            raise ValueError(
                f"intervention(s) never fired: {', '.join(map(repr, never))}: the module did not run in any forward "
                "inside the block (or ran fewer times than the call index after '#'); check the name against "
                "hv.ActivationRecorder(model, '*') keys, or pass strict=False"
            )
