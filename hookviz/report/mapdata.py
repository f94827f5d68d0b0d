"""The raw maps behind the detail view, so the page can redo the display modes (`hookviz.display.normalize`) in
the browser: per block of items one script file, ``maps/NNNNN.js``, which calls ``HV.maps(block, data)``.

Script files rather than JSON or binary files because a page opened from the file system (file://) may load
scripts but may not ``fetch`` its neighbours or read image pixels back from a canvas. Each map is kept as 16-bit
codes over its own [min, max] (a step of (max - min) / 65535, far below what a colour map shows) after the channel
reduction its method displays with; 3-channel maps shown as RGB (Guided Backprop) keep their channels.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import display as _display
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
    """(n, C, h, w) float -> {"shape", "lo", "hi", "data"}: little-endian uint16 codes of (x - lo) / (hi - lo)."""
    flat = maps.float().flatten(1)
    lo, hi = flat.min(dim=1).values, flat.max(dim=1).values
    span = (hi - lo).clamp_min(1e-30)
    codes = ((flat - lo[:, None]) / span[:, None] * 65535).round().clamp(0, 65535).to(torch.int32)
    raw = codes.numpy().astype("<u2")
    return {
        "shape": list(maps.shape[1:]),
        "lo": [float(v) for v in lo.tolist()],
        "hi": [float(v) for v in hi.tolist()],
        "data": base64.b64encode(raw.tobytes()).decode("ascii"),
    }


def decode(record: dict[str, Any]) -> Tensor:
    """The inverse of `encode` (to 16-bit precision): (n, C, h, w) float32."""
    import numpy as np

    codes = torch.from_numpy(np.frombuffer(base64.b64decode(record["data"]), dtype="<u2").astype("float32"))
    lo, hi = torch.tensor(record["lo"]), torch.tensor(record["hi"])
    n = lo.shape[0]
    return (lo[:, None] + codes.reshape(n, -1) / 65535 * (hi - lo)[:, None]).reshape(n, *record["shape"])


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
