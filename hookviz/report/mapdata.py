"""The raw maps behind the detail view, so the page can redo the display modes (`hookviz.display.normalize`) in
the browser: per block of items one script file, ``maps/NNNNN.js``, which calls ``HV.maps(block, data)``.

Script files rather than JSON or binary files because a page opened from the file system (file://) may load
scripts but may not ``fetch`` its neighbours or read image pixels back from a canvas. Each map is kept as 16-bit
codes over its own [min, max] (a step of (max - min) / 65534, far below what a colour map shows; 0 exact) after the
channel reduction its method displays with; 3-channel maps shown as RGB (Guided Backprop) keep their channels.
The grid's method thumbnails are drawn from these same files (`hookviz.report.thumbnails`): the only copy of a map.

The codes of one column and block are stored as two byte planes (all high bytes, then all low bytes: the high bytes
of a map repeat far more than its low ones) deflated with zlib at level 1 and then base64-encoded; the page inflates
them with the browser's ``DecompressionStream("deflate")``. Measured on 256 shapes maps per method this stores
62-85 % of the raw 16-bit bytes, where deflating the interleaved codes stores 70-91 % (benchmarks/results).
8-bit codes would store a third of that but band visibly in the detail view's percentile and symmetric modes, which
stretch a narrow part of a gradient map's range over the whole colour map (docs/report.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import display as _display
from . import planes
from .stores import Column

#: items per script file: a detail view loads one file of this many items' maps
BLOCK = 64


def detail_reduce(column: Column, channels: int) -> str | None:
    """The channel reduction the detail view applies (None: keep the channels, which are then 1 or 3)."""
    reduce = column.display.get("reduce")
    if reduce is None and channels not in (1, 3):
        return "max-abs"  # as Explanation.heatmap: neither grey nor RGB
    return reduce


def encode(maps: Tensor) -> dict[str, Any]:
    """(n, C, h, w) float -> {"shape", "lo", "step", "z"}: per map, uint16 codes k with x ~ lo + k * step, as deflated
    byte planes (see the module docstring), base64.

    ``step`` is the map's range over 65534 and ``lo`` its minimum rounded down to a multiple of ``step``, so 0 is a
    code of its own and decodes to exactly 0 (in float64, as the page decodes): gradients are 0 over much of an
    image, and a shifted 0 would move the display modes that centre on the mean (seed) by a visible step."""
    flat = maps.detach().to(torch.float64).flatten(1)
    lo, hi = flat.min(dim=1).values, flat.max(dim=1).values
    step = (hi - lo) / 65534
    safe = torch.where(step > 0, step, torch.ones_like(step))
    lo = torch.where(step > 0, torch.floor(lo / safe) * safe, lo)  # constant map: step 0, every code 0
    codes = ((flat - lo[:, None]) / safe[:, None]).round().clamp(0, 65535).to(torch.int32)
    return {
        "shape": list(maps.shape[1:]),
        "lo": [float(v) for v in lo.tolist()],
        "step": [float(v) for v in step.tolist()],
        "z": planes.pack(codes.numpy().astype(">u2"), 1),  # big-endian: the high bytes' plane first
    }


def decode(record: dict[str, Any]) -> Tensor:
    """The inverse of `encode` (within step / 2), computed in float64 as the page does: (n, C, h, w) float32."""
    codes = torch.from_numpy(planes.unpack(record["z"], ">u2").astype("float64"))
    lo, step = torch.tensor(record["lo"], dtype=torch.float64), torch.tensor(record["step"], dtype=torch.float64)
    n = lo.shape[0]
    return (lo[:, None] + codes.reshape(n, -1) * step[:, None]).float().reshape(n, *record["shape"])


def write_block(out: Path, columns: list[Column], start: int, stop: int) -> None:
    """``maps/{start // BLOCK:05d}.js`` with every column's maps of rows [start, stop)."""
    records = []
    for column in columns:
        maps = column.maps[start:stop].float()
        reduce = detail_reduce(column, maps.shape[1])
        if reduce is not None:
            maps = _display.reduce_channels(maps, reduce)
        records.append(encode(maps))
    text = f"HV.maps({start // BLOCK},{json.dumps(records, separators=(',', ':'))});\n"
    (out / "maps" / f"{start // BLOCK:05d}.js").write_text(text, encoding="utf-8")
