"""The statistics kernels of GradientFlow: per-gradient norm, sum and max |g| (multi-tensor, eager and compiled), the
update ratio's parameter snapshots, the activation statistics, and the policy that picks compiled or eager kernels.

Everything here runs on the model's device and returns float32 tensors there: nothing is read back to the host.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import torch
from torch import Tensor

# the public torch.foreach namespace where this torch has it, the private kernels before
_foreach = getattr(torch, "foreach", None)
_foreach_norm = getattr(_foreach, "norm", None) or torch._foreach_norm
_foreach_copy_ = getattr(_foreach, "copy_", None) or torch._foreach_copy_
_foreach_sub_ = getattr(_foreach, "sub_", None) or torch._foreach_sub_


def _dense(t: Tensor) -> Tensor:
    return t.coalesce().values() if t.is_sparse else t


_LOW = (torch.float16, torch.bfloat16)


def _acc(dtype: torch.dtype) -> torch.dtype | None:
    """Accumulation dtype for a reduction: float32 for half precision (whose range a norm overflows), else native."""
    return torch.float32 if dtype in _LOW else None


def _norm32(t: Tensor) -> Tensor:
    """L2 norm of `t` as a float32 0-d tensor (accumulated in float32 or better)."""
    n = torch.linalg.vector_norm(t, dtype=_acc(t.dtype))
    return n if n.dtype == torch.float32 else n.float()


def _grouped_norms(tensors: Sequence[Tensor], device: torch.device, orders: Sequence[float]) -> list[Tensor]:
    """For each order, the norm of each tensor as one float32 vector on `device`: multi-tensor kernels per (device,
    dtype) group, put back in order as a Python list of 0-d results (indexing with a list would copy it to the device
    and synchronize)."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out = []
    for order in orders:
        if len(groups) == 1:
            vec = torch.stack(_foreach_norm(list(tensors), ord=order, dtype=_acc(tensors[0].dtype)))
        else:
            slots: list[Tensor] = [None] * len(tensors)  # type: ignore[list-item]
            for (_, dtype), idx in groups.items():
                vals = _foreach_norm([tensors[i] for i in idx], ord=order, dtype=_acc(dtype))
                for i, v in zip(idx, vals, strict=True):
                    slots[i] = v.to(device, torch.float32, non_blocking=True)
            vec = torch.stack(slots)
        out.append(vec.to(device, torch.float32, non_blocking=True))
    return out


def _norms(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    """L2 norm of each tensor, as one float32 vector on `device`."""
    return _grouped_norms(tensors, device, (2,))[0]


class _Scratch:
    """Reusable flat buffers (per device and dtype) for |g|: allocating a fresh one per gradient costs more than the
    arithmetic on the CPU."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def abs(self, g: Tensor) -> Tensor:
        if not g.is_contiguous():
            return g.abs()
        key = (g.device, g.dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < g.numel():
            buf = self._buffers[key] = torch.empty(g.numel(), dtype=g.dtype, device=g.device)
        return torch.abs(g, out=buf[: g.numel()].view(g.shape))

    def clear(self) -> None:
        self._buffers.clear()


Kernel: TypeAlias = Literal["foreach", "eager", "compiled"]


def _grad_stats(
    grads: Sequence[Tensor], device: torch.device, scratch: _Scratch, kernel: Kernel | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(L2 norm, sum |g|, max |g|) of each gradient, as float32 vectors on `device`.

    Kernels: ``"foreach"``, three multi-tensor norm kernels (orders 2, 1 and inf) per (device, dtype), no temporaries
    (the default on accelerators); ``"eager"``, for the CPU, where the order-1 and inf norms are not vectorized
    (several times slower than a sum): each gradient is read once into a reused |g| buffer and reduced three times
    while it is in cache; ``"compiled"``, the three reductions fused by ``torch.compile`` into one pass per gradient
    (three times cheaper than ``"eager"`` on the CPU; compiled once per set of shapes).
    """
    grads = [_dense(g) for g in grads]
    if kernel is None:
        kernel = "foreach" if all(g.device.type != "cpu" for g in grads) else "eager"
    if kernel == "foreach":
        l2, l1, mx = _grouped_norms(grads, device, (2, 1, math.inf))
        return l2, l1, mx
    if kernel == "compiled":
        # read in reverse parameter order: the optimizer, stepping in parameter order, then starts on gradients that
        # are still in cache (measured: half a percent of a resnet18 CPU step)
        flat = [g.reshape(-1) if g.numel() else g.new_zeros(1) for g in reversed(grads)]
        rows = _compiled_stats()(flat).flip(1).to(device, torch.float32, non_blocking=True)
        return rows[0], rows[1], rows[2]
    l2s, l1s, mxs = [], [], []
    for g in grads:
        if g.numel() == 0:
            g = torch.zeros(1, dtype=g.dtype, device=g.device)
        a = scratch.abs(g)
        l2s.append(torch.linalg.vector_norm(a, dtype=_acc(a.dtype)))
        l1s.append(a.sum(dtype=_acc(a.dtype)))
        mxs.append(a.amax())
    if len({(g.device, g.dtype) for g in grads}) > 1:
        l2s, l1s, mxs = ([t.to(device, torch.float32, non_blocking=True) for t in ts] for ts in (l2s, l1s, mxs))
    return tuple(torch.stack(ts).to(device, torch.float32, non_blocking=True) for ts in (l2s, l1s, mxs))  # type: ignore[return-value]


def _stats_rows(grads: list[Tensor]) -> Tensor:
    """(3, P) float32: L2 norm, sum |g| and max |g| of each 1-D gradient. Written for ``torch.compile``, which fuses the
    three reductions of a gradient into one vectorized pass (in eager mode each would be a pass of its own)."""
    rows = []
    for g in grads:
        g = g.float()
        a = g.abs()
        rows.append(torch.stack([torch.sqrt((g * g).sum()), a.sum(), a.amax()]))
    return torch.stack(rows, dim=1)


def _snapshot_rows(params: list[Tensor], snaps: list[Tensor]) -> Tensor:
    """Copy each parameter into its snapshot and return the parameters' L2 norms (float32): one pass, compiled."""
    norms = []
    for p, snap in zip(params, snaps, strict=True):
        snap.copy_(p)
        f = p.float()
        norms.append(torch.sqrt((f * f).sum()))
    return torch.stack(norms)


def _update_rows(snaps: list[Tensor], params: list[Tensor]) -> Tensor:
    """``||snapshot - parameter||`` of each pair (float32), without writing the difference anywhere: compiled."""
    norms = []
    for snap, p in zip(snaps, params, strict=True):
        d = snap.float() - p.float() if p.dtype in _LOW else (snap - p).float()
        norms.append(torch.sqrt((d * d).sum()))
    return torch.stack(norms)


def _act_rows(outputs: list[Tensor], relu: tuple[bool, ...]) -> Tensor:
    """(2, K) float32: the L2 norm of each activation output and, where `relu`, its fraction of dead units (units
    along dim 1: a unit is dead when it is 0 for the whole batch). Compiled: one pass over each output."""
    rows = []
    for out, dead_units in zip(outputs, relu, strict=True):
        f = out.float()
        per_row = (f * f).reshape(f.shape[0], f.shape[1], -1).sum(2)  # (N, C): sums of squares per sample and unit
        norm = torch.sqrt(per_row.sum())
        dead = (per_row.sum(0) <= 0).float().mean() if dead_units else torch.zeros_like(norm)
        rows.append(torch.stack([norm, dead]))
    return torch.stack(rows, dim=1)


_COMPILED: dict[str, Callable[..., Tensor]] = {}


def _compiled(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` compiled with ``torch.compile``, shared by every GradientFlow (dynamo recompiles per list of shapes)."""
    compiled = _COMPILED.get(fn.__name__)
    if compiled is None:
        compiled = _COMPILED[fn.__name__] = torch.compile(fn, dynamic=False, fullgraph=True)
    return compiled


def _compiled_stats() -> Callable[[list[Tensor]], Tensor]:
    return _compiled(_stats_rows)


#: Watched parameters on the CPU holding at least this many elements get the compiled kernel by default: below it the
#: eager kernels take well under a millisecond, less than a compilation is worth.
FUSED_MIN_NUMEL = 1 << 20


_ROW_MIN = 64  # entries per (sample, channel) row from which per-row norms beat one reduction over the whole tensor


def _row_norms(t: Tensor) -> Tensor | None:
    """Float32 L2 norms of the (sample, channel) rows of a contiguous (N, C, ...) tensor with long rows, else None.

    On the CPU a reduction along contiguous rows is about twice as fast as one over the whole tensor, and the rows
    serve twice: the norm of the row norms is the tensor's norm, and a channel whose rows are all 0 is a dead unit."""
    if t.dim() < 3 or t.numel() == 0 or not t.is_contiguous():
        return None
    n, c = t.shape[0], t.shape[1]
    if t.numel() < _ROW_MIN * n * c:
        return None
    rows = torch.linalg.vector_norm(t.view(n * c, -1), dim=1, dtype=_acc(t.dtype))
    return rows if rows.dtype == torch.float32 else rows.float()


def _partial_norm(t: Tensor, rows: Tensor | None = None) -> Tensor:
    """A float32 tensor whose L2 norm is that of `t`: its row norms (see `_row_norms`), or its norm as a 0-d tensor.
    The last reduction is left to one multi-tensor kernel per step over all of them (a small op costs microseconds)."""
    if rows is None:
        rows = _row_norms(t)
    return _norm32(t) if rows is None else rows


def _unit_sums(out: Tensor, unit_dim: int) -> Tensor:
    """Per-unit sums of a ReLU output (units along `unit_dim`; every entry for 1-D outputs): a unit is dead when its
    sum over the batch is 0, as ReLU outputs are >= 0 (a sum is a faster reduction than a max on the CPU; summing
    the trailing axes first, then the rest, is faster than one reduction over non-adjacent axes)."""
    if out.dim() < 2:
        return out.reshape(-1).float()
    keep = unit_dim % out.dim()
    if keep < out.dim() - 1:
        out = out.sum(dim=list(range(keep + 1, out.dim())), dtype=_acc(out.dtype))
    if keep > 0:
        out = out.sum(dim=list(range(keep)), dtype=_acc(out.dtype))
    return out.reshape(-1).float()


def _unit_values(out: Tensor, unit_dim: int, rows: Tensor | None) -> tuple[Tensor, int, bool]:
    """Values of a ReLU output from which its dead units are found with one op here: (values, values per unit,
    sample-major). A unit is dead when all its values are 0 (ReLU outputs are >= 0). Sample-major: the row norms of
    (N, C, ...) maps, unit ``i % C``; otherwise unit ``i // values_per_unit``."""
    dim = out.dim()
    if dim >= 2 and unit_dim % dim == 1:
        n = out.shape[0]
        if rows is not None:
            return rows, n, True
        if out.is_contiguous() and out.numel():
            # per (unit, position) sums over the batch: a reduction over the leading axis, fast on the CPU
            return out.view(n, -1).sum(0, dtype=torch.float32), out[0, 0].numel(), False
    return _unit_sums(out, unit_dim), 1, False


class _Kernels:
    """Which kernels compute the statistics (the `GradientFlow` ``fused_stats`` policy): the compiled ones where they
    are wanted and compile, the eager ones otherwise, and from the first failed compilation on (with a warning)."""

    def __init__(self, fused_stats: bool | None, params: Sequence[Tensor]) -> None:
        self.fused_stats = fused_stats
        self.params = params
        self.compile_failed = False
        self.compile_error: BaseException | None = None
        self.scratch = _Scratch()
        self._wanted: dict[torch.device, bool] = {}

    def fused_wanted(self) -> bool:
        """Whether the compiled kernels are wanted for the model as it is now (the `fused_stats` policy)."""
        if self.fused_stats is False or self.compile_failed or not self.params:
            return False
        if self.fused_stats:
            return True
        device = self.params[0].device
        if device not in self._wanted:
            on_cpu = all(p.device.type == "cpu" for p in self.params)
            self._wanted[device] = on_cpu and sum(p.numel() for p in self.params) >= FUSED_MIN_NUMEL
        return self._wanted[device]

    def try_compiled(self, compute: Callable[[], Any]) -> Any:
        """compute() with compiled kernels; None (and the eager kernels from now on) if compiling fails."""
        try:
            return compute()
        except torch.OutOfMemoryError:
            raise  # memory, not the compiler: the eager kernels would need it as well
        except Exception as err:  # no C++ compiler, an unsupported platform: the eager kernels still work
            # Any other error is a compile failure here: the eager kernels compute the same statistics, so an error
            # of the statistics themselves raises again from them, with its own traceback.
            self.compile_failed = True
            self.compile_error = err
            detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
            kind = type(err)
            name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            warnings.warn(
                f"GradientFlow: compiling the fused statistics kernels failed ({name}: {detail}); "
                "using the eager kernels (slower on the CPU); the full error is in flow._kernels.compile_error. "
                "Pass fused_stats=False to skip the attempt.",
                RuntimeWarning,
                stacklevel=5,
            )
            return None

    def grad_stats(self, grads: list[Tensor], dev: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(L2 norm, sum |g|, max |g|) of each gradient (see `_grad_stats`), with the kernel the policy picks."""
        if self.fused_wanted():
            stats = self.try_compiled(lambda: _grad_stats(grads, dev, self.scratch, "compiled"))
            if stats is not None:
                return stats
        return _grad_stats(grads, dev, self.scratch)

    def act_rows(self, values: list[Tensor], relu: tuple[bool, ...]) -> Tensor | None:
        """`_act_rows` compiled; None if compiling fails (the caller takes the eager statistics instead)."""
        if self.compile_failed:
            return None
        return self.try_compiled(lambda: _compiled(_act_rows)(values, relu))

    def clear(self) -> None:
        self.scratch.clear()


class _UpdateRatio:
    """The update-to-weight ratio's two halves: before the optimizer steps, a snapshot of the parameters with their
    norms; after it, ``||w_before - w_after||`` (one copy of the watched parameters is kept between steps)."""

    def __init__(self, kernels: _Kernels, params: Sequence[Tensor]) -> None:
        self.kernels = kernels
        self.params = params
        self._snaps: dict[int, Tensor] = {}

    def snapshot(self, present: list[int], dev: torch.device) -> Tensor:
        """Copy the parameters `present` and return their L2 norms (float32, on `dev`)."""
        params = [self.params[i].detach() for i in present]
        snaps = [self._buffer(i) for i in present]
        weight_norms = None
        if self.kernels.fused_wanted():  # copy and norm in one pass
            weight_norms = self.kernels.try_compiled(lambda: _compiled(_snapshot_rows)(params, snaps))
        if weight_norms is None:
            weight_norms = _norms(params, dev)
            _foreach_copy_(snaps, params)
        return weight_norms.to(dev, torch.float32)

    def update_norms(self, present: list[int], dev: torch.device) -> Tensor:
        """``||w_before - w_after||`` of the parameters `present` since `snapshot` (float32, on `dev`)."""
        snaps = [self._snaps[i] for i in present]
        params = [self.params[i].detach() for i in present]
        update = None
        if self.kernels.fused_wanted():  # ||w_before - w_after|| without writing it
            update = self.kernels.try_compiled(lambda: _compiled(_update_rows)(snaps, params))
        if update is None:
            _foreach_sub_(snaps, params)  # w_before - w_after
            update = _norms(snaps, dev)
        return update.to(dev, torch.float32)

    def _buffer(self, i: int) -> Tensor:
        p = self.params[i]
        snap = self._snaps.get(i)
        if snap is None or snap.shape != p.shape or snap.dtype != p.dtype or snap.device != p.device:
            snap = self._snaps[i] = torch.empty_like(p, memory_format=torch.preserve_format).detach()
        return snap

    def clear(self) -> None:
        self._snaps.clear()
