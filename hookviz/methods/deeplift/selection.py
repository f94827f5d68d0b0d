r"""DeepLift's rule for selections, the operations whose every output is one of their inputs, chosen by value: max
pooling, exact for any pool (every kernel, stride, padding, dilation and ``ceil_mode``, 1-D, 2-D and 3-D, adaptive
pools, modules and functional calls), and the max / min reductions (``amax``, ``amin``, ``torch.max(x, dim)``, ...).

Each output of a max pool equals one input of its window: ``y_j = t_{s(j)}`` at the row and ``y'_j = t'_{s'(j)}``
at its reference row, with s and s' the two rows' own selections. The output's difference goes whole to one of the
two selected inputs, the one whose row holds the larger output (captum's choice for non-overlapping windows,
Shrikumar et al. 2017 section 3.5.2 "Max operation"):

$$ \Delta y_j = \underbrace{(\max(y_j, y'_j) - y'_j)}_{\text{to } s(j)} +
   \underbrace{(y_j - \max(y_j, y'_j))}_{\text{to } s'(j)} $$

and each input's multiplier is the sum of what reaches it over every window it is selected in, divided by its own
difference ``t_i - t'_i`` (the gradient where that is at rounding, `rescale.negligible`; no share reaches an
input whose difference is zero, since then ``y_j = y'_j``). So ``sum_i m_i (t_i - t'_i) = sum_j g_j (y_j - y'_j)``
for any overlap of the windows.

The shares are routed by the pool's own backward pass (the vector-Jacobian product of the pool at each row, with
the share as the output's gradient), which adds what overlapping windows send to one input. The previous rule,
as captum's, scattered them with ``max_unpool``, which keeps only one of the windows that select an input (and on
CUDA an arbitrary one): wrong wherever windows overlap, the stem of every ResNet, DenseNet and GoogLeNet. The
pool's backward is deterministic where PyTorch's is (every CPU pool; 1-D and 2-D pools on CUDA; 3-D and adaptive
pools on CUDA add with atomics, which changes the last bits from run to run).

A minimum is the same with the smaller output deciding. ``torch.maximum(a, b)`` of two activations is
``a + relu(b - a)`` (``torch.minimum``: ``a - relu(a - b)``), exact through the rescale rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..rules import MAX_POOL_MODULES, Call, Rule, out_of_place, spellings
from .rescale import elementwise, negligible
from .rows import differences

MODULES = MAX_POOL_MODULES
_POOLS = ("max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d")
POOL_FUNCTIONS = {func: label for name in _POOLS for func, label in spellings(name, inplace=False).items()}
REDUCTION_FUNCTIONS = {
    func: label
    for name in ("amax", "amin", "max", "min", "maximum", "minimum")
    for func, label in spellings(name, inplace=False).items()
}


class _SelectFn(torch.autograd.Function):
    """Output: the selection's output; backward: each output's difference routed to the selected input of the row
    whose output decides (the larger for a max, the smaller for a min), summed over the outputs that select an
    input, divided by the input's difference."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, y: Tensor, select: Callable[[Tensor], Tensor], largest: bool) -> Tensor:
        ctx.select, ctx.largest = select, largest
        ctx.save_for_backward(t.detach(), y.detach())
        return y.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None]:
        t, y = ctx.saved_tensors
        out, out_ref = y.chunk(2)
        top = torch.maximum(out, out_ref) if ctx.largest else torch.minimum(out, out_ref)
        shares = g * torch.cat([top - out_ref, out - top])  # the row's share to its selection, the reference's to its
        with torch.enable_grad():
            tr = t.detach().requires_grad_(True)
            chosen = ctx.select(tr)
            (routed,) = torch.autograd.grad(chosen, tr, shares, retain_graph=True)
            (plain,) = torch.autograd.grad(chosen, tr, g)
        a, b = routed.chunk(2)
        reached = (a + b).repeat(2, *(1,) * (a.dim() - 1))  # what reaches input i, from either row's selection
        d_in = differences(t)
        small = negligible(t, d_in)
        return torch.where(small, plain, reached / torch.where(small, torch.ones_like(d_in), d_in)), None, None, None


def _rows(t: object) -> bool:
    return isinstance(t, Tensor) and t.requires_grad and t.dim() >= 1 and t.shape[0] % 2 == 0


def _max_pool(call: Call) -> Tensor:
    if not _rows(call.input):
        return NotImplemented  # type: ignore[return-value]
    return _SelectFn.apply(call.input, call.output.detach(), call.function(), True)


def _reduction(call: Call) -> Any:
    """``amax`` / ``amin`` / ``max`` / ``min`` over dims (a full reduction has no rows: left as it is), and the
    two-tensor ``max`` / ``min`` / ``maximum`` / ``minimum``."""
    t, rest, kwargs = call.input, call.args[1:], call.kwargs
    largest = call.name.split(".")[-1] in ("amax", "max", "maximum")
    if not _rows(t):
        return NotImplemented
    other = rest[0] if rest else kwargs.get("other")
    if isinstance(other, Tensor):  # elementwise: a + relu(b - a), a - relu(a - b)
        if len(rest) + len(kwargs) != 1:
            return NotImplemented
        return t + elementwise(torch.relu, other - t) if largest else t - elementwise(torch.relu, t - other)
    dims = rest[0] if rest else kwargs.get("dim")
    if dims is None or 0 in {d % t.dim() for d in ((dims,) if isinstance(dims, int) else dims)}:
        return NotImplemented  # a full reduction, or one over the rows themselves: the two rows would mix
    base = out_of_place(call.op) or call.op
    out = base(*call.args, **kwargs)
    values = out if isinstance(out, Tensor) else out[0]
    if isinstance(out, Tensor):
        select = lambda tr: base(tr, *rest, **kwargs)  # noqa: E731
        return _SelectFn.apply(t, values.detach(), select, largest)
    select = lambda tr: base(tr, *rest, **kwargs)[0]  # noqa: E731
    return type(out)((_SelectFn.apply(t, values.detach(), select, largest), out[1]))


MAX_POOL = Rule("max-pool", _max_pool, needs_input=True)
REDUCTION = Rule("selection", _reduction, owns_call=True)
