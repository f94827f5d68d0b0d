"""Noise tunnels written out in float64: given the noisy copies, the mean, mean of squares or variance of a
method's attribution over them, one copy, one input and one class at a time, with the variance in two passes
(deviations from the mean), not as E[M^2] - E[M]^2. The copies come from `hookviz_copies` (hookviz's documented
draws) or `captum_copies` (captum's NoiseTunnel draws, replayed from the same seed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

# attr_fn(model, x, cls): the attribution of class `cls` for one input x of shape (1, ...), in float64
AttrFn = Callable[[nn.Module, Tensor, int], Tensor]


def hookviz_copies(xs: Sequence[Tensor], n: int, sigma: float, seed: int) -> list[list[Tensor]]:
    """copies[s][e]: input tensor e's copy s as hookviz draws it: per copy, one ``randn(x.shape)`` per input
    tensor in order, from a cpu generator seeded with `seed`, scaled by sigma * (max - min) of each sample."""
    g = torch.Generator().manual_seed(seed)
    copies = []
    for _ in range(n):
        row = []
        for x in xs:
            eps = torch.randn(x.shape, generator=g, dtype=x.dtype).double()
            level = torch.stack([sigma * (x[i].double().max() - x[i].double().min()) for i in range(x.shape[0])])
            row.append(x.double() + level.view(-1, *(1,) * (x.dim() - 1)) * eps)
        copies.append(row)
    return copies


def captum_copies(xs: Sequence[Tensor], n: int, stdev: float, seed: int) -> list[list[Tensor]]:
    """copies[s][e] as captum's NoiseTunnel draws them from ``torch.manual_seed(seed)`` (one partition): per input
    tensor, ``torch.normal(0, stdev)`` of shape (N * n, ...) for ``x.repeat_interleave(n)``, so row i * n + s is
    input i's copy s."""
    torch.manual_seed(seed)
    drawn = []
    for x in xs:
        size = (x.shape[0] * n, *x.shape[1:])
        drawn.append(x.repeat_interleave(n, dim=0) + torch.normal(0, torch.tensor(stdev).repeat(size)))
    return [[d[s::n].double() for d in drawn] for s in range(n)]


def noise_tunnel(
    model: nn.Module, copies: list[list[Tensor]], targets: Tensor, attr_fn: AttrFn, reduction: str, element: int = 0
) -> Tensor:
    """(N, K, ...) reduction ("mean", "mean_sq", "var") over the copies of attr_fn's attribution of input tensor
    `element`; attr_fn gets the copy's tensors of one sample (a tuple when there are several)."""
    n_copies, n = len(copies), copies[0][0].shape[0]
    per: list[list[list[Tensor]]] = [[[] for _ in range(targets.shape[1])] for _ in range(n)]
    for row in copies:
        for i in range(n):
            sample = tuple(t[i : i + 1] for t in row)
            for k, c in enumerate(targets[i]):
                a = attr_fn(model, sample if len(sample) > 1 else sample[0], int(c))
                per[i][k].append((a[element] if isinstance(a, tuple) else a)[0].double())
    out = []
    for i in range(n):
        cols = []
        for k in range(targets.shape[1]):
            values = per[i][k]
            mean = sum(values) / n_copies
            if reduction == "mean":
                cols.append(mean)
            elif reduction == "mean_sq":
                cols.append(sum(v * v for v in values) / n_copies)
            elif reduction == "var":
                cols.append(sum((v - mean) ** 2 for v in values) / n_copies)
            else:
                raise ValueError(reduction)
        out.append(torch.stack(cols))
    return torch.stack(out)
