r"""DeepLift with the rescale rule, and DeepLiftShap (Shrikumar et al., 2017, "Learning Important Features Through
Propagating Activation Differences", ICML, arXiv:1704.02685; Lundberg & Lee, 2017, "A Unified Approach to
Interpreting Model Predictions", NeurIPS).

The inputs and their baselines run in one batched forward pass (2N rows). At every nonlinearity call
``y = f(t)`` the backward pass uses the multiplier $$ m = (f(t) - f(t')) / (t - t') $$ of the input's row and its
baseline's row instead of the derivative (the plain gradient where ``|t - t'| < 1e-10``), and max pooling uses
captum's rule; linear layers keep their gradient. The attribution is $$ (x - x') \odot m_{x \to y_c} $$, which sums
to $$ y_c(x) - y_c(x') $$ (summation-to-delta).

Where captum's ``DeepLift`` covers only modules of exact types, here the rule applies to ReLU, ELU, LeakyReLU,
Sigmoid, Tanh, Softplus, GELU and SiLU as modules (of those types or subclasses) **and** as functional calls inside a
``forward`` (``F.relu``, ``torch.sigmoid``, ``x.relu()``, ...): DeepLift is a rule table (`rule_table`) on the rule
engine `hookviz.methods.rules`, as the ReLU rules are; a module called several times gets one rule per call;
in-place ReLUs run out of place during the call.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from numbers import Real
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..hooks import HookManager
from ..inputs import check_finite
from ..targets import BackwardStrategy, TargetPlan, Targets, batched_grad, resolve_targets
from .base import Attribution, register
from .baseline import baseline_like, check_baseline
from .gradient import _SIGNED_DISPLAY
from .rules import Call, Coverage, Rule, RuleEngine, RuleTable

_EPS = 1e-10  # captum's threshold below which a difference counts as zero
NONLINEAR_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ELU,
    nn.LeakyReLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Softplus,
    nn.GELU,
    nn.SiLU,
)
MAXPOOL_MODULES: tuple[type[nn.Module], ...] = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
NONLINEAR_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.relu: "F.relu",
    torch.relu: "torch.relu",
    Tensor.relu: "Tensor.relu",
    torch.relu_: "torch.relu_",
    Tensor.relu_: "Tensor.relu_",
    F.elu: "F.elu",
    F.leaky_relu: "F.leaky_relu",
    torch.sigmoid: "torch.sigmoid",
    Tensor.sigmoid: "Tensor.sigmoid",
    F.sigmoid: "F.sigmoid",
    torch.tanh: "torch.tanh",
    Tensor.tanh: "Tensor.tanh",
    F.tanh: "F.tanh",
    F.softplus: "F.softplus",
    F.gelu: "F.gelu",
    F.silu: "F.silu",
}


def _halves(t: Tensor) -> Tensor:
    """``t[:n] - t[n:]`` repeated for both halves (2n, ...): the difference of each row to its baseline row."""
    a, b = t.chunk(2)
    d = a - b
    return torch.cat([d, d])


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
        d_in, d_out = _halves(t), _halves(y)
        with torch.enable_grad():
            tr = t.detach().requires_grad_(True)
            (plain,) = torch.autograd.grad(ctx.fn(tr), tr, g)
        small = d_in.abs() < _EPS
        return torch.where(small, plain, g * d_out / torch.where(small, torch.ones_like(d_in), d_in)), None, None, None


class _MaxPoolFn(torch.autograd.Function):
    """captum's max-pool rule: the larger of the two pooled outputs decides, both rows' deltas routed back."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, y: Tensor, module: nn.Module) -> Tensor:
        ctx.module = module
        ctx.save_for_backward(t.detach(), y.detach())
        return y.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        t, y = ctx.saved_tensors
        m = ctx.module
        dims = t.dim() - 2
        pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[dims - 1]
        unpool = (F.max_unpool1d, F.max_unpool2d, F.max_unpool3d)[dims - 1]
        d_in = _halves(t)
        out, out_ref = y.chunk(2)
        top = torch.max(out, out_ref)
        d_out = torch.cat([top - out_ref, out - top])
        _, idx = pool(t, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, True)
        u, u_ref = unpool(g * d_out, idx, m.kernel_size, m.stride, m.padding, list(t.shape)).chunk(2)
        u = torch.cat(2 * [u + u_ref])
        with torch.enable_grad():
            tr = t.detach().requires_grad_(True)
            (plain,) = torch.autograd.grad(m.forward(tr), tr, g)
        small = d_in.abs() < _EPS
        return torch.where(small, plain, u / torch.where(small, torch.ones_like(d_in), d_in)), None, None


def _rescale(call: Call) -> Tensor:
    # an in-place call that the engine split overwrites its input afterwards: the rule keeps a copy of its values
    return _RescaleFn.apply(call.input, call.output.detach(), call.function(), call.inplace)


def _max_pool(call: Call) -> Tensor:
    return _MaxPoolFn.apply(call.input, call.output.detach(), call.op)


RESCALE = Rule("rescale", _rescale, needs_input=True)
MAX_POOL = Rule("max-pool", _max_pool, needs_input=True)


def rule_table() -> RuleTable:
    """DeepLift as a rule table: the rescale rule on the nonlinear modules and functions, captum's rule on max
    pooling. Nothing is watched: a nonlinearity without a rule shows in the summation-to-delta warning instead."""
    return (
        RuleTable()
        .modules(NONLINEAR_MODULES, RESCALE)
        .modules(MAXPOOL_MODULES, MAX_POOL)
        .functions(NONLINEAR_FUNCTIONS, RESCALE)
    )


def _coverage_dict(coverage: Coverage) -> dict[str, Any]:
    """The summary DeepLift reports as ``coverage``: module calls rewritten, functional calls rewritten by name."""
    modules = sum(kinds["module"] for kinds in coverage.by_kind.values())
    covered = coverage.covered.get(RESCALE.name, {})
    return {"modules": modules, "functional": {n: c for n, c in covered.items() if coverage.kind_of[n] == "functional"}}


def _warn_delta(method: str, delta: Tensor, expected: Tensor, sums: Tensor, stacklevel: int = 7) -> None:
    excess = delta.abs() - (0.01 * expected.abs() + 1e-8)
    if bool((excess > 0).any()):
        rel = delta.abs() / (expected.abs() + 1e-8)
        worst = int(rel.flatten().argmax())
        i, k = divmod(worst, rel.shape[1])
        where = f"input {i}" + (f", target column {k}" if rel.shape[1] > 1 else "")
        warnings.warn(
            f"{method}: attributions of {where} sum to {float(sums[i, k]):.4g} but f(x) - f(baseline) = "
            f"{float(expected[i, k]):.4g} (error {float(rel[i, k]):.1%} > 1%): a nonlinearity without a rule "
            "(see the module docstring) passes its plain gradient; see .last_delta",
            stacklevel=stacklevel,
        )


def _deeplift(
    model: nn.Module, hooks: HookManager, x: Tensor, base: Tensor, plan: TargetPlan, method: str = "DeepLift"
) -> tuple[Tensor, Targets, Tensor, Coverage]:
    """Multipliers (N, K, ...) of the rows `x` w.r.t. their baselines `base` (both (N, ...)), the targets at x,
    the scores at the baselines (N, K) and the rule engine's report: one forward of 2N rows, K backward passes."""
    n = x.shape[0]
    engine = RuleEngine(model, hooks, rule_table(), method=method)
    leaf = torch.cat([x.detach(), base.detach()]).requires_grad_(True)
    with engine.forward_pass():
        output = model(leaf)
    assert engine.coverage is not None
    if not isinstance(output, Tensor) or output.shape[0] != 2 * n:
        raise ValueError("DeepLift needs a model output tensor with one row per input (N, classes)")
    if plan.fn is None:
        targets = resolve_targets(plan, output[:n], n)
        ref = output[n:].gather(1, targets.indices)  # type: ignore[arg-type]
    else:  # the callable scores the rows at x and at the baselines, each time on the user's rows
        both = resolve_targets(plan.take(torch.arange(2 * n) % n), output, 2 * n)
        targets, ref = Targets(both.scores[:n], None, both.multi), both.scores[n:]
    # both halves are differentiated, as in captum: the baseline rows' gradients feed the max-pool rule, which
    # routes both rows' deltas. The custom backward functions do not batch under vmap: K backward passes.
    (grads,) = batched_grad(targets.scores + ref, [leaf], strategy="loop")
    ref = ref.detach()
    return grads[:n], targets, ref, engine.coverage


@register("deeplift")
class DeepLift(Attribution):
    r"""DeepLift, rescale rule (Shrikumar et al., 2017, arXiv:1704.02685); see the module docstring.

    $$ A = (x - x') \odot m $$ with the multipliers m of the rescale rule (``multiply_by_inputs=False``: m itself),
    shaped like the input (N, C, H, W); (N, K, C, H, W) with K targets per input. Equal to captum's ``DeepLift``
    where captum handles the model. After each call ``last_delta`` holds the (N, K) summation-to-delta gap
    ``sum(A) - (y_c(x) - y_c(x'))``; a warning names the worst input when it exceeds 1% of ``y_c(x) - y_c(x')``.

    Args:
        baseline: a number (a constant image, default 0), or a tensor broadcasting to the inputs' shape.
        multiply_by_inputs: multiply the multipliers by ``x - x'`` (captum's default, "global" attribution).

    Example::

        dl = DeepLift(model, baseline=0.0)
        attr = dl.attribute(x, target=3); print(dl.last_delta)
    """

    display_defaults = _SIGNED_DISPLAY

    def __init__(
        self,
        model: nn.Module,
        baseline: Tensor | float = 0.0,
        *,
        multiply_by_inputs: bool = True,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        if baseline is None or isinstance(baseline, tuple):
            raise TypeError("baseline must be a number or a tensor that broadcasts to the inputs' shape")
        check_baseline(baseline)
        if not isinstance(multiply_by_inputs, bool):
            raise TypeError(f"multiply_by_inputs must be True or False, got {multiply_by_inputs!r}")
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self.baseline = baseline
        self.multiply_by_inputs = multiply_by_inputs
        self.last_delta: Tensor | None = None
        self.coverage: dict[str, Any] | None = None
        self.rule_coverage: Coverage | None = None

    def _explain(self, x: Tensor, target: Any, **kwargs: Any) -> tuple[Tensor, Targets]:
        base = baseline_like(self.baseline, x)  # shape errors before any work
        self.last_delta = None
        return super()._explain(x, target, baseline=base, **kwargs)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        base = kwargs["baseline"]
        mult, targets, ref, coverage = _deeplift(self.model, hooks, x, base, target, type(self).__name__)
        self.rule_coverage = coverage
        self.coverage = _coverage_dict(coverage)
        diff = (x - base).detach().unsqueeze(1).to(mult.dtype)
        attribution = diff * mult
        sums = attribution.flatten(2).sum(2)
        expected = targets.scores.detach() - ref
        self.last_delta = sums - expected
        if self.multiply_by_inputs:
            _warn_delta(type(self).__name__, self.last_delta, expected, sums)
            return attribution, targets
        return mult, targets


@register("deeplift-shap")
class DeepLiftShap(Attribution):
    r"""DeepLiftShap (Lundberg & Lee, 2017): DeepLift averaged over a distribution of B baselines, as captum's
    ``DeepLiftShap``: every input paired with every baseline (N * B rows and their N * B baselines in one forward
    pass), $$ A_i = \frac{1}{B} \sum_b (x_i - x'_b) \odot m_{i,b} $$. Result shaped like the input (N, C, H, W);
    (N, K, C, H, W) with K targets per input. ``last_delta``: (N, K) gap ``sum(A) - (y_c(x) - mean_b y_c(x'_b))``.

    Args:
        baselines: a tensor (B, C, H, W) of B >= 1 baselines (e.g. images of a background data set), or a number:
            one constant baseline (default 0.0, which makes it DeepLift with a zero baseline).
    """

    display_defaults = _SIGNED_DISPLAY

    def __init__(
        self,
        model: nn.Module,
        baselines: Tensor | float = 0.0,
        *,
        multiply_by_inputs: bool = True,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        _check_distribution(baselines)
        if not isinstance(multiply_by_inputs, bool):
            raise TypeError(f"multiply_by_inputs must be True or False, got {multiply_by_inputs!r}")
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self.baselines = baselines
        self.multiply_by_inputs = multiply_by_inputs
        self.last_delta: Tensor | None = None
        self.rule_coverage: Coverage | None = None

    def _explain(self, x: Tensor, target: Any, **kwargs: Any) -> tuple[Tensor, Targets]:
        _check_distribution_shape(self.baselines, x)
        self.last_delta = None
        return super()._explain(x, target, **kwargs)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        plan: TargetPlan = target
        n = x.shape[0]
        b = distribution(self.baselines, x)
        nb = b.shape[0]
        if plan.indices is None and plan.fn is None:  # the top class of each input, not of each pair
            with torch.no_grad():
                top = self.model(x).argmax(1, keepdim=True)
            plan = TargetPlan(top.cpu(), None, False)
        rows = torch.arange(n, device=x.device).repeat_interleave(nb)  # input i paired with baselines 0..B-1
        xs = x.detach()[rows]
        bs = b.repeat(n, *(1,) * (b.dim() - 1))
        pair_plan = plan.take(rows)  # a callable sees the user's inputs: one call per baseline
        mult, targets, ref, coverage = _deeplift(self.model, hooks, xs, bs, pair_plan, type(self).__name__)
        self.rule_coverage = coverage
        diff = (xs - bs).unsqueeze(1).to(mult.dtype)
        pairs = diff * mult if self.multiply_by_inputs else mult
        attribution = pairs.view(n, nb, *pairs.shape[1:]).mean(1)
        scores = targets.scores.view(n, nb, -1)[:, 0]
        expected = scores.detach() - ref.view(n, nb, -1).mean(1)
        sums = attribution.flatten(2).sum(2)
        self.last_delta = sums - expected
        if self.multiply_by_inputs:
            _warn_delta(type(self).__name__, self.last_delta, expected, sums)
        indices = targets.indices.view(n, nb, -1)[:, 0] if targets.indices is not None else None
        return attribution, Targets(scores, indices, targets.multi)


def _check_distribution(baselines: object) -> None:
    if isinstance(baselines, Real) and not isinstance(baselines, bool):
        if not math.isfinite(baselines):
            raise ValueError(f"baselines must be a finite number (one constant baseline), got {baselines!r}")
        return
    if not isinstance(baselines, Tensor):
        raise TypeError(
            f"baselines must be a tensor (B, ...) of B baselines or a number (one constant baseline), got "
            f"{type(baselines).__name__}"
        )
    if not baselines.is_floating_point():
        raise TypeError(f"baselines must hold floating-point values, got dtype {baselines.dtype}")
    if baselines.dim() < 1 or baselines.shape[0] == 0:
        raise ValueError(
            f"baselines is an empty distribution (shape {tuple(baselines.shape)}); give B >= 1 baselines (B, C, H, W)"
        )
    check_finite(baselines, "baselines")


def distribution(baselines: Tensor | float, x: Tensor) -> Tensor:
    """The baselines (B, ...) on `x`'s device and dtype; a number is one constant baseline shaped like one input."""
    if not isinstance(baselines, Tensor):
        return torch.full((1, *x.shape[1:]), float(baselines), device=x.device, dtype=x.dtype)
    return baselines.detach().to(device=x.device, dtype=x.dtype)


def _check_distribution_shape(baselines: Tensor | float, x: Tensor) -> None:
    if isinstance(baselines, Tensor) and tuple(baselines.shape[1:]) != tuple(x.shape[1:]):
        raise ValueError(
            f"baselines of shape {tuple(baselines.shape)} do not match the inputs' shape {tuple(x.shape)}: give B "
            f"baselines shaped like one input, (B, {', '.join(map(str, x.shape[1:]))})"
        )


__all__ = ["DeepLift", "DeepLiftShap"]
