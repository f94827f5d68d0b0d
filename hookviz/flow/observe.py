"""What GradientFlow's hooks observe during one step: the statistics of module outputs and of the gradients w.r.t.
them (partial norms, ReLU unit values; activation outputs kept for the compiled kernel), the orders in which they
came (forward and backward, for the NaN localisation), and the module graph learnt from the first recorded forward
passes (which module's output feeds which). Nothing here is read back to the host."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from .._calls import CallCounter
from ..hooks import HookManager
from ..record import first_tensor
from .kernels import _Kernels, _partial_norm, _row_norms, _unit_values
from .watch import _Watched

_EDGE_FORWARDS = 4  # recorded forward passes that learn the module graph (for naming NaN culprits)


class _StepObserver:
    """The hook callbacks and the per-step state they fill; `clear` empties it once the step is written."""

    def __init__(self, watched: _Watched, kernels: _Kernels, unit_dim: int) -> None:
        self.w = watched
        self.kernels = kernels
        self.unit_dim = unit_dim
        self.tensor_hooks: HookManager | None = None  # the hooks on output gradients of this step (while attached)
        self.live = False  # this forward pass is recorded (recording step, grad mode, training mode)
        self.track_edges = False
        self.edge_forwards = 0
        self.defer_outputs = False
        self.calls = CallCounter()
        self.producer: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.inputs_of: dict[str, set[str]] = {}
        self.graph_order: dict[str, None] = {}  # every watched call key, in forward order (learnt with the edges)
        self.fwd: list[tuple[str, Tensor]] = []
        self.dead: list[tuple[str, Tensor, int, bool]] = []  # (key, *_unit_values)
        self.dead_done: list[tuple[str, Tensor]] = []  # (key, dead fraction) computed by the compiled kernel
        # activation outputs kept for the compiled kernel at the end of the step: (key, name, output, version, relu)
        self.deferred: list[tuple[str, str, Tensor, int, bool]] = []
        self.eager_outputs: set[str] = set()  # modules whose outputs are modified in place later: never deferred
        self.grads: list[tuple[str, Tensor]] = []
        self.fwd_order: dict[str, None] = {}
        self.bwd_order: dict[str, None] = {}

    @property
    def learning(self) -> bool:
        """Whether the module graph is still being learnt (the first recorded forward passes)."""
        return self.edge_forwards < _EDGE_FORWARDS

    def begin_forward(self, live: bool) -> None:
        """A forward pass of the model starts; `live`: it is recorded."""
        if self.deferred:  # gradient accumulation: the previous micro-step's outputs, before this forward makes more
            self.process_deferred()
        self.calls.reset()
        self.live = live
        self.defer_outputs = live and bool(self.w.deferrable) and self.kernels.fused_wanted()
        # which module output feeds which module is learnt from the first recorded forwards (the structure rarely
        # changes and the bookkeeping costs as much as a statistic); it only serves to name NaN culprits
        self.track_edges = live and self.learning
        if self.track_edges:
            self.edge_forwards += 1

    def on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if not self.live:
            return
        out = output if isinstance(output, Tensor) else first_tensor(output)
        key = self.calls.key(name)
        if out is None:
            return
        if self.track_edges:
            producer = self.producer
            for a in args:
                if isinstance(a, Tensor):
                    src = producer.get(a)
                    if src is not None and src != key:
                        self.inputs_of.setdefault(key, set()).add(src)
            producer[out] = key
            self.graph_order.setdefault(key, None)
        w = self.w
        if name not in w.probes:
            return
        value = out.detach()
        if key not in self.fwd_order:
            self.fwd_order[key] = None
        if (
            self.defer_outputs
            and name in w.deferrable
            and name not in self.eager_outputs
            and value.dim() >= 2
            and value.numel()
            and (name not in w.relu_like or self.unit_dim % value.dim() == 1)  # the kernel's units: dim 1
        ):
            # kept for one compiled pass over all of them at the end of the step (outputs that autograd keeps
            # anyway); the version counter tells whether it is modified in place before then
            self.deferred.append((key, name, value, value._version, name in w.relu_like))
            return
        self.output_stats(key, value, name in w.relu_like)
        if out.requires_grad and self.tensor_hooks is not None and name in w.grad_probes:
            self.tensor_hooks.tensor(out, partial(self.on_grad, key))

    def on_grad(self, key: str, grad: Tensor) -> None:
        self.grads.append((key, _partial_norm(grad)))
        if key not in self.bwd_order:
            self.bwd_order[key] = None

    def output_stats(self, key: str, value: Tensor, relu: bool) -> None:
        """The eager statistics of one module output: its partial norm and, for ReLUs, the values of its units."""
        rows = _row_norms(value)
        self.fwd.append((key, _partial_norm(value, rows)))
        if relu:
            self.dead.append((key, *_unit_values(value, self.unit_dim, rows)))

    def process_deferred(self) -> None:
        """Statistics of the kept activation outputs, with one compiled kernel (or, if compiling fails, eagerly)."""
        entries, self.deferred = self.deferred, []
        fresh = []
        for entry in entries:
            if entry[2]._version != entry[3]:  # modified in place after its module ran: its statistics are lost
                self.eager_outputs.add(entry[1])  # for this step; from now on they are taken in the hook
            else:
                fresh.append(entry)
        if not fresh:
            return
        values = [value for _, _, value, _, _ in fresh]
        relu = tuple(r for _, _, _, _, r in fresh)
        with torch.no_grad():
            stats = self.kernels.act_rows(values, relu)
            if stats is None:
                for (key, _, _, _, r), v in zip(fresh, values, strict=True):
                    self.output_stats(key, v, r)
                return
        for i, (key, _, _, _, r) in enumerate(fresh):
            self.fwd.append((key, stats[0, i]))
            if r:
                self.dead_done.append((key, stats[1, i]))

    def clear(self) -> None:
        """Forget this step's observations and remove its gradient hooks (every backward of the step is done)."""
        self.fwd.clear()
        self.dead.clear()
        self.dead_done.clear()
        self.deferred.clear()
        self.grads.clear()
        self.fwd_order = {}
        self.bwd_order = {}
        if self.tensor_hooks is not None:
            self.tensor_hooks.remove()
