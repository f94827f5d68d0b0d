"""AttnLRP / CP-LRP in gradient-times-input form: this checkout's hookviz against another revision's, lxt and the
floor, round-robin in one process, paired differences.

    python benchmarks/bench_attnlrp_ab.py --base d9f0d94 [--models llama vit_b_16] [--variants attn cp]
        [--repeats 21] [--clock process]

The revision's ``hookviz/`` is extracted with ``git archive`` into a temporary folder as the package
``hookviz_base`` (its imports are relative), so both versions run side by side on the same model object
(`bench_attnlrp.make_model`, random weights, eval mode, parameters frozen; N = 1, one thread). Rows: ``base``,
``new`` (the composite with epsilon 0 and stabilizer 0), ``dense`` (``new`` with the output layer's backward product
taken whole, as lxt takes it; models with output embeddings), ``floor`` and lxt's rows where lxt runs the model
(`bench_attnlrp.lxt_model`). Each repeat runs every row once, in alternating order; per row the median time and the
median of the minor page faults of a call; then the median of the paired differences ``new - base`` and
``x - lxt``, steadier than the difference of the medians on a shared machine. ``--clock process``
(`time.process_time`, default) leaves out time the process waits for a core; ``--clock wall`` is the perf counter.
Set ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` to pin glibc's heap: which row's call finds its 16 MiB
logits gradient in fresh pages (4000 page faults, about 5 ms) otherwise depends on the rows before it.
"""

from __future__ import annotations

import argparse
import importlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attnlrp as b  # noqa: E402


def extract(rev: str, into: Path) -> None:
    """``hookviz/`` of `rev` as the package ``hookviz_base`` under `into`."""
    root = Path(__file__).resolve().parents[1]
    tar = subprocess.run(["git", "-C", str(root), "archive", rev, "hookviz"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    (into / "hookviz").rename(into / "hookviz_base")


def rows_for(name: str, variant: str, model: torch.nn.Module) -> dict[str, Callable[[torch.Tensor], Any]]:
    fns: dict[str, Callable[[torch.Tensor], Any]] = {}
    target = (lambda out: b._score(name, out)) if name == "llama" else b.TARGET
    for row, package in (("base", "hookviz_base"), ("new", "hookviz")):
        hv = importlib.import_module(package)
        comp = importlib.import_module(f"{package}.methods.lrp").composite(
            f"{variant}-lrp", epsilon=0.0, stabilizer=0.0
        )
        lrp = hv.LRP(model, comp, layer=b.LAYER.get(name))
        fns[row] = lambda x, lrp=lrp: lrp.attribute(x, target)
    if b.output_layer_of(model) is not None:  # this checkout's rows also with the head's product taken whole
        fns["dense"] = b.build(f"hookviz-{variant}-lrp-eps0-dense", name, model)
    fns["floor"] = b.build("floor", name, model)
    try:
        fns["lxt"] = b.build(f"lxt-{variant}-lrp", name, model)
    except RuntimeError as exc:  # lxt has no map for this model and variant
        print(f"{name} {variant}: no lxt row ({exc})", flush=True)
    return fns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare with")
    ap.add_argument("--models", nargs="+", default=["llama", "vit_b_16"], choices=["llama", "vit_b_16"])
    ap.add_argument("--variants", nargs="+", default=["attn", "cp"], choices=["attn", "cp"])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--clock", choices=["process", "wall"], default="process")
    args = ap.parse_args()
    torch.set_num_threads(1)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        extract(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        for name in args.models:
            model = b.make_model(name)
            x = b.make_input(name, 1)
            for variant in args.variants:
                fns = rows_for(name, variant, model)
                for fn in fns.values():  # warm-up
                    fn(x)
                times: dict[str, list[float]] = {r: [] for r in fns}
                faults: dict[str, list[int]] = {r: [] for r in fns}
                order = list(fns)
                for i in range(args.repeats):
                    for row in order if i % 2 == 0 else order[::-1]:
                        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                        t0 = clock()
                        fns[row](x)
                        times[row].append((clock() - t0) * 1000)
                        faults[row].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                for row in order:
                    print(f"{name:9s} {variant:4s} {row:5s} {statistics.median(times[row]):8.1f} ms  "
                          f"page faults {statistics.median(faults[row]):6.0f}")  # fmt: skip
                vs_lxt = [(r, "lxt") for r in ("base", "new", "dense") if "lxt" in times and r in times]
                pairs = [("new", "base"), *vs_lxt]
                for a, c in pairs:
                    d = statistics.median(u - v for u, v in zip(times[a], times[c], strict=True))
                    print(f"{name:9s} {variant:4s} {a} - {c}: {d:+.1f} ms (median of {args.repeats} paired)")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
