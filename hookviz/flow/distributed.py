"""GradientFlow under data parallelism: what it reports with DistributedDataParallel, and why it refuses FSDP.

DistributedDataParallel all-reduces (averages) the parameter gradients during the backward pass, so when GradientFlow
reads ``.grad`` (after the backward pass, at the optimizer's step) every rank holds the full, averaged gradient: its
parameter statistics are those of a single process on the global batch (with the loss averaged over it), on every
rank, and cost no collective at all. The statistics of module outputs and of the gradients w.r.t. them stay local to
each rank (its share of the batch).

FullyShardedDataParallel (``FullyShardedDataParallel`` or ``fully_shard``) keeps each rank's shard of every parameter
and of its gradient: per-rank norms would cover only the local shard, and the per-parameter maximum and mean of the
whole tensor would need collectives per parameter. GradientFlow refuses such models rather than report shard norms.
"""

from __future__ import annotations

from torch import nn

_FSDP_CLASSES = ("FullyShardedDataParallel", "FSDPModule")


def _refuse_sharded(model: nn.Module) -> None:
    """Raise a clear ValueError for models whose parameters are sharded (FSDP 1 or 2). Checked by class names, so
    that ``torch.distributed`` is never imported here."""
    for name, module in model.named_modules():
        mro = {cls.__name__ for cls in type(module).__mro__}
        if mro & set(_FSDP_CLASSES):
            raise ValueError(
                f"GradientFlow does not support FSDP (module {name or '<model>'!r} is "
                f"{type(module).__name__}): its gradients are sharded across ranks, so the per-rank norms would cover "
                "only the local shard. Use DistributedDataParallel, or watch the model in a single-process run"
            )
    for pname, p in model.named_parameters():
        if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor":
            raise ValueError(
                f"GradientFlow does not support sharded (DTensor) parameters such as {pname!r} (FSDP 2, tensor "
                "parallelism): the per-rank norms would cover only the local shard. Use DistributedDataParallel"
            )
