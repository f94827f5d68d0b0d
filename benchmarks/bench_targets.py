"""K targets per input: one backward pass per target over the retained graph ("loop") against one vectorized
backward pass ("vmap"), to choose what ``backward="auto"`` does (hookviz/targets.py `batched_grad`).

Usage::

    python benchmarks/bench_targets.py [--device cpu|cuda] [--size 224] [--ns 1 8 64 128] [--k 10] [--repeats 5]
        [--models resnet18 vgg11] [--methods saliency guided-backprop gradcam] [--out PATH.md]

torchvision models with ``weights=None`` (seed 0), eval mode. Each (model, method) row times ``attribute(x, target)``
with an (N, K) target under ``backward="loop"``, ``"vmap"`` and ``"auto"``, round-robin, after one warm-up call, for
each N of ``--ns``; the median of the repeats in ms is printed as a Markdown table (and written to ``--out``), with
the elements the backward pass differentiates (what ``auto`` decides by) and whether auto is within 5% of the faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torchvision

import hookviz as hv
import hookviz.targets as hv_targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--ns", type=int, nargs="+", default=[1])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=["resnet18", "vgg11"])
    parser.add_argument("--methods", nargs="+", default=["saliency", "guided-backprop", "gradcam"])
    parser.add_argument("--out", default=None, help="also write the table to this Markdown file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    lines = [
        f"device {device}, torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}; K={args.k}, {args.size}x{args.size}, median of {args.repeats} (ms); "
        f"`python benchmarks/bench_targets.py --ns {' '.join(map(str, args.ns))} --size {args.size} --k {args.k} "
        f"--models {' '.join(args.models)}`",
        "",
        "| model | method | N | elements | loop | vmap | auto | vmap / loop | auto within 5% |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    print("\n".join(lines), flush=True)
    for name in args.models:
        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None).eval().to(device)
        for n in args.ns:
            x = torch.randn(n, 3, args.size, args.size, device=device)
            target = torch.arange(args.k).repeat(n, 1)
            for key in args.methods:
                lines.append(row(name, key, model, x, target, args.repeats, device))
                print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


def row(name: str, key: str, model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, repeats: int,
        device: torch.device) -> str:  # fmt: skip
    cls = hv.get_method(key)
    runs = {b: cls(model, backward=b) for b in ("loop", "vmap", "auto")}
    times: dict[str, list[float]] = {b: [] for b in runs}
    seen: dict[str, int] = {}
    real = hv_targets.auto_strategy

    def spy(dev: torch.device, work: int | None = None) -> str:
        seen["work"] = work or 0
        return real(dev, work)

    for method in runs.values():
        method.attribute(x, target)  # warm-up
    for _ in range(repeats):
        for b, method in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            method.attribute(x, target)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[b].append(1e3 * (time.perf_counter() - t))
    hv_targets.auto_strategy = spy  # the elements the pass differentiates, as auto sees them
    try:
        runs["auto"].attribute(x, target)
    finally:
        hv_targets.auto_strategy = real
    med = {b: statistics.median(v) for b, v in times.items()}
    ok = med["auto"] <= 1.05 * min(med["loop"], med["vmap"])
    work = seen.get("work", 0)
    return (
        f"| {name} | {key} | {x.shape[0]} | {work:,} | {med['loop']:.1f} | {med['vmap']:.1f} | {med['auto']:.1f} | "
        f"{med['vmap'] / med['loop']:.2f} | {'yes' if ok else 'no'} |"
    )


if __name__ == "__main__":
    main()
