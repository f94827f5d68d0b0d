"""CRP's sections of the concepts report (`hookviz.report.report_concepts(..., crp=...)`): a channel's RelMax /
ActMax crops and its conditional maps of the inputs where it is most relevant, on a page of its own or on a TCAV
concept's page; escaping and bad arguments."""

from __future__ import annotations

import html

import pytest
import torch
from PIL import Image

import hookviz as hv
from hookviz.report import CRPConcept, report_concepts
from hookviz.report.concepts import STRIP, TILE
from hookviz.zoo import ShapesDataset, shapes, shapes_concepts, shapes_model

EVIL = "<script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def crp_parts(tmp_path_factory):
    model = shapes_model()
    crp = hv.CRP(model)
    x = shapes(5, seed=6).images
    refs = crp.relmax(ShapesDataset(24, seed=7), "features.3", str(tmp_path_factory.mktemp("rm")), channels=[25, 8],
                      k=3, target="label")  # fmt: skip
    maps = crp.attribute(x, 5, conditions=[{"features.3": [c]} for c in (25, 8)])
    shares = crp.concept_relevance(x, 5, "features.3")
    return model, x, refs, maps, shares


def test_crp_alone_pages_crops_and_maps(crp_parts, tmp_path) -> None:
    _, x, refs, maps, shares = crp_parts
    concepts = {
        f"ch {c}": CRPConcept("features.3", c, references=refs, inputs=x, maps=maps[:, j], relevance=shares[:, c],
                              names=[f"{EVIL} {i}" for i in range(5)])
        for j, c in enumerate((25, 8))
    }  # fmt: skip
    index = report_concepts(None, tmp_path / "rep", crp=concepts)
    root = tmp_path / "rep"
    assert sorted(p.name for p in (root / "concept").iterdir()) == sorted(
        f"{i}{part}" for i in range(2) for part in (".html", "-relmax.png", "-actmax.png", "-maps.png")
    )
    page = index.read_text()
    assert "<title>CRP: 2 concepts</title>" in page and "tcav.png" not in page
    assert 'src="concept/1-relmax.png"' in page  # the index shows a CRP concept by its RelMax crops
    c1 = (root / "concept" / "1.html").read_text()
    assert "CRP: channel 8 of features.3" in c1 and EVIL not in c1 and html.escape(EVIL) in c1
    for j in range(3):  # every RelMax item with its score, as the result holds them
        assert f"#{int(refs.relevance.indices[1, j])} ({float(refs.relevance.scores[1, j]):.3g})" in c1
    with Image.open(root / "concept" / "0-relmax.png") as im:
        assert im.size == (3 * TILE + 2 * 4, TILE)
    # the maps: the STRIP // 2 inputs with the largest R_c, largest first, each next to its map
    order = torch.argsort(shares[:, 25], descending=True, stable=True)[: STRIP // 2].tolist()
    c0 = (root / "concept" / "0.html").read_text()
    captions = [f"{html.escape(EVIL)} {i}: R_c {float(shares[i, 25]):.3g}" for i in order]
    assert "; ".join(captions) in c0
    with Image.open(root / "concept" / "0-maps.png") as im:
        assert im.size == (len(order) * (2 * TILE + 4) + (len(order) - 1) * 16, TILE)
        heat = im.crop((TILE + 4, 0, 2 * TILE + 4, TILE)).convert("RGB")
        assert max(heat.getextrema()[1]) >= 250 and min(heat.getextrema()[1]) < 128  # white and red: not blank


def test_crp_sections_join_tcav_pages(crp_parts, tmp_path) -> None:
    model, x, refs, maps, shares = crp_parts
    sets = shapes_concepts(4)
    result = hv.TCAV(model, ["features.4"], cav="mean").interpret(
        x, {"round outline": sets["round outline"]}, shapes(8, seed=5).images, n_random=2
    )
    crp = {"round outline": CRPConcept("features.3", 25, references=refs), "ch 8": CRPConcept("features.3", 8)}
    report_concepts(result, tmp_path / "rep", examples={"round outline": sets["round outline"]}, crp=crp)
    c0 = (tmp_path / "rep" / "concept" / "0.html").read_text()
    assert c0.index("<h2>TCAV</h2>") < c0.index("CRP: channel 25 of features.3") and 'src="0-relmax.png"' in c0
    c1 = (tmp_path / "rep" / "concept" / "1.html").read_text()  # a page of its own; nothing to show but its title
    assert "CRP: channel 8 of features.3" in c1 and "<img" not in c1
    assert "tcav.png" in (tmp_path / "rep" / "index.html").read_text()


def test_crp_bad_arguments(crp_parts, tmp_path) -> None:
    with pytest.raises(ValueError, match="nothing to report"):
        report_concepts(None, tmp_path / "x")
    with pytest.raises(TypeError, match="CRPConcept"):
        report_concepts(None, tmp_path / "x", crp={"a": ("features.3", 1)})
    with pytest.raises(ValueError, match="concepts the result does not have"):
        report_concepts(
            None, tmp_path / "x", crp={"a": CRPConcept("features.3", 1)}, examples={"b": torch.rand(2, 3, 8, 8)}
        )
    assert not (tmp_path / "x").exists()
