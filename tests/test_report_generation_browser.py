"""The generation report in a real browser: headless Chromium through Playwright (tests/chromium.py: nothing is
downloaded; skipped without Chromium or Playwright). Screenshots go to ``HOOKVIZ_SCREENSHOTS`` (default: the test's
tmp_path); docs/generation-report.png is ``generation-report.png`` of a run with it set."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import torch
from chromium import require
from test_report_generation import METHODS, STEPS, explain_retrieval, handmade, script_data

import hookviz as hv
from hookviz.generation.views import finite_max
from hookviz.text import token_colour

require()  # skips this module without Playwright or Chromium

N = 60  # two pages of 50 rows; four blocks of 16 prompts
EVIL = "<script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    prompts, exps = explain_retrieval(N, seed=21)
    index = hv.report_generation(exps, tmp_path_factory.mktemp("genbrowser") / "r", title=f"retrieval {EVIL}")
    return index, prompts, exps


def _open(browser, url: str, errors: list[str] | None = None, **viewport):
    page = browser.new_page(viewport={"width": 1280, "height": 900, **viewport})
    if errors is not None:
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']")
    return page


def _rows(page) -> list[int]:
    return [int(v) for v in page.eval_on_selector_all("#grid tbody tr", "rs => rs.map(r => r.dataset.item)")]


def _shots(tmp_path: Path) -> Path:
    shots = Path(os.environ.get("HOOKVIZ_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def test_list_sort_filter_and_url(site, browser, tmp_path):
    index, prompts, exps = site
    errors: list[str] = []
    page = _open(browser, index.as_uri(), errors)
    assert page.evaluate("window.__pwned") is None and page.text_content("h1") == f"retrieval {EVIL}"
    # one row per prompt, 50 a page, in the file's order: its number, its text, the continuation, token counts
    assert _rows(page) == list(range(50))
    assert page.text_content("#count") == f"{N} of {N} prompts, page 1 of 2"
    cells = page.eval_on_selector_all("#grid tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    first = exps[METHODS[0]]
    for i, row in enumerate(cells):
        counts = f"{first.prompt_lengths[i]} + {len(first.generated_tokens[i])}"
        assert row[:4] == [str(i), prompts[i], "".join(first.generated_tokens[i]), counts]
        for text, k in zip(row[4:], STEPS, strict=True):  # the means to 4 significant digits
            mean = float(first.step_scores[k][i].double().mean())
            assert len(text.lstrip("-0.")) == 4 and math.isclose(float(text), mean, rel_tol=5e-4), (text, mean)
    page.click(".pager button:text('2')")
    assert _rows(page) == list(range(50, N)) and "page=2" in page.url

    # sort by the mean probability, lowest first: the order computed here (ties by prompt number)
    page.select_option("#sort", "s|probability")
    means = [float(v.double().mean()) for v in first.step_scores["probability"]]
    want = sorted(range(N), key=lambda i: (means[i], i))
    assert _rows(page) == want[:50] and "sort=s%7Cprobability" in page.url and "page" not in page.url
    page.select_option("#dir", "desc")
    # descending is the ascending order reversed (ties too), as in the image report
    assert _rows(page) == sorted(range(N), key=lambda i: (means[i], i), reverse=True)[:50]
    page.select_option("#sort", "p")  # prompt tokens, most first
    lengths = first.prompt_lengths
    by_length = sorted(range(N), key=lambda i: (lengths[i], i), reverse=True)
    assert len(set(lengths)) < N and _rows(page) == by_length[:50]  # ties among the lengths

    # the filter: text of the prompt or the continuation, case-insensitive
    page.fill("#q", " K3 ")
    texts = [(prompts[i] + "\n" + "".join(first.generated_tokens[i])).lower() for i in range(N)]
    hits = [i for i in by_length if "k3" in texts[i]]
    assert 2 <= len(hits) < N
    assert _rows(page) == hits[:50] and page.text_content("#count").startswith(f"{len(hits)} of {N} prompts")
    # the URL reproduces the view
    other = _open(browser, page.url)
    assert _rows(other) == hits[:50] and other.input_value("#q") == " K3 " and other.input_value("#sort") == "p"
    other.close()

    # the detail view by keyboard, its URL reproducing it with the method, unit, scale and generated token
    page.focus("#grid tbody tr")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#detail-body[data-drawn='{hits[0]}']")
    assert f"item={hits[0]}" in page.url and page.text_content("#detail-title") == f"prompt #{hits[0]}"
    page.select_option("#d-method", "1")
    page.select_option("#d-scale", "prompt")
    page.wait_for_selector("#detail-body[data-view='1,tokens,prompt,0']")
    again = _open(browser, page.url)
    again.wait_for_selector(f"#detail-body[data-drawn='{hits[0]}'][data-view='1,tokens,prompt,0']")
    assert again.input_value("#d-method") == "1" and again.input_value("#d-scale") == "prompt"
    names = again.eval_on_selector_all("section.gen-method h3 span", "hs => hs.map(h => h.textContent)")
    assert names == [METHODS[1]]
    again.close()
    page.keyboard.press("ArrowRight")  # the next prompt of the filtered, sorted list
    page.wait_for_selector(f"#detail-body[data-drawn='{hits[1]}']")
    page.keyboard.press("Escape")
    assert page.is_hidden("#detail") and page.evaluate("document.activeElement.dataset.item") == str(hits[0])
    assert errors == []


def _parse_rgba(text: str) -> tuple[int, int, int, float]:
    m = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, ([\d.]+))?\)", text)
    assert m, text
    return int(m[1]), int(m[2]), int(m[3]), float(m[4]) if m[4] is not None else 1.0


def _cells(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(
        selector, "cs => cs.map(c => ({text: c.textContent, colour: c.style.backgroundColor, title: c.title}))"
    )


def _check_colours(cells: list[dict], values: list[float], scale: float, src: list[str], gen: str) -> None:
    """Each cell's colour is `token_colour(value, scale)` (alpha written with 3 decimals, as views.to_html writes it;
    the browser keeps it to its own precision: within 1/255) and its title the stored float32 value, exactly."""
    assert len(cells) == len(values)
    for c, v, s in zip(cells, values, src, strict=True):
        r, g, b, a = token_colour(v, scale)
        got = _parse_rgba(c["colour"])
        assert got[:3] == (r, g, b) and abs(got[3] - round(a, 3)) <= 1 / 255, (c, v, scale)
        label, _, number = c["title"].rpartition(": ")
        assert label == f"{s} → {gen}"
        assert torch.tensor(float(number), dtype=torch.float32).item() == v  # the shortest text of the float32


def test_detail_colours_and_titles_match_python(site, browser):
    index, prompts, exps = site
    i = 37  # in the third block of scores
    page = _open(browser, index.as_uri() + f"#item={i}")
    page.wait_for_selector(f"#detail-body[data-drawn='{i}']")
    for scale in ("row", "prompt"):
        page.select_option("#d-scale", scale)
        page.wait_for_selector(f"#detail-body[data-view='all,tokens,{scale},0']")
        sections = page.eval_on_selector_all("section.gen-method", "ss => ss.map(s => s.dataset.method)")
        assert sections == ["0", "1", "2"]  # every method, one under the other (the default with several)
        for j, name in enumerate(METHODS):
            exp = exps[name]
            s, p = exp.scores[i], exp.prompt_lengths[i]
            gen = exp.generated_tokens[i][0]
            row = s[0].tolist()
            want_scale = finite_max(s[0]) if scale == "row" else finite_max(s)
            # the heat map's one row: the prompt's columns coloured, the generated token's own column grey
            tds = _cells(page, f"section.gen-method[data-method='{j}'] table.heat tbody tr td")
            assert len(tds) == p + 1
            _check_colours([c for c in tds if c["colour"]], row[:p], want_scale, exp.source_tokens[i][:p], gen)
            classes = page.eval_on_selector_all(
                f"section.gen-method[data-method='{j}'] table.heat tbody td", "cs => cs.map(c => c.className)"
            )
            assert classes[p].split() == ["future", "gen-start"]
            # the token view: the same colours on the source's tokens, the generated token outlined after them
            spans = _cells(page, f"section.gen-method[data-method='{j}'] .gen-line span:not(.gen-target)")
            assert [c["text"] for c in spans] == exp.source_tokens[i][:p]
            _check_colours(spans, row[:p], want_scale, exp.source_tokens[i][:p], gen)
            assert page.text_content(f"section.gen-method[data-method='{j}'] .gen-target") == gen
            heads = page.eval_on_selector_all(
                f"section.gen-method[data-method='{j}'] thead th.src", "hs => hs.map(h => h.textContent)"
            )
            assert heads == exp.source_tokens[i]


def test_word_units_match_aggregate(browser, tmp_path):
    """The page's words (pieces joined, scores summed) against GenerationExplanation.aggregate("words") in float64:
    the page sums the stored float32 values in float64, as the aggregate of the float64 copy does, in another order
    (float64 rounding only)."""
    exp = handmade()
    exp.scores[0][1, :2] = torch.tensor([0.25, -0.5])  # finite values where the handmade one has NaN / -inf
    index = hv.report_generation(exp, tmp_path / "r")
    page = _open(browser, index.as_uri())
    steps64 = {k: [v.double() for v in vs] for k, vs in exp.step_scores.items()}
    as64 = hv.GenerationExplanation(
        **{**exp.__dict__, "scores": [s.double() for s in exp.scores], "step_scores": steps64}
    )
    words = as64.aggregate("words")
    # at most 4 terms a sum (2 pieces x 2 pieces); each of its <= 3 additions rounds by <= 2^-53 of a partial sum
    # <= 4 x the largest |score|, in either order
    tol = 2 * 3 * 2**-53 * 4 * max(float(s.abs().max()) for s in exp.scores)
    for i in range(len(exp)):
        got = page.evaluate(f"HV.units(0, {i}, 0, true)")
        assert got["src"] == words.source_tokens[i] and got["gen"] == words.generated_tokens[i]
        assert got["p"] == words.prompt_lengths[i]
        want = words.scores[i]
        got_rows = torch.tensor(got["rows"], dtype=torch.float64).reshape(want.shape)
        assert torch.allclose(got_rows, want, rtol=0, atol=tol)
        steps = torch.tensor(got["steps"]["probability"], dtype=torch.float64)
        assert torch.allclose(steps, words.step_scores["probability"][i], rtol=1e-15, atol=0)
        tokens = page.evaluate(f"HV.units(0, {i}, 0, false)")  # tokens: the stored values themselves
        assert torch.equal(torch.tensor(tokens["rows"], dtype=torch.float64).reshape(exp.scores[i].shape),
                           exp.scores[i].double())  # fmt: skip
    assert words.source_tokens[0] == ["the", " cat", " sat", " on", " a"]  # what the check above covered
    # the toggle: the detail view in words, its rows and columns the words'
    page.goto(index.as_uri() + "#item=0&agg=words")
    page.wait_for_selector("#detail-body[data-view='0,words,row,0']")
    heads = page.eval_on_selector_all("thead th.src", "hs => hs.map(h => h.textContent)")
    assert heads == ["the", " cat", " sat", " on", " a"]
    assert page.eval_on_selector_all("table.heat tbody th", "hs => hs.map(h => h.textContent)") == [" on", " a"]
    page.click(".gen-steps button:nth-child(2)")  # the second generated word colours the source
    page.wait_for_selector("#detail-body[data-view='0,words,row,1']")
    assert "step=1" in page.url
    spans = _cells(page, ".gen-line span:not(.gen-target)")
    assert [c["text"] for c in spans] == ["the", " cat", " sat", " on"]
    row = words.scores[0][1]
    for c, v in zip(spans, row.tolist(), strict=False):
        r, g, b, a = token_colour(v, finite_max(row))
        got = _parse_rgba(c["colour"])
        assert got[:3] == (r, g, b) and abs(got[3] - round(a, 3)) <= 1 / 255
        assert math.isclose(float(c["title"].rpartition(": ")[2]), v, rel_tol=5e-6)  # sums: 6 significant digits


def test_text_from_data_is_shown_as_text(browser, tmp_path):
    """A prompt and tokens holding markup are shown as text: nothing runs, nothing is parsed."""
    exp = handmade(prompt=f"{EVIL} the cat sat")
    exp.source_tokens[0][1] = "<b>cat</b>"
    index = hv.report_generation({EVIL: exp}, tmp_path / "r", title=EVIL)
    errors: list[str] = []
    page = _open(browser, index.as_uri(), errors)
    assert page.text_content("h1") == EVIL and page.title() == EVIL
    assert page.text_content("#grid tbody tr td:nth-child(2)") == f"{EVIL} the cat sat"
    page.click("#grid tbody tr")
    page.wait_for_selector("#detail-body[data-drawn='0']")
    assert page.text_content(".gen-prompt") == f"{EVIL} the cat sat"
    assert page.text_content("section.gen-method h3 span") == f"{EVIL} (saliency)"
    assert "<b>cat</b>" in page.eval_on_selector_all("thead th.src", "hs => hs.map(h => h.textContent)")
    assert page.eval_on_selector_all("#detail b, #grid b", "bs => bs.length") == 0  # no element made of the text
    assert page.evaluate("window.__pwned") is None and errors == []


def test_screenshot(site, browser, tmp_path):
    """The list and a prompt's detail view, for docs/generation-report.png (looked at, not compared)."""
    index = site[0]
    shots = _shots(tmp_path)
    page = _open(browser, index.as_uri())
    page.screenshot(path=str(shots / "generation-report-list.png"))
    page.goto(index.as_uri() + "#item=3")
    page.wait_for_selector("#detail-body[data-drawn='3']")
    page.screenshot(path=str(shots / "generation-report.png"))
    assert (shots / "generation-report.png").stat().st_size > 10_000
    data = script_data(index.parent / "data" / "items.js", "window.HV_DATA")
    assert data["n"] == N
