"""Overhead of the training-loop callbacks (`hookviz.integrations`) on real Lightning and Hugging Face training.

Usage::

    python benchmarks/bench_training.py [--rounds R] [--only shapes|resnet18|hf] [--out PATH]

Workloads (CPU, seeded, ``weights=None``):

- ``shapes``: a Lightning ``Trainer.fit`` of the shapes CNN (`hookviz.zoo.ShapesCNN`), 64x64 images, batch 32,
  2 epochs of 8 steps, SGD; rows: no callback; `GradientFlowCallback` at its default ``every=50`` and at
  ``every=1``; `ExplanationTrackerCallback` with Grad-CAM on 16 probe images at each epoch end (the default
  schedule; plus its one-off check and first snapshot at fit start); both callbacks together.
- ``resnet18``: the same Lightning loop on a torchvision resnet18 at 224x224, batch 2, 1 epoch of 4 steps; rows: no
  callback, `GradientFlowCallback(every=1)` and default, the tracker (4 probe images) at the epoch end.
- ``hf``: the Hugging Face ``Trainer`` on the shapes CNN (a wrapper that returns the loss), 8 steps of batch 32;
  rows: no callback, `GradientFlowCallback` default and ``every=1``.

``micro`` (first): paired per-step costs in one process, the robust figure on a loaded machine (see `micro`).

Each fit is timed from the first ``on_fit_start`` / ``on_train_begin`` to the last ``on_fit_end`` /
``on_train_end`` (the Trainer's own setup outside is the same for every row); rows run round-robin, in reverse
order every other round, each on a fresh copy of the same model; the overhead quoted is the median over the rounds
of ``time / plain time - 1`` in the same round.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookviz as hv
from hookviz.zoo import ShapesCNN, shapes


def _lightning():
    import lightning.pytorch as pl

    from hookviz.integrations.lightning import ExplanationTrackerCallback, GradientFlowCallback

    class Module(pl.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)

    class Timer(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            self.start = time.perf_counter()

        def on_fit_end(self, trainer, pl_module):
            self.seconds = time.perf_counter() - self.start

    return pl, Module, Timer, GradientFlowCallback, ExplanationTrackerCallback


def lightning_rows(workload: str) -> tuple[Callable[[str], float], list[str]]:
    pl, Module, Timer, GradientFlowCallback, ExplanationTrackerCallback = _lightning()
    if workload == "shapes":
        torch.manual_seed(0)
        base: nn.Module = ShapesCNN()
        d = shapes(8 * 32, seed=1, size=64)
        loader = DataLoader(TensorDataset(d.images, d.labels), batch_size=32, shuffle=False)
        probe = shapes(16, seed=2, size=64)
        epochs = 2
    else:
        import torchvision

        torch.manual_seed(0)
        base = torchvision.models.resnet18(weights=None, num_classes=10)
        x = torch.rand(8, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        loader = DataLoader(TensorDataset(x, torch.arange(8) % 10), batch_size=2, shuffle=False)
        probe = type("P", (), {"images": x[:4], "labels": torch.arange(4)})
        epochs = 1
    rows = {
        "plain": lambda: [],
        "GradientFlowCallback()": lambda: [GradientFlowCallback()],
        "GradientFlowCallback(every=1)": lambda: [GradientFlowCallback(every=1)],
        "ExplanationTrackerCallback(epoch)": lambda: [
            ExplanationTrackerCallback(hv.ExplanationTracker("gradcam", probe.images, target=probe.labels))
        ],
    }
    if workload == "shapes":
        rows["both (default)"] = lambda: [
            GradientFlowCallback(),
            ExplanationTrackerCallback(hv.ExplanationTracker("gradcam", probe.images, target=probe.labels)),
        ]

    def run(name: str) -> float:
        timer = Timer()
        trainer = pl.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            logger=False,
            callbacks=[timer, *rows[name]()],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=tempfile.mkdtemp(),
        )
        trainer.fit(Module(copy.deepcopy(base)), loader)
        return timer.seconds

    return run, list(rows)


def hf_rows() -> tuple[Callable[[str], float], list[str]]:
    import transformers

    from hookviz.integrations.transformers import GradientFlowCallback

    class Wrap(nn.Module):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, pixel_values, labels):
            logits = self.net(pixel_values)
            return {"loss": F.cross_entropy(logits, labels), "logits": logits}

    class Timer(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_train_end(self, args, state, control, **kw):
            self.seconds = time.perf_counter() - self.start

    torch.manual_seed(0)
    base = ShapesCNN()
    d = shapes(8 * 32, seed=1, size=64)
    items = [{"pixel_values": d.images[i], "labels": d.labels[i]} for i in range(len(d.images))]
    rows = {
        "plain": lambda: [],
        "GradientFlowCallback()": lambda: [GradientFlowCallback()],
        "GradientFlowCallback(every=1)": lambda: [GradientFlowCallback(every=1)],
    }

    def run(name: str) -> float:
        timer = Timer()
        args = transformers.TrainingArguments(
            output_dir=tempfile.mkdtemp(), max_steps=8, per_device_train_batch_size=32, use_cpu=True,
            report_to=[], save_strategy="no", disable_tqdm=True, logging_strategy="no", max_grad_norm=0.0,
        )  # fmt: skip
        model = Wrap(copy.deepcopy(base))
        trainer = transformers.Trainer(model=model, args=args, train_dataset=items, callbacks=[timer, *rows[name]()])
        trainer.train()
        return timer.seconds

    return run, list(rows)


def micro(rounds: int) -> dict[str, float]:
    """Paired per-step costs in one process, robust on a loaded machine: a shapes-CNN training step (the zoo's
    training: batch 64 at 64x64, AdamW) alone and with ``GradientFlow.step()`` at every step (what the callbacks do on
    a recorded step), interleaved; and one tracker snapshot (Grad-CAM of 16 probe images). The tracker's share of an
    epoch is ``snapshot / (96 steps * step)``, 96 being the zoo training's steps per epoch; the flow callback's
    share at ``every=N`` is the per-step overhead divided by N."""
    from hookviz import GradientFlow

    torch.manual_seed(0)
    model = ShapesCNN().train()
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3)
    d = shapes(64, seed=1, size=64)
    probe = shapes(16, seed=2, size=64)
    tracker = hv.ExplanationTracker("gradcam", probe.images, target=probe.labels)
    flow = GradientFlow(model, alarms=False).start()

    def step(with_flow: bool) -> float:
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(d.images), d.labels).backward()
        if with_flow:
            flow.step()
        opt.step()
        return time.perf_counter() - t

    def snap() -> float:
        t = time.perf_counter()
        tracker.snapshot(model, 0)
        return time.perf_counter() - t

    for _ in range(3):
        step(True), step(False), snap()
    plain, flowed, paired, snaps = [], [], [], []
    for r in range(rounds):
        a = step(False)
        b = step(True)
        plain.append(a), flowed.append(b), paired.append(b / a - 1)
        if r % 4 == 0:
            snaps.append(snap())
    flow.stop()
    step_s = statistics.median(plain)
    return {
        "step_ms": 1000 * step_s,
        "flow_step_ms": 1000 * statistics.median(flowed),
        "flow_every1_paired_overhead": statistics.median(paired),
        "snapshot_ms": 1000 * statistics.median(snaps),
        "tracker_share_of_96_step_epoch": statistics.median(snaps) / (96 * step_s),
    }


def measure(run: Callable[[str], float], names: list[str], rounds: int) -> dict[str, dict[str, float]]:
    run(names[0])  # warm-up: imports, allocator, first compilation
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(run(name))
            print(f"  round {r} {name}: {times[name][-1]:.2f} s", flush=True)
    plain = times["plain"]
    out = {}
    for name in names:
        paired = [t / p - 1 for t, p in zip(times[name], plain, strict=True)]
        out[name] = {
            "median_s": statistics.median(times[name]),
            "paired_overhead": statistics.median(paired),
            "overheads": paired,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["micro", "shapes", "resnet18", "hf"], action="append")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    results: dict[str, object] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": torch.get_num_threads()},
        "load_before": os.getloadavg(),
        "versions": {"torch": torch.__version__, "hookviz": hv.__version__, "python": sys.version.split()[0]},
    }
    for workload in args.only or ["micro", "shapes", "resnet18", "hf"]:
        print(workload, flush=True)
        if workload == "micro":
            results["micro"] = micro(40 * args.rounds)
            print(json.dumps(results["micro"], indent=1), flush=True)
            continue
        run, names = hf_rows() if workload == "hf" else lightning_rows(workload)
        results[workload] = measure(run, names, args.rounds)
        for name, row in results[workload].items():  # type: ignore[union-attr]
            print(f"{workload:9s} {name:36s} {row['median_s']:7.2f} s  {100 * row['paired_overhead']:+6.1f}%")
    results["load_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
