"""Which methods work on which torchvision architectures, and what the ReLU coverage report says.

    python benchmarks/arch_table.py [--size 128] [--out benchmarks/results/architectures.md]

Random weights (weights=None, seed 0), one input per architecture; vit_b_16 at 224x224 (its fixed size). A cell is
"ok" when the method returns a finite, non-zero map, else the error's first words. Not a test: a record for the README.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch
from torchvision import models

import hookviz as hv
from hookviz.methods.guided import ReLURuleAttribution

ARCHS = ["resnet18", "vgg11", "densenet121", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16"]
# keep the sampling methods cheap: the table is about whether they run, not about their convergence
OPTIONS = {"smoothgrad": {"n": 4}, "integrated-gradients": {"steps": 8}}


def run_cell(method: hv.Attribution, x: torch.Tensor) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = method.attribute(x, target=0)
        except Exception as exc:  # the table records failures, it does not stop on them
            if "no ReLU ran" in str(exc):
                return "✗ no ReLU (use activations='all')"
            return f"✗ {type(exc).__name__}: {str(exc)[:70]}…"
    if not torch.isfinite(out).all():
        return "✗ non-finite"
    return "ok" if out.abs().sum() > 0 else "ok (all-zero map)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results/architectures.md")
    args = parser.parse_args()
    names = sorted(hv.METHODS)
    rows, coverage, layers = {}, {}, {}
    for arch in ARCHS:
        torch.manual_seed(0)
        model = getattr(models, arch)(weights=None).eval()
        if arch.startswith("vit"):  # torchvision zero-initialises the ViT head: every map would be empty
            torch.nn.init.normal_(model.heads.head.weight, std=0.02)
        size = 224 if arch.startswith("vit") else args.size
        x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        cells = {}
        for name in names:
            start = time.perf_counter()
            method = hv.METHODS[name](model, **OPTIONS.get(name, {}))
            cells[name] = run_cell(method, x)
            if isinstance(method, ReLURuleAttribution) and method.coverage is not None and name == "guided-backprop":
                coverage[arch] = str(method.coverage)
            if name == "gradcam":
                layers[arch] = method.layer
            print(f"{arch:20s} {name:22s} {cells[name][:60]:60s} {time.perf_counter() - start:6.1f} s", flush=True)
        rows[arch] = cells
    lines = [
        f"torch {torch.__version__}, random weights, one {args.size}x{args.size} input (vit_b_16: 224x224), target 0.",
        "",
        "| architecture | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for arch, cells in rows.items():
        lines.append(f"| {arch} | " + " | ".join(cells[n] for n in names) + " |")
    lines += ["", "| architecture | Grad-CAM layer (automatic) | Guided Backprop ReLU coverage |", "|---|---|---|"]
    for arch in ARCHS:
        lines.append(f"| {arch} | `{layers.get(arch)}` | {coverage.get(arch, '–')} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
