"""The report in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright's Python API
(tests/chromium.py: nothing is downloaded; skipped without Chromium or Playwright). Screenshots go to
``HOOKVIZ_SCREENSHOTS`` (default: the test's tmp_path) and the first-page render time is printed (``-s`` shows it)
and recorded as a property: measured, never asserted.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from chromium import CHROMIUM, FLAGS, require

import hookviz as hv
from hookviz.display_options import resolve_options
from hookviz.zoo import ShapesDataset, shapes_model

require()  # skips this module without Playwright or Chromium

N = 64
# the grid drawn with its first three rows' images decoded and their method thumbnails drawn
FIRST_ROWS_DRAWN = (
    "[...document.querySelectorAll('#grid tbody tr:nth-child(-n+3) img')].every(i => i.complete && i.naturalWidth)"
    " && [...document.querySelectorAll('#grid tbody tr:nth-child(-n+3) canvas.tile')]"
    ".every(c => c.dataset.drawn === '1')"
)
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
    page.wait_for_function(FIRST_ROWS_DRAWN)
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
    assert len(widths) == 50 and set(widths) == {64 * N}  # the images: sprite sheets of 64 tiles
    # the methods' thumbnails are canvases drawn from the map files, only once near the view: rows far below the
    # 900-pixel viewport (and the rootMargin) are not drawn yet, and are when scrolled to
    assert page.eval_on_selector_all("#grid canvas.tile", "cs => cs.length") == 50 * len(METHODS)
    last = "#grid tbody tr:last-child canvas.tile"
    assert page.eval_on_selector_all(last, "cs => cs.every(c => !c.dataset.drawn)")
    page.eval_on_selector(last, "c => c.scrollIntoView()")
    page.wait_for_function(f"[...document.querySelectorAll('{last}')].every(c => c.dataset.drawn === '1')")
    page.eval_on_selector("#grid tbody tr", "r => r.scrollIntoView()")
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


@pytest.fixture(scope="module")
def reader(playwright):
    """A Chromium that lets file:// pages read their own images back from a canvas (a file:// image taints the canvas
    it is drawn on otherwise), so the drawn thumbnails' pixels can be compared with Python's."""
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=[*FLAGS, "--allow-file-access-from-files"])
    try:
        yield b
    finally:
        b.close()


def _drawn_thumbnails(browser, index: Path, n: int, methods: int) -> dict[tuple[int, int], np.ndarray]:
    """{(item, method): (h, w, 3) uint8} of every method thumbnail the grid's first page draws."""
    page = browser.new_page(viewport={"width": 1280, "height": 40000})  # every row in view: all drawn
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(index.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_function(
        f"document.querySelectorAll('canvas.tile[data-drawn=\"1\"]').length === {min(n, 50) * methods}"
    )
    got = page.evaluate(
        "() => [...document.querySelectorAll('canvas.tile')].map(c => [+c.dataset.item, +c.dataset.method, c.width,"
        " c.height, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)])"
    )
    page.close()
    assert errors == []
    return {(i, j): np.array(px, dtype=np.uint8).reshape(h, w, 4)[..., :3] for i, j, w, h, px in got}


def _check_thumbnails(drawn, columns, images, thumb) -> None:
    """Drawn thumbnails against `thumbnails.render` (Explanation.overlay / heatmap over the full-precision maps),
    resized to the thumbnail and rounded: the bound, per column kind, with where it comes from.

    - 3-channel maps shown as RGB: at most 1 (round(x * 255) of a value that differs by the 16-bit codes, ~1e-5 of
      the range, and float64 in the page against float32 in torch; both can land on either side of a .5).
    - maps through a colour map: where the normalised value sits on the edge of one of the 256 bins, the same tiny
      difference can pick the next bin: at most the largest step between neighbouring entries of the colour map
      (jet 5, gray 1); elsewhere equal.
    - overlays: the canvas blends in 8 bits with an 8-bit opacity (round(alpha * 255) / 255) over the image's own
      8-bit tile, against float blending in torch: at most 1 more (2 with an opacity per pixel), and a bin step
      counts alpha times.
    Bin changes must be rare: fewer than 0.1 % of the pixels differ by more than the blending's own bound (or 1).
    """
    from hookviz.report import thumbnails

    for j, column in enumerate(columns):
        n = len(column.targets)
        want = hv.display.to_uint8(hv.display.resize(thumbnails.render(column, images, 0, n), thumb))
        want = want.permute(0, 2, 3, 1).numpy().astype(np.int32)
        got = np.stack([drawn[i, j] for i in range(min(n, 50))]).astype(np.int32)
        diff = np.abs(got - want[: got.shape[0]])
        o = resolve_options(column.display, "report", {})
        rgb = column.maps[0:1].shape[1] == 3 and not o["overlay"] and column.display.get("reduce") is None
        lut = hv.display.to_uint8(hv.display._lut(o["cmap"], torch.device("cpu"))).int()
        step = int((lut[1:] - lut[:-1]).abs().max())
        # blending: 1 with one opacity; with an opacity per pixel (alpha_by_map) the canvas also keeps the layer's
        # colours premultiplied by that 8-bit opacity, half a level more each way: 2
        blend = (2 if o["alpha_by_map"] else 1) if o["overlay"] else 0
        bound = 1 if rgb else (math.ceil(o["alpha"] * step) + blend if o["overlay"] else step)
        assert diff.max() <= bound, (column.name, int(diff.max()), bound)
        assert (diff > max(blend, 1)).mean() < 1e-3, (column.name, float((diff > max(blend, 1)).mean()))


def test_thumbnails_drawn_in_the_page_equal_python(site, reader):
    """The grid's method thumbnails, drawn by the page from the map files, against Python's (64 x 64 images, which
    are their own thumbnails): Grad-CAM over the image, Guided Backprop as RGB, Saliency through grey."""
    from hookviz.report.stores import Column

    index, data = site[0], site[1]
    drawn = _drawn_thumbnails(reader, index, N, len(METHODS))
    root = index.parent.parent
    columns = []
    for m in METHODS:
        store = hv.load_explanations(root / m)
        columns.append(Column(m, store[:], store.targets, store.scores, dict(hv.METHODS[m].display_defaults), {}))
    _check_thumbnails(drawn, columns, data.shapes.images, (64, 64))


def test_thumbnails_drawn_of_images_larger_than_a_thumbnail(tmp_path, reader):
    """160 x 160 images, thumbnails of 128 x 128: the page draws each map at the image's size and resizes it, as
    Python resizes its full-size drawing (a 10 x 10 Grad-CAM grid upsampled twice, gradients at the image's size)."""
    from hookviz.report.build import _memory_columns

    n = 6
    data = ShapesDataset(n, seed=4, size=160)
    g = torch.Generator().manual_seed(1)
    maps = {
        "gradcam": torch.randn(n, 1, 10, 10, generator=g).relu(),
        "guided-backprop": torch.randn(n, 3, 160, 160, generator=g),
        "saliency": torch.randn(n, 3, 160, 160, generator=g) ** 3,
    }
    index = hv.report(maps, tmp_path / "r", data=data, workers=1)
    drawn = _drawn_thumbnails(reader, index, n, 3)
    assert drawn[0, 0].shape == (128, 128, 3)
    _check_thumbnails(drawn, _memory_columns(maps), data.shapes.images, (128, 128))


def test_thumbnails_drawn_overlay_with_opacity_by_map(tmp_path, reader, monkeypatch):
    """Guided Backprop overlaid (display defaults changed here): its 3 channels reduced with max-abs as
    Explanation.overlay does, its opacity per pixel alpha * hookviz.display.magnitude, drawn by the page."""
    from hookviz.report.build import _memory_columns

    monkeypatch.setattr(hv.GuidedBackprop, "display_defaults", {**hv.GuidedBackprop.display_defaults, "overlay": True})
    n = 6
    data = ShapesDataset(n, seed=6)
    g = torch.Generator().manual_seed(2)
    maps = {"guided-backprop": torch.randn(n, 3, 64, 64, generator=g) ** 3}
    index = hv.report(maps, tmp_path / "r", data=data, workers=1)
    columns = _memory_columns(maps)
    assert resolve_options(columns[0].display, "report", {})["alpha_by_map"] is True
    _check_thumbnails(_drawn_thumbnails(reader, index, n, 1), columns, data.shapes.images, (64, 64))
