"""The report's pages: ``index.html`` (grid and detail view, filled in by ``report.js`` from ``data/items.js``) and
``summary.html`` (tables written here). Every text that comes from data (names, labels, titles) is escaped here
with `html.escape`, or set with ``textContent`` by the script: never parsed as HTML."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import display as _display
from ..display_options import resolve_options
from .mapdata import BLOCK, detail_reduce
from .sources import Items
from .stores import Column
from .thumbnails import SPRITE, drawn_in_page

#: colour maps offered in the detail view (plus each method's own)
CMAPS = ("jet", "viridis", "inferno", "magma", "gray", "bwr", "coolwarm", "RdBu_r")


def _asset(name: str) -> str:
    return resources.files("hookviz.report").joinpath("assets", name).read_text(encoding="utf-8")


def _num(v: float, digits: int = 4) -> float | None:
    return round(v, digits) if math.isfinite(v) else None


def _column(t: Tensor | None, digits: int = 4) -> list[Any] | None:
    if t is None:
        return None
    if t.is_floating_point():
        return [_num(v, digits) for v in t.tolist()]
    return [int(v) for v in t.tolist()]


def _lut(cmap: str) -> str:
    rgb = _display.to_uint8(_display._lut(cmap, torch.device("cpu")))
    return base64.b64encode(rgb.contiguous().numpy().tobytes()).decode("ascii")


def site_data(
    *,
    title: str,
    columns: list[Column],
    items: Items,
    preds: Tensor | None,
    probs: Tensor | None,
    scores: dict[str, dict[str, Tensor]],
    metrics: list[str],
    summary: dict[str, Any],
    full: tuple[int, int],
    thumb: tuple[int, int],
) -> dict[str, Any]:
    """Everything the page script needs, JSON-able; per-item fields as parallel arrays (small and quick to parse)."""
    methods = []
    for j, c in enumerate(columns):
        channels = int(c.maps[0:1].shape[1])
        reduce = detail_reduce(c, channels)
        o = resolve_options(c.display, "report", {})
        methods.append(
            {
                "name": c.name,
                # the thumbnails' sprite folder, or None where the page draws them from the maps
                "folder": None if drawn_in_page(c, full, thumb) else f"m/{j}",
                "channels": 1 if reduce is not None else channels,
                "overlay": bool(c.display.get("overlay", True)),
                "alpha": float(o["alpha"]),
                "alphaByMap": bool(o["alpha_by_map"]),
                "mode": c.display.get("mode") or "minmax",
                "cmap": c.display.get("cmap") or "jet",
                "sign": c.display.get("sign") or "all",
                "percentile": c.display.get("percentile"),
                "targets": _column(c.targets),
                "scores": _column(c.scores),
                "metrics": {m: _column(v) for m, v in scores[c.name].items()},
            }
        )
    cmaps = sorted({*CMAPS, *(m["cmap"] for m in methods)})
    return {
        "title": title,
        "source": items.source,
        "n": items.n,
        "classes": items.classes,
        "names": items.names,
        "files": [Path(f).as_uri() for f in items.files] if items.files is not None else None,
        "labels": _column(items.labels),
        "preds": _column(preds),
        "probs": _column(probs),
        "methods": methods,
        "metrics": metrics,
        "higher": summary["higher_is_better"],
        "full": list(full),
        "thumb": list(thumb),
        "hasFull": tuple(full) != tuple(thumb),
        "hasImages": items.images is not None,
        "block": BLOCK,
        "sprite": SPRITE,
        "luts": {c: _lut(c) for c in cmaps},
        "percentile": _display.DEFAULT_PERCENTILE,
    }


def script_call(call: str, *args: Any) -> str:
    """A data file's text: one call with JSON arguments (``window.HV_DATA={...};`` for an assignment). A script, not
    JSON: pages opened from file:// may load scripts but may not fetch files."""
    text = ",".join(json.dumps(a, separators=(",", ":"), allow_nan=False) for a in args)
    return (f"{call}={text};" if call.startswith("window.") else f"{call}({text});") + "\n"


def write_index(path: Path, title: str, data: dict[str, Any], parts: str) -> None:
    """``index.html``, ``data/items.js`` (`data` as ``window.HV_DATA``), the shared style and scripts, and the
    report's own script: the page shell ``assets/index.html`` filled with one report's parts (``assets/<parts>``,
    sections ``<!-- slot: name -->``); the title escaped, every other text of data set by the script."""
    (path / "data").mkdir(exist_ok=True)
    (path / "data" / "items.js").write_text(script_call("window.HV_DATA", data), encoding="utf-8")
    slots = dict(re.findall(r"<!-- slot: (\w+) -->\n(.*?)\n(?=<!-- slot: |\Z)", _asset(parts), flags=re.S))
    slots["title"] = html.escape(title)
    for name in ("report.css", "site.js", slots["script"]):
        (path / name).write_text(_asset(name), encoding="utf-8")
    page = re.sub(r"\{\{(\w+)\}\}", lambda m: slots[m.group(1)], _asset("index.html"))
    (path / "index.html").write_text(page, encoding="utf-8")


def write_site(path: Path, *, sanity: str | None, **kwargs: Any) -> None:
    write_index(path, kwargs["title"], site_data(**kwargs), "images.html")
    title = html.escape(kwargs["title"])
    (path / "summary.html").write_text(
        summary_page(title, kwargs["columns"], kwargs["items"], kwargs["metrics"], kwargs["summary"], sanity),
        encoding="utf-8",
    )


def _cell(v: float | None, best: bool = False) -> str:
    text = "—" if v is None else f"{v:.3f}"
    return f'<td class="num{" best" if best else ""}">{text}</td>'


def summary_page(
    title: str, columns: list[Column], items: Items, metrics: list[str], summ: dict[str, Any], sanity: str | None
) -> str:
    """``summary.html``: the methods x metrics table, per-class means of each metric, the sanity figure."""
    e = html.escape
    higher = summ["higher_is_better"]
    table = summ["table"]
    head = "".join(f'<th scope="col">{e(m)} {"↑" if higher[m] else "↓"}</th>' for m in metrics)
    best = {}
    for m in metrics:
        vals = [(table[c.name][m], c.name) for c in columns if table[c.name][m] is not None]
        if vals:
            best[m] = (max if higher[m] else min)(vals)[1]
    rows = "".join(
        f'<tr><th scope="row">{e(c.name)}</th>'
        + "".join(_cell(table[c.name][m], best.get(m) == c.name) for m in metrics)
        + "</tr>"
        for c in columns
    )
    parts = [
        f'<h2>Methods × metrics</h2><table class="summary"><caption>mean over {items.n} images ({e(items.source)}); '
        "best in bold</caption>"
        f'<thead><tr><th scope="col">method</th>{head}</tr></thead><tbody>{rows}</tbody></table>'
    ]
    if not metrics:
        parts = ["<p>No metrics: the items have no object masks and no evaluation was given.</p>"]
    per_class = summ["per_class"]
    if per_class and items.labels is not None:
        classes = sorted(set(items.labels.tolist()))

        def cls_name(k: int) -> str:
            return items.classes[k] if items.classes and 0 <= k < len(items.classes) else str(k)

        counts = {k: int((items.labels == k).sum()) for k in classes}
        for m in metrics:
            if not any(m in per_class[c.name] for c in columns):
                continue
            head = "".join(f'<th scope="col">{e(cls_name(k))} <small>({counts[k]})</small></th>' for k in classes)
            body = "".join(
                f'<tr><th scope="row">{e(c.name)}</th>'
                + "".join(_cell(per_class[c.name].get(m, {}).get(k)) for k in classes)
                + "</tr>"
                for c in columns
            )
            parts.append(
                f'<h2>{e(m)} per class</h2><table class="summary"><thead><tr><th scope="col">method</th>{head}'
                f"</tr></thead><tbody>{body}</tbody></table>"
            )
    if sanity is not None:
        parts.append(
            '<h2>Sanity check</h2><figure><img class="sanity" src="' + e(sanity) + '" alt="sanity check: rank '
            "correlation between the maps of the model and of the model with its weights randomised layer by layer "
            'from the top, per method"><figcaption>Model randomisation (Adebayo et al., 2018): low is good.'
            "</figcaption></figure>"
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{title}: summary</title><link rel="stylesheet" href="report.css"></head><body>'
        f'<header><h1>{title}</h1><nav><a href="index.html">Grid</a> · <a href="summary.html" '
        'aria-current="page">Summary</a></nav></header><main>' + "".join(parts) + "</main></body></html>\n"
    )
