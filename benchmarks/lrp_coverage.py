"""`hv.LRP(model)` with no composite named on the image architectures of `arch_sweep.py`: the composite it picks, the
operations no rule covers (their plain gradient, which the engine warns about), and the conservation ratio.

    OMP_NUM_THREADS=1 python benchmarks/lrp_coverage.py [--out benchmarks/results/lrp-coverage.md]

Random weights, seed 0, one input per architecture at the sweep's size, target 0 (`arch_sweep.all_archs`, with the
heads the sweep makes live); Hugging Face BERT is left out (its token ids need ``layer=``). Conservation is input
relevance / f_c(x): random models' biases and class tokens absorb much of it, so it is a record, not a check.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from arch_sweep import all_archs, live_head

import hookviz as hv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/lrp-coverage.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for arch in all_archs():
        if arch.tokens is not None:
            continue
        torch.manual_seed(0)
        model = arch.build().eval()
        live_head(model)
        x = torch.randn(1, 3, arch.size, arch.size, generator=torch.Generator().manual_seed(1))
        try:
            lrp = hv.LRP(model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the uncovered operations are read from the report below
                lrp.attribute(x, 0)
        except Exception as exc:  # a record: the row says what failed
            rows.append((arch.name, "-", f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:80]}", "-"))
            continue
        assert lrp.rule_coverage is not None and lrp.audit is not None
        missed = lrp.rule_coverage.uncovered
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(missed.items())) if missed else "every operation covered"
        rows.append((arch.name, lrp.composite.name, ops, f"{float(lrp.audit.conservation[0]):.3f}"))
        print(f"{arch.name:34s} {lrp.composite.name:18s} {ops}", flush=True)
    covered = sum(r[2] == "every operation covered" for r in rows)
    lines = [
        f"`hv.LRP(model)` (no composite named) on the sweep's {len(rows)} image architectures (random weights, seed 0, "
        f"torch {torch.__version__}; `python benchmarks/lrp_coverage.py`): every operation covered on {covered}.",
        "",
        "| architecture | composite chosen | operations no rule covers | conservation |",
        "|---|---|---|---:|",
        *(f"| {a} | {c} | {o} | {k} |" for a, c, o, k in rows),
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
