"""LRP against zennit and DeepLift against captum: time and peak memory on resnet18 / vgg16, vs the gradient floor.

    python benchmarks/bench_rules.py [--models resnet18 vgg16] [--size 224] [--repeats 5] [--no-memory]
        [--out benchmarks/results/rules-cpu]

Rows per model (N = 1, weights=None, eval mode, parameters frozen): ``floor`` (one forward + ``autograd.grad`` of the
target score w.r.t. the input: the least any backward-pass method can cost), ``zplus-floor`` (the floor plus one
convolution with the positive weights per convolution: the least an exact z+ rule can cost, since W+ x is not a
by-product of W x), hookviz ``LRP("epsilon-plus-flat")`` and ``LRP("epsilon")`` (no modified weights),
zennit ``EpsilonPlusFlat`` with its canonizer (``ResNetCanonizer`` / ``VGGCanonizer``), hookviz ``DeepLift`` and
captum ``DeepLift`` (zero baseline). The rows of a model are timed round-robin, ``--repeats`` times, median in ms;
peak memory of one call in a fresh process per row (peak RSS above the resident memory just before the call, as in
``bench_peers.py``). Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import _reset_peak_kib, _status_kib  # noqa: E402

import hookviz as hv  # noqa: E402

ROWS = (
    "floor",
    "zplus-floor",
    "hookviz-lrp",
    "hookviz-lrp-epsilon",
    "zennit-lrp",
    "hookviz-deeplift",
    "captum-deeplift",
)


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def build(row: str, model_name: str, model: nn.Module) -> Callable[[torch.Tensor], Any]:
    target = 3

    def floor(x: torch.Tensor) -> Any:
        x = x.detach().requires_grad_(True)
        return torch.autograd.grad(model(x)[:, target].sum(), x)[0]

    if row == "floor":
        return floor
    if row == "zplus-floor":
        # the floor plus, per convolution, the one extra convolution with the positive weights that any exact z+
        # rule needs (z+ = W+ x for x >= 0 is not a by-product of z = W x): the least epsilon-plus-flat can cost
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]

        def extra(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            with torch.no_grad():
                module._conv_forward(args[0], module.weight.clamp(min=0), None)

        def zplus_floor(x: torch.Tensor) -> Any:
            handles = [m.register_forward_hook(extra) for m in convs]
            try:
                return floor(x)
            finally:
                for h in handles:
                    h.remove()

        return zplus_floor
    if row in ("hookviz-lrp", "hookviz-lrp-epsilon"):
        lrp = hv.LRP(model, "epsilon-plus-flat" if row == "hookviz-lrp" else "epsilon")
        return lambda x: lrp.attribute(x, target)
    if row == "zennit-lrp":
        from zennit.attribution import Gradient
        from zennit.composites import EpsilonPlusFlat
        from zennit.torchvision import ResNetCanonizer, VGGCanonizer

        # torchvision's ResNets and VGGs get zennit's canonizer; another model (a plain CNN) none
        canon = [ResNetCanonizer()] if model_name.startswith("resnet") else []
        canon = [VGGCanonizer()] if model_name.startswith("vgg") else canon
        comp = EpsilonPlusFlat(canonizers=canon)

        def seed(out: torch.Tensor) -> torch.Tensor:  # one-hot at the target, shaped like the output
            return torch.zeros_like(out).index_fill_(1, torch.tensor([target]), 1.0)

        def zennit(x: torch.Tensor) -> Any:
            with Gradient(model=model, composite=comp) as attributor:
                return attributor(x, seed)[1]

        return zennit
    if row == "hookviz-deeplift":
        dl = hv.DeepLift(model)
        return lambda x: dl.attribute(x, target)
    from captum.attr import DeepLift

    cdl = DeepLift(model)

    def captum(x: torch.Tensor) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cdl.attribute(x, target=target)

    return captum


def child(args: argparse.Namespace) -> None:
    model = make_model(args.child_model)
    fn = build(args.child_row, args.child_model, model)
    x = torch.randn(1, 3, args.size, args.size)
    before = _reset_peak_kib()
    fn(x)
    print(json.dumps({"peak_mib": max(0.0, (_status_kib("VmHWM") - before) / 1024)}))


def peak(row: str, model: str, args: argparse.Namespace) -> float | None:
    cmd = [sys.executable, __file__, "--child-row", row, "--child-model", model, "--size", str(args.size)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"memory run failed for {row} {model}: {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "vgg16"])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/rules-cpu")
    ap.add_argument("--child-row", help=argparse.SUPPRESS)
    ap.add_argument("--child-model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_row:
        child(args)
        return
    results = []
    for model_name in args.models:
        model = make_model(model_name)
        x = torch.randn(1, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
        fns = {row: build(row, model_name, model) for row in ROWS}
        failed: dict[str, str] = {}
        for row, fn in list(fns.items()):  # warm-up; a peer that cannot explain the model gets a note, not a time
            try:
                fn(x)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                failed[row] = f"{type(exc).__name__}: {str(exc)[:90]}"
                del fns[row]
        for row, why in failed.items():
            results.append({"model": model_name, "row": row, "ms": None, "x_floor": None, "peak_mib": None,
                            "n": 1, "error": why})  # fmt: skip
            print(f"{model_name:10s} {row:20s} failed: {why}", flush=True)
        times: dict[str, list[float]] = {row: [] for row in fns}
        for _ in range(args.repeats):
            for row, fn in fns.items():
                t = time.perf_counter()
                fn(x)
                times[row].append((time.perf_counter() - t) * 1000)
        floor = statistics.median(times["floor"])
        for row in fns:
            med = statistics.median(times[row])
            mem = None if args.no_memory else peak(row, model_name, args)
            results.append(
                {"model": model_name, "row": row, "ms": med, "x_floor": med / floor, "peak_mib": mem, "n": 1}
            )
            print(f"{model_name:10s} {row:20s} {med:9.1f} ms  {med / floor:5.2f}x floor  peak {mem} MiB", flush=True)
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": args.size,
        "repeats": args.repeats,
        "device": "cpu",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    lines = [
        f"Rule-based backward passes, CPU ({meta['threads']} threads), N = 1, {args.size}x{args.size}, median of "
        f"{args.repeats}, torch {meta['torch']}",
        "",
        "| model | row | ms | x floor | peak MiB |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        mem = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        if r["ms"] is None:
            lines.append(f"| {r['model']} | {r['row']} | fails: {r['error']} | - | - |")
            continue
        lines.append(f"| {r['model']} | {r['row']} | {r['ms']:.1f} | {r['x_floor']:.2f} | {mem} |")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
