"""Input-gradient methods: the gradient of the target score w.r.t. the input, and what is built on it.

`Saliency` (the plain gradient; Simonyan et al., 2014, arXiv:1312.6034), `InputXGradient` (gradient times input;
Shrikumar et al., 2016, arXiv:1605.01713) and `IntegratedGradients` (gradients averaged along a path from a
baseline; Sundararajan et al., 2017, arXiv:1703.01365), with the helpers they share with the methods that expand
the batch (`chunks`, `plan_rows`, `forward_scores`, the argument checks). Noise over a method (SmoothGrad,
VarGrad) is in `noise`, which builds on this file.

Methods that evaluate the model on many rows per input (path points, noisy copies) lay those rows out in one
"expanded batch" and run it in chunks of at most ``batch_size`` rows: one forward and one batched backward (the K
target seeds batched by `batched_grad`) per chunk, summed into the result with `index_add_`. The Python loops are
over chunks, never over inputs, and the result does not depend on ``batch_size`` beyond float rounding.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar, Literal, TypeAlias

import torch
from torch import Tensor, nn

from .._checks import int_at_least
from .._device import after_work, to_device
from ..hooks import HookManager, Selector
from ..targets import BackwardStrategy, TargetPlan, Targets, TargetSpec, batched_grad, resolve_targets
from .base import Attribution, register
from .baseline import baseline_like, check_baseline
from .batch import acc_dtype, check_batch_size, chunks, plan_rows, scores_and_layer
from .forward import ForwardArgs, as_tuple, take_rows
from .layer import LayerTap

IGMethod: TypeAlias = Literal["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]
IG_METHODS: tuple[str, ...] = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")

# Signed maps (input times gradient): sum the channels, keep 0 at the middle of the colour map.
SIGNED_DISPLAY = {"reduce": "sum", "mode": "percentile", "cmap": "bwr", "overlay": False}


def worst_gap(delta: Tensor, expected: Tensor, sums: Tensor) -> Tensor:
    """Whether any attribution's sum misses f(x) - f(baseline) by more than 1%, and the worst one's figures, from
    (N, K) gaps `delta`, `expected` changes and `sums`: one tensor on their device (missed, the worst's flat index,
    its sum, its f(x) - f(baseline), its relative error), so that a check reads them in one copy. In float32 at
    least (float64 where the sums or changes are: each figure exact; the index below 2**24), not float64 for float32,
    which MPS lacks."""
    excess = delta.abs() - (0.01 * expected.abs() + 1e-8)
    rel = (delta.abs() / (expected.abs() + 1e-8)).flatten()
    worst = rel.argmax()
    picked = [t.flatten().take(worst) for t in (sums, expected, rel)]
    dtype = torch.promote_types(torch.promote_types(sums.dtype, expected.dtype), torch.float32)
    return torch.stack([t.to(dtype) for t in ((excess > 0).any(), worst, *picked)])


def gap_text(method: str, gap: Tensor, columns: int) -> str | None:
    """The start of a completeness warning from `worst_gap`'s values on the host (None where nothing is missed):
    which input (and target column, of `columns`) misses f(x) - f(baseline) most, and by how much."""
    missed, worst, total, expected, rel = gap.tolist()
    if not missed:
        return None
    i, k = divmod(int(worst), columns)
    where = f"input {i}" + (f", target column {k}" if columns > 1 else "")
    return (
        f"{method}: attributions of {where} sum to {total:.4g} but f(x) - f(baseline) = {expected:.4g} "
        f"(error {rel:.1%} > 1%)"
    )


# -- shared helpers -------------------------------------------------------------------------------------------------
def _gradients(
    model: nn.Module,
    xs: tuple[Tensor, ...],
    target: TargetSpec | TargetPlan,
    backward: BackwardStrategy,
    forward_args: ForwardArgs,
    tap: LayerTap | None = None,
    at: Tensor | None = None,
    forward: AbstractContextManager[Any] | None = None,
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Targets]:
    """One forward of the inputs `xs` (each (N, ...)) and one batched backward.

    Returns the tensors differentiated, their gradients (N, K, ...) and the resolved targets. Without `tap`: every
    input, through fresh leaves over the caller's data (which never get ``requires_grad`` or a ``.grad``). With
    `tap`: the layer's tensor, as computed (`at` None) or replaced by `at`; the inputs are passed as they are
    (integer token ids included). `forward`: a context entered around the forward pass only (a method's gradient
    rules).
    """
    with forward if forward is not None else nullcontext():
        if tap is None:
            wrt = tuple(t.detach().requires_grad_(True) for t in xs)
            output = forward_args(model, wrt)
        else:
            with tap.capture() if at is None else tap.replace(at.detach().requires_grad_(True)) as taken:
                output = forward_args(model, tuple(t.detach() for t in xs))
            wrt = (tap.one(taken),)
    targets = resolve_targets(target, output, xs[0].shape[0])
    grads = batched_grad(targets.scores, list(wrt), strategy=backward)
    return wrt, tuple(grads), targets


# -- the plain gradient and input x gradient ------------------------------------------------------------------------
class InputGradientAttribution(Attribution):
    """Differentiates the target score w.r.t. the input; subclasses place gradient rules in `_forward_rules` and
    may turn the gradient into their attribution in `_from_gradient`.

    Several inputs: ``attribute((x1, x2), additional_forward_args=(mask,))`` differentiates
    ``model(x1, x2, mask)`` w.r.t. x1 and x2 and returns a tuple of attributions shaped like them.

    Args (`Saliency` and `InputXGradient`):
        layer: attribute to this module's output instead of the input (captum's ``Layer*`` methods): a module of
            the model, its dotted name, or any `HookManager` selector that names exactly one module; the result
            is shaped like that tensor, (N, ...) or (N, K, ...). The inputs may then be integer tensors (token ids
            into an embedding). The module must run exactly once per forward and output one float tensor.
        layer_input: attribute to the module's (first) input instead of its output.
    """

    multi_input = True
    layer_support: ClassVar[bool] = False  # whether layer= is offered (it is not for the ReLU-rule methods)

    def __init__(
        self,
        model: nn.Module,
        *,
        layer: Selector | None = None,
        layer_input: bool = False,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self._tap = _layer_tap(self, model, layer, layer_input)

    @property
    def layer(self) -> str | None:
        """Dotted name of the layer attributed to (None: the input)."""
        return None if self._tap is None else self._tap.name

    def _allows_integer_inputs(self) -> bool:
        return self._tap is not None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__}{', ' + repr(self._tap) if self._tap else ''})"

    def _forward_rules(self, hooks: HookManager) -> AbstractContextManager[Any]:
        """Place the method's hooks for one pass; the returned context is entered around its forward pass only and
        must undo, on exit, whatever it changed (none for the plain gradient)."""
        return nullcontext()

    def _from_gradient(self, x: Tensor, grad: Tensor) -> Tensor:
        """The attribution (N, K, ...) from the inputs `x` (N, ...) and their gradient (N, K, ...): the gradient."""
        return grad

    def _run(
        self, x: Tensor | tuple[Tensor, ...], target: Any, hooks: HookManager, **kwargs: Any
    ) -> tuple[Tensor | tuple[Tensor, ...], Targets]:
        """A tuple of attributions, one per input (the layer's attribution alone with ``layer=``)."""
        xs = as_tuple(x)
        fwd = kwargs.get("forward_args") or ForwardArgs((), xs[0].shape[0])
        wrt, grads, targets = _gradients(
            self.model, xs, target, self.backward, fwd, self._tap, forward=self._forward_rules(hooks)
        )
        attributions = tuple(self._from_gradient(w, g) for w, g in zip(wrt, grads, strict=True))
        return (attributions[0] if self._tap is not None else attributions), targets


def _layer_tap(method: Attribution, model: nn.Module, layer: Selector | None, layer_input: bool) -> LayerTap | None:
    if layer is None:
        if layer_input is not False:
            raise ValueError(f"layer_input={layer_input!r} needs layer= (the module whose input is attributed to)")
        return None
    if not getattr(method, "layer_support", True):
        raise TypeError(
            f"{type(method).__name__} does not take layer=; layer attribution is offered by Saliency, InputXGradient "
            "and IntegratedGradients (and SmoothGrad / VarGrad over them)"
        )
    return LayerTap(model, layer, layer_input=layer_input)


@register("saliency")
class Saliency(InputGradientAttribution):
    r"""Vanilla gradient (Simonyan et al., 2014, "Deep Inside Convolutional Networks", arXiv:1312.6034).

    $$ A = \partial y_c / \partial x $$, signed, shaped like the input (N, C, H, W); (N, K, C, H, W) with K
    targets per input. Take ``.abs()`` (or display with ``reduce="max-abs"``) for the paper's saliency map.
    With ``layer=`` it is the gradient w.r.t. that layer's output, shaped like it (captum's
    ``LayerGradientXActivation(..., multiply_by_inputs=False)``).

    Example::

        grads = hookviz.Saliency(model).attribute(x, target=281)
    """

    display_defaults = {"reduce": "max-abs", "mode": "minmax", "cmap": "gray", "overlay": False}
    layer_support = True
    # a token's gradient is a direction, not a share of the score: its signed sum over the embedding is rounding
    # noise after a LayerNorm (whose input gradient sums to zero over the normalised axis), its norm is the size
    token_reduction = "norm"


@register("input-x-gradient")
class InputXGradient(InputGradientAttribution):
    r"""Gradient times input (Shrikumar et al., 2016, "Not Just a Black Box: Learning Important Features Through
    Propagating Activation Differences", arXiv:1605.01713; analysed by Ancona et al., 2018, "Towards better
    understanding of gradient-based attribution methods for Deep Neural Networks", arXiv:1711.06104).

    $$ A = x \odot \partial y_c / \partial x $$, signed, shaped like the input (N, C, H, W); (N, K, C, H, W) with K
    targets per input. For a linear model $$ y = w^\top x + b $$ it is $$ x \odot w $$, which sums to $$ y - b $$.
    With ``layer=`` it is the layer's activation times its gradient (captum's ``LayerGradientXActivation``).

    Example::

        attr = hookviz.InputXGradient(model).attribute(x, target=281)
    """

    display_defaults = SIGNED_DISPLAY
    layer_support = True

    def _from_gradient(self, x: Tensor, grad: Tensor) -> Tensor:
        return x.detach().unsqueeze(1).to(grad.dtype) * grad


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

    Several inputs: ``attribute((x1, x2), additional_forward_args=(mask,))`` integrates every input's path at once
    (one alpha for all of them) and returns a tuple of attributions; completeness holds for their sum. Per-sample
    tensors among ``additional_forward_args`` (first dimension N) are expanded with the path points.

    Layer attribution (``layer=``, captum's ``LayerIntegratedGradients``): the path runs in the layer's output
    space, from the layer's output at the baseline, A', to its output at the input, A (both computed by forward
    passes of the inputs and baselines given in input space): $$ (A - A') \odot \sum_j w_j \partial y_c / \partial
    A |_{A' + lpha_j (A - A')} $$, each point run with the model's inputs x and the layer's output replaced.
    Integer inputs (token ids) are allowed: ``IntegratedGradients(model, layer="embedding")`` explains a text model
    through its embedding, with baseline token ids (default 0, often the padding id). The result is shaped like
    the layer's output; completeness holds when everything from the inputs to the output passes through the layer.

    Args:
        baseline: None (zeros), a number (a constant image), a tensor that broadcasts to the inputs' shape, or a
            tuple of those (one per input tensor).
        steps: quadrature points m (>= 1; >= 2 for the Riemann rules).
        method: ``"gausslegendre"`` (default), ``"riemann_left"``, ``"riemann_right"``, ``"riemann_middle"`` or
            ``"riemann_trapezoid"``.
        batch_size: at most this many rows (path points) per forward/backward pass; None: all N * steps at once.
        layer, layer_input: attribute to a layer's output (input); see `InputGradientAttribution`.

    Targets: None means the top class of the input x (not of each path point); a callable is called once per path
    point, on an output whose row i belongs to input i (`hookviz.targets.aligned_scores`). Cost: N * steps rows
    forward and backward, plus 2N rows forward for y(x) and y(x'). The expanded batch is step-major (row
    ``j * N + i`` is input i at alpha_j).

    Example::

        ig = IntegratedGradients(model, steps=64, batch_size=128)
        attr = ig.attribute(x, target=281); print(ig.last_delta)
    """

    display_defaults = SIGNED_DISPLAY
    multi_input = True
    expands_batch = True

    def __init__(
        self,
        model: nn.Module,
        steps: int = 50,
        baseline: Tensor | float | tuple[Tensor | float | None, ...] | None = None,
        *,
        method: IGMethod = "gausslegendre",
        batch_size: int | None = None,
        layer: Selector | None = None,
        layer_input: bool = False,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        if method not in IG_METHODS:
            raise ValueError(f"method must be one of {', '.join(map(repr, IG_METHODS))}; got {method!r}")
        minimum = 1 if method == "gausslegendre" else 2
        steps = int_at_least("steps", steps, minimum, f"quadrature points; >= {minimum} for method={method!r}")
        check_baseline(baseline)
        batch_size = check_batch_size(batch_size)
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self._tap = _layer_tap(self, model, layer, layer_input)
        self.steps = steps
        self.baseline = baseline
        self.method = method
        self.batch_size = batch_size
        self.last_delta: Tensor | None = None

    layer = InputGradientAttribution.layer
    _allows_integer_inputs = InputGradientAttribution._allows_integer_inputs

    def __repr__(self) -> str:
        extra = f", batch_size={self.batch_size}" if self.batch_size is not None else ""
        extra += f", {self._tap!r}" if self._tap is not None else ""
        return f"{type(self).__name__}({type(self.model).__name__}, steps={self.steps}, method={self.method!r}{extra})"

    def _baseline_for(self, x: Tensor) -> Tensor:
        return baseline_like(self.baseline, x)  # type: ignore[arg-type]

    def _baselines_for(self, xs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """One baseline per input tensor; a tuple baseline must have one entry per input."""
        b = self.baseline
        if not isinstance(b, tuple):
            return tuple(baseline_like(b, x) for x in xs)
        if len(b) != len(xs):
            raise ValueError(f"baseline is a tuple of {len(b)} entries but {len(xs)} input tensors came; give one each")
        return tuple(baseline_like(bi, x) for bi, x in zip(b, xs, strict=True))

    def _per_input_state(self, xs: tuple[Tensor, ...]) -> dict[str, tuple[Tensor, ...]]:
        """Per-input tensors (N, ...) that a wrapper expanding the batch (SmoothGrad) indexes with its rows."""
        return {"baseline": self._baselines_for(xs)}

    def _explain(self, x: Tensor, target: TargetSpec, **kwargs: Any) -> tuple[Tensor, Targets]:
        baseline = self._baselines_for(as_tuple(x))  # shape errors before any work
        self.last_delta = None
        return super()._explain(x, target, baseline=baseline, **kwargs)

    def _run(
        self, x: Tensor | tuple[Tensor, ...], target: Any, hooks: HookManager, **kwargs: Any
    ) -> tuple[Tensor | tuple[Tensor, ...], Targets]:
        model, tap = self.model, self._tap
        xs = tuple(t.detach() for t in as_tuple(x))
        n_in, device = xs[0].shape[0], xs[0].device
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), n_in)
        baseline = kwargs.get("baseline", None)
        baselines = self._baselines_for(xs) if baseline is None else as_tuple(baseline)
        plan: TargetPlan = target
        # y(x) resolves "top class" at the input itself; y(x') with the same targets; with a layer, the same
        # passes give its output at the input and at the baseline, the ends of the path
        at_x, layer_x = scores_and_layer(model, xs, plan, self.batch_size, fwd, tap)
        if plan.indices is None and plan.fn is None:
            plan = TargetPlan(at_x.indices, None, False, from_output=True)
        at_baseline, layer_b = scores_and_layer(model, baselines, plan, self.batch_size, fwd, tap)
        if tap is None:
            starts, diffs = baselines, tuple(t - b for t, b in zip(xs, baselines, strict=True))
        else:
            assert layer_x is not None and layer_b is not None
            starts, diffs = (layer_b,), (layer_x - layer_b,)

        alphas, weights = ig_nodes(self.method, self.steps)
        acc = acc_dtype(starts[0].dtype)
        alpha_t = to_device(torch.tensor(alphas, dtype=torch.float64), device)
        weight_t = to_device(torch.tensor(weights, dtype=torch.float64).to(acc), device)
        totals: list[Tensor | None] = [None] * len(starts)
        for start, stop in chunks(n_in * self.steps, self.batch_size):
            rows = torch.arange(start, stop, device=device)
            i, j = rows % n_in, rows // n_in
            on_host = torch.arange(start, stop) % n_in  # the targets' rows (`TargetPlan.take`)
            points = tuple(
                s[i] + alpha_t[j].to(s.dtype).view(-1, *(1,) * (s.dim() - 1)) * d[i]
                for s, d in zip(starts, diffs, strict=True)
            )
            if tap is None:
                _, grads, _ = _gradients(model, points, plan_rows(plan, on_host), self.backward, fwd.rows(i))
            else:  # the inputs themselves, with the layer's output replaced by the path point
                _, grads, _ = _gradients(
                    model, take_rows(xs, i), plan_rows(plan, on_host), self.backward, fwd.rows(i), tap, at=points[0]
                )
            for e, grad in enumerate(grads):
                grad = grad.detach().to(acc) * weight_t[j].view(-1, *(1,) * (grad.dim() - 1))
                if totals[e] is None:
                    totals[e] = grad.new_zeros((n_in, *grad.shape[1:]))
                totals[e].index_add_(0, i, grad)  # type: ignore[union-attr]
        # steps >= 1: every total is set
        attribution = tuple(d.to(acc).unsqueeze(1) * t for d, t in zip(diffs, totals, strict=True))
        self._check_completeness(attribution, at_x.scores, at_baseline.scores)
        targets = Targets(at_x.scores, at_x.indices, at_x.multi)
        return (attribution[0] if tap is not None else attribution), targets

    def _check_completeness(self, attribution: Tensor | tuple[Tensor, ...], fx: Tensor, fb: Tensor) -> None:
        """``last_delta``, and a warning where the attributions miss f(x) - f(baseline) by more than 1% (`worst_gap`,
        read after the work: no wait on an accelerator)."""
        parts = as_tuple(attribution)
        sums = sum(a.flatten(2).sum(2) for a in parts)  # (N, K), over all input tensors
        expected = fx.to(sums.dtype) - fb.to(sums.dtype)  # (N, K)
        delta = sums - expected
        self.last_delta = delta
        columns, steps, method = delta.shape[1], self.steps, self.method  # this call's, should the warning come later

        def missed(values: list[Tensor]) -> str | None:
            gap = gap_text("IntegratedGradients", values[0], columns)
            if gap is None:
                return None
            return f"{gap}; increase steps (now {steps}, method={method!r}); see .last_delta"

        after_work([worst_gap(delta, expected, sums)], missed, type(self).__name__)
