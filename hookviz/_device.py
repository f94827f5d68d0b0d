"""Copies between the host and the device with as few waits as the work allows.

A copy from ordinary (pageable) host memory to a GPU waits for every kernel queued before it (CUDA synchronises the
stream first; ``torch.cuda.set_sync_debug_mode`` reports it), so an index tensor built on the host and moved after
the forward pass stalls the device's queue. `to_device` copies through pinned memory instead, without blocking: the
caching host allocator keeps the pinned copy alive until the transfer is done. On the CPU it is ``t.to(device)``.
A copy to the host must wait for the values; `to_host` brings several tensors with one wait.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """`t` on `device`, copied without a host synchronisation where it comes from the host (module docstring); `t`
    itself where it is there already. A copy from a GPU to the host is an ordinary one: it must wait for the values."""
    device = torch.device(device)
    if device.type == "cpu" and t.device.type != "cpu":
        return t.to(device)
    if t.device.type == "cpu" and device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def to_host(tensors: list[Tensor]) -> list[Tensor]:
    """The `tensors` on the host, detached, with one wait: flattened into one buffer where they are (in one dtype
    that holds each exactly: theirs where they share it, else float64, exact for the floating-point types up to
    float32 and for integers below 2**53) and copied in one ``.cpu()``; each comes back in its own dtype and shape.
    The same steps on every device (on the CPU the copy costs one pass over the data), so that the host-read count
    of tests/test_host_reads.py, taken on the CPU, is a GPU's."""
    if not tensors:
        return []
    dtypes = {t.dtype for t in tensors}
    common = dtypes.pop() if len(dtypes) == 1 else torch.float64
    flat = torch.cat([t.detach().reshape(-1).to(common) for t in tensors]).cpu()
    parts = flat.split([t.numel() for t in tensors])
    return [p.view(t.shape).to(t.dtype) for p, t in zip(parts, tensors, strict=True)]
