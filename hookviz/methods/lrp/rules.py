r"""LRP rules (Bach et al., 2015, "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by Layer-Wise
Relevance Propagation", PLoS ONE; Montavon et al., 2019, "Layer-Wise Relevance Propagation: An Overview").

Each rule maps the relevance ``R`` (N, ...) at a layer's output to the relevance at its input, from tensors stored in
the forward pass (the input ``x`` and, where the rule needs it, the output ``z``). The formulas and defaults are
zennit's (0.5.1, ``zennit.rules``), so maps agree with zennit to float32 rounding; they are written here as explicit
affine terms instead of re-running the layer with modified parameters:

- a term ``t`` is a modified input ``x_t`` and modified parameters ``(W_t, b_t)``; its output is
  ``z_t = layer(x_t; W_t, b_t)`` and ``vjp_t(g) = W_t^T g`` (the transposed layer, no forward pass);
- ``stabilize(z, eps) = z + eps * sign(z)`` with ``sign(0) = +1`` (zennit's default stabilizer).

`LinearRule` subclasses apply to layers with ``weight``/``bias`` (convolutions, ``nn.Linear``, with BatchNorm folded
in); `Norm` and `Pass` apply to parameter-free layers (sums, average pooling, activations).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._device import to_device
from . import output_rows


def stabilize(z: Tensor, epsilon: float = 1e-6) -> Tensor:
    """``z + epsilon * sign(z)`` with ``sign(0) = +1`` (zennit's ``stabilize``): the denominator of every rule.

    Written as ``z + ([z >= 0] * 2 eps - eps)`` with eps rounded to the default dtype (as ``torch.where(z >= 0, eps,
    -eps)`` rounds it): the same numbers bit for bit, in a third of the time of a ``where`` on scalars."""
    eps = rounded(epsilon, torch.get_default_dtype())
    return (z >= 0).to(z.dtype).mul_(2 * eps).sub_(eps).add_(z)


@functools.lru_cache(maxsize=64)
def rounded(epsilon: float, dtype: torch.dtype) -> float:
    """`epsilon` rounded to `dtype` (the default dtype: as ``torch.where(z >= 0, eps, -eps)`` rounds it), once."""
    return float(torch.tensor(epsilon, dtype=dtype))


def stabilized_ratio(r: Tensor, z: Tensor, epsilon: float = 1e-6) -> Tensor:
    """``r / stabilize(z, epsilon)``, the same numbers, written into the fresh denominator where its shape and dtype
    are the result's: one output-sized temporary fewer at the backward pass's peak (an LM head's logits are large).

    With epsilon 0 a zero denominator gives 0, not 0/0: a neuron with ``z = 0`` passes no relevance (it has none to
    pass where the rules conserve: its relevance is its activation times a factor), so that the unstabilised rules
    conserve exactly on bias-free networks instead of spreading NaN."""
    d = stabilize(z, epsilon)
    if (r.shape == d.shape and r.dtype == d.dtype) or (
        d.shape == torch.broadcast_shapes(r.shape, d.shape) and torch.result_type(r, d) == d.dtype
    ):
        out = torch.div(r, d, out=d) if epsilon != 0 else torch.div(r, d).masked_fill_(d == 0, 0.0)
        return out
    out = r / d
    return out if epsilon != 0 else out.masked_fill_((d == 0).expand_as(out), 0.0)


def _check_eps(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass
class Affine:
    """A convolution or fully connected layer as the rules see it: its kind, parameters and geometry.

    ``weight``/``bias`` are the values of this call (with a following BatchNorm folded in); ``forward`` computes the
    layer with other parameters, ``vjp`` applies the transposed layer (the gradient w.r.t. the input) to ``g``.
    """

    kind: str  # "linear" or "conv"
    weight: Tensor
    bias: Tensor | None
    conv: dict[str, Any] | None = None  # stride, padding, dilation, groups, transposed, output_padding
    # the output layer (`output_rows`): `vjp` over the rows and columns of g that hold a non-zero value
    rows: bool = False
    # the input is known to be >= 0 (a ReLU's output, pooled or reshaped: `LayerRules.nonnegative`): the x- terms of the
    # sign-splitting rules are zero and skipped
    nonnegative: bool = False

    @classmethod
    def of(cls, module: nn.Module) -> Affine:
        w = module.weight.detach()
        b = module.bias.detach() if getattr(module, "bias", None) is not None else None
        if isinstance(module, nn.Linear):
            return cls("linear", w, b)
        if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
            return cls("linear", w.t(), b)  # transformers' GPT-2 Conv1D: y = x W + b with W (in, out)
        conv = module  # a torch.nn.modules.conv._ConvNd
        if isinstance(conv.padding, str):
            raise TypeError(
                f"LRP: {type(module).__name__} with padding={conv.padding!r} is not supported; use numeric padding"
            )
        return cls(
            "conv",
            w,
            b,
            {
                "stride": conv.stride,
                "padding": conv.padding,
                "dilation": conv.dilation,
                "groups": conv.groups,
                "transposed": conv.transposed,
                "output_padding": conv.output_padding,
                "padding_mode": conv.padding_mode,
            },
        )

    def forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self.kind == "linear":
            return F.linear(x, weight, bias)
        c = self.conv
        assert c is not None
        if c["padding_mode"] != "zeros":
            raise TypeError(f"LRP: convolutions with padding_mode={c['padding_mode']!r} are not supported")
        return torch.ops.aten.convolution(
            x, weight, bias, c["stride"], c["padding"], c["dilation"], c["transposed"], c["output_padding"], c["groups"]
        )

    def vjp(self, g: Tensor, x: Tensor, weight: Tensor) -> Tensor:
        """``W^T g``: the gradient of ``layer(x; weight)`` w.r.t. x for the output gradient `g` (x gives the shape)."""
        if self.kind == "linear":
            return output_rows.product(g, weight) if self.rows else g @ weight
        c = self.conv
        assert c is not None
        return torch.ops.aten.convolution_backward(
            g,
            x,
            weight,
            None,
            c["stride"],
            c["padding"],
            c["dilation"],
            c["transposed"],
            c["output_padding"],
            c["groups"],
            [True, False, False],
        )[0]

    def folded(self, bn: nn.Module) -> Affine:
        """This layer with the BatchNorm `bn` (in eval mode) that follows it folded in, as zennit's
        ``MergeBatchNorm``: ``W' = W * s``, ``b' = (b - mean) * s + beta`` with ``s = gamma / sqrt(var + eps)``."""
        if self.kind == "conv" and self.conv and self.conv["transposed"]:
            raise TypeError("LRP: folding BatchNorm into a transposed convolution is not supported")
        var, mean = bn.running_var.detach(), bn.running_mean.detach()
        gamma = bn.weight.detach() if bn.weight is not None else torch.ones_like(var)
        beta = bn.bias.detach() if bn.bias is not None else torch.zeros_like(var)
        scale = gamma / (var + bn.eps) ** 0.5
        w = self.weight * scale.view(-1, *(1,) * (self.weight.dim() - 1))
        b = self.bias if self.bias is not None else torch.zeros_like(mean)
        return Affine(self.kind, w, (b - mean) * scale + beta, self.conv, nonnegative=self.nonnegative)


class Rule:
    """Base class of all rules; ``name`` is how composites and error messages call it."""

    name: ClassVar[str] = ""
    needs_output: ClassVar[bool] = False  # whether the rule reads the layer's output z of the forward pass

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class LinearRule(Rule):
    """A rule for layers with weights (convolutions, ``nn.Linear``).

    In gradient-times-input form (`gradient`) the rule maps the gradient g at the layer's output y (relevance
    ``y * g``) to the gradient at its input, whose relevance is ``x * gradient``: exact for the rules whose input
    relevance is a multiple of x (``proportional``: epsilon, z+, alpha-beta, gamma). The others (flat, w², z^B) spread
    relevance over inputs whatever their value; their `relevance` is taken and divided by x (or, on the explained
    input itself, handed to it whole: `layer_fn`)."""

    proportional: ClassVar[bool] = True

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        """Relevance at the input (shaped like `x`) from the relevance `r` at the output (shaped like `z`)."""
        raise NotImplementedError

    def gradient(self, layer: Affine, x: Tensor, y: Tensor, g: Tensor) -> Tensor:
        """The gradient at the input (relevance ``x * gradient``) from the gradient `g` at the output `y`."""
        raise NotImplementedError


def _split(x: Tensor, nonnegative: bool) -> tuple[Tensor, Tensor | None]:
    """``(x+, x-)``, with ``x- = None`` where `x` is known to be >= 0 (`Affine.nonnegative`: after a ReLU): the x-
    terms of a rule are then exactly zero, and skipping them halves its convolutions. Known from the forward pass,
    not read from the values (on a GPU, a read waits for the device: one per layer); where it is not known, both
    terms are computed, and an x- of zeros adds zeros (the same relevance, but for the sign of a zero)."""
    if nonnegative or x.numel() == 0:
        return x, None
    return x.clamp(min=0), x.clamp(max=0)


def _signed_term(
    layer: Affine,
    x: Tensor,
    parts: tuple[Tensor, Tensor | None],
    w_pos: Tensor,
    w_neg: Tensor | None,
    bias: Tensor | None,
    r: Tensor,
    stabilizer: float,
    mask: Tensor | None = None,
) -> Tensor:
    r"""One sign-split term of z+, alpha-beta and gamma: $$ z = W_+ x^+ + b + W_- x^- $$,
    $$ s = m R / \mathrm{stab}(z) $$, $$ R_{in} = x^+ W_+^\top s + x^- W_-^\top s $$ (`parts` from `_split`; `w_neg`
    is only read when x has negative entries; `mask` m, if given, selects the outputs the term explains)."""
    xp, xn = parts
    z = layer.forward(xp, w_pos, bias)
    if xn is not None:
        assert w_neg is not None
        z = z + layer.forward(xn, w_neg, None)
    s = stabilized_ratio(r if mask is None else mask * r, z, stabilizer)
    out = xp * layer.vjp(s, x, w_pos)
    if xn is not None:
        out = out + xn * layer.vjp(s, x, w_neg)  # type: ignore[arg-type]
    return out


def _signed_gradient(
    layer: Affine,
    x: Tensor,
    parts: tuple[Tensor, Tensor | None],
    w_pos: Tensor,
    w_neg: Tensor | None,
    bias: Tensor | None,
    r: Tensor,
    stabilizer: float,
    mask: Tensor | None = None,
) -> Tensor:
    r"""`_signed_term` in gradient-times-input form: its relevance $$ x^+ W_+^\top s + x^- W_-^\top s $$ over x,
    $$ W_+^\top s $$ where x > 0 and $$ W_-^\top s $$ where x < 0 (where x = 0 the relevance is 0 either way)."""
    xp, xn = parts
    z = layer.forward(xp, w_pos, bias)
    if xn is not None:
        assert w_neg is not None
        z = z + layer.forward(xn, w_neg, None)
    s = stabilized_ratio(r if mask is None else mask * r, z, stabilizer)
    out = layer.vjp(s, x, w_pos)
    if xn is None:
        return out
    return torch.where(x > 0, out, layer.vjp(s, x, w_neg))  # type: ignore[arg-type]


def _pos(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clamp(min=0)


def _neg(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clamp(max=0)


class Epsilon(LinearRule):
    r"""LRP-epsilon (Bach et al., 2015): $$ R_i = x_i \sum_j w_{ij} R_j / \mathrm{stab}(z_j, \epsilon) $$ with the
    layer's own output z (bias included); ``epsilon=0`` is LRP-0. Default epsilon 1e-6 (zennit's)."""

    name = "epsilon"
    needs_output = True

    def __init__(self, epsilon: float = 1e-6) -> None:
        self.epsilon = _check_eps("epsilon", epsilon)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        assert z is not None
        return x * layer.vjp(stabilized_ratio(r, z, self.epsilon), x, layer.weight)

    def gradient(self, layer: Affine, x: Tensor, y: Tensor, g: Tensor) -> Tensor:
        return layer.vjp(stabilized_ratio(y * g, y, self.epsilon), x, layer.weight)


class ZPlus(LinearRule):
    r"""LRP-z+ (Montavon et al., 2017; zennit's form, which allows negative inputs): positive contributions only,
    $$ z^+ = W^+ x^+ + W^- x^- + b^+ $$, $$ R = x^+ (W^+)^\top s + x^- (W^-)^\top s $$, $$ s = R / \mathrm{stab}(z^+)
    $$. Equals `AlphaBeta` with alpha=1, beta=0."""

    name = "zplus"

    def __init__(self, stabilizer: float = 1e-6) -> None:
        self.stabilizer = _check_eps("stabilizer", stabilizer)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        parts = _split(x, layer.nonnegative)
        wn = None if parts[1] is None else layer.weight.clamp(max=0)
        return _signed_term(layer, x, parts, layer.weight.clamp(min=0), wn, _pos(layer.bias), r, self.stabilizer)

    def gradient(self, layer: Affine, x: Tensor, y: Tensor, g: Tensor) -> Tensor:
        parts = _split(x, layer.nonnegative)
        wn = None if parts[1] is None else layer.weight.clamp(max=0)
        wp = layer.weight.clamp(min=0)
        return _signed_gradient(layer, x, parts, wp, wn, _pos(layer.bias), y * g, self.stabilizer)


class AlphaBeta(LinearRule):
    r"""LRP-alpha-beta (Bach et al., 2015), zennit's form: positive contributions weighted by alpha, negative ones by
    beta, each normalized by its own sum; ``alpha - beta`` must be 1 (conservation). Defaults alpha=2, beta=1."""

    name = "alpha-beta"

    def __init__(self, alpha: float = 2.0, beta: float = 1.0, stabilizer: float = 1e-6) -> None:
        for n, v in (("alpha", alpha), ("beta", beta)):
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"AlphaBeta: {n} must be a finite number >= 0, got {v!r}")
        if abs(float(alpha) - float(beta) - 1.0) > 1e-12:
            raise ValueError(f"AlphaBeta: alpha - beta must equal 1 (conservation); got alpha={alpha}, beta={beta}")
        self.alpha, self.beta = float(alpha), float(beta)
        self.stabilizer = _check_eps("stabilizer", stabilizer)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        parts = _split(x, layer.nonnegative)
        wp, wn = layer.weight.clamp(min=0), layer.weight.clamp(max=0)
        out = self.alpha * _signed_term(layer, x, parts, wp, wn, _pos(layer.bias), r, self.stabilizer)
        if self.beta == 0:
            return out
        return out - self.beta * _signed_term(layer, x, parts, wn, wp, _neg(layer.bias), r, self.stabilizer)

    def gradient(self, layer: Affine, x: Tensor, y: Tensor, g: Tensor) -> Tensor:
        parts = _split(x, layer.nonnegative)
        wp, wn = layer.weight.clamp(min=0), layer.weight.clamp(max=0)
        r = y * g
        out = self.alpha * _signed_gradient(layer, x, parts, wp, wn, _pos(layer.bias), r, self.stabilizer)
        if self.beta == 0:
            return out
        return out - self.beta * _signed_gradient(layer, x, parts, wn, wp, _neg(layer.bias), r, self.stabilizer)


class Gamma(LinearRule):
    r"""Generalized LRP-gamma (Montavon et al., 2019; Andéol et al., 2021), zennit's form: where the output is
    positive, inputs and weights of agreeing sign are boosted, $$ W + \gamma W^+ $$ on $$ x^+ $$ and
    $$ W + \gamma W^- $$ on $$ x^- $$ (bias $$ b + \gamma b^+ $$ on the first term); where it is negative, the
    opposite pairing. Default gamma 0.25."""

    name = "gamma"
    needs_output = True

    def __init__(self, gamma: float = 0.25, stabilizer: float = 1e-6) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, Real) or not math.isfinite(gamma) or gamma < 0:
            raise ValueError(f"Gamma: gamma must be a finite number >= 0, got {gamma!r}")
        self.gamma = float(gamma)
        self.stabilizer = _check_eps("stabilizer", stabilizer)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        assert z is not None
        g, w, b = self.gamma, layer.weight, layer.bias
        w_up, w_dn = w + g * w.clamp(min=0), w + g * w.clamp(max=0)
        b_up = None if b is None else b + g * b.clamp(min=0)
        b_dn = None if b is None else b + g * b.clamp(max=0)
        parts = _split(x, layer.nonnegative)
        # output > 0: x+ with W + gW+ (bias b + gb+), x- with W + gW- (no bias); output < 0: the opposite pairing
        up = _signed_term(layer, x, parts, w_up, w_dn, b_up, r, self.stabilizer, (z > 0).to(r.dtype))
        return up + _signed_term(layer, x, parts, w_dn, w_up, b_dn, r, self.stabilizer, (z < 0).to(r.dtype))

    def gradient(self, layer: Affine, x: Tensor, y: Tensor, g: Tensor) -> Tensor:
        gm, w, b = self.gamma, layer.weight, layer.bias
        w_up, w_dn = w + gm * w.clamp(min=0), w + gm * w.clamp(max=0)
        b_up = None if b is None else b + gm * b.clamp(min=0)
        b_dn = None if b is None else b + gm * b.clamp(max=0)
        parts = _split(x, layer.nonnegative)
        r = y * g
        up = _signed_gradient(layer, x, parts, w_up, w_dn, b_up, r, self.stabilizer, (y > 0).to(r.dtype))
        return up + _signed_gradient(layer, x, parts, w_dn, w_up, b_dn, r, self.stabilizer, (y < 0).to(r.dtype))


class ZBox(LinearRule):
    r"""LRP-z^B (Montavon et al., 2017) for inputs bounded by ``low <= x <= high`` (first layer on pixels):
    $$ z = W x - W^+ l - W^- h $$, $$ R = x W^\top s - l (W^+)^\top s - h (W^-)^\top s $$. `low`/`high`: numbers
    or tensors broadcasting to one input, e.g. (1, C, 1, 1) per channel."""

    name = "zbox"
    proportional = False

    def __init__(self, low: float | Tensor, high: float | Tensor, stabilizer: float = 1e-6) -> None:
        for n, v in (("low", low), ("high", high)):
            if v is None:
                raise ValueError(
                    "ZBox needs the input bounds low= and high= (e.g. the normalized images of pixel values 0 and 1)"
                )
            if not isinstance(v, Tensor) and (isinstance(v, bool) or not isinstance(v, Real)):
                raise TypeError(f"ZBox: {n} must be a number or a tensor, got {type(v).__name__}")
        self.low, self.high = low, high
        self.stabilizer = _check_eps("stabilizer", stabilizer)

    def bound(self, value: float | Tensor, x: Tensor, which: str) -> Tensor:
        """The bound expanded to the input's shape; a bound that does not broadcast raises `ValueError`."""
        if not isinstance(value, Tensor):
            return torch.full_like(x, float(value))
        t = to_device(value.detach().to(x.dtype), x.device)  # bounds built on the host: copied without a wait
        check_bound(value, x.shape, which)
        while t.dim() < x.dim() and t.dim() == x.dim() - 1:
            t = t.unsqueeze(0)
        return t.expand_as(x)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        low, high = self.bound(self.low, x, "low"), self.bound(self.high, x, "high")
        w = layer.weight
        wp, wn = w.clamp(min=0), w.clamp(max=0)
        b = layer.bias
        zb = layer.forward(x, w, b) - layer.forward(low, wp, _pos(b)) - layer.forward(high, wn, _neg(b))
        s = stabilized_ratio(r, zb, self.stabilizer)
        return x * layer.vjp(s, x, w) - low * layer.vjp(s, x, wp) - high * layer.vjp(s, x, wn)


def check_bound(value: float | Tensor, shape: torch.Size | tuple[int, ...], which: str) -> None:
    """`ValueError` unless the ZBox bound `value` broadcasts to inputs of `shape` (N, C, H, W)."""
    if not isinstance(value, Tensor):
        return
    try:
        ok = torch.broadcast_shapes(tuple(value.shape), tuple(shape)) == tuple(shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"ZBox: {which} of shape {tuple(value.shape)} does not broadcast to the first layer's input "
            f"{tuple(shape)}; give a number, a (C, 1, 1) or (1, C, 1, 1) tensor, or one shaped like the input"
        )


class Flat(LinearRule):
    r"""LRP-flat (Lapuschkin et al., 2019): relevance spread uniformly over the receptive field, all weights and
    inputs set to one, no bias: $$ R_i = \sum_j R_j / \mathrm{stab}(\sum_i 1) $$."""

    name = "flat"
    proportional = False

    def __init__(self, stabilizer: float = 1e-6) -> None:
        self.stabilizer = _check_eps("stabilizer", stabilizer)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        ones = torch.ones_like(x)
        w = torch.ones_like(layer.weight)
        s = r / stabilize(layer.forward(ones, w, None), self.stabilizer)
        return layer.vjp(s, x, w)


class WSquare(LinearRule):
    r"""LRP-w^2 (Montavon et al., 2017): $$ R_i = \sum_j w_{ij}^2 R_j / \mathrm{stab}(\sum_i w_{ij}^2 + b_j^2) $$
    (zennit squares the bias too)."""

    name = "wsquare"
    proportional = False

    def __init__(self, stabilizer: float = 1e-6) -> None:
        self.stabilizer = _check_eps("stabilizer", stabilizer)

    def relevance(self, layer: Affine, x: Tensor, z: Tensor | None, r: Tensor) -> Tensor:
        w2 = layer.weight**2
        b2 = None if layer.bias is None else layer.bias**2
        s = r / stabilize(layer.forward(torch.ones_like(x), w2, b2), self.stabilizer)
        return layer.vjp(s, x, w2)


class Norm(Rule):
    r"""Relevance split in proportion to each input's contribution, for parameter-free linear layers (sums of
    branches, average pooling): $$ R_i = x_i \, (J^\top (R / \mathrm{stab}(z)))_i $$."""

    name = "norm"
    needs_output = True

    def __init__(self, stabilizer: float = 1e-6) -> None:
        self.stabilizer = _check_eps("stabilizer", stabilizer)


class Pass(Rule):
    """Relevance passed through unchanged (elementwise layers: activations, a folded BatchNorm)."""

    name = "pass"


class Gradient(Rule):
    """No rule: the layer's own gradient (max pooling routes relevance to the maximum, as in zennit)."""

    name = "gradient"


RULES: dict[str, type[Rule]] = {
    cls.name: cls for cls in (Epsilon, ZPlus, AlphaBeta, Gamma, ZBox, Flat, WSquare, Norm, Pass, Gradient)
}
