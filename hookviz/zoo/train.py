"""Training the zoo's models: ``python -m hookviz.zoo.train --out FILE`` reproduces the shipped CNN's weights byte
for byte, ``python -m hookviz.zoo.train --model vit --out FILE`` the shipped ViT's (both on the shapes data), and
``python -m hookviz.zoo.train --model lm --out FILE`` the retrieval language model's (on the retrieval task)."""

from __future__ import annotations

import argparse
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._progress import progress_bar
from .data import shapes
from .lm import RetrievalLM, retrieval_accuracy
from .model import ShapesCNN, _load_weights, accuracy
from .retrieval import retrieval, training_batch
from .vit import ShapesViT

FRESH_SEED = 0  # the split `train` reports; training draws from seeds 1_000_000 + 1000 * seed + epoch only
_TRAIN_SEED_BASE = 1_000_000


@dataclass(frozen=True)
class Recipe:
    """How one zoo model is trained: its class, the defaults of `train`, and its optimiser's details.

    `no_decay` names parameters kept out of weight decay (the ViT's biases, norms, class token and position
    embeddings, as timm and DeiT do); `transpose`: images are also transposed at random (the objects are drawn at any
    rotation, so the dihedral flips keep every class); `clip`: the gradient norm is clipped to it (None: not clipped).
    `task`: ``"shapes"`` (images and labels, cross-entropy on the class) or ``"retrieval"`` (token sequences,
    cross-entropy on the next tokens the prompt determines: `hookviz.zoo.retrieval.training_batch`).
    """

    build: Callable[[], nn.Module]
    epochs: int
    per_epoch: int
    lr: float
    weight_decay: float
    pct_start: float
    channels_last: bool = False
    no_decay: Callable[[str, Tensor], bool] | None = None
    transpose: bool = False
    clip: float | None = None
    task: str = "shapes"


def _vit_no_decay(name: str, p: Tensor) -> bool:
    return p.ndim < 2 or name in ("cls_token", "pos_embed")


def _lm_no_decay(name: str, p: Tensor) -> bool:
    return p.ndim < 2 or "embed" in name


RECIPES: dict[str, Recipe] = {
    "cnn": Recipe(ShapesCNN, epochs=8, per_epoch=6144, lr=4e-3, weight_decay=5e-4, pct_start=0.25, channels_last=True),
    "vit": Recipe(
        ShapesViT,
        epochs=128,
        per_epoch=3072,
        lr=1e-3,
        weight_decay=0.05,
        pct_start=0.06,
        no_decay=_vit_no_decay,
        transpose=True,
        clip=1.0,
    ),
    "lm": Recipe(
        RetrievalLM,
        epochs=8,
        per_epoch=4096,
        lr=2e-3,
        weight_decay=0.05,
        pct_start=0.1,
        no_decay=_lm_no_decay,
        clip=1.0,
        task="retrieval",
    ),
}


def _optimizer(model: nn.Module, recipe: Recipe, lr: float) -> torch.optim.Optimizer:
    if recipe.no_decay is None:
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=recipe.weight_decay)
    named = list(model.named_parameters())
    plain = [p for n, p in named if recipe.no_decay(n, p)]
    decayed = [p for n, p in named if not recipe.no_decay(n, p)]
    groups = [{"params": decayed, "weight_decay": recipe.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr)


def train(
    out: str | Path,
    *,
    model: str = "cnn",
    seed: int = 0,
    epochs: int | None = None,
    per_epoch: int | None = None,
    batch_size: int = 64,
    lr: float | None = None,
    fresh: int = 2000,
    progress: bool = True,
) -> dict[str, float | str]:
    """Train a zoo model (``"cnn"``: `ShapesCNN`, ``"vit"``: `ShapesViT`, ``"lm"``: `RetrievalLM`) and write its
    float16 state dict to `out` (safetensors); returns the fresh-split accuracy, the sha256, the file's size and the
    seconds taken.

    Each epoch draws `per_epoch` new images (seed ``1_000_000 + 1000 * seed + epoch``; random horizontal flips on
    top, and for the ViT random transposes), AdamW with a one-cycle learning rate (Smith & Topin, 2019).
    `epochs`, `per_epoch` and `lr` default to the model's recipe (`RECIPES`). The accuracy is measured after the
    round trip through float16, on `fresh` images of seed `FRESH_SEED`, which training never draws from. The language
    model draws `per_epoch` new sequences of `hookviz.zoo.retrieval.retrieval` per epoch from the same seeds (no
    augmentation) and reports the exact-answer accuracy (`retrieval_accuracy`) on `fresh` prompts of seed
    `FRESH_SEED`.
    """
    if model not in RECIPES:
        raise ValueError(f"model must be one of {', '.join(map(repr, RECIPES))}, got {model!r}")
    recipe = RECIPES[model]
    epochs = recipe.epochs if epochs is None else epochs
    per_epoch = recipe.per_epoch if per_epoch is None else per_epoch
    lr = recipe.lr if lr is None else lr
    torch.manual_seed(seed)
    net = recipe.build()
    if recipe.channels_last:
        net = net.to(memory_format=torch.channels_last)
    opt = _optimizer(net, recipe, lr)
    steps = epochs * math.ceil(per_epoch / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=recipe.pct_start)
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    bar = progress_bar(total=steps, enabled=progress, desc=f"train {model}", unit="step")
    batches = _retrieval_batches if recipe.task == "retrieval" else _shapes_batches
    for epoch in range(epochs):
        net.train()
        right = seen = 0
        for x, y, mask in batches(recipe, _TRAIN_SEED_BASE + 1000 * seed + epoch, per_epoch, batch_size, g):
            if mask is None:
                logits = net(x)
                loss = F.cross_entropy(logits, y)
                hits, count = (logits.argmax(1) == y).sum().item(), len(y)
            else:
                logits = net(x, attention_mask=mask).flatten(0, 1)
                y = y.flatten()
                loss = F.cross_entropy(logits, y, ignore_index=-100)
                scored = y != -100
                hits, count = (logits[scored].argmax(1) == y[scored]).sum().item(), int(scored.sum())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.clip is not None:
                nn.utils.clip_grad_norm_(net.parameters(), recipe.clip)
            opt.step()
            sched.step()
            right += hits
            seen += count
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", acc=f"{right / seen:.3f}")
            bar.update()
    bar.close()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # safetensors: a JSON header and the raw tensors, the same bytes for the same weights whatever the file's name
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in net.state_dict().items()}
    out.write_bytes(safetensors.torch.save(state))
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    trained = recipe.build()
    trained.load_state_dict(_load_weights(out, digest))
    if recipe.task == "retrieval":
        fresh_accuracy = retrieval_accuracy(trained.eval(), retrieval(fresh, seed=FRESH_SEED))
    else:
        fresh_accuracy = accuracy(trained.eval(), shapes(fresh, seed=FRESH_SEED))
    return {
        "fresh_accuracy": fresh_accuracy,
        "sha256": digest,
        "bytes": out.stat().st_size,
        "seconds": time.perf_counter() - start,
    }


def _shapes_batches(
    recipe: Recipe, data_seed: int, per_epoch: int, batch_size: int, g: torch.Generator
) -> Iterator[tuple[Tensor, Tensor, None]]:
    """One epoch of `per_epoch` new shapes images in `g`'s random order, flipped (and transposed) at random."""
    data = shapes(per_epoch, seed=data_seed)
    order = torch.randperm(per_epoch, generator=g)
    for i in range(0, per_epoch, batch_size):
        idx = order[i : i + batch_size]
        x, y = data.images[idx], data.labels[idx]
        flip = torch.rand(len(idx), generator=g) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        if recipe.transpose:
            turn = torch.rand(len(idx), generator=g) < 0.5
            x = torch.where(turn.view(-1, 1, 1, 1), x.transpose(-1, -2), x)
        if recipe.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        yield x, y, None


def _retrieval_batches(
    recipe: Recipe, data_seed: int, per_epoch: int, batch_size: int, g: torch.Generator
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """One epoch of `per_epoch` new retrieval sequences (right-padded) as (input_ids, labels, attention_mask)."""
    inputs, mask, labels = training_batch(retrieval(per_epoch, seed=data_seed))
    for i in range(0, per_epoch, batch_size):
        yield inputs[i : i + batch_size], labels[i : i + batch_size], mask[i : i + batch_size]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hookviz.zoo.train [--model cnn|vit|lm] --out FILE``: reproduce the shipped weights."""
    p = argparse.ArgumentParser(prog="python -m hookviz.zoo.train", description=__doc__)
    p.add_argument("--out", required=True, help="where to write the float16 state dict (.safetensors)")
    p.add_argument("--model", choices=tuple(RECIPES), default="cnn", help="the model to train (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None, help="default: the model's recipe (cnn 8, vit 128, lm 8)")
    p.add_argument(
        "--per-epoch",
        type=int,
        default=None,
        help="new images (or prompts) drawn for each epoch (cnn 6144, vit 3072, lm 4096)",
    )
    p.add_argument("--fresh", type=int, default=2000, help="images of the fresh split the accuracy is measured on")
    args = p.parse_args(argv)
    result = train(
        args.out, model=args.model, seed=args.seed, epochs=args.epochs, per_epoch=args.per_epoch, fresh=args.fresh
    )
    print(f"wrote {Path(args.out).resolve()} ({result['bytes']} bytes) in {result['seconds']:.0f} s")
    items = "prompts" if RECIPES[args.model].task == "retrieval" else "images"
    print(f"accuracy on a fresh split ({args.fresh} {items}, seed {FRESH_SEED}): {result['fresh_accuracy']:.4f}")
    print(f"sha256 {result['sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
