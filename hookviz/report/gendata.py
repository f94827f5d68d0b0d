"""The generation report's data: the index every page load reads (``data/items.js``: per prompt its text, the
continuation, token counts and the mean of each step score, for the list, its sort and its filter), and the scores
(per block of `BLOCK` prompts one script file, ``data/g/NNNNN.js``, calling ``HV.gen(block, data)``), loaded only
when a prompt of the block is opened: a report of 1,000 prompts x 64 tokens x 3 methods opens as fast as one of 10.

Each (G, S) score matrix is stored exactly: its float32 (or float64) bytes, little-endian, as byte planes (every
value's first byte, then every second byte, ...: the sign and exponent bytes repeat far more than the mantissa's),
deflated with zlib and base64-encoded; the page inflates them with the browser's ``DecompressionStream`` (the
image report's maps are stored the same way, `hookviz.report.mapdata`). `decode` is the inverse, bit for bit. The
step scores are JSON numbers: a float32 read as a float64 and written by `json` comes back as the same float32.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..generation import GenerationExplanation
from . import planes
from .pages import script_call

#: prompts per scores file: a detail view loads one file of this many prompts
BLOCK = 16
#: characters of a prompt kept in the index (shown shortened in the list and searched); the detail view has it all
INDEX_TEXT = 2000
_DTYPES = {torch.float64: ("f8", "<f8", torch.float64)}
_F4 = ("f4", "<f4", torch.float32)


def prompt_text(exp: GenerationExplanation, i: int) -> str:
    """The prompt as given, or its tokens joined where the explanation does not keep the text."""
    if exp.prompts:
        return exp.prompts[i]
    return "".join(exp.source_tokens[i][: exp.prompt_lengths[i]])


def step_scores(exps: dict[str, GenerationExplanation]) -> dict[str, list[Tensor]]:
    """Each step score once (the continuations are the same): from the first explanation that has it."""
    out: dict[str, list[Tensor]] = {}
    for exp in exps.values():
        for name, values in exp.step_scores.items():
            out.setdefault(name, values)
    return out


def _mean(v: Tensor) -> float | None:
    m = float(v.detach().double().mean()) if v.numel() else math.nan
    return m if math.isfinite(m) else None


def _finite(values: list[float]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in values]


def index_data(title: str, exps: dict[str, GenerationExplanation]) -> dict[str, Any]:
    """``window.HV_DATA``: what the list needs, as parallel arrays (small and quick to parse)."""
    first = next(iter(exps.values()))
    n = len(first)
    steps = step_scores(exps)
    starts = first.word_starts
    return {
        "kind": "generation",
        "title": title,
        "n": n,
        "block": BLOCK,
        "methods": [
            {"name": name, "method": e.method, "score": e.score, "contrast": e.contrast_tokens is not None}
            for name, e in exps.items()
        ],
        "steps": list(steps),
        "prompts": [prompt_text(first, i)[:INDEX_TEXT] for i in range(n)],
        "continuations": ["".join(first.generated_tokens[i]) for i in range(n)],
        "p": list(first.prompt_lengths),
        "g": [len(t) for t in first.generated_tokens],
        "means": {name: [_mean(v) for v in values] for name, values in steps.items()},
        # whether the words toggle means anything: some word is made of several tokens
        "pieces": starts is not None and any(not all(s) for s in starts),
    }


def encode(scores: Tensor) -> dict[str, Any]:
    """A (G, S) score matrix -> {"dtype", "z"}: its bytes as deflated byte planes, base64 (module docstring)."""
    kind, little, dtype = _DTYPES.get(scores.dtype, _F4)  # float16 / bfloat16 widen to float32 exactly
    raw = scores.detach().to("cpu", dtype).contiguous().numpy().astype(little)
    return {"dtype": kind, "z": planes.pack(raw, 6)}


def decode(record: dict[str, Any], shape: tuple[int, int]) -> Tensor:
    """The inverse of `encode`, bit for bit: a (G, S) float32 (or float64) tensor."""
    little, dtype = {"f4": ("<f4", torch.float32), "f8": ("<f8", torch.float64)}[record["dtype"]]
    values = planes.unpack(record["z"], little).reshape(shape)
    return torch.from_numpy(values.astype(little[1:])).to(dtype)


def block_data(exps: dict[str, GenerationExplanation], start: int, stop: int) -> list[dict[str, Any]]:
    """Prompts [start, stop): text, tokens, word starts, step scores, and each method's scores (and contrast tokens)."""
    first = next(iter(exps.values()))
    steps = step_scores(exps)
    items = []
    for i in range(start, stop):
        starts = first.word_starts[i] if first.word_starts is not None else None
        items.append(
            {
                "prompt": prompt_text(first, i),
                "src": list(first.source_tokens[i]),
                "gen": list(first.generated_tokens[i]),
                "p": first.prompt_lengths[i],
                "starts": None if starts is None else "".join("1" if s else "0" for s in starts),
                "steps": {name: _finite(values[i].detach().double().cpu().tolist()) for name, values in steps.items()},
                "m": [
                    {
                        **encode(e.scores[i]),
                        "contrast": None if e.contrast_tokens is None else list(e.contrast_tokens[i]),
                    }
                    for e in exps.values()
                ],
            }
        )
    return items


def write_block(out: Path, exps: dict[str, GenerationExplanation], start: int, stop: int) -> None:
    """``data/g/{start // BLOCK:05d}.js`` with prompts [start, stop)."""
    text = script_call("HV.gen", start // BLOCK, block_data(exps, start, stop))
    (out / "data" / "g" / f"{start // BLOCK:05d}.js").write_text(text, encoding="utf-8")
