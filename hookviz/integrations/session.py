"""The GradientFlow life cycle shared by the training-loop callbacks: checked attach at fit start, one statistics
step per optimizer step, scalars for the loggers every `every` steps, alarms, and failures that never lose the run.

A callback that fails (a bug, a model the hooks cannot handle) warns, removes its hooks and lets training go on; only
an alarm with ``raise_on_alarm=True`` stops training. Each recorded step is read back with one device sync
(``every=50`` by default, the logging period of Lightning and the HF Trainer).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from ..flow import Alarm, GradientFlow, GradientFlowError
from ..flow.export import row_records

_OWN = ("every", "prefix", "raise_on_alarm")


def _check_every(every: Any) -> int:
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"every must be a positive int (record and log every every-th optimizer step), got {every!r}")
    return every


class _FlowViews:
    """What both callbacks show of their `_FlowSession` (``self._session``): the period, the latest GradientFlow,
    its alarms, every logged step and why the callback detached itself."""

    _session: _FlowSession

    @property
    def every(self) -> int:
        return self._session.every

    @property
    def flow(self) -> GradientFlow | None:
        """The GradientFlow of the latest run (its statistics stay readable after it: ``callback.flow.report()``)."""
        return self._session.last

    @property
    def alarms(self) -> list[Alarm]:
        return [] if self._session.last is None else self._session.last.alarms

    @property
    def history(self) -> list[tuple[int, dict[str, float]]]:
        """Every logged step: ``(global_step, scalars)``."""
        return self._session.history

    @property
    def failed(self) -> str | None:
        """Why the callback detached itself during training, or None."""
        return self._session.failed


class _FlowSession:
    """One GradientFlow attached for one training run (see the module docs). `options`: GradientFlow's keywords."""

    def __init__(self, owner: str, every: int, prefix: str, raise_on_alarm: bool, options: dict[str, Any]) -> None:
        self.owner = owner
        self.every = _check_every(every)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        self.prefix = prefix
        self.raise_on_alarm = bool(raise_on_alarm) or options.get("on_alarm") == "raise"
        for bad in ("model", "optimizer", "scaler"):
            if bad in options:
                raise TypeError(f"{owner}: {bad}= is taken from the trainer, do not pass it")
        if self.raise_on_alarm and options.get("on_alarm", "raise") != "raise":
            raise ValueError(
                f"{owner}: raise_on_alarm=True raises on alarms, on_alarm={options['on_alarm']!r} conflicts"
            )
        self.options = dict(options)
        if self.raise_on_alarm:
            self.options["on_alarm"] = "raise"
        # fail on bad options now, at construction, rather than at fit start
        probe = {k: v for k, v in self.options.items() if k != "select"}  # select is checked on the real model
        GradientFlow(nn.Linear(1, 1), every=self.every, **probe)
        self.flow: GradientFlow | None = None  # attached, while training
        self.last: GradientFlow | None = None  # the latest one, readable after training
        self.failed: str | None = None
        self.history: list[tuple[int, dict[str, float]]] = []

    # -- life cycle -----------------------------------------------------------------------------------------------
    def attach(self, model: nn.Module, scaler: Any = None) -> None:
        """Build and start the GradientFlow on `model`; bad input raises here, at fit start."""
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(
                f"{self.owner}: the model {type(model).__name__} has no parameters that require gradients; there is "
                "no gradient flow to watch"
            )
        self.detach()
        self.failed = None
        flow = GradientFlow(model, every=self.every, scaler=scaler, **self.options)
        self.flow = self.last = flow.start()

    def detach(self) -> None:
        """Remove the hooks (idempotent); alarms found in the last read-out are delivered per `on_alarm`."""
        flow, self.flow = self.flow, None
        if flow is not None and flow.active:
            flow.stop()

    @property
    def alarms(self) -> list[Alarm]:
        return [] if self.flow is None else self.flow.alarms

    # -- one optimizer step ---------------------------------------------------------------------------------------
    def step(self, global_step: int) -> dict[str, float] | None:
        """Take this optimizer step's statistics; on a recorded step, return its scalars (one device sync)."""
        flow = self.flow
        if flow is None:
            return None
        try:
            recorded = flow.steps_taken % self.every == 0
            flow.step()
            if not recorded:
                return None
            metrics = self._scalars(flow)
            self.history.append((global_step, metrics))
            return metrics
        except GradientFlowError:
            if self.raise_on_alarm:
                self._quiet_detach()
                raise
            self.fail(global_step, "an alarm raised", None)
        except Exception as err:  # a failing monitor never loses the training run
            self.fail(global_step, f"{type(err).__name__}: {err}", err)
        return None

    def _scalars(self, flow: GradientFlow) -> dict[str, float]:
        stats = flow.read()
        if len(stats.steps) == 0:
            return {}
        p = self.prefix
        metrics = {f"{p}grad_norm/total": float(stats.total_grad_norm[-1])}
        for _, level, name, stat, value in row_records(stats, len(stats.steps) - 1):
            if level == "module":
                metrics[f"{p}{stat}/{name or '<model>'}"] = value
        metrics[f"{p}alarms"] = float(len(flow.alarms))
        return metrics

    def fail(self, step: int, reason: str, err: BaseException | None) -> None:
        """Warn, remove the hooks, and let training go on."""
        self.failed = reason
        self._quiet_detach()
        warnings.warn(
            f"{self.owner} failed at step {step} ({reason}); its hooks are removed and training goes on",
            RuntimeWarning,
            stacklevel=3,
        )

    def _quiet_detach(self) -> None:
        flow, self.flow = self.flow, None
        if flow is None:
            return
        try:
            flow.stop()
        except Exception:  # already failing: stop removes the hooks in its finally, the rest can go
            pass

    def finish(self) -> None:
        """Detach at the end of training (alarms of the last read-out raise only with `raise_on_alarm`)."""
        try:
            self.detach()
        except GradientFlowError:
            if self.raise_on_alarm:
                raise
