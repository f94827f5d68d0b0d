"""Activation patching: sites per second batched over sites (``hv.patching``, with the prefix shared and with whole
forwards, ``share_prefix=False``) against one forward pass per site (the loop a user writes with ``hv.intervene`` +
``replace``, and the same loop with a plain forward hook), and attribution patching (one forward + one backward);
each warm (after the other variants) and in fresh processes.

Usage::

    python benchmarks/bench_patching.py [--device cpu|cuda] [--n 4] [--repeats 3] [--threads N]
        [--layer features.4] [--kind channel] [--batch-sizes 64 512 2048] [--fresh R] [--calls C] [--out FILE.md]
    python benchmarks/bench_patching.py --depth [--batch-sizes 64 512]   # the table over site depth

``--depth``: channel sites at each depth of the network (conv1 ... features.4), the loop against ``hv.patching`` with
the prefix shared, per batch size: early sites share little (the loop's forward is mostly after them), late sites
most.

The shapes CNN (``hookviz.zoo.shapes_model()``, 64x64 images) with N clean / corrupt pairs of the shapes data set;
every site of ``--layer`` (``--kind`` channel: 96 sites; spatial: 256). Each variant runs once to warm up, then
``--repeats`` times round-robin; the median time is reported with sites/s and the ratio to the per-site loop, and the
largest |difference| between the batched and looped values.

Warm is not what a fresh process sees. The variants allocate blocks of very different sizes (a chunk of 84 rows at
``features.4`` against the loop's 4), and glibc serves a block above its mmap threshold (128 KiB at the start) from a
fresh ``mmap`` whose pages are zeroed and faulted in on first touch; the threshold rises only when such a block is
freed (to its size; and the heap is trimmed back past twice that). In one process, a variant that allocates large
blocks (``share_prefix=False`` at ``batch_size=2048``) raises it for every variant timed after it. ``--fresh R`` times
each variant in R fresh processes (``--calls`` calls each, the variants' processes round-robin): the first call of the
process (after the setup the warm table has too: model, data, the clean cache, one plain forward), and the later calls
with no other variant before them. Each call's minor page faults (``ru_minflt``) and CPU time come with it; the
ratios are taken on CPU time where one torch thread runs on the CPU (the machine's other processes then slow the wall
clock, not the work), else on the wall clock. ``--out FILE.md`` writes the tables and every call in ``FILE.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_attribution import cpu_name, git_state

import hookviz as hv
from hookviz.interventions import replace
from hookviz.zoo import shapes, shapes_model

LOOP = "one forward per site"
HOOK_LOOP = "one forward per site, plain forward hook"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--layer", default="features.4")
    parser.add_argument("--kind", default="channel", choices=["channel", "spatial"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--depth", action="store_true", help="the table over site depth instead")
    parser.add_argument("--fresh", type=int, default=0, help="fresh processes per variant (0: none)")
    parser.add_argument("--calls", type=int, default=3, help="calls per fresh process (at least 2)")
    parser.add_argument("--only", nargs="+", default=None, help="time only these variants (by name)")
    parser.add_argument("--out", type=Path, default=None, help="write the tables (markdown) and a .json beside")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[dict[str, Callable[[], torch.Tensor]], int]:
    """The model, the pairs, the clean cache and one plain forward (what every process, warm or fresh, has done
    before the timed calls); the variants by name, each returning the (N, sites) metric values; the number of sites."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = shapes_model().to(device)
    data = shapes(2 * args.n, seed=0)
    clean, corrupt = data.images[: args.n].to(device), data.images[args.n :].to(device)
    labels = data.labels[: args.n].to(device)

    def metric(out: torch.Tensor) -> torch.Tensor:
        return out.gather(1, labels[:, None])[:, 0]

    acts = hv.cache(model, clean, layers=[args.layer])
    with torch.no_grad():
        model(corrupt)
    shape = acts[args.layer].shape
    n_sites = shape[1] if args.kind == "channel" else shape[2] * shape[3]

    def selection(s: int) -> dict:
        if args.kind == "channel":
            return {"channels": [s]}
        y, x = divmod(s, shape[3])
        return {"region": (y, y + 1, x, x + 1)}

    def loop() -> torch.Tensor:
        out = torch.empty(args.n, n_sites, device=device)
        with torch.no_grad():
            for s in range(n_sites):
                with hv.intervene(model, {args.layer: replace(acts, **selection(s))}):
                    out[:, s] = metric(model(corrupt))
        return out

    site, source = model.get_submodule(args.layer), acts[args.layer]

    def hook_loop() -> torch.Tensor:
        """What a user writes without hookviz: a forward hook that returns the output with the site replaced."""
        out = torch.empty(args.n, n_sites, device=device)
        with torch.no_grad():
            for s in range(n_sites):
                if args.kind == "channel":
                    where: tuple = (slice(None), s)
                else:
                    where = (slice(None), slice(None), *divmod(s, shape[3]))

                def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor, where: tuple = where):
                    output = output.clone()
                    output[where] = source[where]
                    return output

                handle = site.register_forward_hook(hook)
                try:
                    out[:, s] = metric(model(corrupt))
                finally:
                    handle.remove()
        return out

    variants: dict[str, Callable[[], torch.Tensor]] = {LOOP: loop, HOOK_LOOP: hook_loop}
    for bs in args.batch_sizes:
        for share in (True, False):
            variants[f"patching batch_size={bs}" + ("" if share else " share_prefix=False")] = (
                lambda bs=bs, share=share: hv.patching(
                    model, clean, corrupt, metric, {args.layer: args.kind}, batch_size=bs, share_prefix=share
                )[args.layer].reshape(args.n, -1)
            )
    variants["attribution_patching"] = lambda: hv.attribution_patching(
        model, clean, corrupt, metric, {args.layer: args.kind}
    )[args.layer].reshape(args.n, -1)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only or k == LOOP}
    return variants, n_sites


def timed_call(fn: Callable[[], torch.Tensor], device: torch.device) -> dict[str, float]:
    """Wall and CPU milliseconds of one call, and the minor page faults it took."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    faults, cpu, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    return {
        "ms": 1e3 * wall,
        "cpu_ms": 1e3 * (time.process_time() - cpu),
        "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
    }


def child(args: argparse.Namespace) -> None:
    """`--calls` calls of one variant in this fresh process; prints them as JSON."""
    variants, _ = setup(args)
    fn = variants[args.child]
    print(json.dumps([timed_call(fn, torch.device(args.device)) for _ in range(args.calls)]))


def fresh_runs(args: argparse.Namespace, names: list[str]) -> dict[str, list[list[dict]]]:
    """Per variant, the calls of each of its `--fresh` processes; the processes of the variants round-robin (the
    order rotated every round)."""
    runs: dict[str, list[list[dict]]] = {name: [] for name in names}
    base = [sys.executable, __file__, "--device", args.device, "--n", str(args.n), "--layer", args.layer,
            "--kind", args.kind, "--calls", str(args.calls), "--batch-sizes", *map(str, args.batch_sizes)]  # fmt: skip
    if args.threads:
        base += ["--threads", str(args.threads)]
    for r in range(args.fresh):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            proc = subprocess.run([*base, "--child", name], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"fresh process for {name!r} failed: {proc.stderr.strip()[-500:]}")
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def spread(values: list[float], scale: float = 1.0) -> str:
    return f"{statistics.median(values) * scale:.1f} ({min(values) * scale:.1f}-{max(values) * scale:.1f})"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    if args.fresh and args.calls < 2:
        parser_error = "--calls must be at least 2 with --fresh (the first call and the later ones)"
        raise SystemExit(parser_error)
    device = torch.device(args.device)
    load_before = os.getloadavg()[0]
    if args.depth:
        depth_table(args)
        return
    variants, n_sites = setup(args)
    results = {name: fn() for name, fn in variants.items()}  # warm-up, and the values to compare
    calls: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            calls[name].append(timed_call(fn, device))
    load_warm = os.getloadavg()[0]
    names = list(variants)
    runs = fresh_runs(args, names) if args.fresh else {}
    load_after = os.getloadavg()[0]
    # the ratios: on CPU time where one thread runs on the CPU (other processes on the machine then slow the wall
    # clock, not the work), else on the wall clock
    basis = "cpu_ms" if device.type == "cpu" and torch.get_num_threads() == 1 else "ms"
    what = "CPU time" if basis == "cpu_ms" else "wall time"

    def med(cs: list[dict], field: str = basis) -> float:
        return statistics.median(c[field] for c in cs)

    warm = {name: med(calls[name]) for name in names}
    lines = [
        f"shapes CNN, {args.layer} x {args.kind}: {n_sites} sites, N={args.n}, device {device} ({cpu_name()}, "
        f"{os.cpu_count()} CPUs), torch {torch.__version__}, {torch.get_num_threads()} torch threads; 1-minute load "
        f"average {load_before:.2f} at the start, {load_warm:.2f} after the warm table, {load_after:.2f} at the end",
        "",
        f"**Warm**: every variant called once, then {args.repeats} times round-robin in one process; per call: wall "
        f"ms, median (min-max), CPU ms and minor page faults (medians); × loop: the loop's median {what} over the "
        "variant's.",
        "",
        "| variant | ms | CPU ms | page faults | sites/s | × loop | max abs diff vs loop |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        c = calls[name]
        diff = (results[name] - results[LOOP]).abs().max().item()
        lines.append(
            f"| {name} | {spread([x['ms'] for x in c])} | {med(c, 'cpu_ms'):.1f} | {med(c, 'faults'):.0f} | "
            f"{n_sites / med(c, 'ms') * 1e3:.0f} | {warm[LOOP] / warm[name]:.2f}x | {diff:.2e} |"
        )
    if runs:
        first = {name: [r[0] for r in runs[name]] for name in names}
        later = {name: [c for r in runs[name] for c in r[1:]] for name in names}
        lines += [
            "",
            f"**Fresh**: each variant in {args.fresh} fresh processes (round-robin), {args.calls} calls each: the "
            "first call of the process, and the later ones (no other variant before them); wall ms, median (min-max), "
            f"CPU ms and minor page faults (medians); × loop: against the same column of the loop, and × warm: the "
            f"later calls against the warm table, both on {what}.",
            "",
            "| variant | first call ms | CPU ms | page faults | × loop | later calls ms | CPU ms | page faults "
            "| × loop | × warm |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in names:
            f, rest = first[name], later[name]
            lines.append(
                f"| {name} | {spread([x['ms'] for x in f])} | {med(f, 'cpu_ms'):.1f} | {med(f, 'faults'):.0f} | "
                f"{med(first[LOOP]) / med(f):.2f}x | {spread([x['ms'] for x in rest])} | {med(rest, 'cpu_ms'):.1f} | "
                f"{med(rest, 'faults'):.0f} | {med(later[LOOP]) / med(rest):.2f}x | {med(rest) / warm[name]:.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    if args.out:
        state = git_state()
        dirty = state["hookviz_uncommitted"]
        head = (
            f"Written by `python benchmarks/bench_patching.py {' '.join(sys.argv[1:] if argv is None else argv)}` "
            f"on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; hookviz at {state['commit']}"
            f"{' with uncommitted changes to ' + ', '.join(dirty) if dirty else ''}."
        )
        args.out.write_text(f"# Activation patching, warm and fresh\n\n{head}\n\n{text}\n")
        meta = {"load": [load_before, load_warm, load_after], **state, "threads": torch.get_num_threads()}
        args.out.with_suffix(".json").write_text(
            json.dumps({"meta": meta, "warm": calls, "fresh": runs}, indent=1) + "\n"
        )


DEPTHS = ("conv1", "conv2", "conv3", "features.0", "features.3", "features.4")


def depth_table(args: argparse.Namespace) -> None:
    """Channel sites at each depth: the loop (one forward per site) against `hv.patching` with the prefix shared."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model = shapes_model().to(args.device)
    data = shapes(2 * args.n, seed=0)
    clean, corrupt = data.images[: args.n].to(args.device), data.images[args.n :].to(args.device)
    labels = data.labels[: args.n].to(args.device)

    def metric(out: torch.Tensor) -> torch.Tensor:
        return out.gather(1, labels[:, None])[:, 0]

    acts = hv.cache(model, clean, layers=list(DEPTHS))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    # whether each call shared its prefix (it declines where sharing would not pay): read off its private planner
    module = sys.modules["hookviz.interventions.patching"]
    planner, shared_at = module._shared_plan, {}

    def spy(model, target_in, key, n_sites):
        plan = planner(model, target_in, key, n_sites)
        shared_at[key] = plan is not None
        return plan

    module._shared_plan = spy

    def loop(layer: str) -> torch.Tensor:
        out = torch.empty(args.n, acts[layer].shape[1])
        with torch.no_grad():
            for c in range(out.shape[1]):
                with hv.intervene(model, {layer: replace(acts, channels=[c])}):
                    out[:, c] = metric(model(corrupt))
        return out

    rows = []
    for layer in DEPTHS:
        variants = {"loop": lambda layer=layer: loop(layer)}
        for bs in args.batch_sizes:
            variants[bs] = lambda layer=layer, bs=bs: hv.patching(
                model, clean, corrupt, metric, {layer: "channel"}, batch_size=bs
            )[layer]
        results = {name: fn() for name, fn in variants.items()}
        times: dict = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        floor = statistics.median(times["loop"])
        cells = []
        for bs in args.batch_sizes:
            med = statistics.median(times[bs])
            diff = (results[bs] - results["loop"]).abs().max().item()
            cells.append(f"{med:.3f} s, {floor / med:.1f}x, diff {diff:.0e}")
        shared = "yes" if shared_at.get(layer) else "no (would not pay)"
        rows.append(f"| {layer} | {acts[layer].shape[1]} | {shared} | {floor:.3f} | " + " | ".join(cells) + " |")
    print(
        f"shapes CNN, channel sites per layer, N={args.n}, threads {torch.get_num_threads()}, median of "
        f"{args.repeats}; load average after: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)"
    )
    head = " | ".join(f"patching, batch_size={bs}" for bs in args.batch_sizes)
    print(f"| layer | sites | prefix shared | loop (s) | {head} |")
    print("|---|---|---|---|" + "---|" * len(args.batch_sizes))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
