"""Throughput of `hookviz.explain_dataset` against a hand-written loop and against the floor, in images/s.

Usage::

    python benchmarks/bench_dataset.py [--device cpu|cuda] [--sets shapes resnet18] [--n-shapes 2048]
        [--n-resnet 256] [--batch-size 64] [--workers 2] [--method saliency] [--out PATH.json]

Two sets: ``shapes`` (hookviz.zoo.ShapesDataset and zoo.shapes_model when the zoo has them, else a shapes-like
stand-in: (3, 64, 64) images and a small 4-conv CNN) and ``resnet18`` (torchvision resnet18, weights=None, seed 0,
on (3, 224, 224) images). The images are made once and held in memory by the data set, so every contender pays the
same (small) cost per item and the comparison is about the pipeline.

- ``floor``: the batches preloaded as tensors on the device, forward plus ``torch.autograd.grad`` of the top scores
  w.r.t. the input, no hooks, nothing kept;
- ``hand loop``: a DataLoader with the same workers, ``method.attribute(x)`` per batch, ``torch.save`` per batch;
- ``explain_dataset``: ``explain_dataset(method, data, out, batch_size, num_workers, dtype="float16")``.

Each contender runs once over the set after a warm-up batch; images/s = items / wall time. On a GPU (``--device
cuda``) the batch size defaults to 256 and every contender runs in fp32 and under bf16 autocast.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hookviz as hv


class InMemory(Dataset):
    """(image, label) pairs held in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


def shapes_set(n: int) -> tuple[nn.Module, InMemory, str]:
    from hookviz import zoo

    if hasattr(zoo, "ShapesDataset") and hasattr(zoo, "shapes_model"):
        ds = zoo.ShapesDataset(n, seed=0)
        items = [ds[i] for i in range(n)]
        images = torch.stack([it[0] for it in items])
        labels = torch.tensor([int(it[1]) for it in items])
        return zoo.shapes_model().eval(), InMemory(images, labels), "zoo.ShapesDataset + zoo.shapes_model"
    torch.manual_seed(0)
    images = torch.rand(n, 3, 64, 64)
    labels = torch.randint(0, 3, (n,))
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 3),
    ).eval()  # fmt: skip
    return model, InMemory(images, labels), "stand-in: random (3, 64, 64) images, 4-conv CNN (zoo not merged yet)"


def resnet_set(n: int) -> tuple[nn.Module, InMemory, str]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    return model, InMemory(torch.randn(n, 3, 224, 224), torch.randint(0, 1000, (n,))), "resnet18, 224x224"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def floor(model: nn.Module, data: InMemory, bs: int, device: torch.device) -> float:
    batches = [data.images[i : i + bs].to(device) for i in range(0, len(data), bs)]

    def one(x: torch.Tensor) -> None:
        x = x.requires_grad_(True)
        out = model(x)
        (g,) = torch.autograd.grad(out.gather(1, out.detach().argmax(1, keepdim=True)).sum(), x)
        del g

    for p in model.parameters():
        p.requires_grad_(False)
    one(batches[0].clone())  # warm-up
    sync(device)
    start = time.perf_counter()
    for x in batches:
        one(x)
    sync(device)
    return len(data) / (time.perf_counter() - start)


def hand_loop(method: Any, data: InMemory, bs: int, workers: int, device: torch.device, tmp: Path) -> float:
    tmp.mkdir(parents=True, exist_ok=True)
    loader = DataLoader(data, batch_size=bs, num_workers=workers, pin_memory=device.type == "cuda")
    method.attribute(data.images[:bs].to(device))  # warm-up
    sync(device)
    start = time.perf_counter()
    for i, (x, _) in enumerate(loader):
        maps = method.attribute(x.to(device, non_blocking=True))
        torch.save(maps.half().cpu(), tmp / f"batch-{i:05d}.pt")
    sync(device)
    return len(data) / (time.perf_counter() - start)


def dataset_run(method: Any, data: InMemory, bs: int, workers: int, device: torch.device, tmp: Path) -> float:
    method.attribute(data.images[:bs].to(device))  # warm-up
    sync(device)
    start = time.perf_counter()
    hv.explain_dataset(method, data, tmp, batch_size=bs, num_workers=workers, shard_size=16 * bs, progress=False)
    sync(device)
    return len(data) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sets", nargs="+", default=["shapes", "resnet18"], choices=["shapes", "resnet18"])
    parser.add_argument("--n-shapes", type=int, default=2048)
    parser.add_argument("--n-resnet", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--method", default="saliency")
    parser.add_argument("--out", default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    device = torch.device(args.device)
    bs = args.batch_size or (256 if device.type == "cuda" else 64)
    precisions = ["fp32", "bf16"] if device.type == "cuda" else ["fp32"]
    print(
        f"device {device}, torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}; batch {bs}, {args.workers} workers, method {args.method}\n"
    )
    print("| set | precision | items | floor img/s | hand loop img/s | explain_dataset img/s | × floor | × hand loop |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in args.sets:
        model, data, note = shapes_set(args.n_shapes) if name == "shapes" else resnet_set(args.n_resnet)
        model = model.to(device)
        for precision in precisions:
            tmp = Path(tempfile.mkdtemp(prefix="hookviz-bench-"))
            try:
                ctx = (
                    torch.autocast(device.type, dtype=torch.bfloat16)
                    if precision == "bf16"
                    else torch.autocast(device.type, enabled=False)
                )
                with ctx:
                    method = hv.get_method(args.method)(model)
                    r_floor = floor(model, data, bs, device)
                    r_hand = hand_loop(method, data, bs, args.workers, device, tmp / "hand")
                    r_ds = dataset_run(method, data, bs, args.workers, device, tmp / "ds")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            row = {"set": name, "note": note, "precision": precision, "items": len(data), "floor": r_floor,
                   "hand_loop": r_hand, "explain_dataset": r_ds}  # fmt: skip
            rows.append(row)
            print(
                f"| {name} | {precision} | {len(data)} | {r_floor:.1f} | {r_hand:.1f} | {r_ds:.1f} | "
                f"{r_ds / r_floor:.2f} | {r_ds / r_hand:.2f} |",
                flush=True,
            )
    for row in rows:
        print(f"\n{row['set']}: {row['note']}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": str(device), "batch_size": bs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
