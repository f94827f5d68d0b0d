"""Build time and weight of `hookviz.report_generation` on a large prompt file, and how fast its pages open.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_report_generation.py [--n 1000] [--prompt 64] [--generated 64]
        [--methods 3] [--repeats 3] [--root DIR] [--out benchmarks/results/report-generation-cpu.md]

The explanations are synthetic (made here, not timed): ``--n`` prompts of ``--prompt`` tokens, each with
``--generated`` generated tokens, ``--methods`` methods, float32 scores drawn from a normal distribution with the
causal zeros (at and after each generated token's own position), three step scores; what a real run of
`explain_generation` returns, at the size the report must stay light at. Reported (median of ``--repeats``):

- the build's wall time, its files and bytes: ``data/items.js`` (read by every page load), the scores files (one per
  block of prompts, read when one of its prompts is opened) and the largest of them;
- in Chromium (``HOOKVIZ_CHROMIUM`` or ``/usr/bin/chromium``, tests/chromium.py), from ``goto`` in a fresh page: the
  list's first page shown (``body[data-ready]``); a prompt's detail view drawn (``#item=K``: its block loaded and
  inflated, every method's token view and heat map drawn); the list sorted by a mean step score (a ``change``
  event to the rows redrawn); in the page (``performance.now`` to the layout done): the next prompt drawn and
  another generated token chosen. The first round warms the browser's caches and is not counted. Nothing is
  asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import hookviz as hv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from chromium import CHROMIUM, FLAGS  # noqa: E402 (the browser tests' Chromium and flags)


def synthetic(n: int, p: int, g: int, methods: int) -> dict[str, hv.GenerationExplanation]:
    gen = torch.Generator().manual_seed(0)
    src = [[f" w{(i * 7 + j) % 5000}" for j in range(p + g)] for i in range(n)]
    future = torch.arange(p + g)[None, :] >= (p + torch.arange(g))[:, None]
    steps = {k: [torch.rand(g, generator=gen) for _ in range(n)] for k in ("probability", "log-probability", "entropy")}
    exps = {}
    for m in range(methods):
        scores = [torch.randn(g, p + g, generator=gen).masked_fill(future, 0.0) for _ in range(n)]
        exps[f"method-{m}"] = hv.GenerationExplanation(
            scores=scores,
            source_tokens=src,
            generated_tokens=[s[p:] for s in src],
            prompt_lengths=[p] * n,
            step_scores=steps,
            method=f"method-{m}",
            word_starts=[[True] * (p + g)] * n,
            prompts=["".join(s[:p]) for s in src],
        )
    return exps


# another generated token chosen: its token lines redrawn, the heat maps' chosen row moved
STEP = """() => { const t = performance.now(); document.querySelector('.gen-steps button:nth-child(3)').click();
  document.body.offsetHeight; return performance.now() - t; }"""
# the next prompt (same block of scores, already loaded) drawn, from the URL's change
NEXT = """(item) => new Promise((done) => { const t = performance.now(); location.hash = '#item=' + item;
  const poll = () => { if (document.querySelector(`#detail-body[data-drawn='${item}']`)) { document.body.offsetHeight;
  done(performance.now() - t); } else setTimeout(poll, 2); }; poll(); })"""


def browser_times(index: Path, repeats: int, item: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {"list": [], "detail": [], "sort": [], "step": [], "next": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for r in range(repeats + 1):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            t = time.perf_counter()
            page.goto(index.as_uri())
            page.wait_for_selector("body[data-ready='1']")
            shown = time.perf_counter() - t
            t = time.perf_counter()
            page.select_option("#sort", "s|probability")
            page.wait_for_function("location.hash.includes('sort=')")
            sort = time.perf_counter() - t
            page.close()
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            t = time.perf_counter()
            page.goto(index.as_uri() + f"#item={item}")
            page.wait_for_selector(f"#detail-body[data-drawn='{item}']")
            detail = time.perf_counter() - t
            # measured in the page (performance.now, up to the layout done): Playwright's own round trips left out
            step = page.evaluate(STEP)
            following = page.evaluate(NEXT, item + 1)
            page.close()
            if r:  # the first round warms the caches
                out["list"].append(shown)
                out["sort"].append(sort)
                out["detail"].append(detail)
                out["step"].append(step / 1000)
                out["next"].append(following / 1000)
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--generated", type=int, default=64)
    ap.add_argument("--methods", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--root", default="/tmp/hookviz-bench-report-generation")
    ap.add_argument("--out", default="benchmarks/results/report-generation-cpu.md")
    args = ap.parse_args()
    exps = synthetic(args.n, args.prompt, args.generated, args.methods)
    out = Path(args.root) / "report"
    load = os.getloadavg()
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        index = hv.report_generation(exps, out, overwrite=True)
        times.append(time.perf_counter() - t)
    files = [p for p in out.rglob("*") if p.is_file()]
    blocks = [p for p in (out / "data" / "g").iterdir()]
    mib = 2**20
    raw = args.n * args.methods * args.generated * (args.prompt + args.generated) * 4
    web = browser_times(index, args.repeats, item=args.n // 2)
    med = {k: statistics.median(v) * 1000 for k, v in web.items()}
    lines = [
        f"# report_generation: {args.n} prompts x ({args.prompt} prompt + {args.generated} generated tokens) x "
        f"{args.methods} methods",
        "",
        f"`{' '.join(['OMP_NUM_THREADS=' + os.environ.get('OMP_NUM_THREADS', '(unset)'), 'python', *sys.argv])}`; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} at the "
        f"start; torch {torch.__version__}; median of {args.repeats}.",
        "",
        "| what | value |",
        "|---|---:|",
        f"| build (wall) | {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}) |",
        f"| files | {len(files)} |",
        f"| all files | {sum(p.stat().st_size for p in files) / mib:.1f} MiB |",
        f"| the scores as raw float32 | {raw / mib:.1f} MiB |",
        f"| data/items.js (every page load) | {(out / 'data' / 'items.js').stat().st_size / 1024:.0f} KiB |",
        f"| scores files | {len(blocks)}, {sum(p.stat().st_size for p in blocks) / mib:.1f} MiB, the largest "
        f"{max(p.stat().st_size for p in blocks) / mib:.2f} MiB |",
        f"| Chromium: the list's first page shown | {med['list']:.0f} ms |",
        f"| Chromium: sorted by mean probability | {med['sort']:.0f} ms |",
        f"| Chromium: a prompt's detail view opened from its URL (its block loaded, every method drawn) | "
        f"{med['detail']:.0f} ms |",
        f"| Chromium, in the page: the next prompt drawn (same block) | {med['next']:.0f} ms |",
        f"| Chromium, in the page: another generated token chosen | {med['step']:.0f} ms |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
