"""The expanded batch: methods that evaluate the model on many rows per input (integration path points, noisy
copies, occluded or masked copies) lay those rows out in one batch and run it in chunks of at most ``batch_size``
rows. Shared by `hookviz.methods.gradient`, `hookviz.methods.noise` and `hookviz.methods.perturbation`.

The Python loops are over chunks, never over inputs, and results do not depend on ``batch_size`` beyond float
rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import torch
from torch import Tensor, nn

from .._checks import int_option
from ..targets import TargetPlan, Targets, resolve_targets
from .forward import ForwardArgs, as_tuple
from .layer import LayerTap


def chunks(total: int, batch_size: int | None) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` row ranges covering ``range(total)``, at most `batch_size` rows each (None: one range)."""
    step = total if batch_size is None else batch_size
    for start in range(0, total, step):
        yield start, min(start + step, total)


def plan_rows(plan: TargetPlan, inputs: Tensor) -> TargetPlan:
    """The plan of an expanded batch whose rows belong to the inputs `inputs` (indices into the N inputs): class
    indices gathered, a `RowTarget` told its rows, or a callable's rows composed (`TargetPlan.take`: it still sees
    the user's rows)."""
    return plan.take(inputs)


def forward_scores(
    model: nn.Module,
    x: Tensor | tuple[Tensor, ...],
    plan: TargetPlan,
    batch_size: int | None,
    *,
    forward_args: ForwardArgs | None = None,
) -> Targets:
    """Target scores of `x` (N, ...) without a backward pass, in chunks; a "top class" plan resolves per input.

    Class targets run under ``torch.no_grad()``; a callable target needs its scores connected to the output
    (`resolve_targets` checks that), so it runs with a graph that is dropped right after.
    """
    return scores_and_layer(model, as_tuple(x), plan, batch_size, forward_args)[0]


def scores_and_layer(
    model: nn.Module,
    xs: tuple[Tensor, ...],
    plan: TargetPlan,
    batch_size: int | None,
    forward_args: ForwardArgs | None = None,
    tap: LayerTap | None = None,
) -> tuple[Targets, Tensor | None]:
    """`forward_scores` of the inputs `xs`, and with `tap` the layer's tensor (N, ...) from the same passes."""
    n = xs[0].shape[0]
    fwd = forward_args or ForwardArgs((), n)
    scores: list[Tensor] = []
    indices: list[Tensor] = []
    acts: list[Tensor] = []
    multi = plan.multi
    for start, stop in chunks(n, batch_size):
        rows = torch.arange(start, stop)
        chunk = tuple(t[start:stop] for t in xs)
        chunk_fwd = fwd if stop - start == n else fwd.rows(rows)
        with ExitStack() as stack:
            taken = stack.enter_context(tap.capture()) if tap is not None else None
            if plan.fn is None:
                with torch.no_grad():
                    t = resolve_targets(plan_rows(plan, rows), chunk_fwd(model, chunk), stop - start)
            else:
                # the layer's leaf connects the scores when there is a tap; else the inputs do
                if tap is None:
                    chunk = tuple(c.detach().requires_grad_(True) for c in chunk)
                row_plan = plan if stop - start == n else plan_rows(plan, rows)
                t = resolve_targets(row_plan, chunk_fwd(model, chunk), stop - start)
        if tap is not None and taken is not None:
            acts.append(tap.one(taken).detach())
        scores.append(t.scores.detach())
        if t.indices is not None:
            indices.append(t.indices)
        multi = t.multi
    targets = Targets(torch.cat(scores), torch.cat(indices) if indices else None, multi)
    return targets, (torch.cat(acts) if acts else None)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Results and sums in float32 at least (float64 stays float64), whatever the autocast dtype."""
    return torch.promote_types(dtype, torch.float32)


def check_batch_size(batch_size: object) -> int | None:
    """`batch_size` checked: None (all rows in one pass) or an int >= 1."""
    expected = "None (all rows in one pass) or an int >= 1 (rows per forward/backward pass)"
    return int_option("batch_size", batch_size, expected, optional=True)
