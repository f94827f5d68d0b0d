"""The report in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright's Python API.

Nothing is downloaded: Playwright launches the system Chromium by its path (``HOOKVIZ_CHROMIUM`` or
``/usr/bin/chromium``). Screenshots go to ``HOOKVIZ_SCREENSHOTS`` (default: the test's tmp_path) and the first-page
render time is printed (``-s`` shows it) and recorded as a property: measured, never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

import hookviz as hv
from hookviz.zoo import ShapesDataset, shapes_model

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])")

CHROMIUM = os.environ.get("HOOKVIZ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.isfile(CHROMIUM):
    pytest.skip(
        f"no Chromium at {CHROMIUM!r}: install Debian's chromium (apt-get install -y chromium) or set HOOKVIZ_CHROMIUM",
        allow_module_level=True,
    )
# the machine's closed network refuses Chromium's background connections; these flags keep it from trying
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
N = 64
METHODS = ("gradcam", "guided-backprop", "saliency")
EVIL = "<script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    model, data = shapes_model(), ShapesDataset(N, seed=11)
    stores = [hv.explain_dataset(hv.METHODS[m](model), data, root / m, target="label", progress=False) for m in METHODS]
    index = hv.report(stores, root / "report", data=data, model=model, title=f"shapes {EVIL}", workers=2)
    with torch.no_grad():
        preds = model(data.shapes.images).argmax(dim=1)
    energy = hv.energy_in_mask(stores[0][:], data.shapes.masks)
    return index, data, preds, energy


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def _rows(page) -> list[int]:
    return [int(v) for v in page.eval_on_selector_all("#grid tbody tr", "rs => rs.map(r => r.dataset.item)")]


def test_report_in_chromium(site, browser, tmp_path, record_property):
    index, data, preds, energy = site
    shots = Path(os.environ.get("HOOKVIZ_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    start = time.perf_counter()
    page.goto(index.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_function(
        "[...document.querySelectorAll('#grid tbody tr:nth-child(-n+3) img')].every(i => i.complete && i.naturalWidth)"
    )
    render_ms = (time.perf_counter() - start) * 1000
    record_property("first_page_render_ms", round(render_ms, 1))
    print(f"\nfirst page rendered (grid and its first rows' images) in {render_ms:.0f} ms")

    # the title with <script> in it is text, not markup
    assert page.evaluate("window.__pwned") is None
    assert page.text_content("h1") == f"shapes {EVIL}"
    assert len(_rows(page)) == 50  # the first page
    # the grid's images load lazily; made eager here, every one of the page's loads
    assert page.eval_on_selector_all("#grid img", "is => is.every(i => i.loading === 'lazy')")
    page.eval_on_selector_all("#grid img", "is => is.forEach(i => { i.loading = 'eager'; })")
    page.wait_for_function("[...document.querySelectorAll('#grid img')].every(i => i.complete)")
    widths = page.eval_on_selector_all("#grid img", "is => is.map(i => i.naturalWidth)")
    assert len(widths) == 50 * (1 + len(METHODS)) and set(widths) == {64 * N}  # sprite sheets of 64 tiles
    page.screenshot(path=str(shots / "report-grid.png"))

    # sort by Grad-CAM's energy in the mask, highest first: the order of the values computed here
    page.select_option("#sort", "m|0|energy in mask")
    page.select_option("#dir", "desc")
    want = sorted(range(N), key=lambda i: (-round(float(energy[i]), 4), i))
    assert _rows(page) == want[:50]
    assert "sort=m%7C0%7Cenergy+in+mask" in page.url and "dir=desc" in page.url

    # filter to the wrong predictions
    wrong = [i for i in want if preds[i] != data.shapes.labels[i]]
    assert wrong, "the test needs a wrong prediction among its images"
    page.select_option("#ok", "wrong")
    assert _rows(page) == wrong
    assert page.text_content("#count").startswith(f"{len(wrong)} of {N} images")
    page.screenshot(path=str(shots / "report-grid-wrong-by-energy.png"))
    # the state is in the URL: a fresh page on it shows the same view
    shared = page.url
    other = browser.new_page(viewport={"width": 1280, "height": 900})
    other.goto(shared)
    other.wait_for_selector("body[data-ready='1']")
    assert _rows(other) == wrong and other.input_value("#ok") == "wrong"
    other.close()

    # the detail view, by keyboard: focus the first row, Enter
    page.focus("#grid tbody tr")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#detail-maps[data-drawn='{wrong[0]}']")
    assert page.is_visible("#detail") and f"item={wrong[0]}" in page.url
    assert page.eval_on_selector_all("#detail-maps canvas", "cs => cs.length") == 1 + len(METHODS)  # image + maps
    page.wait_for_selector("#detail-maps canvas[data-loaded='1']")  # the image, drawn from its tile
    page.screenshot(path=str(shots / "report-detail.png"))
    page.select_option("#d-mode", "percentile")
    page.select_option("#d-scale", "shared")
    page.select_option("#d-cmap", "inferno")
    page.screenshot(path=str(shots / "report-detail-percentile-shared.png"))
    page.keyboard.press("Escape")
    assert page.is_hidden("#detail")
    assert page.evaluate("document.activeElement.dataset.item") == str(wrong[0])  # focus back on its row
    assert errors == []
    print(f"screenshots in {shots}")


@pytest.mark.parametrize("mode", ["seed", "minmax", "absmax", "percentile", "mass"])
@pytest.mark.parametrize("sign", ["all", "positive", "absolute"])
def test_page_normalizer_matches_display(site, browser, mode, sign):
    """The detail view redoes the display modes in the browser; they agree with hookviz.display.normalize."""
    index = site[0]
    page = browser.contexts[0].pages[0] if browser.contexts and browser.contexts[0].pages else browser.new_page()
    if not page.url.startswith(index.as_uri()):
        page.goto(index.as_uri())
        page.wait_for_selector("body[data-ready='1']")
    g = torch.Generator().manual_seed(0)
    maps = [torch.randn(1, 1, 8, 8, generator=g) ** 3, torch.randn(1, 1, 8, 8, generator=g) * 5]
    for scale in ("sample", "shared"):
        opts = {"mode": mode, "sign": sign, "scale": scale, "percentile": None}
        got = page.evaluate(
            "([maps, o]) => HV.normalizeMaps(maps.map(m => Float64Array.from(m)), o).map(a => Array.from(a))",
            [[m.flatten().tolist() for m in maps], opts],
        )
        if scale == "shared":
            want = hv.display.normalize(torch.cat(maps), mode, sign=sign, scale="shared")
        else:
            want = torch.cat([hv.display.normalize(m, mode, sign=sign) for m in maps])
        torch.testing.assert_close(torch.tensor(got).reshape(2, 1, 8, 8), want, atol=2e-6, rtol=0)


def test_summary_page(site, browser):
    index = site[0]
    page = browser.new_page()
    page.goto(index.with_name("summary.html").as_uri())
    heads = page.eval_on_selector_all("table.summary:first-of-type thead th", "hs => hs.map(h => h.textContent)")
    assert heads[:3] == ["method", "pointing game ↑", "energy in mask ↑"]
    rows = page.eval_on_selector_all("table.summary:first-of-type tbody th", "hs => hs.map(h => h.textContent)")
    assert rows == list(METHODS)
    data = json.loads(index.with_name("data").joinpath("items.js").read_text()[len("window.HV_DATA=") : -2])
    assert data["title"] == f"shapes {EVIL}"
    page.close()
