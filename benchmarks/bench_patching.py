"""Activation patching: sites per second batched over sites (``hv.patching``, with the prefix shared and with whole
forwards, ``share_prefix=False``) against one forward pass per site (the loop a user writes with ``hv.intervene`` +
``replace``), and attribution patching (one forward + one backward).

Usage::

    python benchmarks/bench_patching.py [--device cpu|cuda] [--n 4] [--repeats 3] [--threads N]
        [--layer features.4] [--kind channel] [--batch-sizes 64 512 2048]
    python benchmarks/bench_patching.py --depth [--batch-sizes 64 512]   # the table over site depth

``--depth``: channel sites at each depth of the network (conv1 ... features.4), the loop against ``hv.patching`` with
the prefix shared, per batch size: early sites share little (the loop's forward is mostly after them), late sites
most.

The shapes CNN (``hookviz.zoo.shapes_model()``, 64x64 images) with N clean / corrupt pairs of the shapes data set;
every site of ``--layer`` (``--kind`` channel: 96 sites; spatial: 256). Each variant runs once to warm up, then
``--repeats`` times round-robin; the median time is reported with sites/s and the ratio to the per-site loop, and the
largest |difference| between the batched and looped values (they must agree).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import hookviz as hv
from hookviz.interventions import replace
from hookviz.zoo import shapes, shapes_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--layer", default="features.4")
    parser.add_argument("--kind", default="channel", choices=["channel", "spatial"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--depth", action="store_true", help="the table over site depth instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = shapes_model().to(device)
    data = shapes(2 * args.n, seed=0)
    clean, corrupt = data.images[: args.n].to(device), data.images[args.n :].to(device)
    labels = data.labels[: args.n].to(device)

    def metric(out: torch.Tensor) -> torch.Tensor:
        return out.gather(1, labels[:, None])[:, 0]

    load_before = os.getloadavg()[0]
    if args.depth:
        depth_table(model, clean, corrupt, metric, args)
        return
    acts = hv.cache(model, clean, layers=[args.layer])
    shape = acts[args.layer].shape
    n_sites = shape[1] if args.kind == "channel" else shape[2] * shape[3]

    def loop() -> torch.Tensor:
        out = torch.empty(args.n, n_sites, device=device)
        with torch.no_grad():
            for s in range(n_sites):
                sel = {"channels": [s]} if args.kind == "channel" else {"region": divmod(s, shape[3])}
                if args.kind == "spatial":
                    y, x = sel.pop("region")
                    sel["region"] = (y, y + 1, x, x + 1)
                with hv.intervene(model, {args.layer: replace(acts, **sel)}):
                    out[:, s] = metric(model(corrupt))
        return out

    variants = {"one forward per site": loop}
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

    results = {name: fn() for name, fn in variants.items()}  # warm-up, and the values to compare
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
    floor = statistics.median(times["one forward per site"])
    print(f"load average before: {load_before:.2f}, after: {load_after()}")
    print(
        f"shapes CNN, {args.layer} x {args.kind}: {n_sites} sites, N={args.n}, device {device}, "
        f"threads {torch.get_num_threads()}, median of {args.repeats}"
    )
    print("| variant | time (s) | sites/s | speed-up vs loop | max abs diff vs loop |")
    print("|---|---|---|---|---|")
    for name in variants:
        med = statistics.median(times[name])
        diff = (results[name] - results["one forward per site"]).abs().max().item()
        print(f"| {name} | {med:.3f} | {n_sites / med:.1f} | {floor / med:.2f}x | {diff:.2e} |")


def load_after() -> str:
    return f"{os.getloadavg()[0]:.2f} (1-minute load average of the machine, {os.cpu_count()} cores)"


DEPTHS = ("conv1", "conv2", "conv3", "features.0", "features.3", "features.4")


def depth_table(model: torch.nn.Module, clean: torch.Tensor, corrupt: torch.Tensor, metric, args) -> None:
    """Channel sites at each depth: the loop (one forward per site) against `hv.patching` with the prefix shared."""
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
        f"{args.repeats}; load average after: {load_after()}"
    )
    head = " | ".join(f"patching, batch_size={bs}" for bs in args.batch_sizes)
    print(f"| layer | sites | prefix shared | loop (s) | {head} |")
    print("|---|---|---|---|" + "---|" * len(args.batch_sizes))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
