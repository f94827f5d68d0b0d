"""Per-call overhead of the gradient and CAM families on the CPU: the proxy for a GPU at small batches and under bf16
(issue 35, parts 3 and 5).

    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py [--base REV] [--repeats 41]
        [--out benchmarks/results/overhead-cpu.md]

At batch 1 a GPU waits on the host: what a call costs is the Python that queues its kernels, and the kernels
themselves. Both show on the CPU with models too small to compute anything:

- host time per call (`time.process_time`, one torch thread, median of ``--repeats`` calls after warm-up; every
  repeat calls each row once, round-robin, the order reversed every other repeat) of hookviz's Saliency,
  GuidedBackprop and GradCAM against the floor: a hand-written forward and backward to the input (no hooks), and
  for Grad-CAM the CAM floor (the backward stops at the layer, then the mean-weighted channel sum and the ReLU);
- aten operations per call (a `TorchDispatchMode` counter, forward and backward passes alike: the backward of a
  CPU graph runs in the calling thread, where the mode is active), hookviz's against its floor's: the
  device-independent count of the extra kernels.

Configurations (random weights, seed 0, eval mode, parameters frozen):

- ``cnn``: three 3x3 convolutions (3 -> 8 -> 8 -> 8 channels) with ReLUs, average pooling and a linear layer on
  8x8 images, batch 1; Grad-CAM at the last ReLU (``5``);
- ``deep``: resnet50's number of ReLU calls (49) without its compute: a stem and 24 torchvision ``BasicBlock``s of
  8 channels (BatchNorm, in-place ReLUs, residual additions) on 8x8 images, batch 1; Grad-CAM at the blocks' output
  (``3``);
- ``resnet18``: torchvision's resnet18 on 32x32 images, batch 1 (17 ReLU calls); Grad-CAM at ``layer4``;
- ``resnet18-bf16``: the same at batch 16 with every row, floors included, under
  ``torch.autocast("cpu", dtype=torch.bfloat16)`` (part 5: the casts hookviz adds).

With ``--base REV`` that revision's ``hookviz/`` runs beside this checkout's (``bench_attnlrp_ab.extract``) as rows
``base ...``, in the same process and the same round-robin: before and after from one run.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("Saliency", "GuidedBackprop", "GradCAM")


# -- models ---------------------------------------------------------------------------------------------------------
def _frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    convs = [m for i in range(3) for m in (nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1), nn.ReLU())]
    return _frozen(nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)))


def deep_cnn() -> nn.Module:
    """resnet50's count of ReLU calls (49) and convolutions without its compute: a stem (3x3 convolution, BatchNorm,
    in-place ReLU) and 24 torchvision ``BasicBlock``s of 8 channels."""
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    stem = [nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True)]
    blocks = [BasicBlock(8, 8) for _ in range(24)]
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)]
    return _frozen(nn.Sequential(*stem, nn.Sequential(*blocks), *head))


def resnet18() -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    return _frozen(torchvision.models.resnet18(weights=None))


# name -> (model builder, image size, batch, bf16 autocast, Grad-CAM layer)
CONFIGS: dict[str, tuple[Callable[[], nn.Module], int, int, bool, str]] = {
    "cnn": (tiny_cnn, 8, 1, False, "5"),
    "deep": (deep_cnn, 8, 1, False, "3"),
    "resnet18": (resnet18, 32, 1, False, "layer4"),
    "resnet18-bf16": (resnet18, 32, 16, True, "layer4"),
}


# -- floors ---------------------------------------------------------------------------------------------------------
def floor(model: nn.Module, x: Tensor, t: Tensor) -> Callable[[], Tensor]:
    """Forward + the input gradient of the summed target scores; no hooks."""

    def fn() -> Tensor:
        inp = x.detach().requires_grad_(True)
        scores = model(inp).gather(1, t.view(-1, 1))
        (grad,) = torch.autograd.grad(scores.sum(), inp)
        return grad

    return fn


def cam_floor(model: nn.Module, x: Tensor, t: Tensor, layer: str) -> Callable[[], Tensor]:
    """Grad-CAM by hand: the layer's output made a leaf (the backward stops there), then ReLU(sum_k mean(g_k) A_k)."""
    module = dict(model.named_modules())[layer]

    def fn() -> Tensor:
        taken: list[Tensor] = []

        def leaf(m: nn.Module, args: tuple, out: Tensor) -> Tensor:
            taken.append(out.detach().requires_grad_(True))
            return taken[0]

        handle = module.register_forward_hook(leaf)
        try:
            out = model(x)
        finally:
            handle.remove()
        (grad,) = torch.autograd.grad(out.gather(1, t.view(-1, 1)).sum(), taken[0])
        return torch.relu((grad.mean((2, 3), keepdim=True) * taken[0]).sum(1, keepdim=True))

    return fn


def rows_for(config: str, packages: dict[str, str]) -> tuple[dict[str, Callable[[], Any]], bool]:
    build, size, n, bf16, layer = CONFIGS[config]
    model = build()
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    t = torch.arange(n) % 10
    rows: dict[str, Callable[[], Any]] = {"floor": floor(model, x, t), "CAM floor": cam_floor(model, x, t, layer)}
    for prefix, package in packages.items():
        hv = importlib.import_module(package)
        for method in METHODS:
            m = getattr(hv, method)(model, layer=layer) if method == "GradCAM" else getattr(hv, method)(model)
            rows[f"{prefix}{method}"] = lambda m=m: m.attribute(x, t)
    return rows, bf16


# -- measuring -------------------------------------------------------------------------------------------------------
class OpCounter(TorchDispatchMode):
    """Counts the aten operations (overload packets) that reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], Any], bf16: bool) -> Counter[str]:
    with autocast(bf16), OpCounter() as counter:
        fn()
    return counter.ops


def autocast(bf16: bool) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()


def time_rows(rows: dict[str, Callable[[], Any]], bf16: bool, repeats: int) -> dict[str, list[float]]:
    with autocast(bf16):
        for fn in rows.values():  # warm-up
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {r: [] for r in rows}
        order = list(rows)
        for i in range(repeats):
            for row in order if i % 2 == 0 else order[::-1]:
                t0 = time.process_time()
                rows[row]()
                times[row].append((time.process_time() - t0) * 1000)
    return times


def floor_of(row: str) -> str:
    return "CAM floor" if row.endswith("GradCAM") else "floor"


def extra_ops(ops: Counter[str], base: Counter[str]) -> str:
    """The multiset difference hookviz - floor, as ``op xN`` (and ``-op xN`` for ops the floor runs more often)."""
    more = ops - base
    fewer = base - ops
    parts = [f"{k} x{v}" for k, v in sorted(more.items(), key=lambda kv: (-kv[1], kv[0]))]
    parts += [f"-{k} x{v}" for k, v in sorted(fewer.items(), key=lambda kv: (-kv[1], kv[0]))]
    return ", ".join(parts) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a git revision whose hookviz runs beside this checkout's (rows 'base ...')")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", help="write the tables to this .md file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines: list[str] = []
    summary: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"": "hookviz"}
        if args.base:
            import bench_attnlrp_ab as ab

            ab.extract(args.base, Path(tmp))
            sys.path.insert(0, tmp)
            packages = {"base ": "hookviz_base", "": "hookviz"}
        for config in args.configs:
            rows, bf16 = rows_for(config, packages)
            ops = {row: count_ops(fn, bf16) for row, fn in rows.items()}
            times = time_rows(rows, bf16, args.repeats)
            _, size, n, _, layer = CONFIGS[config]
            title = f"**{config}** ({size}x{size}, batch {n}{', bf16 autocast' if bf16 else ''}; Grad-CAM at `{layer}`)"
            lines += [title, "", "| row | ms (median) | × floor | aten ops | extra ops against the floor |",
                      "|---|---:|---:|---:|---|"]  # fmt: skip
            med = {row: statistics.median(v) for row, v in times.items()}
            for row in rows:
                f = floor_of(row)
                ratio = med[row] / med[f]
                extra = "" if row in ("floor", "CAM floor") else extra_ops(ops[row], ops[f])
                lines.append(f"| {row} | {med[row]:.3f} | {ratio:.2f} | {sum(ops[row].values())} | {extra} |")
            lines.append("")
            print("\n".join(lines[-len(rows) - 5 :]), flush=True)
            if args.base:
                for method in METHODS:
                    f = floor_of(method)
                    old, new = med[f"base {method}"], med[method]
                    summary.append(
                        f"| {config} | {method} | {old:.3f} ({old / med[f]:.2f}) | {new:.3f} ({new / med[f]:.2f}) | "
                        f"{old - med[f]:+.3f} -> {new - med[f]:+.3f} | {sum(ops[f'base {method}'].values())} -> "
                        f"{sum(ops[method].values())} ({sum(ops[f].values())}) |"
                    )
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        head = "?"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "hookviz"], capture_output=True,
                           text=True).stdout.split("\n")  # fmt: skip
    dirty = [line[3:] for line in dirty if line.strip()]
    meta = (
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 torch thread; process CPU time, "
        f"median of {args.repeats} calls after 3 warm-up calls per row, rows round-robin; hookviz at {head}"
        + (f" (uncommitted in hookviz/: {', '.join(dirty)})" if dirty else "")
        + (f"; base rows: hookviz at {args.base}" if args.base else "")
        + ". No GPU: these are the CPU proxies for issue 35's GPU rows, not GPU figures."
    )
    if args.out:
        cmd = "OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py " + " ".join(sys.argv[1:])
        text = ["# Per-call overhead on the CPU (issue 35, parts 3 and 5)", "", f"`{cmd}`", "", meta, ""]
        if summary:
            text += [
                "**Before and after** (the base revision's rows against this checkout's, same run): ms per call "
                "(× its floor), hookviz's time above the floor, aten ops per call (the floor's).",
                "",
                "| config | method | before ms (× floor) | after ms (× floor) | ms above the floor | aten ops (floor) "
                "|",
                "|---|---|---:|---:|---:|---:|",
                *summary,
                "",
            ]
        text += lines
        Path(args.out).write_text("\n".join(text))
    print(meta)


if __name__ == "__main__":
    main()
