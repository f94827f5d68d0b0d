"""`GradientFlowCallback` for the Hugging Face ``Trainer``: per-layer gradient statistics and alarms inside
``Trainer.train``.

Imports ``transformers`` when this module is imported; ``import hookviz`` does not.
"""

from __future__ import annotations

import os
from typing import Any

from .session import _FlowSession, _FlowViews
from .tracker import ExplanationTracker

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - only without transformers
    raise ImportError("hookviz.integrations.transformers needs transformers: pip install transformers") from exc


class GradientFlowCallback(_FlowViews, TrainerCallback):
    """`GradientFlow` in a Hugging Face ``Trainer`` (see `hookviz.integrations.lightning.GradientFlowCallback`).

    Life cycle: attached to the Trainer's model in ``on_train_begin`` (bad input raises there); a step is taken in
    ``on_pre_optimizer_step``, once per optimizer step (gradients accumulated and unscaled; note that the Trainer
    calls it *after* its gradient clipping: with ``max_grad_norm > 0``, the default 1.0, the norms are those of the
    clipped gradient, and the Trainer's own ``grad_norm`` log is the norm before clipping); detached in
    ``on_train_end``.

    Logging: every `every`-th optimizer step, the module scalars (``flow/grad_norm/<module>``, ...) are written to
    TensorBoard, on the main process only: to `writer` (a ``SummaryWriter`` or a log directory), or, when None and
    ``"tensorboard"`` is in ``args.report_to``, to ``<output_dir>/runs/hookviz_flow``. They are also kept in
    `history`. Alarms, `raise_on_alarm` and failures: as the Lightning callback (a failing callback warns, detaches
    and training goes on). The Trainer has no exception event: when ``train()`` raises for another reason, call
    `detach` to remove the hooks.
    """

    def __init__(
        self,
        every: int = 50,
        *,
        writer: Any = None,
        prefix: str = "flow/",
        raise_on_alarm: bool = False,
        **flow_options: Any,
    ) -> None:
        if writer is not None and not (isinstance(writer, str | os.PathLike) or hasattr(writer, "add_scalar")):
            raise TypeError(f"writer must be a SummaryWriter, a log directory or None, got {type(writer).__name__}")
        self._writer_arg = writer
        self._writer: Any = None
        self._own_writer = False
        self._session = _FlowSession(type(self).__name__, every, prefix, raise_on_alarm, flow_options)

    def detach(self) -> None:
        """Remove the hooks and close the writer (idempotent); ``on_train_end`` does it after a normal run."""
        try:
            self._session._quiet_detach()
        finally:
            self._close_writer()

    # -- Trainer events -------------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("GradientFlowCallback: the Trainer passed no model to on_train_begin")
        optimizer = kwargs.get("optimizer")
        self._session.attach(model, scaler=getattr(optimizer, "scaler", None))  # accelerate's AcceleratedOptimizer
        self._writer = None
        if state.is_world_process_zero:
            self._writer = self._open_writer(args)

    def _open_writer(self, args: Any) -> Any:
        target = self._writer_arg
        if target is None:
            report_to = args.report_to if isinstance(args.report_to, list | tuple) else [args.report_to]
            if "tensorboard" not in report_to and "all" not in report_to:
                return None
            target = os.path.join(args.output_dir, "runs", "hookviz_flow")
        if hasattr(target, "add_scalar"):
            return target
        from torch.utils.tensorboard import SummaryWriter

        self._own_writer = True
        return SummaryWriter(log_dir=os.fspath(target))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        metrics = self._session.step(step)
        if metrics and self._writer is not None:
            for tag, value in metrics.items():
                self._writer.add_scalar(tag, value, step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            self._session.finish()
        finally:
            self._close_writer()

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.flush()
            if self._own_writer:
                writer.close()
        self._own_writer = False


class ExplanationTrackerCallback(TrainerCallback):
    """Drive an `ExplanationTracker` from a Hugging Face ``Trainer`` (see the Lightning twin): checked, with a first
    snapshot, in ``on_train_begin``; then at each epoch end (``every="epoch"``) or every `every` optimizer steps
    (``on_step_end``). Snapshots go to `writer` (a ``SummaryWriter`` or a log directory) as image grids, on the main
    process only. A failing snapshot warns and stops the tracking; training goes on."""

    def __init__(self, tracker: ExplanationTracker, *, writer: Any = None) -> None:
        if not isinstance(tracker, ExplanationTracker):
            raise TypeError(f"tracker must be an ExplanationTracker, got {type(tracker).__name__}")
        if writer is not None and not (isinstance(writer, str | os.PathLike) or hasattr(writer, "add_image")):
            raise TypeError(f"writer must be a SummaryWriter, a log directory or None, got {type(writer).__name__}")
        self.tracker = tracker
        self._writer_arg = writer
        self._writer: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("ExplanationTrackerCallback: the Trainer passed no model to on_train_begin")
        self.tracker.check(model)
        if state.is_world_process_zero and self._writer_arg is not None:
            target = self._writer_arg
            if not hasattr(target, "add_image"):
                from torch.utils.tensorboard import SummaryWriter

                target = SummaryWriter(log_dir=os.fspath(target))
            self._writer = target
        self._take(model, state.global_step, 0)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if isinstance(self.tracker.every, int) and self.tracker.due(state.global_step) and model is not None:
            self._take(model, state.global_step, None)

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.tracker.every == "epoch" and model is not None:
            self._take(model, state.global_step, round(state.epoch or 0))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._writer is not None:
            self._writer.flush()
        self._writer = None

    def _take(self, model: Any, step: int, epoch: int | None) -> None:
        if self.tracker._guarded(type(self).__name__, model, step, epoch) and self._writer is not None:
            self._writer.add_image(f"tracker/{self.tracker.name}", self.tracker.grid(), step)
