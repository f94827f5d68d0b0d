"""One rank of tests/test_ddp.py, run by ``torch.distributed.run`` (gloo, CPU): the shapes CNN under
DistributedDataParallel with GradientFlow, its shard of a fixed global batch; writes the statistics to OUT/rank<r>.npz.

BatchNorm is kept in eval mode (running statistics): in training mode each rank would normalise with its own shard's
statistics, and no data-parallel run equals one process on the global batch without SyncBatchNorm.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hookviz import GradientFlow
from hookviz.zoo import ShapesCNN, shapes

STEPS, GLOBAL_BATCH, SIZE = 3, 8, 32


def model_and_data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = ShapesCNN().train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    d = shapes(STEPS * GLOBAL_BATCH, seed=5, size=SIZE)
    return model, d.images, d.labels


def run(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, rank: int, world: int) -> GradientFlow:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with GradientFlow(model, optimizer=opt, update_ratio=True, alarms=False) as flow:
        for s in range(STEPS):
            x = images[s * GLOBAL_BATCH : (s + 1) * GLOBAL_BATCH][rank::world]
            y = labels[s * GLOBAL_BATCH : (s + 1) * GLOBAL_BATCH][rank::world]
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return flow


def main(out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        model, images, labels = model_and_data()
        ddp = nn.parallel.DistributedDataParallel(model)
        s = run(ddp, images, labels, rank, world).read()
        np.savez(f"{out}/rank{rank}.npz", params=np.array(s.params), **s.param_stats)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
