"""Build time of `hookviz.report` and the first-page render time of the report in Chromium.

Usage::

    python benchmarks/bench_report.py [--n 10000] [--methods gradcam guided-backprop saliency] [--workers 1 2]
        [--repeats 3] [--root DIR] [--out benchmarks/results/report-cpu.json]

The stores are made once with `explain_dataset` (shapes data set, embedded shapes model, target="label"; not timed).
Then, per thread count in ``--workers``, the report is built ``--repeats`` times into the same folder (a rebuild
replaces the previous report) and the median wall time is reported, with min and max, images/s, the CPU time of the
process (all threads: on a shared machine, what the build would take on idle cores is about CPU time / workers), the
report's size and file count, and the ratio to the fastest setting. The **floor**: PNG-encoding (zlib level 1, one
thread) the images' own sprite sheets (64 thumbnails each), times 1 + the number of methods: what any static report
of these thumbnails must pay, before rendering a map or writing the detail view's map files.

First-page render: Chromium (``/usr/bin/chromium`` or ``HOOKVIZ_CHROMIUM``) through Playwright opens
``index.html`` from the file system ``--repeats`` times in fresh pages; the time runs from ``goto`` to the grid
drawn with its first three rows' images decoded and their method thumbnails drawn from the map files (as in the
browser test), median reported. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import hookviz as hv
from hookviz.zoo import ShapesDataset, shapes_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from chromium import CHROMIUM, FLAGS  # noqa: E402 (the browser tests' Chromium and flags)

# as tests/test_report_browser.py: the first three rows' images decoded and their method thumbnails drawn
FIRST_ROWS_DRAWN = (
    "[...document.querySelectorAll('#grid tbody tr:nth-child(-n+3) img')].every(i => i.complete && i.naturalWidth)"
    " && [...document.querySelectorAll('#grid tbody tr:nth-child(-n+3) canvas.tile')]"
    ".every(c => c.dataset.drawn === '1')"
)


def make_stores(root: Path, n: int, methods: list[str]) -> tuple[list[Path], ShapesDataset]:
    model, data = shapes_model(), ShapesDataset(n, seed=0)
    paths = []
    for m in methods:
        t = time.perf_counter()
        store = hv.explain_dataset(hv.METHODS[m](model), data, root / m, target="label", batch_size=256, progress=False)
        print(f"store {m}: {len(store)} maps in {time.perf_counter() - t:.1f} s (resumed if already there)")
        paths.append(root / m)
    return paths, data


def floor(data: ShapesDataset, columns: int) -> float:
    """Seconds to PNG-encode the images' sprite sheets on one thread, times 1 + columns."""
    from hookviz.display import to_pil, to_uint8

    images = data.shapes.images
    t = time.perf_counter()
    for a in range(0, images.shape[0], 64):
        # converted a sheet at a time: the whole set at once was killed for memory at 100,000 images
        sheet = torch.cat(to_uint8(images[a : a + 64]).unbind(0), dim=-1)
        to_pil(sheet).save(io.BytesIO(), format="PNG", compress_level=1)
    return (time.perf_counter() - t) * (1 + columns)


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def render_times(index: Path, repeats: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for _ in range(repeats + 1):  # the first load warms the browser's caches: not counted
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            t = time.perf_counter()
            page.goto(index.as_uri())
            page.wait_for_selector("body[data-ready='1']")
            page.wait_for_function(FIRST_ROWS_DRAWN)
            out.append(time.perf_counter() - t)
            page.close()
        browser.close()
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--methods", nargs="+", default=["gradcam", "guided-backprop", "saliency"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--root", default="/tmp/hookviz-bench-report")
    ap.add_argument("--out", default="benchmarks/results/report-cpu.json")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--render-repeats", type=int, default=None, help="first-page loads (default: --repeats)")
    args = ap.parse_args()
    root = Path(args.root)
    load_start = os.getloadavg()
    stores, data = make_stores(root / "stores", args.n, args.methods)
    rows = []
    report_dir = root / "report"
    for w in args.workers:
        times, cpu = [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), _cpu_seconds()
            index = hv.report(stores, report_dir, data=data, workers=w, overwrite=True)
            times.append(time.perf_counter() - t)
            cpu.append(_cpu_seconds() - c)
        files = [p for p in report_dir.rglob("*") if p.is_file()]
        med = statistics.median(times)
        rows.append(
            {
                "workers": w,
                "median_s": round(med, 2),
                "min_s": round(min(times), 2),
                "max_s": round(max(times), 2),
                "images_per_s": round(args.n / med, 1),
                # CPU time of all threads: on a loaded machine, wall time / this tells how much of the cores it got
                "cpu_s_median": round(statistics.median(cpu), 1),
                "files": len(files),
                "mbytes": round(sum(p.stat().st_size for p in files) / 2**20, 1),
                # per top-level folder (img: image sprite sheets, maps: the map files the page draws from, ...)
                "mbytes_by_folder": {
                    part: round(
                        sum(p.stat().st_size for p in files if p.relative_to(report_dir).parts[0] == part) / 2**20, 1
                    )
                    for part in sorted({p.relative_to(report_dir).parts[0] for p in files})
                },
            }
        )
        print(rows[-1])
    best = min(r["median_s"] for r in rows)
    for r in rows:
        r["ratio_to_fastest"] = round(r["median_s"] / best, 2)
    result = {
        "n": args.n,
        "methods": args.methods,
        "rows": rows,
        "floor_png_encode_1_thread_s": round(floor(data, len(args.methods)), 2),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if not args.no_browser:
        rt = render_times(index, args.render_repeats or args.repeats)
        result["first_page_render_ms"] = {
            "median": round(statistics.median(rt) * 1000),
            "min": round(min(rt) * 1000),
            "max": round(max(rt) * 1000),
        }
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
