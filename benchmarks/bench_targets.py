"""K targets per input: one backward pass per target over the retained graph ("loop") against one vectorized
backward pass ("vmap"), to choose what ``backward="auto"`` does (hookviz/targets.py `batched_grad`).

Usage::

    python benchmarks/bench_targets.py [--device cpu|cuda] [--size 224] [--n 1] [--k 10] [--repeats 5]
        [--models resnet18 vgg11] [--methods saliency guided-backprop gradcam]

torchvision models with ``weights=None`` (seed 0), eval mode. Each (model, method) row times ``attribute(x, target)``
with an (N, K) target under ``backward="loop"``, ``"vmap"`` and ``"auto"``, round-robin, after one warm-up call;
the median of the repeats in ms is printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torchvision

import hookviz as hv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=["resnet18", "vgg11"])
    parser.add_argument("--methods", nargs="+", default=["saliency", "guided-backprop", "gradcam"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"device {device}, torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}; N={args.n}, K={args.k}, {args.size}x{args.size}, "
        f"median of {args.repeats} (ms)\n"
    )
    print("| model | method | loop | vmap | auto | vmap / loop |\n|---|---|---:|---:|---:|---:|")
    for name in args.models:
        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None).eval().to(device)
        x = torch.randn(args.n, 3, args.size, args.size, device=device)
        target = torch.arange(args.k).repeat(args.n, 1)
        for key in args.methods:
            cls = hv.get_method(key)
            runs = {b: cls(model, backward=b) for b in ("loop", "vmap", "auto")}
            times: dict[str, list[float]] = {b: [] for b in runs}
            for method in runs.values():
                method.attribute(x, target)  # warm-up
            for _ in range(args.repeats):
                for b, method in runs.items():
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    method.attribute(x, target)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    times[b].append(1e3 * (time.perf_counter() - t))
            med = {b: statistics.median(v) for b, v in times.items()}
            print(
                f"| {name} | {key} | {med['loop']:.0f} | {med['vmap']:.0f} | {med['auto']:.0f} | "
                f"{med['vmap'] / med['loop']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
