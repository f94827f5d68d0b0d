"""The concepts report (`hookviz.report.report_concepts`): its files, the TCAV table with p-values as the result
holds them, the strips of example images, the concept pages, escaping, and the output folder's rules (as
`hookviz.report`'s). The pages in a browser: tests/test_report_concepts_browser.py."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import hookviz as hv
from hookviz.concepts.result import _p
from hookviz.report import report_concepts
from hookviz.report.concepts import STRIP, TILE
from hookviz.zoo import shapes, shapes_concepts, shapes_model

EVIL = "<script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def tcav():
    sets = shapes_concepts(6)
    concepts = {"round outline": sets["round outline"], EVIL: sets["background"]}
    pool = shapes(16, seed=5).images
    inputs = shapes(8, seed=6).images
    model = shapes_model()
    result = hv.TCAV(model, ["conv3", "features.4"], cav="mean").interpret(inputs, concepts, pool, n_random=2)
    return result, concepts


def test_files_table_and_strips(tcav, tmp_path) -> None:
    result, concepts = tcav
    examples = {"round outline": concepts["round outline"], EVIL: concepts[EVIL] * 4 - 2}  # not in [0, 1]
    index = report_concepts(result, tmp_path / "rep", examples=examples)
    root = tmp_path / "rep"
    assert index == root / "index.html"
    assert {p.name for p in root.iterdir()} == {
        "index.html",
        "report.css",
        "tcav.png",
        "concept",
        ".hookviz-report.json",
    }
    assert sorted(p.name for p in (root / "concept").iterdir()) == ["0.html", "0.png", "1.html", "1.png"]
    assert json.loads((root / ".hookviz-report.json").read_text())["complete"] is True
    page = index.read_text()
    # every row of the result with both scores' p-values as the result formats them
    assert page.count("<tr><td>") == len(result.rows)
    for r in result.rows:
        for kind in ("sign_count", "magnitude"):
            s = r.stats[kind]
            assert f"{s.mean:.3f} ± {s.std:.3f}" in page and _p(s.p_corrected) in page
    n_sig = sum(r.stats[k].significant for r in result.rows for k in ("sign_count", "magnitude"))
    assert page.count('class="num best"') == 2 * n_sig  # the score and its corrected p-value in bold
    assert page.count("n.s.</small>") == 2 * len(result.rows) - n_sig
    assert 'src="tcav.png"' in page and 'href="concept/1.html"' in page
    # names from data are escaped everywhere
    assert EVIL not in page and html.escape(EVIL) in page
    assert EVIL not in (root / "concept" / "1.html").read_text()
    # the strips: the first STRIP examples, TILE pixels each; the one out of [0, 1] scaled to its range
    with Image.open(root / "concept" / "0.png") as im:
        assert im.size == (6 * TILE + 5 * 4, TILE)
        first = torch.from_numpy(np.array(im.crop((0, 0, TILE, TILE)))).float()
    want = torch.nn.functional.interpolate(concepts["round outline"][:1], size=(TILE, TILE), mode="nearest")
    torch.testing.assert_close(first, (want[0].permute(1, 2, 0) * 255).round(), atol=0, rtol=0)
    with Image.open(root / "concept" / "1.png") as im:
        lo, hi = zip(*im.getextrema(), strict=True)
        assert min(lo) <= 2 and max(hi) >= 250  # scaled per image, not clipped to black
    # a concept's page: its rows only, a link back
    c0 = (root / "concept" / "0.html").read_text()
    assert c0.count("<tr><td>") == len(result.layers) * len(result.classes)
    assert 'href="../index.html"' in c0 and 'href="../report.css"' in c0 and 'src="0.png"' in c0


def test_strips_of_image_files_and_none(tcav, tmp_path) -> None:
    result, concepts = tcav
    files = []
    for i in range(STRIP + 2):  # more files than a strip shows
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (50 + i, 40), (10 * i, 0, 0)).save(path)
        files.append(path)
    report_concepts(result, tmp_path / "rep", examples={"round outline": files}, title="files")
    with Image.open(tmp_path / "rep" / "concept" / "0.png") as im:
        assert im.size == (STRIP * TILE + (STRIP - 1) * 4, TILE)
    assert not (tmp_path / "rep" / "concept" / "1.png").exists()  # no examples given: no strip
    assert "<title>files</title>" in (tmp_path / "rep" / "index.html").read_text()
    report_concepts(result, tmp_path / "bare")
    assert '<img class="strip"' not in (tmp_path / "bare" / "index.html").read_text()


def test_output_folder_and_bad_arguments(tcav, tmp_path) -> None:
    result, _ = tcav
    out = tmp_path / "rep"
    report_concepts(result, out)
    (out / "concept" / "stale.html").write_text("old")
    report_concepts(result, out)  # a previous report is replaced whole
    assert not (out / "concept" / "stale.html").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="not a hookviz report"):
        report_concepts(result, other)
    report_concepts(result, other, overwrite=True)
    assert (other / "mine.txt").read_text() == "keep" and (other / "index.html").is_file()
    with pytest.raises(TypeError, match="TCAVResult"):
        report_concepts({"rows": []}, tmp_path / "x")
    with pytest.raises(ValueError, match="concepts the result does not have"):
        report_concepts(result, tmp_path / "x", examples={"striped": torch.rand(3, 3, 8, 8)})
    assert not (tmp_path / "x").exists()  # refused before anything is written
    assert re.search(r"hookviz\.report\.report_concepts", report_concepts.__doc__ or "")
