"""TCAV's cost on the shapes data: CAVs for 10 concepts x 3 layers x 20 random sets (issue 36's speed target).

Usage::

    python benchmarks/bench_tcav.py [--device cpu|cuda] [--threads 1] [--repeats 3] [--per-set 50]
        [--layers conv3 features.1 features.4] [--pool flatten] [--out PATH.md]

The zoo's shapes CNN (shipped weights), eval mode. Concepts: 10 sets of ``--per-set`` shapes images (one class each,
the 8 classes then the first two again from another seed); random: a pool of 2 x 20 x ``--per-set`` shapes images
(40 disjoint random sets: 20 counter-example sets, and the 20 random concepts of the null, ``null="independent"``).
Per CAV kind (logistic, mean), each repeat on a fresh `hv.TCAV`:

- ``activations + CAVs``: `TCAV.compute_cavs` from nothing: the forward passes over every example, then the
  10 x 20 concept CAVs and the 20 null CAVs at each of the 3 layers (660 CAVs);
- ``CAVs only``: `compute_cavs` again with the activations cached and the CAV cache cleared (the training alone);
- ``interpret, cached``: `TCAV.interpret` of 100 images with everything cached (gradients, scores and t-tests).

The median of the repeats in seconds is printed as a Markdown table (and written to ``--out``), wall time and
process CPU time (with ``--threads 1`` the CPU time is the work, which a shared machine's other processes do not
stretch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import hookviz as hv
from hookviz.zoo import shapes, shapes_model


def _timed(fn, cpu: list[float]) -> float:  # noqa: ANN001
    """Wall seconds of fn(); its process CPU seconds appended to `cpu` (with one thread: the work itself, which
    other processes on a shared machine do not stretch as they stretch the wall time)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-set", type=int, default=50)
    parser.add_argument("--n-random", type=int, default=20)
    parser.add_argument("--layers", nargs="+", default=["conv3", "features.1", "features.4"])
    parser.add_argument("--pool", default="flatten")
    parser.add_argument("--out", default=None, help="also write the table to this Markdown file")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = shapes_model().to(device).eval()
    k = args.per_set
    data = shapes(40 * k, seed=11)
    more = shapes(40 * k, seed=12)
    concepts = {}
    for i in range(10):
        source = data if i < 8 else more
        concepts[f"{hv.zoo.CLASSES[i % 8]}{'' if i < 8 else '-2'}"] = source.images[source.labels == i % 8][:k]
    pool = shapes(2 * args.n_random * k, seed=13).images  # disjoint sets: n_random counter-examples, n_random nulls
    inputs = shapes(100, seed=14).images
    header = (
        f"TCAV on the shapes CNN, {args.device}, {torch.get_num_threads()} thread(s): 10 concepts x "
        f"{len(args.layers)} layers ({', '.join(args.layers)}, pool={args.pool!r}) x {args.n_random} random sets, "
        f"{k} examples per set; median of {args.repeats} repeats, seconds"
    )
    head = ["| CAV | activations + CAVs | CAVs only | interpret 100 inputs, cached |", "|---|---|---|---|"]
    lines, cpu_lines = [header, "", *head], ["", "The same calls, process CPU seconds (median):", "", *head]
    for cav in ("logistic", "mean"):
        cold, warm, interp = [], [], []
        cpu: list[list[float]] = [[], [], []]
        for _ in range(args.repeats):
            tcav = hv.TCAV(model, list(args.layers), cav=cav, pool=args.pool)
            cold.append(_timed(lambda t=tcav: t.compute_cavs(concepts, pool, n_random=args.n_random), cpu[0]))
            tcav._cavs.clear()
            warm.append(_timed(lambda t=tcav: t.compute_cavs(concepts, pool, n_random=args.n_random), cpu[1]))
            interp.append(
                _timed(lambda t=tcav: t.interpret(inputs, concepts, pool, target=5, n_random=args.n_random), cpu[2])
            )
            del tcav
        row = [statistics.median(v) for v in (cold, warm, interp)]
        lines.append(f"| {cav} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
        cpu_lines.append(f"| {cav} | " + " | ".join(f"{statistics.median(v):.2f}" for v in cpu) + " |")
    text = "\n".join(lines + cpu_lines)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
