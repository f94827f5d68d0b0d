"""A tiny model and data set for tests/test_dataset.py, and a script run in subprocesses (SIGKILL, torchrun).

``python tests/dataset_run.py OUT [--kill-at K]``: explain the tiny data set into OUT with Saliency (target
"label", batch 4, shards of 8); with ``--kill-at K`` the process SIGKILLs itself when item K is loaded.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import Dataset

N_ITEMS = 30
SHARD = 8
BATCH = 4


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 5)
    ).eval()


class TinyData(Dataset):
    """Item i: a (3, 8, 8) image drawn from a generator seeded with i, label i % 5; counts the items it loads."""

    def __init__(self, n: int = N_ITEMS, kill_at: int | None = None, labels: bool = True, size: int = 8) -> None:
        self.n, self.kill_at, self.labels, self.size = n, kill_at, labels, size
        self.loaded = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.kill_at is not None and i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.loaded += 1
        image = torch.rand(3, self.size, self.size, generator=torch.Generator().manual_seed(int(i)))
        return (image, i % 5) if self.labels else image

    def images(self) -> torch.Tensor:
        return torch.stack(
            [torch.rand(3, self.size, self.size, generator=torch.Generator().manual_seed(i)) for i in range(self.n)]
        )


def run(out: str, kill_at: int | None = None, dtype: str = "float32") -> None:
    import hookviz as hv

    hv.explain_dataset(
        hv.Saliency(tiny_model()),
        TinyData(kill_at=kill_at),
        out,
        target="label",
        batch_size=BATCH,
        shard_size=SHARD,
        dtype=dtype,
        progress=False,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-at", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run(args.out, args.kill_at)
    sys.exit(0)
