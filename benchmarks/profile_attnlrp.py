"""Where an AttnLRP / CP-LRP call spends its time, op by op, beside the floor and lxt: torch.profiler's self CPU time
per aten op and autograd node, one call of each row after two warm-up calls, one thread.

    OMP_NUM_THREADS=1 python benchmarks/profile_attnlrp.py [--model llama] [--rows floor hookviz-attn-lrp-eps0
        lxt-attn-lrp] [--top 14]

The models, inputs and rows are `bench_attnlrp`'s (random weights, N = 1). Matrix products are the same work in every
row (their self time moves by a few ms between calls), so the rows differ in the rest: what the rules add (products,
divisions, norms' own Functions) and the page faults of memory first touched, which land in whichever op touches it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attnlrp as b  # noqa: E402


def main() -> None:
    """Profile each row once and print its most expensive ops."""
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama", choices=("llama", "vit_b_16", "vit_small", "bert_base"))
    ap.add_argument("--rows", nargs="+", default=["floor", "hookviz-attn-lrp-eps0", "lxt-attn-lrp"])
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, x = b.make_model(args.model), b.make_input(args.model, 1)
    rows = {r: b.build(r, args.model, model) for r in args.rows}
    for fn in rows.values():  # warm-up: allocator caches and lazily built state
        fn(x)
        fn(x)
    for row, fn in rows.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(x)
        events = prof.key_averages()
        mm = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::bmm", "aten::addmm"))
        total = sum(e.self_cpu_time_total for e in events)
        print(
            f"== {row}: self CPU {total / 1e3:.1f} ms, of which matrix products {mm / 1e3:.1f} ms, the rest "
            f"{(total - mm) / 1e3:.1f} ms; {sum(e.count for e in events)} ops"
        )
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
            print(f"  {e.key:58s} n={e.count:5d} self={e.self_cpu_time_total / 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
