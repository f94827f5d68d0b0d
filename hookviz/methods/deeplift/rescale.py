r"""DeepLift's rescale rule on every elementwise function of one input (Shrikumar et al., 2017, arXiv:1704.02685,
section 3.5.1): for ``y = f(t)`` the multiplier of each row is the secant slope to its reference row,
$$ m = (f(t) - f(t')) / (t - t') $$, the derivative where ``t - t'`` is at the dtype's rounding (`negligible`). Then
``m * (t - t') = f(t) - f(t')`` holds for each element whatever f is: monotone or not (GELU, SiLU, Mish), smooth
or not (ReLU6, Hardswish), so the rule covers every elementwise function, activations and arithmetic alike (``exp``,
``rsqrt``, ``x ** 2``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..rules import Call, Rule, spellings
from .rows import differences

#: Elementwise activation modules (subclasses too: ``nn.ReLU6`` is an ``nn.Hardtanh``).
MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ELU,
    nn.CELU,
    nn.SELU,
    nn.LeakyReLU,
    nn.PReLU,
    nn.RReLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Softplus,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Hardtanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.LogSigmoid,
    nn.Softsign,
    nn.Tanhshrink,
    nn.Softshrink,
    nn.Hardshrink,
    nn.Threshold,
)

# elementwise functions of one tensor input; their other arguments are constants (a slope, a threshold, an exponent)
_ACTIVATIONS = (
    "relu", "relu6", "elu", "celu", "selu", "leaky_relu", "prelu", "rrelu", "sigmoid", "tanh", "softplus", "gelu",
    "silu", "mish", "hardtanh", "hardswish", "hardsigmoid", "logsigmoid", "softsign", "tanhshrink", "softshrink",
    "hardshrink", "threshold",
)  # fmt: skip
_ARITHMETIC = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "square", "abs", "pow",
    "erf", "erfc", "sin", "cos", "atan", "asinh", "sinh", "cosh", "clamp", "clip", "sign", "sgn",
)  # fmt: skip


def _functions() -> dict[Callable[..., Any], str]:
    found: dict[Callable[..., Any], str] = {}
    for name in _ACTIVATIONS + _ARITHMETIC:
        for func, label in spellings(name).items():
            found.setdefault(func, label)
    found.setdefault(Tensor.__pow__, "**")
    return found


#: Every spelling of those functions: ``F.relu``, ``torch.relu_``, ``Tensor.exp``, ``x ** 2``, ...
FUNCTIONS: dict[Callable[..., Any], str] = _functions()


class _RescaleFn(torch.autograd.Function):
    """Output: ``f(t)``; backward: the rescale multiplier, the derivative where the input difference vanishes."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, y: Tensor, fn: Callable[[Tensor], Tensor], copy: bool = False) -> Tensor:
        ctx.fn = fn
        # an in-place call overwrites t afterwards: keep a copy of its values then
        ctx.save_for_backward(t.detach().clone() if copy else t.detach(), y.detach())
        return y.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None]:
        t, y = ctx.saved_tensors
        return rescaled(ctx.fn, t, y, g), None, None, None


def negligible(t: Tensor, d_in: Tensor) -> Tensor:
    """Where the rows' difference `d_in` (2n, ...) of the rows `t` is at the dtype's rounding, ``|t - t'| <= 4 u
    (|t| + |t'|)`` (u: the unit roundoff), or not a number (two rows at -inf, a masked score): there the multiplier
    is the derivative, and the secant would divide rounding noise by rounding noise. The threshold is relative:
    captum's absolute 1e-10 takes the derivative also where a difference is real but small (1e-11 at values of 1),
    which in float64 missed GoogLeNet's summation-to-delta by 2e4 rounding units."""
    a, b = t.chunk(2)
    size = (a.abs() + b.abs()).repeat(2, *(1,) * (a.dim() - 1))
    unit = torch.finfo(t.dtype).eps / 2 if t.is_floating_point() else 0.0
    return ~(d_in.abs() > 4 * unit * size)


def rescaled(fn: Callable[[Tensor], Tensor], t: Tensor, y: Tensor, g: Tensor) -> Tensor:
    """``g * (f(t) - f(t')) / (t - t')`` of the rows `t` (2n, ...) and their outputs `y`; ``g * f'(t)`` where the
    rows' difference is `negligible`."""
    d_in = differences(t)
    small = negligible(t, d_in)
    with torch.enable_grad():
        tr = t.detach().requires_grad_(True)
        (plain,) = torch.autograd.grad(fn(tr), tr, g)
    return torch.where(small, plain, g * differences(y) / torch.where(small, torch.ones_like(d_in), d_in))


def elementwise(fn: Callable[[Tensor], Tensor], t: Tensor) -> Tensor:
    """``fn(t)`` with the rescale rule as its backward (for operations written out: `decomposed`)."""
    return _RescaleFn.apply(t, fn(t.detach()), fn)


def _other_inputs_need_grad(call: Call) -> bool:
    rest = list(call.args[1:]) + [v for k, v in call.kwargs.items() if k != "input"]
    return any(isinstance(a, Tensor) and a.requires_grad for a in rest)


def _random_slope(call: Call) -> bool:
    """A training-mode RReLU (``eval_mode=False``): its slopes are drawn anew for each element and call."""
    if isinstance(call.op, nn.RReLU):
        return call.op.training
    if call.op in (F.rrelu, F.rrelu_):
        training = call.kwargs.get("training", call.args[3] if len(call.args) > 3 else False)
        return bool(training)
    return False


def _rescale(call: Call) -> Tensor:
    t = call.input
    if not isinstance(t, Tensor) or not t.requires_grad or _other_inputs_need_grad(call):
        # ``x ** y``, ``clamp(x, min=t)``, F.prelu with a weight of another activation: not one input's function
        return NotImplemented  # type: ignore[return-value]
    if _random_slope(call):
        return NotImplemented  # type: ignore[return-value]  # a slope drawn per element: not one function of t
    # an in-place call that the engine split overwrites its input afterwards: the rule keeps a copy of its values
    return _RescaleFn.apply(t, call.output.detach(), call.function(), call.inplace)


RESCALE = Rule("rescale", _rescale, needs_input=True)
