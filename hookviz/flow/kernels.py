"""The statistics kernels of GradientFlow: per-gradient norm, sum and max |g| (multi-tensor, eager and compiled), the
update ratio's parameter snapshots, the activation statistics, and the policy that picks compiled or eager kernels.

Everything here runs on the model's device and returns float32 tensors there: nothing is read back to the host,
except once per compiled kernel and set of input shapes, when the self-check compares it with the eager kernel
(`_Checked`).
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


# -- the compiled kernels' self-check -------------------------------------------------------------------------
# A compiled kernel is trusted only once it has given the eager kernel's numbers on real inputs. torch.compile's code
# can be wrong for a CPU: on AMD EPYC machines under ATEN_CPU_CAPABILITY=avx2 (torch 2.14), inductor's code for
# `_act_rows` alone gave an activation norm of 22.83 where eager gives 39.65 (issue 34), with no error to catch. The
# one cause found (code generated for another vector ISA, served by inductor's cache) is closed by `_isa_options`;
# the check is there for the causes not found.
#
# Tolerance, from float32 rounding (u = 2**-24). Every statistic here reduces n terms that are >= 0 (squares, |g|),
# so the sum of their absolute values is the sum itself. A float32 sum of n terms, in any order (sequential, pairwise,
# vector lanes, threads), is within (n - 1)u of the exact sum, relatively; rounding each square adds u: within nu.
# The square root halves a relative error and rounds once more: a norm is within (n/2 + 1)u of the exact norm. The
# compiled and the eager kernels each keep to these bounds, so they differ by at most (n + 2)u for a norm and 2(n - 1)u
# for a sum |g|: `_rtol` allows 2(n + 1)u for both. A max is exact in any order, and a dead fraction is a count divided
# by the number of units (one or two roundings): they get n = 1, 4u. Terms below float32's normal range lose relative
# precision (a square under 2**-126 is subnormal, or flushed to 0 by code that flushes denormals): n of them move a
# sum (of squares or of |g|) by at most n 2**-126, and so a norm by sqrt(n) 2**-63, which `_atol` adds. A value NaN
# in both, or infinite and equal in both, agrees. The bound is the worst case, loose for large n (12% for a million
# terms, where real rounding errors are near sqrt(n)u), yet far from the factor of two of the miscompiled kernel; a
# tighter bound would be a guess, and a guess that fails falls back to the slower kernels for good.
_U = 2.0**-24


def _rtol(n: Tensor) -> Tensor:
    return 2 * (n + 1) * _U


def _atol(n: Tensor) -> Tensor:
    return n.sqrt() * 2.0**-63


class _Mismatch(Exception):
    """A compiled kernel gave other numbers than the eager kernel on the same inputs (the message says which)."""


class _SelfCheck:
    """The process-wide verdict on the compiled kernels, shared by every GradientFlow: None while each compiled
    kernel has agreed with its eager twin, else the warning that said why they are not used."""

    def __init__(self) -> None:
        self.mismatch: str | None = None


_SELF_CHECK = _SelfCheck()


def _terms_stats(grads: list[Tensor]) -> list[list[int]]:
    return [[g.numel() for g in grads]] * 2 + [[1] * len(grads)]


def _terms_act(outputs: list[Tensor], relu: tuple[bool, ...]) -> list[list[int]]:
    return [[o.numel() for o in outputs], [1] * len(outputs)]


def _terms_norms(tensors: list[Tensor], others: list[Tensor]) -> list[int]:
    return [t.numel() for t in tensors]


#: per compiled kernel: what it computes, the names of its output rows (one row: a vector), the terms each output
#: entry reduces (for the tolerance)
_CHECKS: dict[str, tuple[str, tuple[str, ...], Callable[..., list[Any]]]] = {
    "_stats_rows": ("gradient statistics", ("gradient norm", "sum |grad|", "max |grad|"), _terms_stats),
    "_act_rows": ("activation statistics", ("activation norm", "dead fraction"), _terms_act),
    "_snapshot_rows": ("parameter snapshot", ("parameter norm",), _terms_norms),
    "_update_rows": ("update norms", ("update norm",), _terms_norms),
}


def _signature(arg: Any) -> Any:
    """What tells dynamo's compilations of a kernel apart (``dynamic=False``): each tensor's dtype, device, shape and
    strides, the other arguments' values. Read on the host from the tensors' metadata: no value, no sync."""
    if isinstance(arg, Tensor):
        return (arg.dtype, arg.device, arg.shape, arg.stride())
    if isinstance(arg, (list, tuple)):
        return tuple(_signature(a) for a in arg)
    return arg


def _disagreement(
    compiled: Tensor, eager: Tensor, terms: list[Any]
) -> tuple[tuple[int, ...], float, float, float] | None:
    """The first entry where the compiled and eager results differ by more than float32 rounding (see `_rtol`): its
    index, the compiled value, the eager value, the tolerance; None if they agree. Compared on the host in float64."""
    c, e = compiled.detach().double().cpu(), eager.detach().double().cpu()
    if c.shape != e.shape:
        return (), math.nan, math.nan, 0.0
    n = torch.tensor(terms, dtype=torch.float64).reshape(e.shape)
    tol = _rtol(n) * e.abs() + _atol(n)
    agree = ((c - e).abs() <= tol) | (c == e) | (c.isnan() & e.isnan())
    if bool(agree.all()):
        return None
    idx = tuple(int(i) for i in (~agree).nonzero()[0])
    return idx, c[idx].item(), e[idx].item(), tol[idx].item()


def _isa_options() -> dict[str, Any] | None:
    """Inductor options that name the vector ISA inductor picks in this process (its ``cpp.simdlen``, in bits).

    Inductor picks its vector ISA from ``ATEN_CPU_CAPABILITY``, but its FX graph cache (on disk, shared by the user's
    processes) leaves that ISA out of its key in torch 2.14: a process served the C++ generated in another process
    for another ISA compiles it with its own flags. The loops then step by the other ISA's vector width. Measured on
    an Intel Xeon, with one thread in both processes: AVX-512 code run under ``ATEN_CPU_CAPABILITY=avx2`` reduced
    part of each tensor (`_act_rows`: 23.48 where eager gives 39.81, the numbers of issue 34), and AVX2 code run with
    AVX-512 vectors stored past its buffers (glibc aborted: ``corrupted size vs. prev_size``). The ISA's width in the
    options is part of the key. It only names the width inductor would pick anyway: with ``cpp.simdlen`` set,
    inductor takes the first ISA of that width, the one ``ATEN_CPU_CAPABILITY`` picks (x86: AMX before AVX-512, both
    512 bits; AVX2 256; ``default``, no vectors, 0: no ISA has that width). None where the ISA cannot be found."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        return {"cpp.simdlen": pick_vec_isa().bit_width()}
    except Exception:  # a torch without it, or a machine where probing the ISA fails: inductor decides alone
        return None


def _compile(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` compiled as GradientFlow compiles its kernels: static shapes, one graph, the ISA in the cache key."""
    return torch.compile(fn, dynamic=False, fullgraph=True, options=_isa_options())


class _Checked:
    """A kernel compiled by ``torch.compile``, compared with its eager self on its first inputs of every set of shapes.

    Per set of shapes, because dynamo compiles each set anew (``dynamic=False``): new code, with other loop bounds,
    vector tails and thread splits, that can be wrong where the first was right. The check runs the eager kernel and
    reads the comparison on the host (one sync) only then, at a call that compiles anyway (seconds, against the eager
    kernel's milliseconds); after it a call costs a signature of the inputs' metadata (microseconds, no sync). A
    disagreement raises `_Mismatch`, which `_Kernels.try_compiled` turns into the eager kernels for the process."""

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        self.fn = fn
        self.compiled = _compile(fn)
        self.checked: set[Any] = set()

    def __call__(self, *args: Any) -> Tensor:
        out = self.compiled(*args)
        key = (_signature(args), torch.is_grad_enabled())
        if key not in self.checked:
            self._check(args, out)
            self.checked.add(key)
        return out

    def _check(self, args: tuple[Any, ...], out: Tensor) -> None:
        name = self.fn.__name__
        what, rows, terms = _CHECKS[name]
        found = None
        if name == "_snapshot_rows":  # the copy first: the eager kernel writes the snapshots again
            params, snaps = args
            same = torch.stack([((s == p) | (s.isnan() & p.isnan())).all() for p, s in zip(params, snaps, strict=True)])
            if not bool(same.all()):
                j = int((~same).nonzero()[0, 0])
                found = f"its copy of parameter {j} (shape {tuple(params[j].shape)}) differs from the parameter"
        if found is None:
            bad = _disagreement(out, self.fn(*args), terms(*args))
            if bad is None:
                return
            idx, c, e, tol = bad
            if not idx:
                found = f"its output has shape {tuple(out.shape)} where the eager kernel's has another"
            else:
                row, col = (idx[0], idx[1]) if len(idx) == 2 else (0, idx[0])
                shape = tuple(args[0][col].shape)
                found = (
                    f"{rows[row]} of input {col} (shape {shape}) is {c:.7g} compiled, {e:.7g} eager "
                    f"(float32 rounding allows {tol:.2g})"
                )
        raise _Mismatch(
            f"GradientFlow: the compiled {what} kernel ({name}) disagrees with the eager kernel on the same inputs: "
            f"{found}. This is torch.compile's code for this CPU (torch {torch.__version__}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}); the eager kernels are used from now on in this process, by "
            "every GradientFlow (slower on the CPU). fused_stats=False skips the compiled kernels."
        )


_COMPILED: dict[str, _Checked] = {}


def _compiled(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` compiled with ``torch.compile`` and self-checked (`_Checked`), shared by every GradientFlow (dynamo
    recompiles per list of shapes)."""
    compiled = _COMPILED.get(fn.__name__)
    if compiled is None:
        compiled = _COMPILED[fn.__name__] = _Checked(fn)
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
    are wanted, compile and agree with the eager ones (`_Checked`), the eager ones otherwise, and from the first failed
    compilation on (with a warning), or in the whole process from a compiled kernel's first disagreement on (with one
    warning)."""

    def __init__(self, fused_stats: bool | None, params: Sequence[Tensor]) -> None:
        self.fused_stats = fused_stats
        self.params = params
        self.compile_failed = False
        self.compile_error: BaseException | None = None
        self.scratch = _Scratch()
        self._wanted: dict[torch.device, bool] = {}

    def fused_wanted(self) -> bool:
        """Whether the compiled kernels are wanted for the model as it is now (the `fused_stats` policy)."""
        if self.fused_stats is False or self.compile_failed or _SELF_CHECK.mismatch is not None or not self.params:
            return False
        if self.fused_stats:
            return True
        device = self.params[0].device
        if device not in self._wanted:
            on_cpu = all(p.device.type == "cpu" for p in self.params)
            self._wanted[device] = on_cpu and sum(p.numel() for p in self.params) >= FUSED_MIN_NUMEL
        return self._wanted[device]

    def try_compiled(self, compute: Callable[[], Any]) -> Any:
        """compute() with compiled kernels; None (and the eager kernels from now on) if compiling fails, or if a
        compiled kernel disagrees with the eager one (then in every GradientFlow of the process, with one warning)."""
        try:
            return compute()
        except torch.OutOfMemoryError:
            raise  # memory, not the compiler: the eager kernels would need it as well
        except _Mismatch as err:
            if _SELF_CHECK.mismatch is None:
                _SELF_CHECK.mismatch = str(err)
                warnings.warn(str(err), RuntimeWarning, stacklevel=5)
            return None
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
        """`_act_rows` compiled; None if compiling fails or the compiled kernels are not trusted (the caller takes the
        eager statistics instead)."""
        if self.compile_failed or _SELF_CHECK.mismatch is not None:
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
