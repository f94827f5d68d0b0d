"""Count the host synchronisations a call would make on a GPU, on a machine without one (issue 35, part 1).

On a GPU, reading a tensor's value on the host (``t.item()``, ``bool(t)``, ``t.tolist()``, ``t.cpu()``, a boolean
mask ``t[mask]``, ``nonzero``, ``unique``) waits for every kernel queued before it, and so does a blocking copy from
the host to the device (``torch.tensor(data, device=...)``, an index tensor built on the CPU and used with the
device's tensors): ``torch.cuda.set_sync_debug_mode("warn")`` reports both. On the CPU none of them costs anything
and most are invisible (``t.cpu()`` of a CPU tensor returns ``t`` itself and dispatches no operation), so
`HostReads` tells apart, during a call, the tensors that a GPU run would hold on the device from those it would hold
on the host, and counts what would cross between the two.

Where a tensor would live:

- on the host: what is built from Python data or numpy (``torch.tensor(data)``, ``torch.as_tensor``,
  ``torch.from_numpy``: ``aten.lift_fresh``), what a factory (``torch.zeros``, ``torch.arange``, ...) builds without
  a ``device=`` argument, the copies ``t.cpu()`` / ``t.to("cpu")`` make, and every result of an operation whose tensor
  arguments all live on the host;
- on the device: everything else. The model's parameters and buffers, the inputs, any tensor made before the call
  (the user's tensors), a factory's result with ``device=`` (a ``torch.device``, which on a GPU run would name the
  model's device; a ``"cpu"`` string names the host), the copy ``t.to(device, non_blocking=True)`` makes of a host
  tensor (`hookviz._device.to_device`, which on CUDA copies from pinned memory without a wait), and every result of
  an operation with a tensor argument on the device. A tensor whose placement is unknown counts as on the device, so a
  doubt counts as a read, never the other way round. A view lives where its base does.

What counts (each a `Read`, with the operation and the innermost line of hookviz that ran it):

- ``read``: an aten operation that reads a device tensor's values on the host: ``_local_scalar_dense`` (what
  ``item``, ``bool``, ``float``, ``int``, ``__index__`` call), ``nonzero`` (``torch.where(cond)``, ``argwhere``),
  ``masked_select``, indexing with a boolean mask (``index`` / ``index_put`` with a bool or uint8 index; an
  ``index_put`` of one value is a ``masked_fill`` on CUDA and does not count), ``unique`` and its variants,
  ``repeat_interleave`` with tensor repeats and no ``output_size``, ``bincount``, ``histc`` without a range,
  ``equal``, ``allclose``, ``_linalg_check_errors``; and at the Python level ``cpu()``, ``to("cpu")``,
  ``tolist()``, ``numpy()`` (``np.asarray``) of a device tensor, and ``copy_`` from a device tensor into a host one;
- ``h2d``: a host tensor that would have to be copied to the device: a host tensor with at least one dimension in an
  operation with device tensors (an index built on the CPU; a 0-dim host tensor is a scalar that CUDA kernels take
  as it is), and ``torch.tensor`` / ``torch.as_tensor`` of host data with ``device=``. The host tensor then counts
  as on the device, as the copy a GPU run makes once (``idx = idx.to(device)``) and uses again.

Reads that hookviz makes on the CPU only (a function that asks for the device type first and takes another way on an
accelerator, `CPU_ONLY`) and reads that the model's own code or a callable target makes are reported, not counted in
``ours``.

The backward pass runs outside every ``TorchFunctionMode`` (the autograd engine clears them), so the operations are
seen through a ``TorchDispatchMode`` (it sees every aten operation of both passes, the rules' autograd Functions and
tensor hooks included) and the Python-level conversions through patches of ``torch.Tensor``'s methods and torch's
factories, in place only inside the ``with`` block. What it cannot see: an operation that synchronises inside one
aten kernel other than those listed; a device chosen by comparing ``torch.device`` objects (on this machine every
tensor is on the CPU, so ``t.to(x.device)`` changes nothing and the ``h2d`` rule counts the copy where the tensor
meets a device tensor instead).

Validated in tests/test_host_reads.py on known examples; measured against ``torch.cuda.set_sync_debug_mode`` where a
GPU was lent (the figures are in benchmarks/results/host-reads-cpu.md).
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

import hookviz

HOOKVIZ = str(Path(hookviz.__file__).parent)
aten = torch.ops.aten

# aten operations that read values on the host (on CUDA: a device-to-host copy and a wait) whatever their arguments
SYNCING = {
    aten._local_scalar_dense,
    aten.nonzero,
    aten.masked_select,
    aten._unique,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.unique_dim_consecutive,
    aten.bincount,
    aten.equal,
    aten.allclose,
    aten._linalg_check_errors,
}
# factories that build on the host unless told a device
FACTORIES = (
    "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "rand", "randn", "randint",
    "randperm", "empty_strided", "scalar_tensor", "tril_indices", "triu_indices", "tensor", "as_tensor",
)  # fmt: skip
# Tensor methods that read values on the host (the aten operations above are seen by the dispatch mode instead)
READING_METHODS = ("cpu", "tolist", "numpy", "to")  # np.asarray(t) calls t.numpy()


def _syncs(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the aten operation `func` reads its tensor arguments' values on the host (module docstring)."""
    packet = func._overloadpacket
    if packet in SYNCING:
        return True
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        masks = [i for i in indices if isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8)]
        if not masks:
            return False
        if packet is aten.index:
            return True
        values = args[2] if len(args) > 2 else kwargs["values"]
        return not (len(indices) == 1 and values.numel() == 1)  # one value through one mask: masked_fill
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    if packet is aten.histc:
        lo, hi = (list(args[2:4]) + [kwargs.get("min", 0), kwargs.get("max", 0)])[:2]
        return lo == hi
    return False


# hookviz functions that read values on the CPU only: they ask for the device type first and take another way on
# an accelerator; their reads are reported ("CPU only"), not counted, since a GPU run never makes them
CPU_ONLY = {
    ("methods/lrp/output_rows.py", "product"),  # off the CPU the output layer's product is taken whole
    ("methods/lrp/output_rows.py", "reached"),  # the same for LRP-epsilon's product (`stabilized_rows`)
    ("methods/lrp/identity.py", "_ratio"),  # off the CPU the mask of zero inputs is always applied
    # a check after the work (every map zero, completeness) reads its values at once on the CPU; on an accelerator
    # `after_work` copies them without a wait and runs the check once an event says they have come
    ("_device.py", "_check_on_host"),
}


@dataclass(frozen=True)
class Read:
    """One kind of host read: ``kind`` ("read" or "h2d"), the operation, where it happened (the innermost line of
    hookviz on the stack), and whether hookviz made it on every device (``ours``): False where the innermost line
    outside torch belongs to someone else (the model's own code, a callable target; named in `where` too), or where a
    function of `CPU_ONLY` made it."""

    kind: str
    op: str
    where: str
    ours: bool


TORCH = str(Path(torch.__file__).parent)


def _where() -> tuple[str, bool]:
    stack = [f for f in traceback.extract_stack()[:-3] if not f.filename.startswith(TORCH) and f.filename != __file__]
    ours = next((f for f in reversed(stack) if f.filename.startswith(HOOKVIZ)), None)
    where = f"hookviz/{Path(ours.filename).relative_to(HOOKVIZ)}:{ours.lineno}" if ours is not None else "outside"
    in_hookviz = [(str(Path(f.filename).relative_to(HOOKVIZ)), f.name) for f in stack if f.filename.startswith(HOOKVIZ)]
    if any(f in CPU_ONLY for f in in_hookviz):
        return f"{where} (CPU only)", False
    if not stack or stack[-1] is ours:
        return where, ours is not None
    inner = stack[-1]
    parts = Path(inner.filename).parts
    package = next((p for p in reversed(parts[:-1]) if p not in ("models", "utils", "modeling")), "")
    return f"{where}, in {package}/{parts[-1]}:{inner.lineno}", False


class _Placement(TorchDispatchMode):
    """Follows where each tensor would live and counts the reads of aten operations (`HostReads`)."""

    def __init__(self, owner: HostReads) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        owner = self.owner
        packet = func._overloadpacket
        if packet in (aten.lift_fresh, aten.lift_fresh_copy):  # Python or numpy data: built on the host
            out = func(*args, **kwargs)
            owner.host(out)
            return out
        tensors = [t for t in _pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        device = [t for t in tensors if not owner.is_host(t)]
        if packet is aten.copy_ and owner.is_host(args[0]):
            if device:
                owner.count("read", "copy_ to the host")
            return func(*args, **kwargs)
        if device:
            for t in tensors:
                if t.dim() > 0 and owner.is_host(t):
                    owner.count("h2d", f"{func} of a host {tuple(t.shape)}")
                    owner.device(t)
            if _syncs(func, args, kwargs):
                owner.count("read", str(func))
        out = func(*args, **kwargs)
        host = bool(tensors) and not device  # a factory's result: where its Python call said (`_factory`)
        for t in _pytree.tree_leaves(out):
            if isinstance(t, Tensor):
                owner.host(t) if host else owner.device(t)
        return out


class HostReads:
    """``with HostReads() as reads: method.attribute(x, target)``: the host reads of the block, `total` and per
    `Read` in `reads` (a Counter). Tensors made before the block count as on the device (module docstring), but for
    those in `host` (a batch the user holds on the host for a model on a GPU)."""

    _lock = threading.Lock()
    _active: HostReads | None = None

    def __init__(self, host: tuple[Tensor, ...] = ()) -> None:
        self.reads: Counter[Read] = Counter()
        self._host: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        for t in host:
            self.host(t)
        self._saved: list[tuple[Any, str, Any, bool]] = []
        self._mode = _Placement(self)

    @property
    def total(self) -> int:
        """Every read of the block."""
        return sum(self.reads.values())

    @property
    def ours(self) -> int:
        """The reads hookviz makes (not the model's own, nor a callable target's)."""
        return sum(n for r, n in self.reads.items() if r.ours)

    def report(self) -> str:
        """One line per kind of read, most frequent first."""
        lines = []
        for r, n in self.reads.most_common():
            whose = "" if r.ours or r.where.endswith("(CPU only)") else " (not hookviz)"
            lines.append(f"\n  {n}x {r.kind} {r.op} at {r.where}{whose}")
        return "".join(lines)

    # -- placement ------------------------------------------------------------------------------------------------
    # a view lives where its base does: placement is kept per base tensor, so that a host tensor copied to the device
    # through one view counts as there through every other
    def is_host(self, t: Tensor) -> bool:
        return _base(t) in self._host

    def host(self, t: Tensor) -> None:
        self._host[_base(t)] = True

    def device(self, t: Tensor) -> None:
        self._host.pop(_base(t), None)

    def count(self, kind: str, op: str) -> None:
        self.reads[Read(kind, op, *_where())] += 1

    # -- the block ------------------------------------------------------------------------------------------------
    def __enter__(self) -> HostReads:
        if not HostReads._lock.acquire(blocking=False):
            raise RuntimeError("HostReads blocks cannot nest or overlap: they patch torch.Tensor for the process")
        HostReads._active = self
        try:
            for name in READING_METHODS:
                self._patch(torch.Tensor, name, _reading_method(name))
            for name in FACTORIES:
                self._patch(torch, name, _factory(getattr(torch, name)))
            self._mode.__enter__()
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._mode.__exit__(*exc)
        finally:
            self._undo()

    def _patch(self, owner: Any, name: str, make: Any) -> None:
        own = name in vars(owner)
        real = getattr(owner, name)
        self._saved.append((owner, name, real, own))
        setattr(owner, name, make(real))

    def _undo(self) -> None:
        for owner, name, real, own in reversed(self._saved):
            if own:
                setattr(owner, name, real)
            else:
                delattr(owner, name)
        self._saved.clear()
        HostReads._active = None
        HostReads._lock.release()


def _base(t: Tensor) -> Tensor:
    return t if t._base is None else t._base


def _names_cpu(device: Any) -> bool:
    """Whether a ``device`` argument names the host: only a string does here (``x.device`` is the CPU too on this
    machine, and names the model's device on a GPU run)."""
    return isinstance(device, str) and device.split(":")[0] == "cpu"


def _async_to_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` is a copy to the model's device that does not wait: ``non_blocking=True``
    with a ``torch.device`` (`hookviz._device.to_device`, which pins the host memory first on CUDA)."""
    device = kwargs.get("device", args[0] if args else None)
    return bool(kwargs.get("non_blocking")) and isinstance(device, torch.device)


def _reading_method(name: str) -> Any:
    def make(real: Any) -> Any:
        def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
            reads = HostReads._active
            if reads is not None and name == "to" and reads.is_host(self) and _async_to_device(args, kwargs):
                out = real(self, *args, **kwargs)
                out = out.clone() if out is self else out  # on a GPU run, a new tensor on the device
                reads.device(out)
                return out
            if reads is None or reads.is_host(self):
                return real(self, *args, **kwargs)
            if name == "to" and not any(_names_cpu(a) for a in (*args, kwargs.get("device"))):
                return real(self, *args, **kwargs)  # a dtype or the model's device: no copy to the host
            reads.count("read", f"Tensor.{name}")
            if name not in ("cpu", "to"):
                return real(self, *args, **kwargs)
            out = real(self, *args, **kwargs)
            out = out.clone() if out is self else out  # a CUDA tensor's .cpu() is a copy
            reads.host(out)
            return out

        method.__name__ = name
        return method

    return make


def _factory(real: Any) -> Any:
    def make(_: Any) -> Any:
        def factory(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            reads = HostReads._active
            if reads is None or not isinstance(out, Tensor):
                return out
            device = kwargs.get("device")
            data = args[0] if args else kwargs.get("data")
            if isinstance(data, Tensor):  # torch.tensor / as_tensor of a tensor: a copy, or the tensor itself
                if device is None:
                    return out  # where the tensor is (the dispatch mode saw the copy)
                if _names_cpu(device):
                    if not reads.is_host(data):
                        reads.count("read", f"torch.{real.__name__}(..., device='cpu')")
                        out = out.clone() if out is data else out
                    reads.host(out)
                elif reads.is_host(data) and data.dim() > 0:
                    reads.count("h2d", f"torch.{real.__name__}(..., device=)")
                    reads.device(out)
                return out
            if device is None or _names_cpu(device):
                reads.host(out)
            else:
                if real.__name__ in ("tensor", "as_tensor"):
                    reads.count("h2d", f"torch.{real.__name__}(..., device=)")
                reads.device(out)
            return out

        factory.__name__ = real.__name__
        return factory

    return make
