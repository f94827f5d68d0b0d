"""The concepts report in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright's Python API
(tests/chromium.py: nothing is downloaded; skipped without Chromium or Playwright). The pages load without errors,
their images decode, the table links to each concept's page and back, names from data stay text. Screenshots go to
``HOOKVIZ_SCREENSHOTS`` (default: the test's tmp_path)."""

from __future__ import annotations

import os
from pathlib import Path

from chromium import require

import hookviz as hv
from hookviz.report import report_concepts
from hookviz.zoo import shapes, shapes_concepts, shapes_model

require()  # skips this module without Playwright or Chromium

EVIL = "<script>window.__pwned = 1</script>"


def test_concepts_report_in_chromium(browser, tmp_path) -> None:
    shots = Path(os.environ.get("HOOKVIZ_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    sets = shapes_concepts(6)
    concepts = {"round outline": sets["round outline"], EVIL: sets["background"]}
    tcav = hv.TCAV(shapes_model(), ["conv3", "features.4"], cav="mean")
    result = tcav.interpret(shapes(8, seed=6).images, concepts, shapes(16, seed=5).images, n_random=2)
    index = report_concepts(result, tmp_path / "rep", examples=concepts, title=f"tcav {EVIL}")

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(index.as_uri())
    page.wait_for_function("[...document.images].every(i => i.complete)")
    assert page.evaluate("window.__pwned") is None
    assert page.text_content("h1") == f"tcav {EVIL}"
    widths = page.eval_on_selector_all("img", "is => is.map(i => i.naturalWidth)")
    assert len(widths) == 3 and all(w > 0 for w in widths)  # the figure and two strips
    assert page.eval_on_selector_all("table.tcav tbody tr", "rs => rs.length") == len(result.rows)
    page.screenshot(path=str(shots / "concepts-index.png"), full_page=True)
    # the table's concept link opens the concept's page; its link leads back
    page.click('table.tcav a[href="concept/1.html"] >> nth=0')
    page.wait_for_url("**/concept/1.html")
    page.wait_for_function("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
    assert page.eval_on_selector_all("table.tcav tbody tr", "rs => rs.length") == 2 * len(result.classes)
    page.screenshot(path=str(shots / "concepts-page.png"), full_page=True)
    page.click("text=All concepts")
    page.wait_for_url("**/index.html")
    assert errors == []
