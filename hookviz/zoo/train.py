"""Training the shapes CNN: ``python -m hookviz.zoo.train --out FILE`` reproduces the shipped weights byte for byte."""

from __future__ import annotations

import argparse
import hashlib
import math
import time
from collections.abc import Sequence
from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F

from .._progress import progress_bar
from .data import shapes
from .model import ShapesCNN, _load_weights, accuracy

FRESH_SEED = 0  # the split `train` reports; training draws from seeds 1_000_000 + 1000 * seed + epoch only
_TRAIN_SEED_BASE = 1_000_000


def train(
    out: str | Path,
    *,
    seed: int = 0,
    epochs: int = 8,
    per_epoch: int = 6144,
    batch_size: int = 64,
    lr: float = 4e-3,
    fresh: int = 2000,
    progress: bool = True,
) -> dict[str, float | str]:
    """Train a `ShapesCNN` and write its float16 state dict to `out` (safetensors); returns the fresh-split accuracy
    and sha256.

    Each epoch draws `per_epoch` new images (seed ``1_000_000 + 1000 * seed + epoch``; random horizontal flips on
    top), AdamW with a one-cycle learning rate (Smith & Topin, 2019). The accuracy is measured after the round trip
    through float16, on `fresh` images of seed `FRESH_SEED`, which training never draws from.
    """
    torch.manual_seed(seed)
    model = ShapesCNN().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=5e-4)
    steps = epochs * math.ceil(per_epoch / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25)
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    bar = progress_bar(total=steps, enabled=progress, desc="train", unit="step")
    for epoch in range(epochs):
        data = shapes(per_epoch, seed=_TRAIN_SEED_BASE + 1000 * seed + epoch)
        order = torch.randperm(per_epoch, generator=g)
        model.train()
        right = seen = 0
        for i in range(0, per_epoch, batch_size):
            idx = order[i : i + batch_size]
            x, y = data.images[idx], data.labels[idx]
            flip = torch.rand(len(idx), generator=g) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x).contiguous(memory_format=torch.channels_last)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            right += (logits.argmax(1) == y).sum().item()
            seen += len(idx)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", acc=f"{right / seen:.3f}")
            bar.update()
    bar.close()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # safetensors: a JSON header and the raw tensors, the same bytes for the same weights whatever the file's name
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}
    out.write_bytes(safetensors.torch.save(state))
    trained = ShapesCNN()
    trained.load_state_dict(_load_weights(out, hashlib.sha256(out.read_bytes()).hexdigest()))
    return {
        "fresh_accuracy": accuracy(trained.eval(), shapes(fresh, seed=FRESH_SEED)),
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "bytes": out.stat().st_size,
        "seconds": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hookviz.zoo.train --out FILE``: reproduce the shipped weights."""
    p = argparse.ArgumentParser(prog="python -m hookviz.zoo.train", description=__doc__)
    p.add_argument("--out", required=True, help="where to write the float16 state dict (.safetensors)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--per-epoch", type=int, default=6144, help="new images drawn for each epoch")
    p.add_argument("--fresh", type=int, default=2000, help="images of the fresh split the accuracy is measured on")
    args = p.parse_args(argv)
    result = train(args.out, seed=args.seed, epochs=args.epochs, per_epoch=args.per_epoch, fresh=args.fresh)
    print(f"wrote {Path(args.out).resolve()} ({result['bytes']} bytes) in {result['seconds']:.0f} s")
    print(f"accuracy on a fresh split ({args.fresh} images, seed {FRESH_SEED}): {result['fresh_accuracy']:.4f}")
    print(f"sha256 {result['sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
