"""GradientFlow's results as data: `FlowData`, every recorded statistic as numpy arrays over the recorded steps, with
the accessors that plots, exports and reports read (`hookviz.flow.plots` and `hookviz.flow.export` are functions
over it; `hookviz.flow.stats.FlowStats` adds them as methods)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .alarms import Alarm
from .layout import _MODULE_STATS, _PARAM_STATS


@dataclass
class FlowData:
    """The arrays of a `FlowStats` (see there for what each holds) and their accessors."""

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
    # (kind, module, step) where a vanishing / exploding alarm stopped holding: the report's status in between
    cleared: list[tuple[str, str, int]] = field(default_factory=list)

    def active_alarms(self, step: int) -> dict[str, list[str]]:
        """The alarm kinds that hold for each module at `step`: a vanishing or exploding alarm from the step it fired
        until its condition stopped (``cleared``), a non-finite one at its step."""
        out: dict[str, list[str]] = {}
        for a in self.alarms:
            if a.step > step:
                continue
            for name in a.modules or ((a.name,) if a.name is not None else ()):
                if a.kind == "nonfinite":
                    holds = a.step == step
                else:
                    holds = not any(k == a.kind and m == name and a.step < c <= step for k, m, c in self.cleared)
                if holds and a.kind not in out.get(name, []):
                    out.setdefault(name, []).append(a.kind)
        return out

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

    def owner_columns(self) -> list[int]:
        """Columns of `modules` (indices) that own parameters, in model order."""
        owners = set(self.param_modules)
        return [j for j, m in enumerate(self.modules) if m in owners]

    def column(self, name: str, level: str) -> int:
        """The column of module (``level="module"``) or parameter (``level="param"``) `name` in `matrix`."""
        names = self.matrix("grad_norm", level)[0]
        return self._index(names, name, level)

    def matrix(self, stat: str, level: str) -> tuple[list[str], np.ndarray]:
        """(names, (S, M or P) values of `stat`) at `level` (``"module"`` or ``"param"``)."""
        if level == "module":
            return self.modules, self.module_stats[_check_stat(stat, _MODULE_STATS)]
        if level == "param":
            return self.params, self.param_stats[_check_stat(stat, _PARAM_STATS)]
        raise ValueError(f"level must be 'module' or 'param', got {level!r}")


def _check_stat(stat: str, allowed: tuple[str, ...]) -> str:
    if stat not in allowed:
        raise ValueError(f"stat must be one of {', '.join(allowed)}; got {stat!r}")
    return stat


def _few(values: list[int]) -> str:
    return ", ".join(map(str, values)) if len(values) <= 8 else f"{values[0]}, {values[1]}, ..., {values[-1]}"
