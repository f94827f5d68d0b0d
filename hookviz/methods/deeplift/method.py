r"""DeepLift and DeepLiftShap: one forward pass of the inputs and their baselines under DeepLift's rule table, K
backward passes, and the summation-to-delta check.

The inputs and their baselines run in one batched forward pass (2N rows). The attribution is
$$ (x - x') \odot m_{x \to y_c} $$ with the multipliers m of the rules (`table`), which sums to
$$ y_c(x) - y_c(x') $$ (summation-to-delta) wherever every nonlinear operation of the model has a rule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..._device import after_work
from ...hooks import HookManager
from ...targets import BackwardStrategy, TargetPlan, Targets, batched_grad, class_logits, class_rows, resolve_targets
from ..base import Attribution, register
from ..baseline import baseline_like, check_baseline, check_distribution, check_distribution_shape, distribution
from ..gradient import SIGNED_DISPLAY, gap_text, worst_gap
from ..rules import Coverage, RuleEngine, first_few
from .table import rule_table


def _coverage_dict(coverage: Coverage) -> dict[str, Any]:
    """The summary DeepLift reports as ``coverage``: module calls rewritten, functional calls rewritten by name."""
    modules = sum(kinds["module"] for kinds in coverage.by_kind.values())
    functional: dict[str, int] = {}
    for ops in coverage.covered.values():
        for name, count in ops.items():
            if coverage.kind_of[name] == "functional":
                functional[name] = functional.get(name, 0) + count
    return {"modules": modules, "functional": functional}


def _warn_delta(method: str, delta: Tensor, expected: Tensor, sums: Tensor, coverage: Coverage | None) -> None:
    """Warn where the attributions miss f(x) - f(baseline) by more than 1%, naming the operations without a rule:
    the gap is read after the work, without a wait on an accelerator (`hookviz._device.after_work`)."""
    columns = delta.shape[1]
    if coverage is not None and coverage.uncovered:
        ops = first_few(coverage.uncovered, 6)
        why = f"operations without a DeepLift rule ran: {ops}; they pass their plain gradient"
    else:
        why = "an operation the rule engine does not see (a custom kernel, TorchScript) passes its plain gradient"

    def missed(values: list[Tensor]) -> str | None:
        gap = gap_text(method, values[0], columns)
        return None if gap is None else f"{gap}: {why} (see .rule_coverage, .last_delta)"

    after_work([worst_gap(delta, expected, sums)], missed, method)


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
    if class_rows(output) != 2 * n:
        raise ValueError(
            f"{method} needs a model output with one row per input (N, classes) or a logits field holding one; the "
            f"model returned {2 * n} rows' output with {class_rows(output)} rows"
        )
    if plan.fn is None:
        logits = class_logits(output)
        targets = resolve_targets(plan, logits[:n], n)
        ref = logits[n:].gather(1, targets.indices)  # type: ignore[arg-type]
    else:  # the callable scores the rows at x and at the baselines, each time on the user's rows
        both = resolve_targets(plan.take(torch.arange(2 * n) % n), output, 2 * n)
        targets, ref = Targets(both.scores[:n], None, both.multi), both.scores[n:]
    # both halves are differentiated, as in captum: the max-pool rule routes both rows' shares, and every rule
    # keeps the two halves' gradients equal. The custom backward functions do not batch under vmap: K passes.
    (grads,) = batched_grad(targets.scores + ref, [leaf], strategy="loop")
    ref = ref.detach()
    return grads[:n], targets, ref, engine.coverage


class _Multipliers(Attribution):
    """What DeepLift and DeepLiftShap share: signed maps, ``multiply_by_inputs``, ``last_delta`` and the rule
    engine's report ``rule_coverage``."""

    display_defaults = SIGNED_DISPLAY

    def __init__(self, model: nn.Module, multiply_by_inputs: bool, eval_mode: bool, backward: BackwardStrategy) -> None:
        if not isinstance(multiply_by_inputs, bool):
            raise TypeError(f"multiply_by_inputs must be True or False, got {multiply_by_inputs!r}")
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self.multiply_by_inputs = multiply_by_inputs
        self.last_delta: Tensor | None = None
        self.rule_coverage: Coverage | None = None


@register("deeplift")
class DeepLift(_Multipliers):
    r"""DeepLift, rescale rule (Shrikumar et al., 2017, "Learning Important Features Through Propagating Activation
    Differences", ICML, arXiv:1704.02685).

    $$ A = (x - x') \odot m $$ with the multipliers m of DeepLift's rules (``multiply_by_inputs=False``: m itself),
    shaped like the input (N, C, H, W); (N, K, C, H, W) with K targets per input. The rules
    (`hookviz.methods.deeplift`): the rescale rule on every elementwise function, an exact max-pool rule for any
    pool, the two-factor split on products and quotients of two activations, and softmax, normalisations and fused
    attention written out in those. With them the attributions sum to ``y_c(x) - y_c(x')`` (summation-to-delta)
    to float rounding on every model whose operations all have a rule (docs/relevance.md lists the families).
    Equal to captum's ``DeepLift`` where captum handles the model and its max pools do not overlap. After each call
    ``last_delta`` holds the (N, K) gap ``sum(A) - (y_c(x) - y_c(x'))``; a warning names the worst input and the
    operations without a rule when it exceeds 1% of ``y_c(x) - y_c(x')``.

    Args:
        baseline: a number (a constant image, default 0), or a tensor broadcasting to the inputs' shape.
        multiply_by_inputs: multiply the multipliers by ``x - x'`` (captum's default, "global" attribution).

    Example::

        dl = DeepLift(model, baseline=0.0)
        attr = dl.attribute(x, target=3); print(dl.last_delta)
    """

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
        super().__init__(model, multiply_by_inputs, eval_mode, backward)
        self.baseline = baseline
        self.coverage: dict[str, Any] | None = None

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
            _warn_delta(type(self).__name__, self.last_delta, expected, sums, coverage)
            return attribution, targets
        return mult, targets


@register("deeplift-shap")
class DeepLiftShap(_Multipliers):
    r"""DeepLiftShap (Lundberg & Lee, 2017, "A Unified Approach to Interpreting Model Predictions", NeurIPS):
    DeepLift (same rules) averaged over a distribution of B baselines, as captum's ``DeepLiftShap``: every input
    paired with every baseline (N * B rows and their N * B baselines in one forward pass),
    $$ A_i = \frac{1}{B} \sum_b (x_i - x'_b) \odot m_{i,b} $$. Result shaped like the input (N, C, H, W);
    (N, K, C, H, W) with K targets per input. ``last_delta``: (N, K) gap ``sum(A) - (y_c(x) - mean_b y_c(x'_b))``,
    zero to float rounding wherever DeepLift's is.

    Args:
        baselines: a tensor (B, C, H, W) of B >= 1 baselines (e.g. images of a background data set), or a number:
            one constant baseline (default 0.0, which makes it DeepLift with a zero baseline).
    """

    def __init__(
        self,
        model: nn.Module,
        baselines: Tensor | float = 0.0,
        *,
        multiply_by_inputs: bool = True,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        check_distribution(baselines)
        super().__init__(model, multiply_by_inputs, eval_mode, backward)
        self.baselines = baselines

    def _explain(self, x: Tensor, target: Any, **kwargs: Any) -> tuple[Tensor, Targets]:
        check_distribution_shape(self.baselines, x)
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
            plan = TargetPlan(top, None, False, from_output=True)  # on the device, never read
        rows = torch.arange(n).repeat_interleave(nb)  # input i paired with baselines 0..B-1, on the host: no wait
        xs = x.detach().repeat_interleave(nb, 0)
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
            _warn_delta(type(self).__name__, self.last_delta, expected, sums, coverage)
        indices = targets.indices.view(n, nb, -1)[:, 0] if targets.indices is not None else None
        return attribution, Targets(scores, indices, targets.multi)
