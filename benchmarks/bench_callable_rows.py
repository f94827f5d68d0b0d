"""What a callable target costs where the batch is expanded: it is called once per block of N rows (one path point,
one noisy copy, one mask of every input; hookviz/targets.py `aligned_scores`), against the same call with the
equivalent class-index target (one gather over all rows).

Usage::

    python benchmarks/bench_callable_rows.py [--device cpu|cuda] [--size 64] [--n 1] [--k 1 4] [--repeats 5]

torchvision resnet18 with ``weights=None`` (seed 0), eval mode, 10 classes. Rows: IntegratedGradients (64 steps,
one chunk), SmoothGrad over Saliency (32 copies), RISE (512 masks, chunks of 64), each with N inputs and K targets
per input, ``target=idx`` against ``target=lambda out: out.gather(1, idx)`` (an (N, K) callable over a per-input
tensor). Round-robin after one warm-up call; the median of the repeats in ms, and their ratio.
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
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(
        f"device {device}, torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}; N={args.n}, {args.size}x{args.size}, median of {args.repeats} (ms)\n"
    )
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).eval().to(device)
    x = torch.randn(args.n, 3, args.size, args.size, device=device)
    builders = {
        "integrated-gradients (64 steps)": lambda: hv.IntegratedGradients(model, steps=64),
        "smoothgrad (32 copies)": lambda: hv.SmoothGrad(
            hv.Saliency(model), n=32, generator=torch.Generator(device=device).manual_seed(0)
        ),
        "rise (512 masks, chunks of 64)": lambda: hv.RISE(
            model, n_masks=512, batch_size=64, softmax=False, progress=False
        ),
    }
    print("| method | K | index target | callable target | callable / index |\n|---|---:|---:|---:|---:|")
    for label, build in builders.items():
        for k in args.k:
            idx = torch.arange(k, device=device).repeat(args.n, 1)
            targets = {"index": idx if k > 1 else idx[:, 0], "callable": _callable(idx, k)}
            times: dict[str, list[float]] = {t: [] for t in targets}
            for target in targets.values():
                build().attribute(x, target=target)  # warm-up
            for _ in range(args.repeats):
                for name, target in targets.items():
                    method = build()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    method.attribute(x, target=target)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    times[name].append(1000 * (time.perf_counter() - start))
            a, b = statistics.median(times["index"]), statistics.median(times["callable"])
            print(f"| {label} | {k} | {a:.1f} | {b:.1f} | {b / a:.2f} |", flush=True)


def _callable(idx: torch.Tensor, k: int):
    if k == 1:
        return lambda out: out.gather(1, idx)[:, 0]
    return lambda out: out.gather(1, idx)


if __name__ == "__main__":
    main()
