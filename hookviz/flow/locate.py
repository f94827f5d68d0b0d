"""NaN/Inf localisation: which module first produced the non-finite values of a step (see the `hookviz.flow` docs).

From the host copy of one buffer row: the forward and backward orders in which module outputs and the gradients
w.r.t. them were observed, the module graph learnt from the first recorded forward passes, and the parameter
gradients' norms. Pure Python over floats: it runs only for a step whose statistics are not all finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from .layout import _MISSING, ACT_NORM, L2, OUT_GRAD_NORM, _base, _Chunk

if TYPE_CHECKING:
    from .watch import _Watched


def _finite(v: float) -> bool:
    return math.isfinite(v)


def _kind_of(values: Iterable[float]) -> str:
    return "nan" if any(math.isnan(v) for v in values) else "inf"


def _locate_nonfinite(
    forward: Sequence[str],
    backward: Sequence[str],
    act: dict[str, float],
    og: dict[str, float],
    inputs_of: dict[str, set[str]],
    bad_params: dict[str, list[str]],
    describe: Callable[[str], str],
    module_order: Sequence[str],
    through_params: frozenset[str] = frozenset(),
    transparent: frozenset[str] = frozenset(),
) -> tuple[str | None, str, list[float]]:
    """(culprit, explanation, offending values) for a step with non-finite values (see the `hookviz.flow` docs).

    `through_params`: modules whose entry in `og` stands for their parameters' gradients (not observed outputs).
    `transparent`: modules without an `og` entry that cannot create a non-finite gradient: looked through.
    A forward NaN poisons everything after it, so the forward order is searched first, then the backward order, then
    the parameters' gradients."""
    return (
        _forward_culprit(forward, act, inputs_of, describe)
        or _backward_culprit(backward, og, inputs_of, bad_params, describe, through_params, transparent)
        or _parameter_culprit(bad_params, module_order, describe)
        or (None, "non-finite statistics that no watched module could be blamed for", [])
    )


_Found = tuple[str | None, str, list[float]]


def _forward_culprit(
    forward: Sequence[str], act: dict[str, float], inputs_of: dict[str, set[str]], describe: Callable[[str], str]
) -> _Found | None:
    """The first module in forward order whose output is non-finite (where a forward NaN first appeared)."""
    for key in forward:
        v = act.get(key)
        if v is not None and not _finite(v):
            sources = sorted(inputs_of.get(key, ()))
            clean = [s for s in sources if s in act and _finite(act[s])]
            unseen = [s for s in sources if s not in act]
            via = f" (its input from {', '.join(repr(s) for s in clean)} was finite)" if clean else ""
            if unseen:
                via += (
                    f" (the output of {', '.join(repr(s) for s in unseen)} feeding it is not observed at every step: "
                    "GradientFlow(output_stats='all') tells them apart)"
                )
            return (
                key,
                f"the forward pass produced them first in the output of {describe(key)}{via}, the first watched "
                "module in forward order with a non-finite output",
                [v],
            )
    return None


def _gradient_sources(
    key: str, og: dict[str, float], inputs_of: dict[str, set[str]], transparent: frozenset[str]
) -> list[tuple[str, str | None]]:
    """(source with an output gradient, the transparent module it was reached through or None) of module `key`."""
    found: dict[str, str | None] = {}
    stack: list[tuple[str, str | None]] = [(s, None) for s in sorted(inputs_of.get(key, ()))]
    seen: set[str] = set()
    while stack:
        src, via = stack.pop()
        if src in seen:
            continue
        seen.add(src)
        if src in og:
            found.setdefault(src, via)
        elif _base(src) in transparent:
            stack.extend((s, via or src) for s in sorted(inputs_of.get(src, ())))
    return sorted(found.items())


def _backward_culprit(
    backward: Sequence[str],
    og: dict[str, float],
    inputs_of: dict[str, set[str]],
    bad_params: dict[str, list[str]],
    describe: Callable[[str], str],
    through_params: frozenset[str],
    transparent: frozenset[str],
) -> _Found | None:
    """The first module in backward order that received a finite gradient and passed back a non-finite one (or
    that already received a non-finite one)."""
    for key in backward:
        v = og.get(key)
        if v is not None and not _finite(v):
            seen_in = " (seen in the gradients of its parameters)" if key in through_params else ""
            return (
                key,
                f"the gradient was already non-finite where it reached the output of {describe(key)}{seen_in}, the "
                f"first watched module in backward order: it was produced after {key!r} (by the loss, or by code "
                f"between {key!r} and the next watched module)",
                [v],
            )
        bad = [(s, via) for s, via in _gradient_sources(key, og, inputs_of, transparent) if not _finite(og[s])]
        bad_inputs = [s for s, _ in bad]
        own = bad_params.get(_base(key), []) if _base(key) == key and key not in through_params else []
        if bad_inputs or own:
            where = []
            if bad_inputs:
                named = [repr(s) if via is None else f"{s!r} (through {via!r})" for s, via in bad]
                where.append(f"to its input from {', '.join(named)}")
            if own:
                where.append(f"to its parameters {', '.join(repr(p) for p in own)}")
            return (
                key,
                f"first produced in backward order by {describe(key)}: the gradient at its output was finite, the "
                f"gradient it passed back {' and '.join(where)} was not",
                [og[s] for s in bad_inputs] or [float("nan")],
            )
    return None


def _parameter_culprit(
    bad_params: dict[str, list[str]], module_order: Sequence[str], describe: Callable[[str], str]
) -> _Found | None:
    """Without output-gradient evidence: the last owner of non-finite parameter gradients in model order (the first
    in backward order)."""
    if not bad_params:
        return None
    ranked = [m for m in module_order if m in bad_params] or list(bad_params)
    name = ranked[-1]
    return (
        name,
        f"the gradients of the parameters {', '.join(repr(p) for p in bad_params[name])} of {describe(name)} are "
        "non-finite (no watched module output carried a non-finite gradient)",
        [float("nan")],
    )


def _culprit(
    chunk: _Chunk, r: int, watched: _Watched, graph_order: dict[str, None], inputs_of: dict[str, set[str]]
) -> tuple[str | None, str, list[float]]:
    """`_locate_nonfinite` for row `r` of a chunk: the statistics of the row, with the modules watched through their
    parameters placed in backward order by the learnt module graph."""
    layout, row = chunk.layout, chunk.data[r]
    og = {k: float(row[layout.key_block(OUT_GRAD_NORM)][i]) for i, k in enumerate(layout.keys)}
    act = {k: float(row[layout.key_block(ACT_NORM)][i]) for i, k in enumerate(layout.keys)}
    og = {k: v for k, v in og.items() if v != _MISSING}
    act = {k: v for k, v in act.items() if v != _MISSING}
    l2 = row[layout.block(L2)]
    bad_params: dict[str, list[str]] = {}
    for i, v in enumerate(l2.tolist()):
        if v != _MISSING and not _finite(v):
            bad_params.setdefault(watched.param_module[i], []).append(watched.param_names[i])
    backward: Sequence[str] = chunk.backward[r]
    through_params: set[str] = set()
    if watched.probes != watched.watched:
        # a module watched through its parameters: their gradients are non-finite exactly when the gradient at its
        # output is (every output element feeds them), and its place in backward order comes from the graph
        for i, v in enumerate(l2.tolist()):
            m = watched.param_module[i]
            if v == _MISSING or m in watched.probes:
                continue
            w = og.get(m, 0.0)
            og[m] = v if not _finite(v) else w if not _finite(w) else math.hypot(w, v)
            through_params.add(m)
        ranked = [k for k in reversed(graph_order) if k in og]
        seen = set(ranked)
        backward = ranked + [k for k in (*backward, *reversed(watched.module_names)) if k in og and k not in seen]
    return _locate_nonfinite(
        chunk.forward[r],
        backward,
        act,
        og,
        inputs_of,
        bad_params,
        watched.describe,
        watched.module_names,
        frozenset(through_params),
        watched.transparent,
    )
