"""GradientFlow's alarms: vanishing, exploding (a threshold or a jump over the running median) and non-finite
gradients, checked on the host rows of each read-out, and delivered as a warning, a log record, an exception or a
call (``on_alarm``).

The layers that start vanishing (or exploding) at one step are one alarm, a summary: how many of the model's layers
and which, and the likely cause (saturating activations found in the model; a learning rate whose update/weight
ratio is large; exploding norms), so that a 20-layer sigmoid stack gives one message, not one per layer."""

from __future__ import annotations

import logging
import math
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

import numpy as np

from .layout import _MISSING, L2, UPDATE_NORM, WEIGHT_NORM, _Chunk, _Layout
from .locate import _culprit, _kind_of
from .watch import _Watched

logger = logging.getLogger("hookviz.flow")

OnAlarm: TypeAlias = "Literal['warn', 'log', 'raise'] | Callable[[Alarm], Any]"


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
    module could be named; the first of `modules`, in model order, for a summary); ``step`` the training step
    (0-based count of steps since `GradientFlow.start`); ``value`` the norm (the smallest of a vanishing summary, the
    largest of an exploding one). ``modules``: every module the alarm is about (one alarm per step and kind sums up
    all the layers whose condition started at that step); ``cause``: the likely cause in words, where one is seen."""

    kind: Literal["vanishing", "exploding", "nonfinite"]
    step: int
    name: str | None
    value: float
    message: str
    modules: tuple[str, ...] = ()
    cause: str | None = None


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


# activations whose derivative vanishes where they saturate: the likely cause of vanishing gradients in deep stacks
SATURATING = frozenset({"Sigmoid", "Tanh", "Hardtanh", "Hardsigmoid", "Softsign", "LogSigmoid", "Tanhshrink"})
LARGE_UPDATE_RATIO = 1e-2  # ten times the usual ~1e-3 update/weight ratio of a healthy learning rate


def _listing(names: tuple[str, ...]) -> str:
    """Module names for a message: all of up to 8, else the first four and the last two."""
    quoted = [repr(n) for n in names]
    if len(quoted) <= 8:
        return ", ".join(quoted)
    return ", ".join(quoted[:4]) + ", ..., " + ", ".join(quoted[-2:])


def _module_norms(l2: np.ndarray, present: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """(S, M) root of summed squares of the parameter norms of each module (NaN where none has a gradient)."""
    out = np.full((l2.shape[0], len(groups)), np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        for j, cols in enumerate(groups):
            p = present[:, cols]
            sq = np.where(p, l2[:, cols].astype(np.float64) ** 2, 0.0).sum(1)
            out[:, j] = np.where(p.any(1), np.sqrt(sq), np.nan)
    return out


class _AlarmChecker:
    """Checks the rows of each read-out chunk against an `Alarms` config, carrying each module's alarm state (runs,
    fired alarms, the running history of its norms) from chunk to chunk; found alarms go to `alarms` and `on_alarm`
    (both passed to `check`, so a GradientFlow's settings can change between read-outs).

    `graph_order` and `inputs_of`: the module graph the hooks learn (see `_StepObserver`), for naming NaN culprits.
    """

    def __init__(
        self,
        alarms: list[Alarm],
        watched: _Watched,
        scaler: Any,
        graph_order: dict[str, None],
        inputs_of: dict[str, set[str]],
    ) -> None:
        self.alarms = alarms
        self.w = watched
        self.scaler = scaler
        self.graph_order = graph_order
        self.inputs_of = inputs_of
        self._vanish_run: dict[str, int] = {}
        self._vanish_fired: set[str] = set()
        self._explode_hist: dict[str, deque[float]] = {}
        self._explode_fired: set[str] = set()
        self._nonfinite_run = 0
        # (kind, module, step): where a fired vanishing / exploding alarm stopped holding (the report's status)
        self.cleared: list[tuple[str, str, int]] = []

    def check(self, chunk: _Chunk, config: Alarms, on_alarm: OnAlarm) -> None:
        """Check a chunk's rows in step order; alarms are emitted in row, then model order."""
        layout = chunk.layout
        data = chunk.data
        l2 = data[:, layout.block(L2)]
        present = l2 != _MISSING
        modules = [m for m in self.w.module_names if m in self.w.params_of]
        norms = _module_norms(l2, present, [self.w.params_of[m] for m in modules])
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
                has = present[:, self.w.params_of[name]].any(1)
                for r, alarm in self._norm_alarms(config, name, steps, norms[:, j], has):
                    found.append((r, j, alarm))
        found.sort(key=lambda item: (item[0], item[1]))
        for alarm in self._summaries(found, chunk, config):
            self._emit(alarm, on_alarm)

    # -- one alarm per step and kind, with its likely cause -------------------------------------------------------
    def _summaries(self, found: list[tuple[int, int, Alarm]], chunk: _Chunk, config: Alarms) -> list[Alarm]:
        """The alarms of a chunk, those of the same row and kind (vanishing, exploding) merged into one summary that
        names the layers, counts them and says the likely cause; non-finite alarms pass as they are."""
        out: list[Alarm] = []
        groups: dict[tuple[int, str], list[Alarm]] = {}
        order: list[tuple[int, str] | Alarm] = []
        for r, j, alarm in found:
            if j < 0:
                order.append(alarm)
                continue
            key = (r, alarm.kind)
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append(alarm)
        for item in order:
            if isinstance(item, Alarm):
                out.append(replace(item, modules=(item.name,) if item.name is not None else ()))
                continue
            group = groups[item]
            names = tuple(a.name for a in group if a.name is not None)
            cause = self._cause(item[1], chunk, item[0], names)
            if len(group) == 1:
                a = group[0]
                message = a.message + (f"; likely cause: {cause}" if cause else "")
                out.append(replace(a, message=message, modules=names, cause=cause))
                continue
            out.append(self._summary(item[1], group, names, cause, config))
        return out

    def _summary(
        self, kind: str, group: list[Alarm], names: tuple[str, ...], cause: str | None, config: Alarms
    ) -> Alarm:
        values = [a.value for a in group]
        total = sum(1 for m in self.w.module_names if m in self.w.params_of)
        step = group[0].step
        if kind == "vanishing":
            worst = int(np.argmin(values))
            detail = (
                f"gradient norms below {config.vanishing:g} for {config.vanishing_steps} consecutive recorded steps "
                f"(now {min(values):.3g} at {names[worst]!r} to {max(values):.3g})"
            )
        else:
            worst = int(np.argmax(values))
            detail = (
                f"gradient norms up to {max(values):.3g} at {names[worst]!r}, above the threshold or a jump over their "
                "running median"
            )
        message = (
            f"{kind} gradient at step {step} in {len(names)} of {total} layers with parameters: {_listing(names)}: "
            f"{detail}" + (f"; likely cause: {cause}" if cause else "")
        )
        return Alarm(kind, step, names[0], values[worst], message, names, cause)  # type: ignore[arg-type]

    def _cause(self, kind: str, chunk: _Chunk, r: int, names: tuple[str, ...]) -> str | None:
        """The likely cause of a vanishing or exploding gradient in the layers `names` at row `r`, in words."""
        if kind == "vanishing":
            found = [t for t in self.w.types.values() if t in SATURATING]
            if found:
                counts = " and ".join(f"{found.count(t)} {t}" for t in dict.fromkeys(found)) + " modules"
                return (
                    f"saturating activations: the model has {counts} (a sigmoid's derivative is at most 0.25 and a "
                    "saturated tanh's near 0, so the gradient shrinks at each one it passes back through); use ReLU "
                    "or GELU, normalization, or residual connections"
                )
            return (
                "no saturating activation module in the model: look at the initialisation, depth without normalization "
                "or residual connections, or activations called as functions (torch.sigmoid)"
            )
        ratio, where = self._update_ratio(chunk, r, names)
        if ratio is None:
            return (
                "exploding norms; clip them (torch.nn.utils.clip_grad_norm_) or lower the learning rate "
                "(GradientFlow(optimizer=..., update_ratio=True) tells whether the learning rate is too large)"
            )
        if ratio > LARGE_UPDATE_RATIO:
            return (
                f"a learning rate that is too large: the update/weight ratio reached {ratio:.2g} in {where!r} (around "
                "1e-3 is usual); lower the learning rate, warm it up, or clip the gradients"
            )
        return (
            f"exploding norms with small updates (update/weight ratio at most {ratio:.2g}): a loss spike or an "
            "outlier batch rather than the learning rate; clip the gradients (torch.nn.utils.clip_grad_norm_)"
        )

    def _update_ratio(self, chunk: _Chunk, r: int, names: tuple[str, ...]) -> tuple[float | None, str | None]:
        """The largest update/weight ratio ``||w_after - w_before|| / ||w_before||`` over the parameters of `names`
        at row `r`, and its module; (None, None) where no update was recorded (no optimizer, update_ratio=False)."""
        layout, row = chunk.layout, chunk.data[r]
        upd, w = row[layout.block(UPDATE_NORM)], row[layout.block(WEIGHT_NORM)]
        best, where = None, None
        for name in names:
            for c in self.w.params_of.get(name, []):
                if upd[c] != _MISSING and w[c] != _MISSING and w[c] > 0 and math.isfinite(float(upd[c])):
                    ratio = float(upd[c] / w[c])
                    if best is None or ratio > best:
                        best, where = ratio, name
        return best, where

    def _nonfinite_row(self, layout: _Layout, row: np.ndarray, present: np.ndarray) -> bool:
        if not np.isfinite(row[layout.block(L2)][present]).all():
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
        desc = self.w.describe(name)
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
                    if name in self._vanish_fired:
                        self._vanish_fired.discard(name)
                        self.cleared.append(("vanishing", name, step))
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
            elif name in self._explode_fired:
                self._explode_fired.discard(name)
                self.cleared.append(("exploding", name, step))
            history.append(v)
        return out

    def _nonfinite_alarm(self, chunk: _Chunk, r: int, step: int) -> Alarm:
        name, detail, values = _culprit(chunk, r, self.w, self.graph_order, self.inputs_of)
        kind = _kind_of(values) if values else "nan"
        value = float("nan") if kind == "nan" else float("inf")
        return Alarm("nonfinite", step, name, value, f"non-finite values ({kind}) at step {step}: {detail}")

    def _emit(self, alarm: Alarm, mode: OnAlarm) -> None:
        self.alarms.append(alarm)
        if mode == "warn":
            warnings.warn(GradientFlowWarning(alarm.message), stacklevel=2)
        elif mode == "log":
            logger.log(logging.ERROR if alarm.kind == "nonfinite" else logging.WARNING, alarm.message)
        elif mode == "raise":
            raise GradientFlowError(alarm)
        else:
            mode(alarm)  # type: ignore[operator]
