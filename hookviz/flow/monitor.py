"""GradientFlow, the monitor: attaching to a model and its optimizer, taking a step's statistics, reading them out.

The design, the costs and the caveats are in the `hookviz.flow` package docs. The concerns it delegates: what is
watched (`watch`), what the hooks observe in a step (`observe`), the statistics kernels (`kernels`; `amp` for the
GradScaler), the on-device buffer (`layout`), the alarms (`alarms`, with `locate` for NaN culprits), the results
(`stats`, `plots`, `export`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from .._checks import int_option, is_int
from ..hooks import HookManager, Selector
from .alarms import Alarm, Alarms, GradientFlowError, OnAlarm, _AlarmChecker
from .amp import _check_scaler, _scale
from .distributed import _refuse_sharded
from .export import _summary_writer, to_tensorboard
from .kernels import _dense, _Kernels, _norms, _UpdateRatio
from .layout import (
    _MISSING,
    ACT_NORM,
    DEAD_FRACTION,
    L1,
    L2,
    MAX_ABS,
    OUT_GRAD_NORM,
    UPDATE_NORM,
    WEIGHT_NORM,
    _Buffer,
    _Chunk,
)
from .observe import _StepObserver
from .stats import FlowReport, FlowStats, _assemble
from .watch import _watch

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class GradientFlow:
    """Watches gradient flow in a model during training (see the `hookviz.flow` package docs: design, caveats).

    Args:
        model: the model being trained (or its DistributedDataParallel wrapper).
        every: record every ``every``-th step (steps 0, every, 2 * every, ...); other steps cost nothing but a counter.
        optimizer: when given, steps are taken automatically when it steps (its step pre/post hooks). Without it,
            call `step` after each backward pass (after the last micro-step with gradient accumulation).
        select: the modules to watch (any `select_modules` selector). Default: every leaf module and every module
            that owns parameters. A parameter is attributed to the deepest watched module that contains it.
        scaler: the ``torch.amp.GradScaler`` in use, if any: the gradients w.r.t. module outputs are divided by its
            scale (``get_scale()``); parameter gradients are read as they are, so take the step after
            ``scaler.unscale_(optimizer)`` (automatic with `optimizer`: ``scaler.step`` unscales first).
        alarms: an `Alarms` (thresholds), True for the defaults, False or None for none.
        on_alarm: ``"warn"`` (a `GradientFlowWarning`), ``"log"`` (a record on the ``hookviz.flow`` logger: error for
            non-finite values, warning otherwise), ``"raise"`` (a `GradientFlowError`), or a callable taking the
            `Alarm`. Every alarm is also kept in `alarms`.
        update_ratio: with `optimizer`, also record the update-to-weight ratio ``||w_after - w_before|| /
            ||w_before||``. Off by default: it keeps one full copy of the watched parameters (their size again in
            memory, on their device) and reads them three times per recorded step.
        output_stats: which module outputs are observed at every recorded step. ``"parameter-free"`` (default):
            the output norm of the watched activation modules and of custom parameter-free modules (with the dead
            fraction for ReLUs), and the gradient w.r.t. the output of the custom ones only (see the package docs:
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
            are used. Each compiled kernel checks itself: on its first inputs of every set of shapes it is compared
            with the eager kernel, to float32 rounding, and if they differ (torch.compile's code can be wrong for a
            CPU) one warning names the kernel and the two values, and the eager kernels are used for the rest of the
            process, by every GradientFlow.
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
        update_ratio: bool = False,
        abs_stats: bool = True,
        output_stats: Literal["parameter-free", "all"] = "parameter-free",
        fused_stats: bool | None = None,
        buffer_steps: int = 32,
        keep: int | None = None,
        unit_dim: int = 1,
    ) -> None:
        alarms = _check_arguments(
            model, every, optimizer, scaler, alarms, on_alarm, output_stats, fused_stats, buffer_steps, keep, unit_dim
        )
        _refuse_sharded(model)
        _check_scaler(scaler)
        self.model = model
        self.every = every
        self.optimizer = optimizer
        self.scaler = scaler
        self.alarm_config: Alarms | None = alarms
        self.on_alarm = on_alarm
        self.update_ratio = bool(update_ratio) and optimizer is not None
        self.abs_stats = bool(abs_stats)
        self.output_stats = output_stats
        self.buffer_steps = buffer_steps
        self.keep = keep
        self.unit_dim = unit_dim

        # resolved once, up front: a bad selector fails here, before any hook exists
        w = self._w = _watch(model, select, output_stats)
        self.module_names: list[str] = w.module_names
        self.param_names: list[str] = w.param_names
        self._params = w.params
        self._param_module = w.param_module
        self._deferrable = w.deferrable
        # the collaborators: kernels, the hooks' per-step state, the device buffer, the alarms
        self._kernels = _Kernels(fused_stats, self._params)
        self._updates = _UpdateRatio(self._kernels, self._params)
        self._observer = _StepObserver(w, self._kernels, unit_dim)
        device = self._params[0].device if self._params else torch.device("cpu")
        self._buffer = _Buffer(buffer_steps, len(self._params), device, keep)
        self.alarms: list[Alarm] = []
        self._checker = _AlarmChecker(self.alarms, w, scaler, self._observer.graph_order, self._observer.inputs_of)
        # hooks
        self._hooks: HookManager | None = None
        self._learn_hooks: HookManager | None = None  # the modules that are not probes, while the graph is learnt
        self._opt_handles: list[Any] = []
        # host state per step (no tensors read back)
        self._step = 0
        self._recording = True
        self._pending_update: tuple[list[int], Tensor] | None = None
        self._tb_last: dict[int, int] = {}

    # -- state the tests and benchmarks look at -------------------------------------------------------------------
    @property
    def fused_stats(self) -> bool | None:
        return self._kernels.fused_stats

    @fused_stats.setter
    def fused_stats(self, value: bool | None) -> None:
        self._kernels.fused_stats = value

    @property
    def _compile_failed(self) -> bool:
        return self._kernels.compile_failed

    def _fused_wanted(self) -> bool:
        return self._kernels.fused_wanted()

    @property
    def _eager_outputs(self) -> set[str]:
        return self._observer.eager_outputs

    @property
    def _slot(self) -> int:
        return self._buffer.slot

    @property
    def _chunks(self) -> list[_Chunk]:
        return self._buffer.chunks

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
        w, observer = self._w, self._observer
        hooks = HookManager(self.model)
        try:
            hooks.forward_pre(self.model, self._on_model_forward)
            if w.probes:
                hooks.forward(lambda n, m: n in w.probes, observer.on_forward, with_name=True)
            if observer.learning and w.probes != w.watched:
                learn = self._learn_hooks = HookManager(self.model)
                others = w.watched - w.probes
                learn.forward(lambda n, m: n in others, observer.on_forward, with_name=True)
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
        observer.tensor_hooks = HookManager(self.model)
        self._recording = self._step % self.every == 0
        return self

    def stop(self) -> None:
        """Remove every hook (idempotent) and read the buffer out (checking alarms). The statistics stay."""
        try:
            for manager in (self._observer.tensor_hooks, self._hooks):
                if manager is not None:
                    manager.remove()
            self._remove_learn_hooks()
            self._remove_optimizer_hooks()
        finally:
            self._hooks = self._observer.tensor_hooks = None
            self._observer.clear()
            self._pending_update = None
            self._updates.clear()  # the parameter copies and scratch space are only needed while attached
            self._kernels.clear()
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
            self._buffer.slot += 1
        self._step += 1
        self._recording = self._step % self.every == 0
        if self._buffer.slot >= self.buffer_steps:
            self._flush()

    # -- hooks --------------------------------------------------------------------------------------------------
    def _on_model_forward(self, module: nn.Module, args: Any) -> None:
        observer = self._observer
        observer.begin_forward(self._recording and torch.is_grad_enabled() and self.model.training)
        if observer.live and not observer.track_edges and self._learn_hooks is not None:
            self._remove_learn_hooks()  # the graph is known: from now on only the probes run a hook

    # -- writing one row ------------------------------------------------------------------------------------------
    def _collect(self, snapshot: bool) -> None:
        try:
            if self._recording:
                self._write_row(snapshot)
        finally:
            self._observer.clear()

    def _write_row(self, snapshot: bool) -> None:
        obs, buffer = self._observer, self._buffer
        if obs.deferred:
            obs.process_deferred()
        if self._params and self._params[0].device != buffer.device:  # the model moved since the last step
            self._flush()
            buffer.move(self._params[0].device)
        if buffer.add_keys((*obs.fwd_order, *obs.bwd_order)):
            self._flush()  # rows written with the old layout go to the host first
            buffer.new_layout()
        layout, dev, row = buffer.layout, buffer.device, buffer.row()
        assert layout is not None  # set by new_layout
        row.fill_(_MISSING)
        with torch.no_grad():
            present = [i for i, p in enumerate(self._params) if p.grad is not None]
            if present:
                idx = buffer.index(("params", tuple(present)), present)
                grads = [self._params[i].grad for i in present]
                if self.abs_stats:
                    stats = list(self._kernels.grad_stats(grads, dev))  # type: ignore[arg-type]
                else:
                    stats = [_norms([_dense(g) for g in grads], dev)]  # type: ignore[arg-type]
                # parameter gradients are read unscaled: after scaler.unscale_ (see amp.py), never divided here
                for b, values in zip((L2, L1, MAX_ABS), stats, strict=False):  # abs_stats=False: L2 only
                    row[layout.block(b)].index_copy_(0, idx, values)
                if snapshot:
                    row[layout.block(WEIGHT_NORM)].index_copy_(0, idx, self._updates.snapshot(present, dev))
                    self._pending_update = (present, idx)
            if obs.grads:
                keys, vals = buffer.stack(obs.grads)
                scale = _scale(self.scaler, dev)
                buffer.combine(
                    "og", keys, vals if scale is None else vals / scale, layout.key_block(OUT_GRAD_NORM).start, row
                )
            if obs.fwd:
                buffer.combine("act", *buffer.stack(obs.fwd), layout.key_block(ACT_NORM).start, row)
            if obs.dead or obs.dead_done:
                keys, vals = buffer.dead_fractions(obs.dead) if obs.dead else ((), None)
                if obs.dead_done:
                    keys = (*keys, *(k for k, _ in obs.dead_done))
                    done = torch.stack([v for _, v in obs.dead_done]).to(dev)
                    vals = done if vals is None else torch.cat([vals, done])
                buffer.combine("dead", keys, vals, layout.key_block(DEAD_FRACTION).start, row)
        buffer.finish_row(self._step, tuple(obs.fwd_order), tuple(obs.bwd_order))

    def _finish_update(self) -> None:
        pending, self._pending_update = self._pending_update, None
        buffer = self._buffer
        if pending is None or buffer.buf is None or buffer.layout is None:
            return
        present, idx = pending
        with torch.no_grad():
            update = self._updates.update_norms(present, buffer.device)
            buffer.row()[buffer.layout.block(UPDATE_NORM)].index_copy_(0, idx, update)

    # -- read-out -----------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Move the buffered rows to the host in one transfer and check them for alarms."""
        chunk = self._buffer.read_out()
        if chunk is None:
            return
        try:
            if self.alarm_config is not None:
                self._checker.check(chunk, self.alarm_config, self.on_alarm)
        finally:
            self._buffer.trim()

    def read(self) -> FlowStats:
        """Every recorded statistic so far (reads the device buffer out, checking alarms), as a `FlowStats`."""
        self._flush()
        return _assemble(self._buffer.chunks, list(self._buffer.key_index), self._w, self.alarms, self._checker.cleared)

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
        params = zip(self.param_names, self._params, strict=True)
        return to_tensorboard(writer, self.read(), step, histograms, params, self._tb_last)


def _check_arguments(
    model: Any,
    every: Any,
    optimizer: Any,
    scaler: Any,
    alarms: Any,
    on_alarm: Any,
    output_stats: Any,
    fused_stats: Any,
    buffer_steps: Any,
    keep: Any,
    unit_dim: Any,
) -> Alarms | None:
    """`GradientFlow`'s arguments checked before anything is hooked; returns the alarm configuration (None: off)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    int_option("every", every, "a positive int (record every every-th step)")
    if optimizer is not None and not hasattr(optimizer, "register_step_pre_hook"):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer (with register_step_pre_hook), got {type(optimizer).__name__}"
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
    int_option("buffer_steps", buffer_steps, "a positive int")
    int_option("keep", keep, "a positive int or None (keep every recorded step)", optional=True)
    if not is_int(unit_dim):
        raise TypeError(f"unit_dim must be an int, got {type(unit_dim).__name__}")
    return alarms
