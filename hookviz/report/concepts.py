"""`report_concepts`: a static HTML report of concept-based results (no server, no CDN).

``index.html``: the TCAV table with p-values (both scores), the bar figure, and per concept a strip of its example
images linking to the concept's page; ``concept/<i>.html``: a concept's page, its examples and its rows of the
table. Each page is a list of sections (`ConceptPage.sections`): CRP's (`CRPConcept`: a channel's RelMax / ActMax
reference examples and its conditional maps of a few inputs) join a TCAV concept's page of the same name, or make
pages of their own (a report of CRP alone: ``report_concepts(None, out, crp=...)``). Every text from data is escaped
with `html.escape`.
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

__all__ = ["CRPConcept", "ConceptPage", "report_concepts"]

#: examples shown per concept, and their size in pixels in the strips
STRIP = 8
TILE = 96


@dataclass
class ConceptPage:
    """One concept's page: its name, the file of its examples' strip (or None) and its sections (HTML)."""

    name: str
    strip: str | None = None
    sections: list[str] = field(default_factory=list)
    thumb: str | None = None  # the index's image where there is no strip (a CRP concept's RelMax crops)


@dataclass
class CRPConcept:
    """A CRP concept for the report: channel `channel` of `layer`. `references`: a `ReferenceExamples` holding the
    channel (its RelMax and ActMax crops are shown); `inputs` (N, C, H, W) with `maps` (N, [C,] H, W), the
    relevance through the channel (``CRP.attribute(inputs, t, conditions={layer: [channel]})``), shown side by
    side; `relevance` (N,) its R_c per input and `names` the inputs' captions. Each part is optional."""

    layer: str
    channel: int
    references: Any = None
    inputs: Tensor | None = None
    maps: Tensor | None = None
    relevance: Tensor | None = None
    names: Sequence[str] | None = None


def _crop_strip(path: Path, crops: Tensor, indices: Tensor) -> int:
    """The reference crops (k, C, h, w) of one channel whose item index is valid as a strip; how many."""
    keep = [j for j in range(len(indices)) if int(indices[j]) >= 0]
    return len(keep) if keep and _write_strip(path, crops[keep], len(keep)) else 0


def _map_pairs(path: Path, inputs: Tensor, maps: Tensor, n: int) -> int:
    """Up to `n` (input, conditional map) pairs as one strip, each map on its own symmetric scale; how many."""
    from ..concepts.crp.figures import heat_rgb

    tiles = _tiles(inputs, n)
    if not tiles:
        return 0
    gap = np.full((TILE, 4, 3), 255, dtype=np.uint8)
    wide = np.full((TILE, 16, 3), 255, dtype=np.uint8)
    parts = []
    for i, tile in enumerate(tiles):
        heat = torch.from_numpy(heat_rgb(maps[i])).permute(2, 0, 1)[None].float()
        heat = torch.nn.functional.interpolate(heat, size=(TILE, TILE), mode="nearest")[0].permute(1, 2, 0)
        parts += [tile, gap, heat.round().to(torch.uint8).numpy(), wide]
    Image.fromarray(np.concatenate(parts[:-1], axis=1)).save(path)
    return len(tiles)


def _crp_section(folder: Path, i: int, c: CRPConcept) -> str:
    """A CRP concept's section of its page, its images written into `folder` as ``<i>-relmax.png``, ...."""
    e = html.escape
    parts = [f"<h2>CRP: channel {c.channel} of {e(c.layer)}</h2>"]
    refs = c.references
    if refs is not None:
        row = refs._row(c.channel)
        for kind, crops, top, what in (
            ("relmax", refs.relevance_crops, refs.relevance, "RelMax: the items with the largest relevance R_c"),
            ("actmax", refs.activation_crops, refs.activation, "ActMax: the items with the largest activation"),
        ):
            if crops is None:
                continue
            n = _crop_strip(folder / f"{i}-{kind}.png", crops[row], top.indices[row])
            if n:
                items = ", ".join(f"#{int(top.indices[row, j])} ({float(top.scores[row, j]):.3g})" for j in range(n))
                parts.append(f'<figure><img class="strip" src="{i}-{kind}.png" alt="{kind} examples">'
                             f"<figcaption>{what} (item, score): {e(items)}</figcaption></figure>")  # fmt: skip
    if c.inputs is not None and c.maps is not None:
        # the inputs where the channel is most relevant first (as given without `relevance`)
        order = (torch.argsort(c.relevance.detach().float().cpu(), descending=True, stable=True)
                 if c.relevance is not None else torch.arange(len(c.inputs)))[: STRIP // 2]  # fmt: skip
        n = _map_pairs(folder / f"{i}-maps.png", c.inputs[order], c.maps[order], STRIP // 2)
        if n:
            given = list(c.names) if c.names is not None else [f"input {j}" for j in range(len(c.inputs))]
            names = [e(str(given[j])) for j in order.tolist()[:n]]
            if c.relevance is not None:
                names = [f"{s}: R_c {float(c.relevance[j]):.3g}" for j, s in zip(order.tolist(), names, strict=True)]
            parts.append(f'<figure><img class="strip" src="{i}-maps.png" alt="conditional heat maps">'
                         "<figcaption>inputs (largest R_c first) and the relevance through this channel "
                         "(red +, blue -, each map on its own scale): "
                         f"{'; '.join(names)}</figcaption></figure>")  # fmt: skip
    return "".join(parts)


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
    result: TCAVResult | None,
    out: str | os.PathLike[str],
    *,
    examples: Mapping[str, Any] | None = None,
    crp: Mapping[str, CRPConcept] | None = None,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a static HTML report of a TCAV result to `out`; returns the path of its ``index.html``.

    Args:
        result: what `hookviz.TCAV.interpret` returned, or None (a report of `crp` alone).
        out: the report folder: created if missing, replaced if it holds a previous report, refused if it holds
            anything else unless `overwrite` (as `hookviz.report`).
        examples: ``{concept: examples}`` for the strips of example images: tensors (N, C, H, W) (shown as they
            are where they lie in [0, 1], else each image scaled to its range), lists of image files or PIL images;
            the first 8 are shown. Concepts without examples get no strip.
        crp: ``{concept: CRPConcept}``: a section of CRP on the page of that name (a TCAV concept's, or a page of
            its own after them): its RelMax / ActMax crops and its conditional maps of a few inputs.
        title: the report's title (default: the concepts, classes and layers).

    Example::

        result = hv.TCAV(model, ["conv3", "features.4"]).interpret(x, concepts, random, target=5)
        hookviz.report.report_concepts(result, "tcav-report/", examples=concepts)
    """
    if result is not None and not isinstance(result, TCAVResult):
        raise TypeError(f"result must be a TCAVResult (what TCAV.interpret returns), got {type(result).__name__}")
    if crp is not None and (not isinstance(crp, Mapping) or not all(isinstance(c, CRPConcept) for c in crp.values())):
        raise TypeError("crp must be a dict {concept: CRPConcept} or None")
    if result is None and not crp:
        raise ValueError("nothing to report: pass a TCAVResult, crp={concept: CRPConcept}, or both")
    if examples is not None and not isinstance(examples, Mapping):
        raise TypeError(f"examples must be a dict {{concept: examples}} or None, got {type(examples).__name__}")
    tcav_concepts = list(result.concepts) if result is not None else []
    concepts = tcav_concepts + [k for k in (crp or {}) if k not in tcav_concepts]
    unknown = [k for k in (examples or {}) if k not in concepts]
    if unknown:
        raise ValueError(f"examples names concepts the result does not have: {unknown}; its concepts: {concepts}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    path = prepare_out(out, overwrite)
    (path / "concept").mkdir()
    (path / "report.css").write_text(_asset("report.css"), encoding="utf-8")
    if result is not None:
        result.figure().savefig(path / "tcav.png", dpi=100)
    e = html.escape
    pages = []
    for i, name in enumerate(concepts):
        page = ConceptPage(name)
        if (
            examples is not None
            and name in examples
            and _write_strip(path / "concept" / f"{i}.png", examples[name], STRIP)
        ):
            page.strip = f"{i}.png"
        if result is not None and name in tcav_concepts:
            rows = [r for r in result.rows if r.concept == name]
            page.sections.append(f"<h2>TCAV</h2>{tcav_table(result, rows)}")
        if crp is not None and name in crp:
            page.sections.append(_crp_section(path / "concept", i, crp[name]))
            if (path / "concept" / f"{i}-relmax.png").exists():
                page.thumb = f"{i}-relmax.png"
        pages.append(page)
    if result is not None:
        title = title or (
            f"TCAV: {len(result.concepts)} concepts, classes {', '.join(sorted({r.class_name for r in result.rows}))},"
            f" layers {', '.join(result.layers)}"
        )
    else:
        title = title or f"CRP: {len(concepts)} concepts"
    t = e(title)
    strips = []
    for i, page in enumerate(pages):
        shown = page.strip or page.thumb
        img = f'<img class="strip" src="concept/{shown}" alt="examples of {e(page.name)}">' if shown else ""
        strips.append(f'<figure class="concept"><figcaption><a href="concept/{i}.html">{e(page.name)}</a>'
                      f"</figcaption>{img}</figure>")  # fmt: skip
    scores = (
        "<h2>Scores</h2>"
        f'<figure><img class="sanity" src="tcav.png" alt="TCAV sign-count bars per class, concept and layer">'
        f"<figcaption>{e(result._caption())}</figcaption></figure>{tcav_table(result, link=True)}"
        if result is not None
        else ""
    )
    body = f"{scores}<h2>Concepts</h2>{''.join(strips)}"
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
    mark(path, {"format": "hookviz-report", "version": VERSION, "complete": True, "concepts": concepts})
    return path / "index.html"
