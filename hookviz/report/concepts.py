"""`report_concepts`: a static HTML report of concept-based results (no server, no CDN).

``index.html``: the TCAV table with p-values (both scores), the bar figure, and per concept a strip of its example
images linking to the concept's page; ``concept/<i>.html``: a concept's page, its examples and its rows of the
table. Each page is a list of sections (`ConceptPage.sections`): further concept methods (CRP's reference examples
and conditional maps) add theirs to the same pages. Every text from data is escaped with `html.escape`.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ..concepts.result import SCORES, TCAVResult
from .output import VERSION, mark, prepare_out
from .pages import _asset

__all__ = ["ConceptPage", "report_concepts"]

#: examples shown per concept, and their size in pixels in the strips
STRIP = 8
TILE = 96


@dataclass
class ConceptPage:
    """One concept's page: its name, the file of its examples' strip (or None) and its sections (HTML)."""

    name: str
    strip: str | None = None
    sections: list[str] = field(default_factory=list)


def _tiles(examples: Any, n: int) -> list[np.ndarray]:
    """Up to `n` examples as (TILE, TILE, 3) uint8 arrays: tensors (N, C, H, W) shown as they are where they lie in
    [0, 1], else each scaled to its own range; image files and PIL images thumbnailed and center-cropped."""
    tiles = []
    if isinstance(examples, Tensor):
        x = examples[:n].detach().float().cpu()
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            return []  # not images (token ids, feature vectors): no strip
        if x.min() < 0 or x.max() > 1:
            lo = x.amin((1, 2, 3), keepdim=True)
            x = (x - lo) / (x.amax((1, 2, 3), keepdim=True) - lo).clamp_min(1e-12)
        x = torch.nn.functional.interpolate(x, size=(TILE, TILE), mode="nearest")
        u8 = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).permute(0, 2, 3, 1)
        return list(u8.numpy())
    for item in list(examples)[:n]:
        img = item if isinstance(item, Image.Image) else Image.open(item)
        img = img.convert("RGB")
        side = min(img.size)
        left, top = (img.width - side) // 2, (img.height - side) // 2
        img = img.crop((left, top, left + side, top + side)).resize((TILE, TILE))
        tiles.append(np.asarray(img))
    return tiles


def _write_strip(path: Path, examples: Any, n: int) -> bool:
    tiles = _tiles(examples, n)
    if not tiles:
        return False
    gap = np.full((TILE, 4, 3), 255, dtype=np.uint8)
    row = np.concatenate([part for t in tiles for part in (t, gap)][:-1], axis=1)
    Image.fromarray(row).save(path)
    return True


def _p(p: float) -> str:
    return "—" if math.isnan(p) else f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def tcav_table(result: TCAVResult, rows: Sequence[Any] | None = None, *, link: bool = False) -> str:
    """The TCAV rows as an HTML table: per score kind the mean ± std over the random sets, the null's, the p-value
    and the corrected one; significant cells in bold, the others marked n.s."""
    e = html.escape
    head = "".join(
        f'<th scope="col">{k.replace("_", " ")}</th><th scope="col">random</th><th scope="col">p</th>'
        f'<th scope="col">p corr.</th>'
        for k in SCORES
    )
    body = []
    for r in rows if rows is not None else result.rows:
        i = result.concepts.index(r.concept)
        name = f'<a href="concept/{i}.html">{e(r.concept)}</a>' if link else e(r.concept)
        cells = []
        for k in SCORES:
            s = r.stats[k]
            mark_ = "" if s.significant else ' <small class="muted">n.s.</small>'
            cells.append(
                f'<td class="num{" best" if s.significant else ""}">{s.mean:.3f} ± {s.std:.3f}{mark_}</td>'
                f'<td class="num">{s.null_mean:.3f} ± {s.null_std:.3f}</td><td class="num">{_p(s.p)}</td>'
                f'<td class="num{" best" if s.significant else ""}">{_p(s.p_corrected)}</td>'
            )
        body.append(f"<tr><td>{e(r.class_name)}</td><td>{name}</td><td>{e(r.layer)}</td>{''.join(cells)}</tr>")
    note = (
        f"{result.n_random} random sets, {e(result.cav)} CAVs, pool={e(result.pool)}; two-sided {e(result.test)} "
        f"t-test against random-vs-random CAVs; {e(result.correction)} correction over {len(result.rows)} tests; "
        f"bold: significant at alpha = {result.alpha}"
    )
    return (
        f'<table class="summary tcav"><caption>{note}</caption><thead><tr><th scope="col">class</th>'
        f'<th scope="col">concept</th><th scope="col">layer</th>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
        "</table>"
    )


def _page(title: str, nav: str, body: str, css: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{title}</title><link rel="stylesheet" href="{css}"></head><body>'
        f"<header><h1>{title}</h1><nav>{nav}</nav></header><main>{body}</main></body></html>\n"
    )


def report_concepts(
    result: TCAVResult,
    out: str | os.PathLike[str],
    *,
    examples: Mapping[str, Any] | None = None,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a static HTML report of a TCAV result to `out`; returns the path of its ``index.html``.

    Args:
        result: what `hookviz.TCAV.interpret` returned.
        out: the report folder: created if missing, replaced if it holds a previous report, refused if it holds
            anything else unless `overwrite` (as `hookviz.report`).
        examples: ``{concept: examples}`` for the strips of example images: tensors (N, C, H, W) (shown as they
            are where they lie in [0, 1], else each image scaled to its range), lists of image files or PIL images;
            the first 8 are shown. Concepts without examples get no strip.
        title: the report's title (default: the concepts, classes and layers).

    Example::

        result = hv.TCAV(model, ["conv3", "features.4"]).interpret(x, concepts, random, target=5)
        hookviz.report.report_concepts(result, "tcav-report/", examples=concepts)
    """
    if not isinstance(result, TCAVResult):
        raise TypeError(f"result must be a TCAVResult (what TCAV.interpret returns), got {type(result).__name__}")
    if examples is not None and not isinstance(examples, Mapping):
        raise TypeError(f"examples must be a dict {{concept: examples}} or None, got {type(examples).__name__}")
    unknown = [k for k in (examples or {}) if k not in result.concepts]
    if unknown:
        raise ValueError(
            f"examples names concepts the result does not have: {unknown}; its concepts: {result.concepts}"
        )
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    path = prepare_out(out, overwrite)
    (path / "concept").mkdir()
    (path / "report.css").write_text(_asset("report.css"), encoding="utf-8")
    result.figure().savefig(path / "tcav.png", dpi=100)
    e = html.escape
    pages = []
    for i, name in enumerate(result.concepts):
        page = ConceptPage(name)
        if (
            examples is not None
            and name in examples
            and _write_strip(path / "concept" / f"{i}.png", examples[name], STRIP)
        ):
            page.strip = f"{i}.png"
        rows = [r for r in result.rows if r.concept == name]
        page.sections.append(f"<h2>TCAV</h2>{tcav_table(result, rows)}")
        pages.append(page)
    title = title or (
        f"TCAV: {len(result.concepts)} concepts, classes {', '.join(sorted({r.class_name for r in result.rows}))}, "
        f"layers {', '.join(result.layers)}"
    )
    t = e(title)
    strips = []
    for i, page in enumerate(pages):
        img = f'<img class="strip" src="concept/{page.strip}" alt="examples of {e(page.name)}">' if page.strip else ""
        strips.append(f'<figure class="concept"><figcaption><a href="concept/{i}.html">{e(page.name)}</a>'
                      f"</figcaption>{img}</figure>")  # fmt: skip
    body = (
        "<h2>Scores</h2>"
        f'<figure><img class="sanity" src="tcav.png" alt="TCAV sign-count bars per class, concept and layer">'
        f"<figcaption>{e(result._caption())}</figcaption></figure>"
        f"{tcav_table(result, link=True)}<h2>Concepts</h2>{''.join(strips)}"
    )
    (path / "index.html").write_text(_page(t, "Concepts", body, "report.css"), encoding="utf-8")
    for i, page in enumerate(pages):
        img = (
            f'<figure><img class="strip" src="{page.strip}" alt="examples of {e(page.name)}">'
            "<figcaption>its first examples</figcaption></figure>"
            if page.strip
            else ""
        )
        nav = f'<a href="../index.html">All concepts</a> · {t}'
        (path / "concept" / f"{i}.html").write_text(
            _page(e(page.name), nav, img + "".join(page.sections), "../report.css"), encoding="utf-8"
        )
    mark(path, {"format": "hookviz-report", "version": VERSION, "complete": True, "concepts": list(result.concepts)})
    return path / "index.html"
