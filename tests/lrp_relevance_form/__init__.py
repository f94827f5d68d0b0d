"""The relevance form of LRP: each rule an autograd Function whose backward *is* the rule, carrying relevance R
backward (`propagate.LRPRun`, with the transformer rules of `transformer_ops`, `products`, `norm` and `rulecall`).

hookviz ran it beside its gradient-times-input form until issue 35, part 2, stage 4, which left the package with the
gradient form alone (`hookviz.methods.lrp.gradient_form`). It is kept here, outside the package, as the independent
reference the gradient form is compared with (float64, 1e-12 of the largest relevance): the same rules applied in
another order, R divided by stab(z) where the gradient form multiplies g = R / a by z / stab(z).

`relevance_form_lrp` computes its map and audit; `RelevanceFormLRP` is `hookviz.LRP` with this form's run.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from hookviz.hooks import HookManager
from hookviz.methods.lrp import LRP, Composite, RelevanceAudit
from hookviz.targets import Targets, batched_grad

from .propagate import LRPRun

__all__ = ["LRPRun", "RelevanceFormLRP", "relevance_form_lrp"]


class RelevanceFormLRP(LRP):
    """`hookviz.LRP` whose pass is the relevance form's (`LRPRun`): the same arguments, forward pass, targets and
    audit; the relevance starts as the target's score f_c(x) at the output and each rule's backward carries it."""

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        run = LRPRun(self.model, self.composite, hooks, self.canonize)
        leaf, targets = self._forward(run, x, target, kwargs)  # type: ignore[arg-type]
        # seeding each score with its own value makes the relevance start at f_c(x); the rules are linear in it
        scores = targets.scores
        (relevance,) = batched_grad(scores * scores.detach(), [leaf], strategy="loop")
        return self._audited(run, targets, relevance), targets  # type: ignore[arg-type]


def relevance_form_lrp(
    model: nn.Module, composite: str | Composite | None, x: Tensor, target: Any, **kwargs: Any
) -> tuple[Tensor, RelevanceAudit]:
    """The relevance form's map of `x` for `target` and its audit; `kwargs`: `hookviz.LRP`'s (canonize, layer,
    epsilon, ...)."""
    lrp = RelevanceFormLRP(model, composite, **kwargs)
    relevance = lrp.attribute(x, target=target)
    assert lrp.audit is not None
    return relevance, lrp.audit
