"""GradientFlow: per-layer gradient statistics during training, alarms for vanishing, exploding and NaN/Inf gradients.

Attach it to a model in training; at every step (or every ``every``-th) it records, per parameter and per module,
the gradient norm, mean and max |grad|, the update-to-weight ratio (when it knows the optimizer), and for activation
modules the activation norm and, for ReLUs, the fraction of dead units (``output_stats="all"``: the output norm and
the norm of the gradient w.r.t. the output of every watched module). It is built to be left on:

- **No device sync per step.** Statistics are computed on the model's device and written into a preallocated
  ``(buffer_steps, statistics)`` buffer on that device; the buffer is read out in one transfer when it is full, and
  on `read`, `report`, the plots, the exports and `stop`. Alarms are checked at those read-outs, so they arrive up to
  ``buffer_steps`` recorded steps late, always naming the exact step (``buffer_steps=1`` checks every step, at the
  price of one sync per step).
- **Cost.** A recorded step reads each parameter gradient (on accelerators with three multi-tensor ``foreach``
  kernels; on the CPU once, with a kernel compiled by ``torch.compile`` that takes the norm, sum and max of |grad| in
  one pass: `fused_stats`) and each activation output once (with the fused kernels the activation outputs are kept
  until the step is taken and reduced by one compiled kernel too; an output modified in place after its module ran is
  caught by its version counter, loses that step's statistics and is reduced in the hook from then on); the update
  ratio reads the parameters three times (a snapshot before the step, the difference after it).
  benchmarks/bench_flow.py (resnet18 training step on 2 CPU cores, batch 16, 64x64; the paired overhead, median of 7
  processes): 3.6% and 4.0% at ``every=1`` in two runs; one process with every variant: 8% with the eager kernels,
  10% with ``output_stats="all"``, 13% with the update ratio, 1% at ``every=4``; ``detect_anomaly`` costs 25-28%
  there. ``every=N`` divides the cost by N.
- **Hooks chosen on purpose.** Forward hooks on the parameter-free watched modules (activations, custom layers) and
  tensor hooks on the outputs of those whose backward could create a NaN (not the stock activations and pooling
  layers of `TRANSPARENT`); never full backward hooks (which break on in-place operations, pytorch#61519). For the
  first few recorded forward passes every watched module gets a forward hook, to learn which module's output feeds
  which (for naming NaN culprits); those hooks are then removed. The step is taken by ``step()`` after the backward
  pass, or automatically through the optimizer's step pre/post hooks when `optimizer` is given.

**NaN/Inf localisation.** Each recorded step keeps, on the host, the order in which the observed module outputs
were produced (forward) and in which the gradients w.r.t. them arrived (backward). A module with trainable
parameters is observed through them: every element of the gradient at its output feeds its parameters' gradients,
so those are non-finite exactly when that gradient is. A module of `TRANSPARENT` (ReLU, Tanh, pooling, dropout, ...)
cannot turn finite gradients into non-finite ones, so the localisation looks through it.
When a step has non-finite values the culprit is, in this order: the first module in forward order whose *output*
is non-finite (a forward NaN: ``log(0)``, ``0/0``, an overflow; with the default `output_stats` this is the first
*observed* output, and the message names the unobserved modules feeding it); else the first module in backward
order that turned finite gradients into non-finite ones (its output gradient is finite, but the gradient it passed
to its inputs, or to its own parameters, is not: e.g. the ``torch.where(x > 0, x, torch.sqrt(x))`` trap); else,
when the gradient was already non-finite where it reached the first module's output, the code after that module
(the loss). `torch.autograd.detect_anomaly` finds the backward culprit too, by checking the output of every backward
node (with a device sync per node on accelerators), and it raises instead of reporting.

**Gradient accumulation.** With `optimizer`, statistics are taken only when the optimizer steps: the parameter
gradients then hold the sum over the micro-steps, output statistics are aggregated over the micro-steps' forward and
backward passes (norms: root of the summed squares for gradients, mean for activations). Without it, call `step()`
once per optimizer step, after the last micro-step's backward.

**Mixed precision.** With ``torch.amp.GradScaler``: pass ``scaler=``. Gradients w.r.t. module outputs are observed
during the backward pass, where they are scaled: they are divided by the scale. Parameter gradients are read when
the step is taken: ``scaler.step(optimizer)`` unscales them before it calls ``optimizer.step()``, so with `optimizer`
they are already unscaled; in manual mode call ``flow.step()`` after ``scaler.unscale_(optimizer)``, or before it
(the scale is divided out: GradientFlow looks at the scaler's per-optimizer stage). Caveat: a step the scaler skips
(inf/NaN gradients) never calls ``optimizer.step()``, so with `optimizer` that iteration is not a step: its output
statistics merge into the next step, and non-finite alarms come only from the parameter gradients of steps the
optimizer takes (use manual mode to see every iteration, with ``Alarms(nonfinite_steps=k)`` to ignore the few
overflow steps a scaler takes to settle).

**Footguns.** Forward passes in eval mode or under ``torch.no_grad()`` are ignored (validation does not pollute the
statistics). The activation outputs kept for the compiled kernel live until the step is taken, a little longer than
autograd would keep them (with gradient accumulation, until the next micro-step's forward). With activation
checkpointing, the forward recomputed during the backward pass shows up as further calls of the checkpointed modules
(``"name#1"`` keys). A module's parameters are attributed to its first call key. Which module feeds which is learnt
from the first recorded forward passes: a model whose structure changes later gets less precise NaN culprits
(``output_stats="all"`` records the backward order at every step).

**DistributedDataParallel.** Pass the wrapped model or the inner module (names differ by the ``module.`` prefix).
Parameter statistics are read after the backward pass, when ``.grad`` holds the all-reduced (averaged) gradient: they
are the same on every rank. Statistics of module outputs and of the gradients w.r.t. them are local to each rank.
(Tested on the CPU with gloo: one rank, wrapped and inner module; two ranks with different halves of a batch, both
recording the statistics of the averaged gradient.)

Example::

    flow = GradientFlow(model, optimizer=opt).start()
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()                       # the statistics of this step are taken here
    flow.stop()
    flow.report()                        # a table that renders in notebooks
    flow.plot_bars(); flow.plot_heatmap(); flow.plot_norms(["conv1", "fc"])
"""

from __future__ import annotations

import csv
import html
import json
import logging
import math
import os
import re
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from ..hooks import HookManager, Selector, select_modules
from ..record import _CallCounter, first_tensor

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "ACTIVATIONS",
    "FUSED_MIN_NUMEL",
    "TRANSPARENT",
    "Alarm",
    "Alarms",
    "FlowReport",
    "FlowStats",
    "GradientFlow",
    "GradientFlowError",
    "GradientFlowWarning",
]

logger = logging.getLogger("hookviz.flow")

#: Modules whose output norm is reported as the activation norm, and whose dead units are counted when they are ReLUs.
ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.RReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Softsign,
)
#: Parameter-free modules whose backward cannot turn a finite gradient into a non-finite one (given a finite forward):
#: the NaN localisation looks through them, so the gradients w.r.t. their outputs need no hook at every step.
TRANSPARENT: tuple[type[nn.Module], ...] = (
    *ACTIVATIONS,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.Flatten,
    nn.Unflatten,
    nn.Identity,
)
# outputs exactly 0 on a negative input: a unit that is 0 for the whole batch is dead
_RELU_LIKE: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)

OnAlarm: TypeAlias = "Literal['warn', 'log', 'raise'] | Callable[[Alarm], Any]"
_MISSING = -1.0  # buffer value of a statistic that has no value at a step (no grad, module not run): norms are >= 0
_PARAM_STATS = ("grad_norm", "grad_mean_abs", "grad_max_abs", "update_ratio")
_MODULE_STATS = (*_PARAM_STATS, "out_grad_norm", "act_norm", "dead_fraction")
_CALL_SUFFIX = re.compile(r"#\d+$")
_EDGE_FORWARDS = 4  # recorded forward passes that learn the module graph (for naming NaN culprits)


# -- alarms ---------------------------------------------------------------------------------------------------------
class GradientFlowWarning(UserWarning):
    """An alarm raised by `GradientFlow` with ``on_alarm="warn"``."""


class GradientFlowError(RuntimeError):
    """An alarm raised by `GradientFlow` with ``on_alarm="raise"``; ``.alarm`` is the `Alarm`."""

    def __init__(self, alarm: Alarm) -> None:
        super().__init__(alarm.message)
        self.alarm = alarm


@dataclass(frozen=True)
class Alarm:
    """One alarm: ``kind`` is ``"vanishing"``, ``"exploding"`` or ``"nonfinite"``; ``name`` the module (None when no
    module could be named); ``step`` the training step (0-based count of steps since `GradientFlow.start`)."""

    kind: Literal["vanishing", "exploding", "nonfinite"]
    step: int
    name: str | None
    value: float
    message: str


@dataclass(frozen=True)
class Alarms:
    """Alarm thresholds, all on the gradient norm of a module's parameters (the root of the summed squares).

    Args:
        vanishing: a norm below this for `vanishing_steps` consecutive recorded steps (None: off).
        vanishing_steps: how many consecutive steps.
        exploding: a norm above this (None: off).
        jump: a norm above ``jump`` times the module's running median over the last `window` recorded finite norms
            (None: off); needs `min_history` earlier values.
        window, min_history: see `jump`.
        nonfinite: alarm on NaN/Inf values (forward outputs or gradients), naming the first module where they appeared.
        nonfinite_steps: alarm only after this many consecutive non-finite steps (with a GradScaler in manual mode, a
            few overflow steps are normal).

    Each alarm fires once, when its condition starts to hold for a module, and re-arms when it stops holding.
    """

    vanishing: float | None = 1e-7
    vanishing_steps: int = 5
    exploding: float | None = 1e4
    jump: float | None = 20.0
    window: int = 20
    min_history: int = 5
    nonfinite: bool = True
    nonfinite_steps: int = 1

    def __post_init__(self) -> None:
        for name in ("vanishing", "exploding", "jump"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"Alarms.{name} must be a positive number or None, got {value!r}")
        if self.jump is not None and self.jump <= 1:
            raise ValueError(f"Alarms.jump must be > 1 (a factor over the running median), got {self.jump!r}")
        for name in ("vanishing_steps", "window", "min_history", "nonfinite_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Alarms.{name} must be a positive int, got {value!r}")


# -- statistics kernels ---------------------------------------------------------------------------------------------
# the public torch.foreach namespace where this torch has it, the private kernels before
_foreach = getattr(torch, "foreach", None)
_foreach_norm = getattr(_foreach, "norm", None) or torch._foreach_norm
_foreach_copy_ = getattr(_foreach, "copy_", None) or torch._foreach_copy_
_foreach_sub_ = getattr(_foreach, "sub_", None) or torch._foreach_sub_


def _dense(t: Tensor) -> Tensor:
    return t.coalesce().values() if t.is_sparse else t


_LOW = (torch.float16, torch.bfloat16)


def _acc(dtype: torch.dtype) -> torch.dtype | None:
    """Accumulation dtype for a reduction: float32 for half precision (whose range a norm overflows), else native."""
    return torch.float32 if dtype in _LOW else None


def _norm32(t: Tensor) -> Tensor:
    """L2 norm of `t` as a float32 0-d tensor (accumulated in float32 or better)."""
    n = torch.linalg.vector_norm(t, dtype=_acc(t.dtype))
    return n if n.dtype == torch.float32 else n.float()


def _grouped_norms(tensors: Sequence[Tensor], device: torch.device, orders: Sequence[float]) -> list[Tensor]:
    """For each order, the norm of each tensor as one float32 vector on `device`: multi-tensor kernels per (device,
    dtype) group, put back in order as a Python list of 0-d results (indexing with a list would copy it to the device
    and synchronize)."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out = []
    for order in orders:
        if len(groups) == 1:
            vec = torch.stack(_foreach_norm(list(tensors), ord=order, dtype=_acc(tensors[0].dtype)))
        else:
            slots: list[Tensor] = [None] * len(tensors)  # type: ignore[list-item]
            for (_, dtype), idx in groups.items():
                vals = _foreach_norm([tensors[i] for i in idx], ord=order, dtype=_acc(dtype))
                for i, v in zip(idx, vals, strict=True):
                    slots[i] = v.to(device, torch.float32, non_blocking=True)
            vec = torch.stack(slots)
        out.append(vec.to(device, torch.float32, non_blocking=True))
    return out


def _norms(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    """L2 norm of each tensor, as one float32 vector on `device`."""
    return _grouped_norms(tensors, device, (2,))[0]


class _Scratch:
    """Reusable flat buffers (per device and dtype) for |g|: allocating a fresh one per gradient costs more than the
    arithmetic on the CPU."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def abs(self, g: Tensor) -> Tensor:
        if not g.is_contiguous():
            return g.abs()
        key = (g.device, g.dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < g.numel():
            buf = self._buffers[key] = torch.empty(g.numel(), dtype=g.dtype, device=g.device)
        return torch.abs(g, out=buf[: g.numel()].view(g.shape))

    def clear(self) -> None:
        self._buffers.clear()


Kernel: TypeAlias = Literal["foreach", "eager", "compiled"]


def _grad_stats(
    grads: Sequence[Tensor], device: torch.device, scratch: _Scratch, kernel: Kernel | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(L2 norm, sum |g|, max |g|) of each gradient, as float32 vectors on `device`.

    Kernels: ``"foreach"``, three multi-tensor norm kernels (orders 2, 1 and inf) per (device, dtype), no temporaries
    (the default on accelerators); ``"eager"``, for the CPU, where the order-1 and inf norms are not vectorized
    (several times slower than a sum): each gradient is read once into a reused |g| buffer and reduced three times
    while it is in cache; ``"compiled"``, the three reductions fused by ``torch.compile`` into one pass per gradient
    (three times cheaper than ``"eager"`` on the CPU; compiled once per set of shapes).
    """
    grads = [_dense(g) for g in grads]
    if kernel is None:
        kernel = "foreach" if all(g.device.type != "cpu" for g in grads) else "eager"
    if kernel == "foreach":
        l2, l1, mx = _grouped_norms(grads, device, (2, 1, math.inf))
        return l2, l1, mx
    if kernel == "compiled":
        # read in reverse parameter order: the optimizer, stepping in parameter order, then starts on gradients that
        # are still in cache (measured: half a percent of a resnet18 CPU step)
        flat = [g.reshape(-1) if g.numel() else g.new_zeros(1) for g in reversed(grads)]
        rows = _compiled_stats()(flat).flip(1).to(device, torch.float32, non_blocking=True)
        return rows[0], rows[1], rows[2]
    l2s, l1s, mxs = [], [], []
    for g in grads:
        if g.numel() == 0:
            g = torch.zeros(1, dtype=g.dtype, device=g.device)
        a = scratch.abs(g)
        l2s.append(torch.linalg.vector_norm(a, dtype=_acc(a.dtype)))
        l1s.append(a.sum(dtype=_acc(a.dtype)))
        mxs.append(a.amax())
    if len({(g.device, g.dtype) for g in grads}) > 1:
        l2s, l1s, mxs = ([t.to(device, torch.float32, non_blocking=True) for t in ts] for ts in (l2s, l1s, mxs))
    return tuple(torch.stack(ts).to(device, torch.float32, non_blocking=True) for ts in (l2s, l1s, mxs))  # type: ignore[return-value]


def _stats_rows(grads: list[Tensor]) -> Tensor:
    """(3, P) float32: L2 norm, sum |g| and max |g| of each 1-D gradient. Written for ``torch.compile``, which fuses the
    three reductions of a gradient into one vectorized pass (in eager mode each would be a pass of its own)."""
    rows = []
    for g in grads:
        g = g.float()
        a = g.abs()
        rows.append(torch.stack([torch.sqrt((g * g).sum()), a.sum(), a.amax()]))
    return torch.stack(rows, dim=1)


def _snapshot_rows(params: list[Tensor], snaps: list[Tensor]) -> Tensor:
    """Copy each parameter into its snapshot and return the parameters' L2 norms (float32): one pass, compiled."""
    norms = []
    for p, snap in zip(params, snaps, strict=True):
        snap.copy_(p)
        f = p.float()
        norms.append(torch.sqrt((f * f).sum()))
    return torch.stack(norms)


def _update_rows(snaps: list[Tensor], params: list[Tensor]) -> Tensor:
    """``||snapshot - parameter||`` of each pair (float32), without writing the difference anywhere: compiled."""
    norms = []
    for snap, p in zip(snaps, params, strict=True):
        d = snap.float() - p.float() if p.dtype in _LOW else (snap - p).float()
        norms.append(torch.sqrt((d * d).sum()))
    return torch.stack(norms)


def _act_rows(outputs: list[Tensor], relu: tuple[bool, ...]) -> Tensor:
    """(2, K) float32: the L2 norm of each activation output and, where `relu`, its fraction of dead units (units
    along dim 1: a unit is dead when it is 0 for the whole batch). Compiled: one pass over each output."""
    rows = []
    for out, dead_units in zip(outputs, relu, strict=True):
        f = out.float()
        per_row = (f * f).reshape(f.shape[0], f.shape[1], -1).sum(2)  # (N, C): sums of squares per sample and unit
        norm = torch.sqrt(per_row.sum())
        dead = (per_row.sum(0) <= 0).float().mean() if dead_units else torch.zeros_like(norm)
        rows.append(torch.stack([norm, dead]))
    return torch.stack(rows, dim=1)


_COMPILED: dict[str, Callable[..., Tensor]] = {}


def _compiled(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` compiled with ``torch.compile``, shared by every GradientFlow (dynamo recompiles per list of shapes)."""
    compiled = _COMPILED.get(fn.__name__)
    if compiled is None:
        compiled = _COMPILED[fn.__name__] = torch.compile(fn, dynamic=False, fullgraph=True)
    return compiled


def _compiled_stats() -> Callable[[list[Tensor]], Tensor]:
    return _compiled(_stats_rows)


#: Watched parameters on the CPU holding at least this many elements get the compiled kernel by default: below it the
#: eager kernels take well under a millisecond, less than a compilation is worth.
FUSED_MIN_NUMEL = 1 << 20


_ROW_MIN = 64  # entries per (sample, channel) row from which per-row norms beat one reduction over the whole tensor


def _row_norms(t: Tensor) -> Tensor | None:
    """Float32 L2 norms of the (sample, channel) rows of a contiguous (N, C, ...) tensor with long rows, else None.

    On the CPU a reduction along contiguous rows is about twice as fast as one over the whole tensor, and the rows
    serve twice: the norm of the row norms is the tensor's norm, and a channel whose rows are all 0 is a dead unit."""
    if t.dim() < 3 or t.numel() == 0 or not t.is_contiguous():
        return None
    n, c = t.shape[0], t.shape[1]
    if t.numel() < _ROW_MIN * n * c:
        return None
    rows = torch.linalg.vector_norm(t.view(n * c, -1), dim=1, dtype=_acc(t.dtype))
    return rows if rows.dtype == torch.float32 else rows.float()


def _partial_norm(t: Tensor, rows: Tensor | None = None) -> Tensor:
    """A float32 tensor whose L2 norm is that of `t`: its row norms (see `_row_norms`), or its norm as a 0-d tensor.
    The last reduction is left to one multi-tensor kernel per step over all of them (a small op costs microseconds)."""
    if rows is None:
        rows = _row_norms(t)
    return _norm32(t) if rows is None else rows


def _unit_sums(out: Tensor, unit_dim: int) -> Tensor:
    """Per-unit sums of a ReLU output (units along `unit_dim`; every entry for 1-D outputs): a unit is dead when its
    sum over the batch is 0, as ReLU outputs are >= 0 (a sum is a faster reduction than a max on the CPU; summing
    the trailing axes first, then the rest, is faster than one reduction over non-adjacent axes)."""
    if out.dim() < 2:
        return out.reshape(-1).float()
    keep = unit_dim % out.dim()
    if keep < out.dim() - 1:
        out = out.sum(dim=list(range(keep + 1, out.dim())), dtype=_acc(out.dtype))
    if keep > 0:
        out = out.sum(dim=list(range(keep)), dtype=_acc(out.dtype))
    return out.reshape(-1).float()


def _unit_values(out: Tensor, unit_dim: int, rows: Tensor | None) -> tuple[Tensor, int, bool]:
    """Values of a ReLU output from which its dead units are found with one op here: (values, values per unit,
    sample-major). A unit is dead when all its values are 0 (ReLU outputs are >= 0). Sample-major: the row norms of
    (N, C, ...) maps, unit ``i % C``; otherwise unit ``i // values_per_unit``."""
    dim = out.dim()
    if dim >= 2 and unit_dim % dim == 1:
        n = out.shape[0]
        if rows is not None:
            return rows, n, True
        if out.is_contiguous() and out.numel():
            # per (unit, position) sums over the batch: a reduction over the leading axis, fast on the CPU
            return out.view(n, -1).sum(0, dtype=torch.float32), out[0, 0].numel(), False
    return _unit_sums(out, unit_dim), 1, False


def _base(key: str) -> str:
    return _CALL_SUFFIX.sub("", key)


def _finite(v: float) -> bool:
    return math.isfinite(v)


def _kind_of(values: Iterable[float]) -> str:
    return "nan" if any(math.isnan(v) for v in values) else "inf"


# -- storage layout -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """Columns of one buffer row: 5 blocks of P parameter statistics, then 3 blocks of K module-call statistics."""

    n_params: int
    keys: tuple[str, ...]

    @property
    def width(self) -> int:
        return 5 * self.n_params + 3 * len(self.keys)

    def block(self, i: int) -> slice:  # 0 l2, 1 l1, 2 max, 3 update norm, 4 weight norm
        return slice(i * self.n_params, (i + 1) * self.n_params)

    def key_block(self, i: int) -> slice:  # 0 out-grad norm, 1 activation norm, 2 dead fraction
        start = 5 * self.n_params + i * len(self.keys)
        return slice(start, start + len(self.keys))


@dataclass
class _Chunk:
    layout: _Layout
    steps: np.ndarray
    forward: list[tuple[str, ...]]
    backward: list[tuple[str, ...]]
    data: np.ndarray


# -- the monitor ----------------------------------------------------------------------------------------------------
class GradientFlow:
    """Watches gradient flow in a model during training (see the module docs for the design and the caveats).

    Args:
        model: the model being trained (or its DistributedDataParallel wrapper).
        every: record every ``every``-th step (steps 0, every, 2 * every, ...); other steps cost nothing but a counter.
        optimizer: when given, steps are taken automatically when it steps (its step pre/post hooks), and the
            update-to-weight ratio ``||w_after - w_before|| / ||w_before||`` is recorded (one copy of the watched
            parameters is kept for that; ``update_ratio=False`` skips it). Without it, call `step` after each
            backward pass (after the last micro-step with gradient accumulation).
        select: the modules to watch (any `select_modules` selector). Default: every leaf module and every module
            that owns parameters. A parameter is attributed to the deepest watched module that contains it.
        scaler: the ``torch.amp.GradScaler`` in use, if any (statistics are unscaled).
        alarms: an `Alarms` (thresholds), True for the defaults, False or None for none.
        on_alarm: ``"warn"`` (a `GradientFlowWarning`), ``"log"`` (a record on the ``hookviz.flow`` logger: error for
            non-finite values, warning otherwise), ``"raise"`` (a `GradientFlowError`), or a callable taking the
            `Alarm`. Every alarm is also kept in `alarms`.
        update_ratio: record update-to-weight ratios when `optimizer` is given.
        output_stats: which module outputs are observed at every recorded step. ``"parameter-free"`` (default):
            the output norm of the watched activation modules and of custom parameter-free modules (with the dead
            fraction for ReLUs), and the gradient w.r.t. the output of the custom ones only (see the module docs:
            modules with trainable parameters are watched through their gradients, stock activations and pooling
            are looked through). ``"all"``: the output norm and the output-gradient norm of every watched module,
            and the exact module of a forward NaN; each output and each gradient w.r.t. one costs a pass over it.
        abs_stats: record mean and max |grad| per parameter (the classic bar chart). False records the gradient
            norms only (no cheaper with the fused kernel, which takes all three in one pass; cheaper with the eager
            kernels).
        fused_stats: compute the per-parameter statistics (norm, mean and max |grad|) in one fused pass per gradient,
            compiled with ``torch.compile``. None (default): on the CPU when the watched parameters hold at least
            `FUSED_MIN_NUMEL` elements (there it is about three times cheaper than the eager kernels; the first
            recorded step pays a one-off compilation of some seconds); on accelerators the eager multi-tensor kernels
            are used. False: never. If compilation fails (no C++ compiler), a warning says so and the eager kernels
            are used.
        buffer_steps: rows of the on-device buffer; it is read out (one sync) when full.
        keep: keep at most this many recorded steps on the host (the oldest are dropped, after the alarms have seen
            them); None keeps all. A recorded step takes ``4 * (5 * parameters + 3 * module calls)`` bytes (about
            2 KB for a resnet18).
        unit_dim: the axis of a ReLU output that indexes units, for the dead fraction (1: channels of (N, C, ...)
            and features of (N, F); use -1 for (N, L, D) sequences).

    Forward passes in eval mode or under ``torch.no_grad()`` are ignored. Use it as a context manager or with
    `start`/`stop`; every hook is removed on exit, also on exceptions.
    """

    def __init__(
        self,
        model: nn.Module,
        every: int = 1,
        optimizer: torch.optim.Optimizer | None = None,
        select: Selector | None = None,
        *,
        scaler: Any | None = None,
        alarms: Alarms | bool | None = True,
        on_alarm: OnAlarm = "warn",
        update_ratio: bool = True,
        abs_stats: bool = True,
        output_stats: Literal["parameter-free", "all"] = "parameter-free",
        fused_stats: bool | None = None,
        buffer_steps: int = 32,
        keep: int | None = None,
        unit_dim: int = 1,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be a positive int (record every every-th step), got {every!r}")
        if optimizer is not None and not hasattr(optimizer, "register_step_pre_hook"):
            raise TypeError(
                "optimizer must be a torch.optim.Optimizer (with register_step_pre_hook), "
                f"got {type(optimizer).__name__}"
            )
        if scaler is not None and not (hasattr(scaler, "scale") and hasattr(scaler, "is_enabled")):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        if alarms is True:
            alarms = Alarms()
        elif alarms is False:
            alarms = None
        if alarms is not None and not isinstance(alarms, Alarms):
            raise TypeError(f"alarms must be an Alarms, True, False or None, got {type(alarms).__name__}")
        if not (on_alarm in ("warn", "log", "raise") or callable(on_alarm)):
            raise ValueError(f"on_alarm must be 'warn', 'log', 'raise' or a callable taking an Alarm, got {on_alarm!r}")
        if output_stats not in ("parameter-free", "all"):
            raise ValueError(f"output_stats must be 'parameter-free' or 'all', got {output_stats!r}")
        if fused_stats not in (None, True, False):
            raise TypeError(f"fused_stats must be None (automatic), True or False, got {fused_stats!r}")
        if not isinstance(buffer_steps, int) or buffer_steps < 1:
            raise ValueError(f"buffer_steps must be a positive int, got {buffer_steps!r}")
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be a positive int or None (keep every recorded step), got {keep!r}")
        if not isinstance(unit_dim, int):
            raise TypeError(f"unit_dim must be an int, got {type(unit_dim).__name__}")

        self.model = model
        self.every = every
        self.optimizer = optimizer
        self.scaler = scaler
        self.alarm_config: Alarms | None = alarms
        self.on_alarm = on_alarm
        self.update_ratio = bool(update_ratio) and optimizer is not None
        self.abs_stats = bool(abs_stats)
        self.fused_stats = fused_stats
        self.output_stats = output_stats
        self._compile_failed = False
        self.buffer_steps = buffer_steps
        self.keep = keep
        self.unit_dim = unit_dim

        # resolved once, up front: a bad selector fails here, before any hook exists
        if select is None:
            watched = select_modules(model, _default_select)
        else:
            watched = select_modules(model, select)
        self.module_names: list[str] = [n for n, _ in watched]
        self._watched = frozenset(self.module_names)
        self._types = {n: type(m).__name__ for n, m in watched}
        self._relu_like = {n for n, m in watched if isinstance(m, _RELU_LIKE)}
        self.param_names: list[str] = []
        self._params: list[nn.Parameter] = []
        self._param_module: list[str] = []
        for pname, p in model.named_parameters():
            owner = _owner(pname, self._watched)
            if owner is not None:
                self.param_names.append(pname)
                self._params.append(p)
                self._param_module.append(owner)
        self._params_of: dict[str, list[int]] = {}
        for i, m in enumerate(self._param_module):
            self._params_of.setdefault(m, []).append(i)
        self._device = self._params[0].device if self._params else torch.device("cpu")
        self._transparent: frozenset[str] = frozenset()  # looked through by the NaN localisation
        if output_stats == "all":
            self._probes = self._grad_probes = self._watched
        else:
            trainable = {self._param_module[i] for i, p in enumerate(self._params) if p.requires_grad}
            self._probes = frozenset(n for n in self.module_names if n not in trainable)
            # pooling, dropout, reshapes: nothing to report and nothing they could break, so no hook at all
            inert = {n for n, m in watched if isinstance(m, TRANSPARENT) and not isinstance(m, ACTIVATIONS)}
            self._probes = self._probes - inert
            self._transparent = frozenset(n for n, m in watched if isinstance(m, TRANSPARENT))
            self._grad_probes = frozenset(self._probes - self._transparent)
        # activation outputs whose statistics can wait for the compiled kernel at the end of the step
        activations = {n for n, m in watched if isinstance(m, ACTIVATIONS)}
        self._deferrable = frozenset(activations & (self._probes - self._grad_probes))
        self._defer_outputs = False

        # hooks
        self._hooks: HookManager | None = None
        self._learn_hooks: HookManager | None = None  # the modules that are not probes, while the graph is learnt
        self._tensor_hooks: HookManager | None = None
        self._opt_handles: list[Any] = []
        # per-step host state (no tensors read back)
        self._step = 0
        self._recording = True
        self._live = False
        self._track_edges = False
        self._edge_forwards = 0
        self._calls = _CallCounter()
        self._producer: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._inputs_of: dict[str, set[str]] = {}
        self._graph_order: dict[str, None] = {}  # every watched call key, in forward order (learnt with the edges)
        self._fwd: list[tuple[str, Tensor]] = []
        self._dead: list[tuple[str, Tensor, int, bool]] = []  # (key, *_unit_values)
        self._dead_done: list[tuple[str, Tensor]] = []  # (key, dead fraction) computed by the compiled kernel
        # activation outputs kept for the compiled kernel at the end of the step: (key, name, output, version, relu)
        self._deferred: list[tuple[str, str, Tensor, int, bool]] = []
        self._eager_outputs: set[str] = set()  # modules whose outputs are modified in place later: never deferred
        self._grads: list[tuple[str, Tensor]] = []
        self._fwd_order: dict[str, None] = {}
        self._bwd_order: dict[str, None] = {}
        # device buffer
        self._key_index: dict[str, int] = {}
        self._layout: _Layout | None = None
        self._buf: Tensor | None = None
        self._slot = 0
        self._row_steps: list[int] = [0] * buffer_steps
        self._row_fwd: list[tuple[str, ...]] = [()] * buffer_steps
        self._row_bwd: list[tuple[str, ...]] = [()] * buffer_steps
        self._orders: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._cache: dict[Any, Any] = {}
        self._snaps: dict[int, Tensor] = {}
        self._scratch = _Scratch()
        self._pending_update: tuple[list[int], Tensor] | None = None
        # host history and alarm state
        self._chunks: list[_Chunk] = []
        self.alarms: list[Alarm] = []
        self._vanish_run: dict[str, int] = {}
        self._vanish_fired: set[str] = set()
        self._explode_hist: dict[str, deque[float]] = {}
        self._explode_fired: set[str] = set()
        self._nonfinite_run = 0
        self._tb_last: dict[int, int] = {}

    # -- life cycle ---------------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._hooks is not None

    @property
    def steps_taken(self) -> int:
        """Steps taken since the first `start` (recorded or not)."""
        return self._step

    def start(self) -> GradientFlow:
        """Place the hooks (module hooks, and the optimizer's step hooks when given). Returns self."""
        if self._hooks is not None:
            raise RuntimeError("GradientFlow is already attached; call stop() before start()")
        hooks = HookManager(self.model)
        try:
            hooks.forward_pre(self.model, self._on_model_forward)
            if self._probes:
                hooks.forward(lambda n, m: n in self._probes, self._on_forward, with_name=True)
            if self._edge_forwards < _EDGE_FORWARDS and self._probes != self._watched:
                learn = self._learn_hooks = HookManager(self.model)
                others = self._watched - self._probes
                learn.forward(lambda n, m: n in others, self._on_forward, with_name=True)
            if self.optimizer is not None:
                # optimizer hooks are not module hooks: kept here, removed with the rest in stop()
                self._opt_handles.append(self.optimizer.register_step_pre_hook(self._pre_step))
                self._opt_handles.append(self.optimizer.register_step_post_hook(self._post_step))
        except BaseException:
            hooks.remove()
            self._remove_learn_hooks()
            self._remove_optimizer_hooks()
            raise
        self._hooks = hooks
        self._tensor_hooks = HookManager(self.model)
        self._recording = self._step % self.every == 0
        return self

    def stop(self) -> None:
        """Remove every hook (idempotent) and read the buffer out (checking alarms). The statistics stay."""
        try:
            for manager in (self._tensor_hooks, self._hooks):
                if manager is not None:
                    manager.remove()
            self._remove_learn_hooks()
            self._remove_optimizer_hooks()
        finally:
            self._hooks = self._tensor_hooks = None
            self._clear_step_state()
            self._pending_update = None
            self._snaps.clear()  # the parameter copies and scratch space are only needed while attached
            self._scratch.clear()
        self._flush()

    def _remove_learn_hooks(self) -> None:
        learn, self._learn_hooks = self._learn_hooks, None
        if learn is not None:
            learn.remove()

    def _remove_optimizer_hooks(self) -> None:
        try:
            for handle in self._opt_handles:
                handle.remove()
        finally:
            self._opt_handles.clear()

    def __enter__(self) -> GradientFlow:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            self.stop()
        else:
            try:  # the block's own exception matters more than an alarm found while cleaning up
                self.stop()
            except GradientFlowError:
                pass
        return False

    def __repr__(self) -> str:
        state = "attached" if self.active else "detached"
        return (
            f"GradientFlow({type(self.model).__name__}, {len(self.module_names)} modules, {len(self._params)} "
            f"parameters, every={self.every}, {state}, steps={self._step})"
        )

    # -- steps --------------------------------------------------------------------------------------------------
    def step(self) -> None:
        """Take the statistics of this step; call it after the backward pass (after ``scaler.unscale_`` with AMP).

        Only without `optimizer`: with one, steps are taken when it steps.
        """
        if self.optimizer is not None:
            raise RuntimeError(
                "this GradientFlow takes its steps when its optimizer steps; do not call step() (or create it "
                "without optimizer= and call step() after each backward pass)"
            )
        if not self.active:
            raise RuntimeError("GradientFlow is not attached: call start() first, or use it as a context manager")
        self._collect(snapshot=False)
        self._advance()

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._collect(snapshot=self.update_ratio)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._finish_update()
        self._advance()

    def _advance(self) -> None:
        if self._recording:
            self._slot += 1
        self._step += 1
        self._recording = self._step % self.every == 0
        if self._slot >= self.buffer_steps:
            self._flush()

    # -- hooks --------------------------------------------------------------------------------------------------
    def _on_model_forward(self, module: nn.Module, args: Any) -> None:
        if self._deferred:  # gradient accumulation: the previous micro-step's outputs, before this forward makes more
            self._process_deferred()
        self._calls.reset()
        self._live = self._recording and torch.is_grad_enabled() and self.model.training
        self._defer_outputs = self._live and bool(self._deferrable) and self._fused_wanted()
        # which module output feeds which module is learnt from the first recorded forwards (the structure rarely
        # changes and the bookkeeping costs as much as a statistic); it only serves to name NaN culprits
        self._track_edges = self._live and self._edge_forwards < _EDGE_FORWARDS
        if self._track_edges:
            self._edge_forwards += 1
        elif self._live and self._learn_hooks is not None:
            self._remove_learn_hooks()  # the graph is known: from now on only the probes run a hook

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if not self._live:
            return
        out = output if isinstance(output, Tensor) else first_tensor(output)
        key = self._calls.key(name)
        if out is None:
            return
        if self._track_edges:
            producer = self._producer
            for a in args:
                if isinstance(a, Tensor):
                    src = producer.get(a)
                    if src is not None and src != key:
                        self._inputs_of.setdefault(key, set()).add(src)
            producer[out] = key
            self._graph_order.setdefault(key, None)
        if name not in self._probes:
            return
        value = out.detach()
        if key not in self._fwd_order:
            self._fwd_order[key] = None
        if (
            self._defer_outputs
            and name in self._deferrable
            and name not in self._eager_outputs
            and value.dim() >= 2
            and value.numel()
            and (name not in self._relu_like or self.unit_dim % value.dim() == 1)  # the kernel's units: dim 1
        ):
            # kept for one compiled pass over all of them at the end of the step (outputs that autograd keeps
            # anyway); the version counter tells whether it is modified in place before then
            self._deferred.append((key, name, value, value._version, name in self._relu_like))
            return
        self._output_stats(key, value, name in self._relu_like)
        if out.requires_grad and self._tensor_hooks is not None and name in self._grad_probes:
            self._tensor_hooks.tensor(out, partial(self._on_grad, key))

    def _on_grad(self, key: str, grad: Tensor) -> None:
        self._grads.append((key, _partial_norm(grad)))
        if key not in self._bwd_order:
            self._bwd_order[key] = None

    def _output_stats(self, key: str, value: Tensor, relu: bool) -> None:
        """The eager statistics of one module output: its partial norm and, for ReLUs, the values of its units."""
        rows = _row_norms(value)
        self._fwd.append((key, _partial_norm(value, rows)))
        if relu:
            self._dead.append((key, *_unit_values(value, self.unit_dim, rows)))

    def _process_deferred(self) -> None:
        """Statistics of the kept activation outputs, with one compiled kernel (or, if compiling fails, eagerly)."""
        entries, self._deferred = self._deferred, []
        fresh = []
        for entry in entries:
            if entry[2]._version != entry[3]:  # modified in place after its module ran: its statistics are lost
                self._eager_outputs.add(entry[1])  # for this step; from now on they are taken in the hook
            else:
                fresh.append(entry)
        if not fresh:
            return
        values = [value for _, _, value, _, _ in fresh]
        relu = tuple(r for _, _, _, _, r in fresh)
        with torch.no_grad():
            stats = None
            if not self._compile_failed:
                stats = self._try_compiled(lambda: _compiled(_act_rows)(values, relu))
            if stats is None:
                for (key, _, _, _, r), v in zip(fresh, values, strict=True):
                    self._output_stats(key, v, r)
                return
        for i, (key, _, _, _, r) in enumerate(fresh):
            self._fwd.append((key, stats[0, i]))
            if r:
                self._dead_done.append((key, stats[1, i]))

    # -- writing one row ------------------------------------------------------------------------------------------
    def _collect(self, snapshot: bool) -> None:
        try:
            if self._recording:
                self._write_row(snapshot)
        finally:
            self._clear_step_state()

    def _clear_step_state(self) -> None:
        self._fwd.clear()
        self._dead.clear()
        self._dead_done.clear()
        self._deferred.clear()
        self._grads.clear()
        self._fwd_order = {}
        self._bwd_order = {}
        if self._tensor_hooks is not None:
            self._tensor_hooks.remove()  # every backward of this step is done

    def _write_row(self, snapshot: bool) -> None:
        if self._deferred:
            self._process_deferred()
        if self._params and self._params[0].device != self._device:  # the model moved since the last step
            self._flush()
            self._device = self._params[0].device
            self._layout = self._buf = None
            self._cache.clear()
        self._ensure_layout()
        assert self._layout is not None and self._buf is not None  # set by _ensure_layout
        layout, dev = self._layout, self._device
        row = self._buf[self._slot]
        row.fill_(_MISSING)
        with torch.no_grad():
            present = [i for i, p in enumerate(self._params) if p.grad is not None]
            if present:
                idx = self._index(("params", tuple(present)), present)
                grads = [self._params[i].grad for i in present]
                if self.abs_stats:
                    stats = list(self._param_stats(grads, dev))  # type: ignore[arg-type]
                else:
                    stats = [_norms([_dense(g) for g in grads], dev)]  # type: ignore[arg-type]
                scale = self._scale() if self._param_grads_scaled() else None
                for b, values in enumerate(stats):  # l2, then sum |g| and max |g|
                    row[layout.block(b)].index_copy_(0, idx, values if scale is None else values / scale)
                if snapshot:
                    params = [self._params[i].detach() for i in present]
                    snaps = [self._snapshot_buffer(i) for i in present]
                    weight_norms = None
                    if self._fused_wanted():  # copy and norm in one pass
                        weight_norms = self._try_compiled(lambda: _compiled(_snapshot_rows)(params, snaps))
                    if weight_norms is None:
                        weight_norms = _norms(params, dev)
                        _foreach_copy_(snaps, params)
                    row[layout.block(4)].index_copy_(0, idx, weight_norms.to(dev, torch.float32))
                    self._pending_update = (present, idx)
            if self._grads:
                keys, vals = self._stack(self._grads)
                scale = self._scale()
                self._combine("og", keys, vals if scale is None else vals / scale, layout.key_block(0).start, row)
            if self._fwd:
                self._combine("act", *self._stack(self._fwd), layout.key_block(1).start, row)
            if self._dead or self._dead_done:
                keys, vals = self._dead_fractions() if self._dead else ((), None)
                if self._dead_done:
                    keys = (*keys, *(k for k, _ in self._dead_done))
                    done = torch.stack([v for _, v in self._dead_done]).to(self._device)
                    vals = done if vals is None else torch.cat([vals, done])
                self._combine("dead", keys, vals, layout.key_block(2).start, row)
        self._row_steps[self._slot] = self._step
        # the orders are the same at almost every step: store one tuple per distinct order
        fwd, bwd = tuple(self._fwd_order), tuple(self._bwd_order)
        self._row_fwd[self._slot] = self._orders.setdefault(fwd, fwd)
        self._row_bwd[self._slot] = self._orders.setdefault(bwd, bwd)

    def _fused_wanted(self) -> bool:
        """Whether the compiled kernels are wanted for the model as it is now (the `fused_stats` policy)."""
        if self.fused_stats is False or self._compile_failed or not self._params:
            return False
        if self.fused_stats:
            return True
        key = ("fused-wanted", self._params[0].device)
        if key not in self._cache:
            on_cpu = all(p.device.type == "cpu" for p in self._params)
            self._cache_put(key, on_cpu and sum(p.numel() for p in self._params) >= FUSED_MIN_NUMEL)
        return self._cache[key]

    def _try_compiled(self, compute: Callable[[], Any]) -> Any:
        """compute() with compiled kernels; None (and the eager kernels from now on) if compiling fails."""
        try:
            return compute()
        except Exception as err:  # no C++ compiler, an unsupported platform: the eager kernels still work
            self._compile_failed = True
            detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(
                f"GradientFlow: compiling the fused statistics kernels failed ({type(err).__name__}: {detail}); "
                "using the eager kernels (slower on the CPU). Pass fused_stats=False to skip the attempt.",
                RuntimeWarning,
                stacklevel=5,
            )
            return None

    def _param_stats(self, grads: list[Tensor], dev: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        if self._fused_wanted():
            stats = self._try_compiled(lambda: _grad_stats(grads, dev, self._scratch, "compiled"))
            if stats is not None:
                return stats
        return _grad_stats(grads, dev, self._scratch)

    def _combine(self, tag: str, keys: tuple[str, ...], vals: Tensor, offset: int, row: Tensor) -> None:
        """Write per-key values into the row; a key seen several times in a step (gradient accumulation) gets the root
        of the summed squares (``og``: gradient norms add up like that over micro-steps) or the mean (the others)."""
        plan = self._cache.get((tag, keys))
        if plan is None:
            unique = list(dict.fromkeys(keys))
            where = {k: i for i, k in enumerate(unique)}
            repeated = len(unique) != len(keys)
            plan = (
                self._index((tag, "cols", keys), [offset + self._key_index[k] for k in unique]),
                self._index((tag, "pos", keys), [where[k] for k in keys]) if repeated else None,
                self._index((tag, "counts", keys), [float(keys.count(k)) for k in unique], torch.float32)
                if repeated
                else None,
            )
            self._cache_put((tag, keys), plan)
        cols_t, pos_t, counts_t = plan
        if pos_t is not None:
            summed = torch.zeros(len(counts_t), dtype=torch.float32, device=self._device)
            if tag == "og":
                vals = summed.index_add_(0, pos_t, vals * vals).sqrt_()
            else:
                vals = summed.index_add_(0, pos_t, vals).div_(counts_t)
        row.index_copy_(0, cols_t, vals)

    def _stack(self, entries: list[tuple[str, Tensor]]) -> tuple[tuple[str, ...], Tensor]:
        keys = tuple(k for k, _ in entries)
        return keys, _norms([v for _, v in entries], self._device)  # the norm of a 0-d norm is itself

    def _dead_fractions(self) -> tuple[tuple[str, ...], Tensor]:
        """One dead fraction per entry of `_dead`, from all of them at once (a few ops per step, whatever the number
        of entries; see `_unit_values`)."""
        keys = tuple(k for k, _, _, _ in self._dead)
        shape = tuple((v.numel(), per_unit, sample_major) for _, v, per_unit, sample_major in self._dead)
        plan = self._cache.get(("dead-plan", keys, shape))
        if plan is None:
            unit_ids, unit_entry, entry_units, offset = [], [], [], 0
            for e, (size, per_unit, sample_major) in enumerate(shape):
                units = size // max(per_unit, 1)
                i = torch.arange(size)
                unit_ids.append((i % max(units, 1) if sample_major else i // max(per_unit, 1)) + offset)
                unit_entry.append(torch.full((units,), e))
                entry_units.append(float(max(units, 1)))
                offset += units
            tensors = (torch.cat(unit_ids), torch.cat(unit_entry), torch.tensor(entry_units))
            plan = (*(t.to(self._device) for t in tensors), offset)
            self._cache_put(("dead-plan", keys, shape), plan)
        unit_ids, unit_entry, entry_units, n_units = plan
        values = torch.cat([v.reshape(-1).to(self._device, torch.float32) for _, v, _, _ in self._dead])
        # the values are >= 0 (norms and sums of ReLU outputs): a unit is dead when they sum to 0 (a NaN is not dead)
        sums = torch.zeros(n_units, dtype=torch.float32, device=self._device).index_add_(0, unit_ids, values)
        dead = (sums <= 0).float()
        per_entry = torch.zeros(len(keys), dtype=torch.float32, device=self._device).index_add_(0, unit_entry, dead)
        return keys, per_entry.div_(entry_units)

    def _finish_update(self) -> None:
        pending, self._pending_update = self._pending_update, None
        if pending is None or self._buf is None or self._layout is None:
            return
        present, idx = pending
        with torch.no_grad():
            snaps = [self._snaps[i] for i in present]
            params = [self._params[i].detach() for i in present]
            update = None
            if self._fused_wanted():  # ||w_before - w_after|| without writing it
                update = self._try_compiled(lambda: _compiled(_update_rows)(snaps, params))
            if update is None:
                _foreach_sub_(snaps, params)  # w_before - w_after
                update = _norms(snaps, self._device)
            self._buf[self._slot][self._layout.block(3)].index_copy_(0, idx, update.to(self._device, torch.float32))

    def _snapshot_buffer(self, i: int) -> Tensor:
        p = self._params[i]
        snap = self._snaps.get(i)
        if snap is None or snap.shape != p.shape or snap.dtype != p.dtype or snap.device != p.device:
            snap = self._snaps[i] = torch.empty_like(p, memory_format=torch.preserve_format).detach()
        return snap

    def _ensure_layout(self) -> None:
        for key in (*self._fwd_order, *self._bwd_order):
            if key not in self._key_index:
                self._key_index[key] = len(self._key_index)
        if self._layout is None or len(self._layout.keys) != len(self._key_index):
            self._flush()  # rows written with the old layout go to the host first
            self._layout = _Layout(len(self._params), tuple(self._key_index))
            self._buf = torch.empty((self.buffer_steps, self._layout.width), dtype=torch.float32, device=self._device)
            self._cache.clear()

    def _index(self, cache_key: Any, values: Sequence[float], dtype: torch.dtype = torch.long) -> Tensor:
        t = self._cache.get(cache_key)
        if t is None:
            t = torch.tensor(list(values), dtype=dtype)
            if self._device.type == "cuda":
                t = t.pin_memory().to(self._device, non_blocking=True)  # no sync on the way in
            else:
                t = t.to(self._device)
            self._cache_put(cache_key, t)
        return t

    def _cache_put(self, key: Any, value: Any) -> None:
        if len(self._cache) > 512:  # key tuples vary only when the model's control flow does
            self._cache.clear()
        self._cache[key] = value

    # -- AMP ----------------------------------------------------------------------------------------------------
    def _scale(self) -> Tensor | None:
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return None
        get_async = getattr(scaler, "_get_scale_async", None)  # the scale tensor, without the sync of get_scale()
        scale = get_async() if get_async is not None else torch.tensor(scaler.get_scale())
        if scale is None:
            return None
        return scale.to(self._device, torch.float32, non_blocking=True)

    def _param_grads_scaled(self) -> bool:
        """Whether the parameter gradients still carry the scaler's scale (not yet unscaled)."""
        if self.scaler is None or not self.scaler.is_enabled():
            return False
        states = getattr(self.scaler, "_per_optimizer_states", None)
        if states is None:  # unknown GradScaler internals: assume the documented order (after unscale_)
            return False
        if self.optimizer is not None:
            state = states.get(id(self.optimizer)) if id(self.optimizer) in states else None
            return state is None or getattr(state.get("stage"), "name", "READY") == "READY"
        return not any(getattr(s.get("stage"), "name", "READY") != "READY" for s in states.values())

    # -- read-out -----------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Move the buffered rows to the host in one transfer and check them for alarms."""
        if self._slot == 0 or self._buf is None or self._layout is None:
            return
        n = self._slot
        data = self._buf[:n].to("cpu", copy=True).numpy()
        chunk = _Chunk(
            self._layout, np.array(self._row_steps[:n], dtype=np.int64), self._row_fwd[:n], self._row_bwd[:n], data
        )
        self._chunks.append(chunk)
        self._slot = 0
        try:
            if self.alarm_config is not None:
                self._check(chunk)
        finally:
            self._trim()

    def _trim(self) -> None:
        if self.keep is None:
            return
        excess = sum(len(c.steps) for c in self._chunks) - self.keep
        while excess > 0:
            first = self._chunks[0]
            if len(first.steps) <= excess:
                self._chunks.pop(0)
                excess -= len(first.steps)
            else:
                first.steps, first.data = first.steps[excess:], first.data[excess:]
                first.forward, first.backward = first.forward[excess:], first.backward[excess:]
                excess = 0

    def read(self) -> FlowStats:
        """Every recorded statistic so far (reads the device buffer out, checking alarms), as a `FlowStats`."""
        self._flush()
        return _assemble(self)

    def report(self, step: int | None = None) -> FlowReport:
        """A per-module table of the statistics at `step` (default: the last recorded), with the alarms so far."""
        return self.read().report(step)

    def plot_bars(self, step: int | None = None, **kwargs: Any) -> Figure:
        """`FlowStats.plot_bars` of `read()`."""
        return self.read().plot_bars(step, **kwargs)

    def plot_heatmap(self, stat: str = "grad_norm", **kwargs: Any) -> Figure:
        """`FlowStats.plot_heatmap` of `read()`."""
        return self.read().plot_heatmap(stat, **kwargs)

    def plot_norms(self, names: Sequence[str] | None = None, stat: str = "grad_norm", **kwargs: Any) -> Figure:
        """`FlowStats.plot_norms` of `read()`."""
        return self.read().plot_norms(names, stat, **kwargs)

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """`FlowStats.to_csv` of `read()`."""
        return self.read().to_csv(path)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """`FlowStats.to_json` of `read()`."""
        return self.read().to_json(path)

    def to_tensorboard(self, writer: Any = None, step: int | None = None, *, histograms: bool = True) -> Any:
        """Write the statistics to TensorBoard; returns the writer.

        `writer`: a ``torch.utils.tensorboard.SummaryWriter`` (or any object with ``add_scalar`` and
        ``add_histogram``), a log directory, or None (a new writer in ``runs/``); creating one needs the optional
        ``tensorboard`` package. With ``step=None``, every recorded step not yet written to this writer is written
        under its own step number; with ``step=N``, the last recorded step is written as step N. Scalars:
        ``<stat>/<module>`` for each module statistic and ``grad_norm/total``. Histograms (`histograms`): the current
        ``.grad`` of every watched parameter, as ``grad/<parameter>``, at the last step written.
        """
        writer = _summary_writer(writer)
        stats = self.read()
        if len(stats.steps) == 0:
            return writer
        if step is None:
            done = self._tb_last.get(id(writer), -1)
            rows = [i for i, s in enumerate(stats.steps) if s > done]
            numbers = [int(stats.steps[i]) for i in rows]
        else:
            rows, numbers = [len(stats.steps) - 1], [int(step)]
        for i, number in zip(rows, numbers, strict=True):
            writer.add_scalar("grad_norm/total", float(stats.total_grad_norm[i]), number)
            for _, level, name, stat, value in stats._row_records(i):
                if level == "module":
                    writer.add_scalar(f"{stat}/{name or '<model>'}", value, number)
        if histograms and numbers:
            for pname, p in zip(self.param_names, self._params, strict=True):
                if p.grad is not None:
                    writer.add_histogram(f"grad/{pname}", _dense(p.grad).detach().float().cpu(), numbers[-1])
        if rows and step is None:
            self._tb_last[id(writer)] = numbers[-1]
        return writer

    # -- alarms -------------------------------------------------------------------------------------------------
    def _check(self, chunk: _Chunk) -> None:
        config = self.alarm_config
        assert config is not None
        layout = chunk.layout
        data = chunk.data
        l2 = data[:, layout.block(0)]
        present = l2 != _MISSING
        modules = [m for m in self.module_names if m in self._params_of]
        norms = _module_norms(l2, present, [self._params_of[m] for m in modules])
        steps = chunk.steps.tolist()
        found: list[tuple[int, int, Alarm]] = []  # (row, -1 or module index, alarm): emitted in row, then model order
        if config.nonfinite:
            # one vectorized screen: only chunks with a non-finite value go through the rows one by one
            suspect = not np.isfinite(data).all() or self._nonfinite_run > 0
            for r, step in enumerate(steps):
                if suspect and self._nonfinite_row(layout, data[r], present[r]):
                    self._nonfinite_run += 1
                    if self._nonfinite_run == config.nonfinite_steps:
                        found.append((r, -1, self._nonfinite_alarm(chunk, r, step)))
                else:
                    self._nonfinite_run = 0
        if not self._quiet_chunk(config, modules, norms):
            for j, name in enumerate(modules):
                has = present[:, self._params_of[name]].any(1)
                for r, alarm in self._norm_alarms(config, name, steps, norms[:, j], has):
                    found.append((r, j, alarm))
        found.sort(key=lambda item: (item[0], item[1]))
        for _, _, alarm in found:
            self._emit(alarm)

    def _nonfinite_row(self, layout: _Layout, row: np.ndarray, present: np.ndarray) -> bool:
        if not np.isfinite(row[layout.block(0)][present]).all():
            return True
        if self.scaler is not None and self.scaler.is_enabled():
            return False  # overflowing output gradients are the scaler's business; parameter gradients decide
        keys = row[5 * layout.n_params :]
        return not np.isfinite(keys).all()

    def _quiet_chunk(self, config: Alarms, modules: list[str], norms: np.ndarray) -> bool:
        """The common case, tested for all modules at once: every norm finite, no alarm armed or due, full jump
        windows. Then only the histories move on (True); otherwise (False) `_norm_alarms` goes module by module."""
        if not modules or norms.size == 0 or not np.isfinite(norms).all():
            return False
        if self._vanish_fired or self._explode_fired or any(self._vanish_run.values()):
            return False
        if config.vanishing is not None and norms.min() < config.vanishing:
            return False
        if config.exploding is not None and norms.max() > config.exploding:
            return False
        histories = [self._explode_hist.get(name) for name in modules]
        if config.jump is not None:
            if any(h is None or len(h) < config.window for h in histories):
                return False
            seq = np.concatenate([np.asarray(histories, dtype=np.float64).T, norms.astype(np.float64)])  # (W + S, M)
            windows = np.lib.stride_tricks.sliding_window_view(seq, config.window, axis=0)[: len(norms)]  # (S, M, W)
            medians = np.median(windows, axis=2)
            if ((medians > 0) & (norms > config.jump * medians)).any():
                return False
        for name, h, column in zip(modules, histories, norms.T.tolist(), strict=True):
            if h is None:
                h = self._explode_hist[name] = deque(maxlen=config.window)
            h.extend(column)
        return True

    def _norm_alarms(
        self, config: Alarms, name: str, steps: list[int], values: np.ndarray, has: np.ndarray
    ) -> list[tuple[int, Alarm]]:
        """Vanishing and exploding alarms of one module over the rows of a chunk, as (row, alarm). The running
        medians of the jump test are computed for all rows at once (a median per row per module costs more than the
        statistics themselves)."""
        out: list[tuple[int, Alarm]] = []
        rows = [r for r in range(len(steps)) if has[r] and math.isfinite(values[r])]
        if not rows:
            return out
        history = self._explode_hist.setdefault(name, deque(maxlen=config.window))
        finite = values[rows].astype(np.float64)
        medians: np.ndarray | None = None
        counts = np.minimum(config.window, len(history) + np.arange(len(rows)))
        if config.jump is not None and (counts >= config.min_history).any():
            seq = np.concatenate([np.full(config.window, np.nan), np.asarray(history, dtype=np.float64), finite])
            windows = np.lib.stride_tricks.sliding_window_view(seq, config.window)
            windows = windows[len(history) : len(history) + len(rows)]  # the `window` values before each row
            if counts[0] == config.window:  # full windows (after the first `window` steps): no NaN padding
                medians = np.median(windows, axis=1)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows (no history yet) are not used
                    medians = np.nanmedian(windows, axis=1)
        quiet = (
            name not in self._vanish_fired
            and not self._vanish_run.get(name)
            and name not in self._explode_fired
            and (config.vanishing is None or finite.min() >= config.vanishing)
            and (config.exploding is None or finite.max() <= config.exploding)
            and (
                medians is None
                or not ((counts >= config.min_history) & (medians > 0) & (finite > config.jump * medians)).any()  # type: ignore[operator]
            )
        )
        if quiet:  # the common case: no alarm, no state to carry but the history
            history.extend(finite.tolist())
            return out
        desc = self._describe(name)
        for k, r in enumerate(rows):
            v, step = float(finite[k]), steps[r]
            if config.vanishing is not None:
                if v < config.vanishing:
                    run = self._vanish_run[name] = self._vanish_run.get(name, 0) + 1
                    if run >= config.vanishing_steps and name not in self._vanish_fired:
                        self._vanish_fired.add(name)
                        message = (
                            f"vanishing gradient at step {step}: {desc} has had a gradient norm below "
                            f"{config.vanishing:g} for {run} consecutive recorded steps (now {v:.3g})"
                        )
                        out.append((r, Alarm("vanishing", step, name, v, message)))
                else:
                    self._vanish_run[name] = 0
                    self._vanish_fired.discard(name)
            reason = None
            if config.exploding is not None and v > config.exploding:
                reason = f"gradient norm {v:.3g} above the threshold {config.exploding:g}"
            elif medians is not None and counts[k] >= config.min_history:
                median = float(medians[k])
                if median > 0 and v > config.jump * median:  # type: ignore[operator]
                    reason = (
                        f"gradient norm {v:.3g} is {v / median:.1f}x its running median {median:.3g} over the last "
                        f"{int(counts[k])} recorded steps (jump factor {config.jump:g})"
                    )
            if reason is not None:
                if name not in self._explode_fired:
                    self._explode_fired.add(name)
                    message = f"exploding gradient at step {step}: {desc}: {reason}"
                    out.append((r, Alarm("exploding", step, name, v, message)))
            else:
                self._explode_fired.discard(name)
            history.append(v)
        return out

    def _nonfinite_alarm(self, chunk: _Chunk, r: int, step: int) -> Alarm:
        layout, row = chunk.layout, chunk.data[r]
        og = {k: float(row[layout.key_block(0)][i]) for i, k in enumerate(layout.keys)}
        act = {k: float(row[layout.key_block(1)][i]) for i, k in enumerate(layout.keys)}
        og = {k: v for k, v in og.items() if v != _MISSING}
        act = {k: v for k, v in act.items() if v != _MISSING}
        l2 = row[layout.block(0)]
        bad_params: dict[str, list[str]] = {}
        for i, v in enumerate(l2.tolist()):
            if v != _MISSING and not _finite(v):
                bad_params.setdefault(self._param_module[i], []).append(self.param_names[i])
        backward: Sequence[str] = chunk.backward[r]
        through_params: set[str] = set()
        if self._probes != self._watched:
            # a module watched through its parameters: their gradients are non-finite exactly when the gradient at its
            # output is (every output element feeds them), and its place in backward order comes from the graph
            for i, v in enumerate(l2.tolist()):
                m = self._param_module[i]
                if v == _MISSING or m in self._probes:
                    continue
                w = og.get(m, 0.0)
                og[m] = v if not _finite(v) else w if not _finite(w) else math.hypot(w, v)
                through_params.add(m)
            ranked = [k for k in reversed(self._graph_order) if k in og]
            seen = set(ranked)
            backward = ranked + [k for k in (*backward, *reversed(self.module_names)) if k in og and k not in seen]
        name, detail, values = _locate_nonfinite(
            chunk.forward[r],
            backward,
            act,
            og,
            self._inputs_of,
            bad_params,
            self._describe,
            self.module_names,
            frozenset(through_params),
            self._transparent,
        )
        kind = _kind_of(values) if values else "nan"
        value = float("nan") if kind == "nan" else float("inf")
        return Alarm("nonfinite", step, name, value, f"non-finite values ({kind}) at step {step}: {detail}")

    def _describe(self, key: str) -> str:
        return f"{key or '<model>'!r} ({self._types.get(_base(key), '?')})"

    def _emit(self, alarm: Alarm) -> None:
        self.alarms.append(alarm)
        mode = self.on_alarm
        if mode == "warn":
            warnings.warn(GradientFlowWarning(alarm.message), stacklevel=2)
        elif mode == "log":
            logger.log(logging.ERROR if alarm.kind == "nonfinite" else logging.WARNING, alarm.message)
        elif mode == "raise":
            raise GradientFlowError(alarm)
        else:
            mode(alarm)  # type: ignore[operator]


def _default_select(name: str, module: nn.Module) -> bool:
    """Leaf modules, and modules that own parameters directly."""
    return next(module.children(), None) is None or next(module.parameters(recurse=False), None) is not None


def _owner(pname: str, watched: frozenset[str]) -> str | None:
    """The deepest watched module whose subtree holds parameter `pname`."""
    parts = pname.split(".")[:-1]
    for cut in range(len(parts), -1, -1):
        name = ".".join(parts[:cut])
        if name in watched:
            return name
    return None


def _module_norms(l2: np.ndarray, present: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """(S, M) root of summed squares of the parameter norms of each module (NaN where none has a gradient)."""
    out = np.full((l2.shape[0], len(groups)), np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        for j, cols in enumerate(groups):
            p = present[:, cols]
            sq = np.where(p, l2[:, cols].astype(np.float64) ** 2, 0.0).sum(1)
            out[:, j] = np.where(p.any(1), np.sqrt(sq), np.nan)
    return out


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
    """(culprit, explanation, offending values) for a step with non-finite values (see the module docs).

    `through_params`: modules whose entry in `og` stands for their parameters' gradients (not observed outputs).
    `transparent`: modules without an `og` entry that cannot create a non-finite gradient: looked through."""

    def sources(key: str) -> list[tuple[str, str | None]]:
        """(source with an output gradient, the transparent module it was reached through or None)."""
        found: dict[str, str | None] = {}
        stack = [(s, None) for s in sorted(inputs_of.get(key, ()))]
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

    for key in forward:  # a forward NaN poisons everything after it: name where it first appeared
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
        bad = [(s, via) for s, via in sources(key) if not _finite(og[s])]
        bad_inputs = [s for s, _ in bad]
        own = bad_params.get(_base(key), []) if _base(key) == key and key not in through_params else []
        if bad_inputs or own:
            where = []
            if bad_inputs:
                named = [repr(s) if via is None else f"{s!r} (through {via!r})" for s, via in bad]
                where.append(f"to its input from {', '.join(named)}")
            if own:
                where.append(f"to its parameters {', '.join(repr(p) for p in own)}")
            values = [og[s] for s in bad_inputs] or [float("nan")]
            return (
                key,
                f"first produced in backward order by {describe(key)}: the gradient at its output was finite, the "
                f"gradient it passed back {' and '.join(where)} was not",
                values,
            )
    if bad_params:  # no output-gradient evidence: the last owner in model order is the first in backward order
        ranked = [m for m in module_order if m in bad_params] or list(bad_params)
        name = ranked[-1]
        return (
            name,
            f"the gradients of the parameters {', '.join(repr(p) for p in bad_params[name])} of {describe(name)} are "
            "non-finite (no watched module output carried a non-finite gradient)",
            [float("nan")],
        )
    return None, "non-finite statistics that no watched module could be blamed for", []


def _summary_writer(writer: Any) -> Any:
    if writer is None or isinstance(writer, str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "GradientFlow.to_tensorboard needs the optional tensorboard package to create a writer: "
                "pip install tensorboard (or pip install 'hookviz[tensorboard]'); or pass any object with "
                "add_scalar and add_histogram methods"
            ) from exc
        return SummaryWriter(log_dir=None if writer is None else os.fspath(writer))
    if not (hasattr(writer, "add_scalar") and hasattr(writer, "add_histogram")):
        raise TypeError(
            f"writer must be a torch.utils.tensorboard.SummaryWriter (or have add_scalar and add_histogram), a log "
            f"directory or None, got {type(writer).__name__}"
        )
    return writer


# -- results --------------------------------------------------------------------------------------------------------
@dataclass
class FlowStats:
    """Every statistic recorded by a `GradientFlow`, as numpy arrays over the recorded steps.

    ``param_stats[stat]`` is (S, P) over `params` for ``grad_norm`` (L2), ``grad_mean_abs``, ``grad_max_abs`` and
    ``update_ratio`` (``||w_after - w_before|| / ||w_before||``; none without an optimizer or for a zero weight).
    ``module_stats[stat]`` is (S, M) over `modules` for the same four (over the module's parameters; the root of the
    summed squares of the norms for ``grad_norm``), plus ``out_grad_norm`` (L2 norm of the gradient w.r.t. the
    module's output), ``act_norm`` (L2 norm of the output) and ``dead_fraction`` (ReLUs: the fraction of units whose
    output is 0 for the whole batch). `modules` lists the watched modules in model order, each followed by the call
    keys of its further calls (``"layer1.0.relu#1"``: see `hookviz.record`); parameter statistics belong to the first
    key. Where a statistic has no value (no gradient, module not run, statistic not recorded) the array holds NaN and
    ``param_present[stat]`` / ``module_present[stat]`` (same shapes, bool) are False; where they are True, a NaN is a
    NaN.
    """

    steps: np.ndarray
    params: list[str]
    param_modules: list[str]
    param_numel: list[int]
    modules: list[str]
    module_types: list[str]
    param_stats: dict[str, np.ndarray]
    param_present: dict[str, np.ndarray]
    module_stats: dict[str, np.ndarray]
    module_present: dict[str, np.ndarray]
    total_grad_norm: np.ndarray
    alarms: list[Alarm] = field(default_factory=list)

    @property
    def param_has_grad(self) -> np.ndarray:
        """(S, P) bool: where a parameter had a gradient."""
        return self.param_present["grad_norm"]

    @property
    def module_has_grad(self) -> np.ndarray:
        """(S, M) bool: where a module had a gradient in one of its parameters."""
        return self.module_present["grad_norm"]

    # -- access ---------------------------------------------------------------------------------------------------
    def module(self, name: str, stat: str = "grad_norm") -> np.ndarray:
        """(S,) values of `stat` for module (or call key) `name`."""
        return self.module_stats[_check_stat(stat, _MODULE_STATS)][:, self._index(self.modules, name, "module")]

    def param(self, name: str, stat: str = "grad_norm") -> np.ndarray:
        """(S,) values of `stat` for parameter `name`."""
        return self.param_stats[_check_stat(stat, _PARAM_STATS)][:, self._index(self.params, name, "parameter")]

    def module_has_value(self, stat: str) -> np.ndarray:
        """(S, M) bool: where `stat` has a value (NaN there means a NaN, not a missing value)."""
        return self.module_present[_check_stat(stat, _MODULE_STATS)]

    def row(self, step: int | None) -> int:
        """Row index of training step `step` (None: the last recorded)."""
        if len(self.steps) == 0:
            raise ValueError("nothing recorded yet: take a training step with the GradientFlow attached first")
        if step is None:
            return len(self.steps) - 1
        hits = np.flatnonzero(self.steps == step)
        if hits.size == 0:
            raise ValueError(
                f"step {step} was not recorded; recorded steps: {_few(self.steps.tolist())} (every= skips steps)"
            )
        return int(hits[0])

    @staticmethod
    def _index(names: list[str], name: str, what: str) -> int:
        try:
            return names.index(name)
        except ValueError:
            import difflib

            close = difflib.get_close_matches(name, names, n=5, cutoff=0.4)
            hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
            raise KeyError(f"no {what} named {name!r} was watched{hint}") from None

    def _param_modules(self) -> list[int]:
        owners = set(self.param_modules)
        return [j for j, m in enumerate(self.modules) if m in owners]

    # -- report ---------------------------------------------------------------------------------------------------
    def report(self, step: int | None = None) -> FlowReport:
        """A per-module table at `step` (default: the last recorded step)."""
        r = self.row(step)
        numel: dict[str, int] = {}
        for m, n in zip(self.param_modules, self.param_numel, strict=True):
            numel[m] = numel.get(m, 0) + n
        flagged: dict[str, list[str]] = {}
        for a in self.alarms:
            if a.step == int(self.steps[r]) and a.name is not None:
                flagged.setdefault(a.name, []).append(a.kind)
        rows = []
        for j, name in enumerate(self.modules):
            values: dict[str, float | None] = {}
            for stat in _MODULE_STATS:
                values[stat] = float(self.module_stats[stat][r, j]) if self.module_present[stat][r, j] else None
            status = list(flagged.get(name, []))
            owns = name in numel and _base(name) == name
            if owns and not self.module_has_grad[r, j]:
                status.append("no grad")
            elif "nonfinite" not in status and any(v is not None and not _finite(v) for v in values.values()):
                status.append("nonfinite")
            row = {"module": name, "type": self.module_types[j], "params": numel[name] if owns else 0}
            rows.append(row | values | {"status": ", ".join(status)})
        return FlowReport(
            step=int(self.steps[r]),
            steps_recorded=len(self.steps),
            total_grad_norm=float(self.total_grad_norm[r]),
            rows=rows,
            alarms=list(self.alarms),
        )

    # -- plots ----------------------------------------------------------------------------------------------------
    def plot_bars(
        self, step: int | None = None, *, level: Literal["module", "param"] = "module", ax: Axes | None = None
    ) -> Figure:
        """The classic gradient-flow chart at `step`: max |grad| and mean |grad| per layer, on a log scale.

        One entry per module that owns parameters (``level="module"``) or per parameter (``level="param"``), in model
        order. Entries without a gradient get no bar and a grey ``(no grad)`` label; non-finite ones a red ``(nan)``
        or ``(inf)`` label; exact zeros a ``(0)`` label (a log axis has no 0). Returns the Figure.
        """
        r = self.row(step)
        if level == "module":
            cols = self._param_modules()
            names = [self.modules[j] for j in cols]
            mx = self.module_stats["grad_max_abs"][r, cols]
            mean = self.module_stats["grad_mean_abs"][r, cols]
            has = self.module_has_grad[r, cols]
            recorded = self.module_present["grad_max_abs"][r, cols]
        elif level == "param":
            names = list(self.params)
            mx = self.param_stats["grad_max_abs"][r]
            mean = self.param_stats["grad_mean_abs"][r]
            has = self.param_has_grad[r]
            recorded = self.param_present["grad_max_abs"][r]
        else:
            raise ValueError(f"level must be 'module' or 'param', got {level!r}")
        if has.any() and not recorded.any():
            raise ValueError(
                "mean and max |grad| were not recorded (GradientFlow(abs_stats=False)); plot the gradient norms with "
                "plot_norms() or plot_heatmap() instead"
            )
        fig, ax = _figure_axes(ax, (max(6.0, 0.28 * len(names) + 2), 4.2))
        x = np.arange(len(names))
        ok = has & np.isfinite(mx) & np.isfinite(mean) & (mx > 0)
        ax.bar(x[ok], mx[ok], width=0.8, color="tab:cyan", alpha=0.6, label="max |grad|")
        ok_mean = ok & (mean > 0)
        ax.bar(x[ok_mean], mean[ok_mean], width=0.8, color="tab:blue", alpha=0.9, label="mean |grad|")
        ax.set_yscale("log")
        positive = np.concatenate([mx[ok], mean[ok_mean]])
        if positive.size:
            ax.set_ylim(positive.min() / 3, positive.max() * 3)
        labels = []
        for i, name in enumerate(names):
            label = name or "<model>"
            if not has[i]:
                label += " (no grad)"
            elif not (_finite(mx[i]) and _finite(mean[i])):
                label += f" ({_kind_of([mx[i], mean[i]])})"
            elif mx[i] == 0:
                label += " (0)"
            labels.append(label)
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
        for tick, i in zip(ax.get_xticklabels(), range(len(names)), strict=True):
            if not has[i]:
                tick.set_color("grey")
            elif not (_finite(mx[i]) and _finite(mean[i])):
                tick.set_color("red")
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylabel("|grad|")
        ax.set_title(f"gradient flow at step {int(self.steps[r])}")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        return fig

    def plot_heatmap(
        self,
        stat: str = "grad_norm",
        *,
        level: Literal["module", "param"] = "module",
        ax: Axes | None = None,
        log: bool = True,
    ) -> Figure:
        """A layers x steps heatmap of `stat` (log colour scale by default); missing values are blank. Returns the
        Figure (with a colour bar axis)."""
        from matplotlib.colors import LogNorm, Normalize

        self.row(None)
        names, values = self._matrix(stat, level)
        fig, ax = _figure_axes(ax, (max(6.0, 0.05 * len(self.steps) + 4), max(3.0, 0.18 * len(names) + 1.5)))
        masked = np.ma.masked_invalid(values.T)
        if log:
            masked = np.ma.masked_less_equal(masked, 0)
        finite = masked.compressed()
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
            norm = LogNorm(lo, hi if hi > lo else lo * 10) if log else Normalize(lo, hi if hi > lo else lo + 1)
        else:
            norm = None
        steps = self.steps
        extent = (float(steps[0]) - 0.5, float(steps[-1]) + 0.5, len(names) - 0.5, -0.5)
        image = ax.imshow(masked, aspect="auto", interpolation="nearest", norm=norm, cmap="viridis", extent=extent)
        ax.set_yticks(np.arange(len(names)), [n or "<model>" for n in names], fontsize=7)
        ax.set_xlabel("step")
        ax.set_title(f"{stat} per {level}")
        fig.colorbar(image, ax=ax, label=stat)
        fig.tight_layout()
        return fig

    def plot_norms(
        self,
        names: Sequence[str] | None = None,
        stat: str = "grad_norm",
        *,
        level: Literal["module", "param"] = "module",
        ax: Axes | None = None,
        log: bool = True,
    ) -> Figure:
        """`stat` over the recorded steps, one line per name (default: up to 8 modules that own parameters, spread
        over the model). Returns the Figure."""
        self.row(None)
        all_names, values = self._matrix(stat, level)
        if names is None:
            pool = [self.modules[j] for j in self._param_modules()] if level == "module" else list(self.params)
            pool = pool or all_names
            picks = np.unique(np.linspace(0, len(pool) - 1, num=min(8, len(pool))).round().astype(int))
            names = [pool[i] for i in picks]
        fig, ax = _figure_axes(ax, (7.0, 4.0))
        for name in names:
            j = self._index(all_names, name, level)
            ax.plot(self.steps, values[:, j], marker="." if len(self.steps) < 50 else None, label=name or "<model>")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(stat)
        ax.set_title(f"{stat} over steps")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig

    def _matrix(self, stat: str, level: str) -> tuple[list[str], np.ndarray]:
        if level == "module":
            return self.modules, self.module_stats[_check_stat(stat, _MODULE_STATS)]
        if level == "param":
            return self.params, self.param_stats[_check_stat(stat, _PARAM_STATS)]
        raise ValueError(f"level must be 'module' or 'param', got {level!r}")

    # -- exports --------------------------------------------------------------------------------------------------
    def records(self) -> Iterable[tuple[int, str, str, str, float]]:
        """Long format: (step, level, name, stat, value) for every statistic that has a value."""
        for r in range(len(self.steps)):
            yield from self._row_records(r)

    def _row_records(self, r: int) -> Iterable[tuple[int, str, str, str, float]]:
        step = int(self.steps[r])
        for stat in _PARAM_STATS:
            values, has = self.param_stats[stat][r], self.param_present[stat][r]
            for i, name in enumerate(self.params):
                if has[i]:
                    yield step, "param", name, stat, float(values[i])
        for stat in _MODULE_STATS:
            values, has = self.module_stats[stat][r], self.module_present[stat][r]
            for j, name in enumerate(self.modules):
                if has[j]:
                    yield step, "module", name, stat, float(values[j])

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write `records` as CSV (columns step, level, name, stat, value; non-finite values as nan/inf)."""
        path = Path(path)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "level", "name", "stat", "value"])
            for step, level, name, stat, value in self.records():
                w.writerow([step, level, name, stat, repr(value) if _finite(value) else str(value)])
        return path

    def to_dict(self) -> dict[str, Any]:
        """Plain lists: missing values as None, non-finite ones as the strings "NaN", "Infinity", "-Infinity"."""

        def clean(values: np.ndarray, has: np.ndarray) -> list[Any]:
            return [_json_number(v) if h else None for v, h in zip(values.tolist(), has.tolist(), strict=True)]

        params = {}
        for i, name in enumerate(self.params):
            entry: dict[str, Any] = {"module": self.param_modules[i], "numel": self.param_numel[i]}
            for stat in _PARAM_STATS:
                entry[stat] = clean(self.param_stats[stat][:, i], self.param_present[stat][:, i])
            params[name] = entry
        modules = {}
        for j, name in enumerate(self.modules):
            entry = {"type": self.module_types[j]}
            for stat in _MODULE_STATS:
                entry[stat] = clean(self.module_stats[stat][:, j], self.module_present[stat][:, j])
            modules[name] = entry
        return {
            "steps": self.steps.tolist(),
            "total_grad_norm": [_json_number(v) for v in self.total_grad_norm.tolist()],
            "params": params,
            "modules": modules,
            "alarms": [asdict(a) | {"value": _json_number(a.value)} for a in self.alarms],
        }

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write `to_dict` as JSON (strict: no bare NaN/Infinity tokens)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), allow_nan=False, indent=1))
        return path


def _json_number(v: float) -> float | str | None:
    if v is None:
        return None
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _check_stat(stat: str, allowed: tuple[str, ...]) -> str:
    if stat not in allowed:
        raise ValueError(f"stat must be one of {', '.join(allowed)}; got {stat!r}")
    return stat


def _few(values: list[int]) -> str:
    return ", ".join(map(str, values)) if len(values) <= 8 else f"{values[0]}, {values[1]}, ..., {values[-1]}"


def _figure_axes(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, fig.add_subplot()


def _assemble(flow: GradientFlow) -> FlowStats:
    """Host chunks -> FlowStats (parameter statistics per parameter and aggregated per module)."""
    chunks = flow._chunks
    P = len(flow._params)
    keys = list(flow._key_index)
    S = sum(len(c.steps) for c in chunks)
    steps = np.concatenate([c.steps for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
    blocks = [np.full((S, P), _MISSING) for _ in range(5)]
    kb = [np.full((S, len(keys)), _MISSING) for _ in range(3)]
    r = 0
    for c in chunks:
        n = len(c.steps)
        for b in range(5):
            blocks[b][r : r + n] = c.data[:, c.layout.block(b)]
        for b in range(3):
            kb[b][r : r + n, : len(c.layout.keys)] = c.data[:, c.layout.key_block(b)]
        r += n
    l2, l1, mx, upd, w = blocks
    has = l2 != _MISSING
    numel = np.array([p.numel() for p in flow._params], dtype=np.float64)
    nan = np.nan
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        present = {
            "grad_norm": has,
            "grad_mean_abs": has & (l1 != _MISSING),
            "grad_max_abs": has & (mx != _MISSING),
            "update_ratio": has & (upd != _MISSING) & (w != _MISSING),
        }
        param_present = present | {"update_ratio": present["update_ratio"] & (w > 0)}
        param_stats = {
            "grad_norm": np.where(has, l2, nan),
            "grad_mean_abs": np.where(present["grad_mean_abs"], l1 / np.maximum(numel, 1), nan),
            "grad_max_abs": np.where(present["grad_max_abs"], mx, nan),
            "update_ratio": np.where(param_present["update_ratio"], upd / np.where(w > 0, w, 1), nan),
        }
        # module order: watched modules in model order, each followed by its further call keys
        extra: dict[str, list[str]] = {}
        for k in keys:
            if _base(k) != k:
                extra.setdefault(_base(k), []).append(k)
        modules = []
        for name in flow.module_names:
            modules.append(name)
            modules.extend(sorted(extra.get(name, []), key=lambda k: int(k.rsplit("#", 1)[1])))
        M = len(modules)
        mstats = {stat: np.full((S, M), nan) for stat in _MODULE_STATS}
        mpresent = {stat: np.zeros((S, M), dtype=bool) for stat in _MODULE_STATS}
        key_pos = {k: i for i, k in enumerate(keys)}

        def put(stat: str, j: int, mask: np.ndarray, values: np.ndarray) -> None:
            mpresent[stat][:, j] = mask
            mstats[stat][:, j] = np.where(mask, values, nan)

        def sq(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return np.sqrt(np.where(mask, values.astype(np.float64) ** 2, 0.0).sum(1))

        for j, name in enumerate(modules):
            cols = flow._params_of.get(name, []) if _base(name) == name else []
            if cols:
                p = present["grad_norm"][:, cols]
                put("grad_norm", j, p.any(1), sq(l2[:, cols], p))
                p = present["grad_mean_abs"][:, cols]
                mean = np.where(p, l1[:, cols], 0.0).sum(1) / np.maximum((p * numel[cols]).sum(1), 1)
                put("grad_mean_abs", j, p.any(1), mean)
                p = present["grad_max_abs"][:, cols]
                put("grad_max_abs", j, p.any(1), np.where(p, mx[:, cols], -np.inf).max(1))
                p = present["update_ratio"][:, cols]
                ws = sq(w[:, cols], p)
                put("update_ratio", j, p.any(1) & (ws > 0), sq(upd[:, cols], p) / np.where(ws > 0, ws, 1))
            i = key_pos.get(name)
            if i is not None:
                for b, stat in enumerate(("out_grad_norm", "act_norm", "dead_fraction")):
                    v = kb[b][:, i]
                    put(stat, j, v != _MISSING, v)
        total = np.where(has.any(1), sq(l2, has), nan)
    return FlowStats(
        steps=steps,
        params=list(flow.param_names),
        param_modules=list(flow._param_module),
        param_numel=[int(n) for n in numel],
        modules=modules,
        module_types=[flow._types.get(_base(m), "?") for m in modules],
        param_stats=param_stats,
        param_present=param_present,
        module_stats=mstats,
        module_present=mpresent,
        total_grad_norm=total,
        alarms=list(flow.alarms),
    )


# -- report ---------------------------------------------------------------------------------------------------------
_REPORT_COLUMNS = (
    ("module", "module"),
    ("type", "type"),
    ("params", "params"),
    ("grad_norm", "grad norm"),
    ("grad_mean_abs", "mean |grad|"),
    ("grad_max_abs", "max |grad|"),
    ("update_ratio", "update/weight"),
    ("out_grad_norm", "out-grad norm"),
    ("act_norm", "act norm"),
    ("dead_fraction", "dead"),
    ("status", "status"),
)


@dataclass
class FlowReport:
    """A per-module summary at one step: plain dicts in `rows` (keys: module, type, params, the statistics of
    `FlowStats` with None where there is no value, status: the alarm kinds at this step, "no grad" or "nonfinite"),
    the alarms so far, and an HTML table for notebooks."""

    step: int
    steps_recorded: int
    total_grad_norm: float
    rows: list[dict[str, Any]]
    alarms: list[Alarm]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _columns(self) -> list[tuple[str, str]]:
        """The report columns, without statistics that have no value in any row (not recorded in this run)."""
        fixed = ("module", "type", "params", "status")
        return [(k, t) for k, t in _REPORT_COLUMNS if k in fixed or any(r[k] is not None for r in self.rows)]

    def _cells(self, row: dict[str, Any], columns: list[tuple[str, str]]) -> list[str]:
        out = []
        for key, _ in columns:
            v = row[key]
            if key == "params":
                out.append(f"{v:,}" if v else "")
            elif v is None:
                out.append("–")
            elif isinstance(v, float):
                out.append(f"{v:.3g}")
            else:
                out.append(str(v))
        if not row["module"]:
            out[0] = "<model>"
        return out

    def __str__(self) -> str:
        columns = self._columns()
        table = [[title for _, title in columns]] + [self._cells(r, columns) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
        lines = [
            f"GradientFlow at step {self.step} ({self.steps_recorded} steps recorded), total grad norm "
            f"{self.total_grad_norm:.4g}"
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
        lines += [f"alarm: {a.message}" for a in self.alarms]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        columns = self._columns()
        head = "".join(f"<th>{html.escape(t)}</th>" for _, t in columns)
        body = []
        for row in self.rows:
            status = row["status"]
            style = ' style="color:#999"' if status == "no grad" else (' style="color:#c00"' if status else "")
            cells = "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(row, columns))
            body.append(f"<tr{style}>{cells}</tr>")
        caption = (
            f"GradientFlow at step {self.step} ({self.steps_recorded} steps recorded), total grad norm "
            f"{self.total_grad_norm:.4g}"
        )
        alarms = ""
        if self.alarms:
            items = "".join(f"<li>{html.escape(a.message)}</li>" for a in self.alarms)
            alarms = f"<p><b>{len(self.alarms)} alarm(s)</b></p><ul>{items}</ul>"
        return (
            f'<table class="hookviz-flow"><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>{alarms}"
        )
