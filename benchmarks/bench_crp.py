"""CRP with K condition sets in one call against K separate calls (issue 36's speed target).

Usage::

    python benchmarks/bench_crp.py [--threads 1] [--repeats 5] [--batch 2] [--ks 1 8 32] [--out PATH.md]

Models (eval mode, CPU): the zoo's shapes CNN (shipped weights, 64x64, conditions on ``features.3``, 96 channels,
composite epsilon-plus-flat) and torchvision's resnet18 (weights=None, 64x64, conditions on ``layer3``, 256 channels,
epsilon-plus-flat). Per K, the conditions are channels 0..K-1 one each:

- ``one call``: ``crp.attribute(x, t, conditions=[{layer: c} for c in range(K)])``: one forward pass, one backward
  pass from the score to the layer, K backward passes from the layer to the input;
- ``K calls``: ``crp.attribute(x, t, conditions={layer: c})`` for each c: K forward and K full backward passes.

One warm-up call each, then the median of ``--repeats`` repeats in seconds, printed as a Markdown table (and written
to ``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torchvision.models import resnet18

import hookviz as hv
from hookviz.zoo import shapes, shapes_model


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = shapes(args.batch, seed=11).images
    models = [
        ("shapes CNN", shapes_model().eval(), "features.3"),
        ("resnet18", resnet18(weights=None).eval(), "layer3"),
    ]
    rows = []
    for label, model, layer in models:
        crp = hv.CRP(model, "epsilon-plus-flat")
        target = model(x).argmax(1)
        for k in args.ks:
            conds = [{layer: c} for c in range(k)]
            one = _median(lambda conds=conds, crp=crp, t=target: crp.attribute(x, t, conditions=conds), args.repeats)
            many = _median(
                lambda conds=conds, crp=crp, t=target: [crp.attribute(x, t, conditions=c) for c in conds], args.repeats
            )
            rows.append((label, layer, k, one, many))
            print(f"{label} K={k}: one call {one:.3f} s, K calls {many:.3f} s", flush=True)
    lines = [
        f"CRP, K conditions: one call vs K calls (CPU, {args.threads} thread(s), batch {args.batch}, 64x64, median "
        f"of {args.repeats}; torch {torch.__version__})",
        "",
        "| model | layer | K | one call (s) | K calls (s) | speed-up |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {m} | `{layer}` | {k} | {a:.3f} | {b:.3f} | {b / a:.1f}x |" for m, layer, k, a, b in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
