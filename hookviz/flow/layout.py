"""GradientFlow's on-device buffer and its layout: one float32 row per recorded step, written without a device sync,
read out to the host in one transfer when full (and on every read-out).

A row holds 5 blocks of P parameter statistics (L2 norm, sum |g|, max |g|, update norm, weight norm), then 3 blocks
of K module-call statistics (output-gradient norm, activation norm, dead fraction); `_MISSING` marks a statistic that
has no value at that step. Module calls are keyed as in `hookviz.record` (``"name"``, then ``"name#1"``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._device import to_device
from .kernels import _norms

_MISSING = -1.0  # buffer value of a statistic that has no value at a step (no grad, module not run): norms are >= 0
_PARAM_STATS = ("grad_norm", "grad_mean_abs", "grad_max_abs", "update_ratio")
_MODULE_STATS = (*_PARAM_STATS, "out_grad_norm", "act_norm", "dead_fraction")
_CALL_SUFFIX = re.compile(r"#\d+$")

# the blocks of a buffer row: `_Layout.block(i)` holds one value per watched parameter ...
L2, L1, MAX_ABS, UPDATE_NORM, WEIGHT_NORM = range(5)  # ||g||_2, sum |g|, max |g|, ||w_after - w_before||, ||w||
PARAM_BLOCKS = 5
# ... and `_Layout.key_block(i)` one per module call key
OUT_GRAD_NORM, ACT_NORM, DEAD_FRACTION = range(3)  # ||dL/d output||, ||output||, fraction of dead ReLU units
KEY_BLOCKS = 3


def _base(key: str) -> str:
    """The module name of a call key (``"layer1.relu#1"`` -> ``"layer1.relu"``)."""
    return _CALL_SUFFIX.sub("", key)


@dataclass(frozen=True)
class _Layout:
    """Columns of one buffer row: 5 blocks of P parameter statistics, then 3 blocks of K module-call statistics."""

    n_params: int
    keys: tuple[str, ...]

    @property
    def width(self) -> int:
        return PARAM_BLOCKS * self.n_params + KEY_BLOCKS * len(self.keys)

    def block(self, i: int) -> slice:
        """Columns of parameter block `i` (`L2`, `L1`, `MAX_ABS`, `UPDATE_NORM`, `WEIGHT_NORM`)."""
        return slice(i * self.n_params, (i + 1) * self.n_params)

    def key_block(self, i: int) -> slice:
        """Columns of module-call block `i` (`OUT_GRAD_NORM`, `ACT_NORM`, `DEAD_FRACTION`)."""
        start = PARAM_BLOCKS * self.n_params + i * len(self.keys)
        return slice(start, start + len(self.keys))


@dataclass
class _Chunk:
    """Rows read out to the host: their layout, step numbers, forward and backward orders, and values."""

    layout: _Layout
    steps: np.ndarray
    forward: list[tuple[str, ...]]
    backward: list[tuple[str, ...]]
    data: np.ndarray


class _Buffer:
    """The ``(buffer_steps, width)`` float32 rows on the model's device, the host chunks they are read out to (at most
    `keep` recorded steps), and the index tensors that writing a row needs (cached: built once per distinct set of
    keys, so a step moves nothing from the host to the device)."""

    def __init__(self, buffer_steps: int, n_params: int, device: torch.device, keep: int | None) -> None:
        self.buffer_steps = buffer_steps
        self.n_params = n_params
        self.device = device
        self.keep = keep
        self.key_index: dict[str, int] = {}
        self.layout: _Layout | None = None
        self.buf: Tensor | None = None
        self.slot = 0
        self.chunks: list[_Chunk] = []
        self._row_steps: list[int] = [0] * buffer_steps
        self._row_fwd: list[tuple[str, ...]] = [()] * buffer_steps
        self._row_bwd: list[tuple[str, ...]] = [()] * buffer_steps
        self._orders: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._cache: dict[Any, Any] = {}

    # -- layout -----------------------------------------------------------------------------------------------------
    def add_keys(self, keys: Iterable[str]) -> bool:
        """Give each new call key a column; True when the layout must grow (read the old rows out first)."""
        for key in keys:
            if key not in self.key_index:
                self.key_index[key] = len(self.key_index)
        return self.layout is None or len(self.layout.keys) != len(self.key_index)

    def new_layout(self) -> None:
        self.layout = _Layout(self.n_params, tuple(self.key_index))
        self.buf = torch.empty((self.buffer_steps, self.layout.width), dtype=torch.float32, device=self.device)
        self._cache.clear()

    def move(self, device: torch.device) -> None:
        """The model moved to `device` (after its rows were read out): a new buffer there at the next step."""
        self.device = device
        self.layout = self.buf = None
        self._cache.clear()

    # -- writing one row --------------------------------------------------------------------------------------------
    def row(self) -> Tensor:
        """The row of the current step (a view into the buffer)."""
        assert self.buf is not None  # set by new_layout
        return self.buf[self.slot]

    def finish_row(self, step: int, forward: tuple[str, ...], backward: tuple[str, ...]) -> None:
        """Record the current row's step number and its forward and backward orders."""
        self._row_steps[self.slot] = step
        # the orders are the same at almost every step: store one tuple per distinct order
        self._row_fwd[self.slot] = self._orders.setdefault(forward, forward)
        self._row_bwd[self.slot] = self._orders.setdefault(backward, backward)

    def index(self, cache_key: Any, values: Sequence[float], dtype: torch.dtype = torch.long) -> Tensor:
        t = self._cache.get(cache_key)
        if t is None:
            t = to_device(torch.tensor(list(values), dtype=dtype), self.device)  # no sync on the way in
            self._cache_put(cache_key, t)
        return t

    def _cache_put(self, key: Any, value: Any) -> None:
        if len(self._cache) > 512:  # key tuples vary only when the model's control flow does
            self._cache.clear()
        self._cache[key] = value

    def combine(self, tag: str, keys: tuple[str, ...], vals: Tensor, offset: int, row: Tensor) -> None:
        """Write per-key values into the row; a key seen several times in a step (gradient accumulation) gets the root
        of the summed squares (``og``: gradient norms add up like that over micro-steps) or the mean (the others)."""
        plan = self._cache.get((tag, keys))
        if plan is None:
            unique = list(dict.fromkeys(keys))
            where = {k: i for i, k in enumerate(unique)}
            repeated = len(unique) != len(keys)
            plan = (
                self.index((tag, "cols", keys), [offset + self.key_index[k] for k in unique]),
                self.index((tag, "pos", keys), [where[k] for k in keys]) if repeated else None,
                self.index((tag, "counts", keys), [float(keys.count(k)) for k in unique], torch.float32)
                if repeated
                else None,
            )
            self._cache_put((tag, keys), plan)
        cols_t, pos_t, counts_t = plan
        if pos_t is not None:
            summed = torch.zeros(len(counts_t), dtype=torch.float32, device=self.device)
            if tag == "og":
                vals = summed.index_add_(0, pos_t, vals * vals).sqrt_()
            else:
                vals = summed.index_add_(0, pos_t, vals).div_(counts_t)
        row.index_copy_(0, cols_t, vals)

    def stack(self, entries: list[tuple[str, Tensor]]) -> tuple[tuple[str, ...], Tensor]:
        """(keys, one L2 norm per entry) of (key, partial norm) entries (see `_partial_norm`)."""
        keys = tuple(k for k, _ in entries)
        return keys, _norms([v for _, v in entries], self.device)  # the norm of a 0-d norm is itself

    def dead_fractions(self, entries: list[tuple[str, Tensor, int, bool]]) -> tuple[tuple[str, ...], Tensor]:
        """One dead fraction per (key, *`_unit_values`) entry, from all of them at once (a few ops per step, whatever
        the number of entries)."""
        keys = tuple(k for k, _, _, _ in entries)
        shape = tuple((v.numel(), per_unit, sample_major) for _, v, per_unit, sample_major in entries)
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
            plan = (*(to_device(t, self.device) for t in tensors), offset)
            self._cache_put(("dead-plan", keys, shape), plan)
        unit_ids, unit_entry, entry_units, n_units = plan
        values = torch.cat([v.reshape(-1).to(self.device, torch.float32) for _, v, _, _ in entries])
        # the values are >= 0 (norms and sums of ReLU outputs): a unit is dead when they sum to 0 (a NaN is not dead)
        sums = torch.zeros(n_units, dtype=torch.float32, device=self.device).index_add_(0, unit_ids, values)
        dead = (sums <= 0).float()
        per_entry = torch.zeros(len(keys), dtype=torch.float32, device=self.device).index_add_(0, unit_entry, dead)
        return keys, per_entry.div_(entry_units)

    # -- read-out ---------------------------------------------------------------------------------------------------
    def read_out(self) -> _Chunk | None:
        """Move the written rows to the host in one transfer, as a new chunk (None when there are none)."""
        if self.slot == 0 or self.buf is None or self.layout is None:
            return None
        n = self.slot
        data = self.buf[:n].to("cpu", copy=True).numpy()
        chunk = _Chunk(
            self.layout, np.array(self._row_steps[:n], dtype=np.int64), self._row_fwd[:n], self._row_bwd[:n], data
        )
        self.chunks.append(chunk)
        self.slot = 0
        return chunk

    def trim(self) -> None:
        """Drop the oldest host rows beyond `keep`."""
        if self.keep is None:
            return
        excess = sum(len(c.steps) for c in self.chunks) - self.keep
        while excess > 0:
            first = self.chunks[0]
            if len(first.steps) <= excess:
                self.chunks.pop(0)
                excess -= len(first.steps)
            else:
                first.steps, first.data = first.steps[excess:], first.data[excess:]
                first.forward, first.backward = first.forward[excess:], first.backward[excess:]
                excess = 0
