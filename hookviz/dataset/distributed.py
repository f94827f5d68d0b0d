"""torchrun awareness for `explain_dataset`: who am I, which device, and a process group only when needed.

Under ``torchrun`` (``WORLD_SIZE`` and ``RANK`` in the environment), every rank computes its own contiguous block of
shards and rank 0 writes the final manifest after a barrier. A process group the user already initialised is used
as it is; otherwise one is initialised here (nccl when the ranks have GPUs, else gloo) and destroyed again on exit,
also on error, so the process is left as it was found.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shards(self, num_shards: int) -> range:
        """This rank's contiguous block of shard indices (blocks differ by at most one shard in length)."""
        per, extra = divmod(num_shards, self.size)
        start = self.rank * per + min(self.rank, extra)
        return range(start, start + per + (1 if self.rank < extra else 0))

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def current_world() -> World:
    """Rank, world size and local rank: from an initialised process group, else from torchrun's environment."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", dist.get_rank()))
    size, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={size} are inconsistent; expected 0 <= RANK < WORLD_SIZE")
    return World(rank, size, _env_int("LOCAL_RANK", rank))


@contextmanager
def process_group(world: World) -> Iterator[None]:
    """Initialise the default process group if the run is distributed and none exists; destroy only what we made."""
    created = False
    if world.distributed and not dist.is_initialized():
        if not dist.is_available():
            raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
        kwargs = {"device_id": torch.device("cuda", world.local_rank)} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, **kwargs)
        created = True
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()
