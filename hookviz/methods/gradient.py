"""Input-gradient methods: the gradient of the target score w.r.t. the input, and what is built on it.

`Saliency` (the plain gradient), `InputXGradient` (gradient times input), `SmoothGrad` (any input-gradient method
averaged over noisy copies of the input) and `IntegratedGradients` (gradients averaged along a path from a baseline).

Methods that evaluate the model on many rows per input (noisy copies, path points) lay those rows out in one
"expanded batch" and run it in chunks of at most ``batch_size`` rows: one forward and one batched backward (the K
target seeds batched by `batched_grad`) per chunk, summed into the result with `index_add_`. The Python loops are
over chunks (and SmoothGrad's whole-batch noise draws), never over inputs, and the result does not depend on
``batch_size`` beyond float rounding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from numbers import Real
from typing import Any, Literal, TypeAlias

import torch
from torch import Tensor, nn

from ..hooks import HookManager
from ..inputs import check_finite
from ..targets import BackwardStrategy, TargetPlan, Targets, TargetSpec, batched_grad, resolve_targets
from .base import Attribution, register

IGMethod: TypeAlias = Literal["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]
IG_METHODS: tuple[str, ...] = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")

# Signed maps (input times gradient): sum the channels, keep 0 at the middle of the colour map.
_SIGNED_DISPLAY = {"reduce": "sum", "mode": "percentile", "cmap": "bwr", "overlay": False}


# -- shared helpers -------------------------------------------------------------------------------------------------
def _input_gradient(
    model: nn.Module,
    x: Tensor,
    target: TargetSpec | TargetPlan,
    backward: BackwardStrategy = "auto",
    forward: AbstractContextManager[Any] | None = None,
) -> tuple[Tensor, Targets]:
    """One forward of `x` (N, ...) and one batched backward: the input gradient (N, K, ...) and the resolved targets.

    Differentiates through a fresh leaf over the caller's data, so `x` never gets ``requires_grad`` or a ``.grad``.
    `forward`: a context entered around the forward pass only (a method's gradient rules).
    """
    inp = x.detach().requires_grad_(True)
    with forward if forward is not None else nullcontext():
        output = model(inp)
    targets = resolve_targets(target, output, x.shape[0])
    (grad,) = batched_grad(targets.scores, [inp], strategy=backward)
    return grad, targets


def _chunks(total: int, batch_size: int | None) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` row ranges covering ``range(total)``, at most `batch_size` rows each (None: one range)."""
    step = total if batch_size is None else batch_size
    for start in range(0, total, step):
        yield start, min(start + step, total)


def _plan_rows(plan: TargetPlan, inputs: Tensor) -> TargetPlan:
    """The plan of an expanded batch whose rows belong to the inputs `inputs` (indices into the N inputs)."""
    if plan.indices is None:
        return plan  # a callable scores whatever rows it is given
    return TargetPlan(plan.indices[inputs.to(plan.indices.device)], None, plan.multi)


def _forward_scores(model: nn.Module, x: Tensor, plan: TargetPlan, batch_size: int | None) -> Targets:
    """Target scores of `x` (N, ...) without a backward pass, in chunks; a "top class" plan resolves per input.

    Class targets run under ``torch.no_grad()``; a callable target needs its scores connected to the output
    (`resolve_targets` checks that), so it runs with a graph that is dropped right after.
    """
    scores: list[Tensor] = []
    indices: list[Tensor] = []
    multi = plan.multi
    for start, stop in _chunks(x.shape[0], batch_size):
        rows = torch.arange(start, stop)
        if plan.fn is None:
            with torch.no_grad():
                t = resolve_targets(_plan_rows(plan, rows), model(x[start:stop]), stop - start)
        else:
            t = resolve_targets(plan, model(x[start:stop].detach().requires_grad_(True)), stop - start)
        scores.append(t.scores.detach())
        if t.indices is not None:
            indices.append(t.indices)
        multi = t.multi
    return Targets(torch.cat(scores), torch.cat(indices) if indices else None, multi)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Results and sums in float32 at least (float64 stays float64), whatever the autocast dtype."""
    return torch.promote_types(dtype, torch.float32)


def _check_batch_size(batch_size: object) -> int | None:
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"batch_size must be None (all rows in one pass) or an int >= 1 (rows per forward/backward pass), "
            f"got {batch_size!r}"
        )
    return batch_size


def _check_int(name: str, value: object, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int ({what}), got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum} ({what}), got {value}")
    return value


# -- the plain gradient and input x gradient ------------------------------------------------------------------------
class InputGradientAttribution(Attribution):
    """Differentiates the target score w.r.t. the input; subclasses place gradient rules in `_forward_rules` and
    may turn the gradient into their attribution in `_from_gradient`."""

    def _forward_rules(self, hooks: HookManager) -> AbstractContextManager[Any]:
        """Place the method's hooks for one pass; the returned context is entered around its forward pass only and
        must undo, on exit, whatever it changed (none for the plain gradient)."""
        return nullcontext()

    def _from_gradient(self, x: Tensor, grad: Tensor) -> Tensor:
        """The attribution (N, K, ...) from the inputs `x` (N, ...) and their gradient (N, K, ...): the gradient."""
        return grad

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        grad, targets = _input_gradient(self.model, x, target, self.backward, self._forward_rules(hooks))
        return self._from_gradient(x, grad), targets


@register("saliency")
class Saliency(InputGradientAttribution):
    r"""Vanilla gradient (Simonyan et al., 2014, "Deep Inside Convolutional Networks", arXiv:1312.6034).

    $$ A = \partial y_c / \partial x $$, signed, shaped like the input (N, C, H, W); (N, K, C, H, W) with K
    targets per input. Take ``.abs()`` (or display with ``reduce="max-abs"``) for the paper's saliency map.

    Example::

        grads = hookviz.Saliency(model).attribute(x, target=281)
    """

    display_defaults = {"reduce": "max-abs", "mode": "minmax", "cmap": "gray", "overlay": False}


@register("input-x-gradient")
class InputXGradient(InputGradientAttribution):
    r"""Gradient times input (Shrikumar et al., 2016, "Not Just a Black Box: Learning Important Features Through
    Propagating Activation Differences", arXiv:1605.01713; analysed by Ancona et al., 2018, "Towards better
    understanding of gradient-based attribution methods for Deep Neural Networks", arXiv:1711.06104).

    $$ A = x \odot \partial y_c / \partial x $$, signed, shaped like the input (N, C, H, W); (N, K, C, H, W) with K
    targets per input. For a linear model $$ y = w^\top x + b $$ it is $$ x \odot w $$, which sums to $$ y - b $$.

    Example::

        attr = hookviz.InputXGradient(model).attribute(x, target=281)
    """

    display_defaults = _SIGNED_DISPLAY

    def _from_gradient(self, x: Tensor, grad: Tensor) -> Tensor:
        return x.detach().unsqueeze(1).to(grad.dtype) * grad


# -- SmoothGrad -----------------------------------------------------------------------------------------------------
@register("smoothgrad")
class SmoothGrad(Attribution):
    r"""SmoothGrad (Smilkov et al., 2017, "SmoothGrad: removing noise by adding noise", arXiv:1706.03825).

    Averages an input-gradient method M (`Saliency`, `GuidedBackprop`, `InputXGradient`, any
    `InputGradientAttribution`) over n noisy copies of each input:
    $$ \hat M(x) = \frac{1}{n} \sum_{s=1}^{n} M(x + \epsilon_s), \quad
    \epsilon_s \sim \mathcal{N}\big(0, (\sigma (x_{max} - x_{min}))^2\big) $$
    with $$ x_{max} - x_{min} $$ taken per input sample (the paper's noise level, ``sigma=0.15`` is 15 %);
    ``squared=True`` averages $$ M(x + \epsilon_s)^2 $$ instead (SmoothGrad-Squared, Hooker et al., 2019,
    arXiv:1806.10758). Result shaped like M's: (N, C, H, W), or (N, K, C, H, W) with K targets per input.

    Args:
        method: the method to smooth, an `InputGradientAttribution` instance (its model, ``eval_mode`` and hooks are
            used on every noisy pass); a bare `nn.Module` means ``Saliency(module)``.
        n: noisy copies per input.
        sigma: noise standard deviation as a fraction of each input's value range.
        batch_size: at most this many rows (noisy copies) per forward/backward pass; None: all N * n at once.
        squared: average the squared attributions (SmoothGrad-Squared).
        generator: a `torch.Generator` on the inputs' device for reproducible noise (None: the global generator).

    Targets: None means the top class of the *clean* input (one extra forward without gradients); ints, sequences,
    (N, K) tensors and callables apply to every noisy copy of their input (a callable is called on each chunk's
    output and must score its rows independently). The returned scores are the target scores averaged over the
    noisy copies.

    Noise, exactly (so a reference can replicate it): the model is prepared and restored once per call; the copies
    are drawn in order s = 0, ..., n-1, each as one call
    ``eps = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)`` for the whole batch x
    (N, ...), and copy s is ``x + (sigma * (x_max - x_min)) * eps`` with ``x_max``/``x_min`` the per-sample
    ``amax``/``amin`` over all non-batch axes (keepdim). The expanded batch is copy-major (row ``s * N + i`` is
    input i's copy s) and is cut into chunks of ``batch_size`` rows; copies are drawn lazily as chunks need them,
    so the noise (and the result) does not depend on ``batch_size``. The loop over draws is over whole-batch
    draws (one per noise sample), never over inputs.

    Example::

        smooth = SmoothGrad(GuidedBackprop(model), n=25, generator=torch.Generator().manual_seed(0))
        attr = smooth.attribute(x, target=281)
    """

    def __init__(
        self,
        method: InputGradientAttribution | nn.Module,
        n: int = 50,
        sigma: float = 0.15,
        *,
        batch_size: int | None = None,
        squared: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(method, type):
            raise TypeError(
                f"method must be an instance of an input-gradient method, got the class {method.__name__}; "
                f"pass e.g. SmoothGrad({method.__name__}(model))"
            )
        if isinstance(method, nn.Module):
            method = Saliency(method)
        if not isinstance(method, InputGradientAttribution):
            raise TypeError(
                "method must be an input-gradient method (Saliency, GuidedBackprop, InputXGradient, any "
                f"InputGradientAttribution) or a model (smoothed Saliency), got {type(method).__name__}"
            )
        n = _check_int("n", n, 1, "noisy copies per input")
        if isinstance(sigma, bool) or not isinstance(sigma, Real) or not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0 (a fraction of the input range), got {sigma!r}")
        batch_size = _check_batch_size(batch_size)
        if not isinstance(squared, bool):
            raise TypeError(f"squared must be a bool, got {type(squared).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        super().__init__(method.model, eval_mode=method.eval_mode, backward=method.backward)
        self.method = method
        self.n = n
        self.sigma = float(sigma)
        self.batch_size = batch_size
        self.squared = squared
        self.generator = generator
        self.display_defaults = dict(method.display_defaults)

    def __repr__(self) -> str:
        extra = f", batch_size={self.batch_size}" if self.batch_size is not None else ""
        extra += ", squared=True" if self.squared else ""
        return f"{type(self).__name__}({self.method!r}, n={self.n}, sigma={self.sigma}{extra})"

    def _explain(self, x: Tensor, target: TargetSpec, **kwargs: Any) -> tuple[Tensor, Targets]:
        g = self.generator
        if g is not None and g.device.type != x.device.type:
            raise ValueError(
                f"generator is on {g.device} but the inputs are on {x.device}; create it with "
                f"torch.Generator(device={str(x.device)!r})"
            )
        return super()._explain(x, target, **kwargs)

    def _prepared(self) -> AbstractContextManager[HookManager]:
        # the wrapped method prepares the model (its eval_mode), once for all noisy passes
        return self.method._prepared()

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        model, method, n_in = self.model, self.method, x.shape[0]
        plan: TargetPlan = target
        indices = None
        if plan.indices is None and plan.fn is None:  # the top class of the clean input
            indices = _forward_scores(model, x, plan, self.batch_size).indices
            plan = TargetPlan(indices, None, False)
        elif plan.indices is not None:
            indices = plan.indices.to(x.device)
        x = x.detach()
        dims = tuple(range(1, x.dim()))
        scale = self.sigma * (x.amax(dim=dims, keepdim=True) - x.amin(dim=dims, keepdim=True))
        copy_index, copy = -1, x
        total: Tensor | None = None
        score_total: Tensor | None = None
        multi = plan.multi
        for start, stop in _chunks(n_in * self.n, self.batch_size):
            parts = []
            for s in range(start // n_in, (stop - 1) // n_in + 1):  # the copies this chunk touches, in order
                if s > copy_index:  # chunks are contiguous: s is the next copy to draw
                    eps = torch.randn(x.shape, generator=self.generator, device=x.device, dtype=x.dtype)
                    copy_index, copy = s, x + scale * eps
                parts.append(copy[max(start - s * n_in, 0) : min(stop - s * n_in, n_in)])
            rows = torch.arange(start, stop, device=x.device) % n_in
            chunk = parts[0] if len(parts) == 1 else torch.cat(parts)
            # a manager per chunk: the method places its hooks (rules) for this pass only
            with HookManager(model) as chunk_hooks:
                attr, targets = method._run(chunk, _plan_rows(plan, rows), chunk_hooks)
            attr = attr.detach().to(_acc_dtype(attr.dtype))
            if self.squared:
                attr = attr * attr
            if total is None:
                total = attr.new_zeros((n_in, *attr.shape[1:]))
                score_total = attr.new_zeros((n_in, targets.scores.shape[1]))
            total.index_add_(0, rows, attr)
            score_total.index_add_(0, rows, targets.scores.detach().to(score_total.dtype))  # type: ignore[union-attr]
            multi = targets.multi
        assert total is not None and score_total is not None  # n >= 1 and N >= 1: at least one chunk
        return total / self.n, Targets(score_total / self.n, indices, multi)


# -- Integrated Gradients -------------------------------------------------------------------------------------------
def ig_nodes(method: str, steps: int) -> tuple[list[float], list[float]]:
    """Path positions alpha_j in [0, 1] and weights w_j (summing to 1) of a quadrature rule.

    Riemann rules use ``steps`` equal weights 1/steps at the left ends, right ends or midpoints of ``steps``
    intervals; ``riemann_trapezoid`` is the trapezoid rule on ``linspace(0, 1, steps)``: weights 1/(steps - 1),
    halved at both ends (captum's weights are 1/steps, halved at the ends, which sum to (steps - 1) / steps and
    underestimate every attribution by that factor); ``gausslegendre`` uses the Gauss-Legendre nodes and weights
    of numpy's ``leggauss`` mapped from [-1, 1] to [0, 1].
    """
    m = steps
    if method == "gausslegendre":
        import numpy as np

        nodes, weights = np.polynomial.legendre.leggauss(m)
        return (0.5 * (1 + nodes)).tolist(), (0.5 * weights).tolist()
    if method == "riemann_trapezoid":
        alphas = torch.linspace(0, 1, m, dtype=torch.float64).tolist()
        weights = [1 / (m - 1)] * m
        weights[0] /= 2
        weights[-1] /= 2
        return alphas, weights
    offset = {"riemann_left": 0.0, "riemann_middle": 0.5, "riemann_right": 1.0}[method]
    return [(j + offset) / m for j in range(m)], [1 / m] * m


@register("integrated-gradients")
class IntegratedGradients(Attribution):
    r"""Integrated Gradients (Sundararajan et al., 2017, "Axiomatic Attribution for Deep Networks",
    arXiv:1703.01365).

    The gradient integrated along the straight path from a baseline x' to the input x:
    $$ A = (x - x') \odot \int_0^1 \frac{\partial y_c}{\partial x}\Big|_{x' + \alpha (x - x')} d\alpha
    \approx (x - x') \odot \sum_{j=1}^{m} w_j \frac{\partial y_c}{\partial x}\Big|_{x' + \alpha_j (x - x')} $$
    with m = ``steps`` positions alpha_j and weights w_j of the quadrature rule ``method`` (`ig_nodes`; the same
    conventions as captum's ``approximation_methods``, so results match captum's `IntegratedGradients`). Result
    shaped like the input (N, C, H, W); (N, K, C, H, W) with K targets per input.

    Completeness: the attributions sum to $$ y_c(x) - y_c(x') $$ up to the quadrature error. After each call
    ``last_delta`` holds the (N, K) error ``sum(A) - (y_c(x) - y_c(x'))`` (float32; float64 for float64 inputs),
    and a warning names the worst input when ``|delta| > 0.01 |y_c(x) - y_c(x')| + 1e-8`` for any input: use more
    steps. The Riemann and Gauss-Legendre rules give captum's numbers; ``riemann_trapezoid`` is the true trapezoid
    rule, which is (steps / (steps - 1)) times captum's (whose trapezoid weights do not sum to 1).

    Args:
        baseline: None (zeros), a number (a constant image), or a tensor that broadcasts to the inputs' shape.
        steps: quadrature points m (>= 1; >= 2 for the Riemann rules).
        method: ``"gausslegendre"`` (default), ``"riemann_left"``, ``"riemann_right"``, ``"riemann_middle"`` or
            ``"riemann_trapezoid"``.
        batch_size: at most this many rows (path points) per forward/backward pass; None: all N * steps at once.

    Targets: None means the top class of the input x (not of each path point). Cost: N * steps rows forward and
    backward, plus 2N rows forward for y(x) and y(x'). The expanded batch is step-major (row ``j * N + i`` is input
    i at alpha_j).

    Example::

        ig = IntegratedGradients(model, steps=64, batch_size=128)
        attr = ig.attribute(x, target=281); print(ig.last_delta)
    """

    display_defaults = _SIGNED_DISPLAY

    def __init__(
        self,
        model: nn.Module,
        steps: int = 50,
        baseline: Tensor | float | None = None,
        *,
        method: IGMethod = "gausslegendre",
        batch_size: int | None = None,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        if method not in IG_METHODS:
            raise ValueError(f"method must be one of {', '.join(map(repr, IG_METHODS))}; got {method!r}")
        minimum = 1 if method == "gausslegendre" else 2
        steps = _check_int("steps", steps, minimum, f"quadrature points; >= {minimum} for method={method!r}")
        if baseline is not None and not isinstance(baseline, Tensor):
            if isinstance(baseline, bool) or not isinstance(baseline, Real):
                raise TypeError(
                    "baseline must be None (zeros), a number (a constant image) or a tensor that broadcasts to the "
                    f"inputs' shape; got {type(baseline).__name__}"
                )
        if isinstance(baseline, Tensor) and (baseline.is_complex() or baseline.dtype == torch.bool):
            raise TypeError(f"baseline tensor must hold real numbers, got dtype {baseline.dtype}")
        if isinstance(baseline, Real) and not math.isfinite(baseline):
            raise ValueError(f"baseline must be a finite number (a constant image), got {baseline!r}")
        if isinstance(baseline, Tensor):
            check_finite(baseline, "baseline")
        batch_size = _check_batch_size(batch_size)
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self.steps = steps
        self.baseline = baseline
        self.method = method
        self.batch_size = batch_size
        self.last_delta: Tensor | None = None

    def __repr__(self) -> str:
        extra = f", batch_size={self.batch_size}" if self.batch_size is not None else ""
        return f"{type(self).__name__}({type(self.model).__name__}, steps={self.steps}, method={self.method!r}{extra})"

    def _baseline_for(self, x: Tensor) -> Tensor:
        b = self.baseline
        if b is None:
            return torch.zeros_like(x)
        if not isinstance(b, Tensor):
            return torch.full_like(x, float(b))
        try:
            shape = torch.broadcast_shapes(b.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(
                f"baseline of shape {tuple(b.shape)} does not broadcast to the inputs' shape {tuple(x.shape)}; give "
                "one baseline (C, H, W) / (1, C, H, W) or one per input (N, C, H, W)"
            )
        check_finite(b, "baseline")  # again at call time: the tensor may have changed in place since __init__
        return b.detach().to(device=x.device, dtype=x.dtype).expand_as(x)

    def _explain(self, x: Tensor, target: TargetSpec, **kwargs: Any) -> tuple[Tensor, Targets]:
        baseline = self._baseline_for(x)  # shape errors before any work
        self.last_delta = None
        return super()._explain(x, target, baseline=baseline, **kwargs)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        model, n_in = self.model, x.shape[0]
        x = x.detach()
        baseline: Tensor = kwargs.get("baseline", None)
        if baseline is None:
            baseline = self._baseline_for(x)
        plan: TargetPlan = target
        # y(x) resolves "top class" at the input itself; y(x') with the same targets
        at_x = _forward_scores(model, x, plan, self.batch_size)
        if plan.indices is None and plan.fn is None:
            plan = TargetPlan(at_x.indices, None, False)
        at_baseline = _forward_scores(model, baseline, plan, self.batch_size)

        alphas, weights = ig_nodes(self.method, self.steps)
        acc = _acc_dtype(x.dtype)
        alpha_t = torch.tensor(alphas, dtype=torch.float64).to(device=x.device, dtype=x.dtype)
        weight_t = torch.tensor(weights, dtype=torch.float64).to(device=x.device, dtype=acc)
        diff = x - baseline
        view = (-1,) + (1,) * (x.dim() - 1)
        total: Tensor | None = None
        for start, stop in _chunks(n_in * self.steps, self.batch_size):
            rows = torch.arange(start, stop, device=x.device)
            i, j = rows % n_in, rows // n_in
            points = baseline[i] + alpha_t[j].view(view) * diff[i]
            grad, _ = _input_gradient(model, points, _plan_rows(plan, i), self.backward)
            grad = grad.detach().to(acc) * weight_t[j].view(-1, *(1,) * (grad.dim() - 1))
            if total is None:
                total = grad.new_zeros((n_in, *grad.shape[1:]))
            total.index_add_(0, i, grad)
        assert total is not None  # steps >= 1 and N >= 1: at least one chunk
        attribution = diff.to(acc).unsqueeze(1) * total
        self._check_completeness(attribution, at_x.scores, at_baseline.scores)
        targets = Targets(at_x.scores, at_x.indices, at_x.multi)
        return attribution, targets

    def _check_completeness(self, attribution: Tensor, fx: Tensor, fb: Tensor) -> None:
        expected = fx.to(attribution.dtype) - fb.to(attribution.dtype)  # (N, K)
        delta = attribution.flatten(2).sum(2) - expected
        self.last_delta = delta
        excess = delta.abs() - (0.01 * expected.abs() + 1e-8)
        if bool((excess > 0).any()):
            rel = delta.abs() / (expected.abs() + 1e-8)
            worst = int(rel.flatten().argmax())
            i, k = divmod(worst, rel.shape[1])
            where = f"input {i}" + (f", target column {k}" if rel.shape[1] > 1 else "")
            warnings.warn(
                f"IntegratedGradients: attributions of {where} sum to {float(attribution[i, k].sum()):.4g} but "
                f"f(x) - f(baseline) = {float(expected[i, k]):.4g} (error {float(rel[i, k]):.1%} > 1%); increase "
                f"steps (now {self.steps}, method={self.method!r}); see .last_delta",
                stacklevel=6,
            )
