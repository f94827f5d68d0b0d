"""`GradientFlowCallback` for PyTorch Lightning: per-layer gradient statistics and alarms inside ``Trainer.fit``.

Imports ``lightning`` (or the older ``pytorch_lightning``) when this module is imported; ``import hookviz`` does not.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .session import _FlowSession, _FlowViews
from .tracker import ExplanationTracker

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the older package name
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError("hookviz.integrations.lightning needs PyTorch Lightning: pip install lightning") from exc


class GradientFlowCallback(_FlowViews, pl.Callback):
    """`GradientFlow` in a Lightning ``Trainer``: gradient norms per layer, dead ReLUs, vanishing / exploding / NaN
    alarms naming the first module that produced a non-finite value.

    Life cycle: attached to the LightningModule (or its attribute `module`) at fit start, where bad input raises; a
    step is taken in ``on_before_optimizer_step``, where the gradients are accumulated over the micro-batches and
    unscaled by the mixed-precision plugin but not yet clipped (Lightning's documented order); detached at fit end
    and on any exception. Under DDP the parameter statistics are those of the averaged gradient (`hookviz.flow`
    docs); FSDP is refused.

    Logging: every `every`-th optimizer step, the module scalars (``flow/grad_norm/<module>``,
    ``flow/act_norm/<module>``, ``flow/dead_fraction/<module>``, ``flow/grad_norm/total``, ``flow/alarms``) go to
    every logger of the Trainer (TensorBoard, CSV, ...) through ``logger.log_metrics(..., step=trainer.global_step)``
    (``LightningModule.log_dict`` would drop the steps that are not multiples of ``log_every_n_steps``). Each logged
    step costs one device sync.

    Args:
        every: record and log every `every`-th optimizer step (>= 1).
        module: the attribute of the LightningModule to watch (e.g. ``"net"``) when ``training_step`` calls it
            directly instead of ``self(...)``: the activation statistics are taken during the forward pass of the
            watched module. None: the LightningModule itself.
        prefix: the prefix of every logged name.
        raise_on_alarm: an alarm raises `GradientFlowError` and stops training. Otherwise alarms are delivered per
            `on_alarm` (default: a warning) and kept in `alarms`; and a failure of the callback itself only warns,
            removes its hooks and lets training go on.
        **flow_options: the other `GradientFlow` options (``select``, ``alarms``, ``on_alarm``, ``output_stats``,
            ``abs_stats``, ``fused_stats``, ``buffer_steps``, ``keep``, ``unit_dim``).

    Example::

        trainer = lightning.Trainer(max_epochs=3, callbacks=[GradientFlowCallback(every=25)])
        trainer.fit(module, loader)
    """

    def __init__(
        self,
        every: int = 50,
        *,
        module: str | None = None,
        prefix: str = "flow/",
        raise_on_alarm: bool = False,
        **flow_options: Any,
    ) -> None:
        super().__init__()
        if module is not None and not isinstance(module, str):
            raise TypeError(f"module must be the name of an attribute of the LightningModule or None, got {module!r}")
        self.module = module
        self._session = _FlowSession(type(self).__name__, every, prefix, raise_on_alarm, flow_options)

    # -- Lightning hooks ------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        target: nn.Module = pl_module
        if self.module is not None:
            target = getattr(pl_module, self.module, None)
            if not isinstance(target, nn.Module):
                children = [n for n, _ in pl_module.named_children()]
                raise ValueError(
                    f"GradientFlowCallback: module={self.module!r} is not a submodule of "
                    f"{type(pl_module).__name__}; its submodules are {children}"
                )
        self._session.attach(target, scaler=getattr(trainer.precision_plugin, "scaler", None))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step = trainer.global_step
        metrics = self._session.step(step)
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._session.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._session._quiet_detach()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._session._quiet_detach()  # idempotent: whatever ended fit, no hook stays on the model


class ExplanationTrackerCallback(pl.Callback):
    """Drive an `ExplanationTracker` from a Lightning ``Trainer``: checked at fit start (a probe set the model
    refuses or a target out of range raise there) where it also takes a first snapshot (step 0, epoch 0: the model
    before this fit), then one snapshot at each epoch end (``every="epoch"``, labelled with the number of epochs
    done) or every `every` optimizer steps. Each snapshot goes to every logger with a TensorBoard ``experiment``
    as an image grid (``tracker/<method>``; `log_images`). A failing snapshot warns and stops the tracking; training
    goes on.
    """

    def __init__(self, tracker: ExplanationTracker, *, log_images: bool = True) -> None:
        super().__init__()
        if not isinstance(tracker, ExplanationTracker):
            raise TypeError(f"tracker must be an ExplanationTracker, got {type(tracker).__name__}")
        self.tracker = tracker
        self.log_images = bool(log_images)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.check(pl_module)
        self._take(trainer, pl_module, trainer.global_step, trainer.current_epoch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps done
        if isinstance(self.tracker.every, int) and step > 0 and self.tracker.due(step):
            if not self.tracker.snapshots or self.tracker.snapshots[-1][0] != step:  # once per optimizer step
                self._take(trainer, pl_module, step, None)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker.every == "epoch":
            self._take(trainer, pl_module, trainer.global_step, trainer.current_epoch + 1)

    def _take(self, trainer: Any, pl_module: Any, step: int, epoch: int | None) -> None:
        if not self.tracker._guarded(type(self).__name__, pl_module, step, epoch) or not self.log_images:
            return
        tag = f"tracker/{self.tracker.name}"
        grid = None
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_image"):
                grid = self.tracker.grid() if grid is None else grid
                experiment.add_image(tag, grid, step)
