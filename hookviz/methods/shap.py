r"""GradientShap (Lundberg & Lee, 2017, "A Unified Approach to Interpreting Model Predictions", NeurIPS), with
captum's conventions and a `torch.Generator` for every draw (captum draws from numpy's global generator, so seeding
torch does not make it reproducible).

For each input x and each of ``n_samples`` draws: a baseline x'_b picked uniformly from the B baselines, an alpha
uniform in [0, 1) and, with ``stdevs > 0``, Gaussian noise added to the input (x~ = x + noise); the attribution of
the draw is $$ (x\sim - x'_b) \odot \partial y_c / \partial x |_{x'_b + \alpha (x\sim - x'_b)} $$, and the result is
the mean over the draws: in expectation (stdevs = 0, one baseline) it is Integrated Gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._checks import positive_int
from .._device import to_device
from ..hooks import HookManager
from ..targets import BackwardStrategy, TargetPlan, Targets, batched_grad, resolve_targets
from .base import Attribution, register
from .baseline import check_distribution, check_distribution_shape, distribution
from .gradient import SIGNED_DISPLAY


def draw(
    n: int, n_samples: int, n_baselines: int, shape: tuple[int, ...], stdevs: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The draws of one call, in this order from `generator`: baseline indices (n * n_samples,), alphas
    (n * n_samples,) and, if ``stdevs > 0``, noise (n * n_samples, *shape). Rows are input-major (row ``i *
    n_samples + s`` is input i's draw s). On the CPU; a reference implementation can replay them."""
    rows = n * n_samples
    idx = torch.randint(n_baselines, (rows,), generator=generator)
    alpha = torch.rand(rows, generator=generator, dtype=torch.float64)
    noise = torch.randn((rows, *shape), generator=generator, dtype=torch.float64) * stdevs if stdevs > 0 else None
    return idx, alpha, noise


@register("gradient-shap")
class GradientShap(Attribution):
    r"""GradientShap (Lundberg & Lee, 2017); see the module docstring. Result shaped like the input (N, C, H, W);
    (N, K, C, H, W) with K targets per input. Cost: N * n_samples rows forward and backward, one pass.

    Args:
        baselines: a tensor (B, C, H, W) of B >= 1 baselines, or a number: one constant baseline (default 0.0).
        n_samples: draws per input (>= 1).
        stdevs: standard deviation of the Gaussian noise added to the inputs (0: none).
        generator: the `torch.Generator` (CPU) every draw comes from (None: torch's global generator).

    Targets: None means the top class of each input x (one extra forward pass without gradients).
    """

    display_defaults = SIGNED_DISPLAY

    def __init__(
        self,
        model: nn.Module,
        baselines: Tensor | float = 0.0,
        *,
        n_samples: int = 5,
        stdevs: float = 0.0,
        generator: torch.Generator | None = None,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        check_distribution(baselines)
        n_samples = positive_int("n_samples", n_samples, "draws per input")
        if isinstance(stdevs, bool) or not isinstance(stdevs, int | float) or not stdevs >= 0:
            raise ValueError(f"stdevs must be a number >= 0 (the noise's standard deviation), got {stdevs!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        self.baselines = baselines
        self.n_samples = n_samples
        self.stdevs = float(stdevs)
        self.generator = generator

    def _explain(self, x: Tensor, target: Any, **kwargs: Any) -> tuple[Tensor, Targets]:
        check_distribution_shape(self.baselines, x)
        return super()._explain(x, target, **kwargs)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        plan: TargetPlan = target
        n, s = x.shape[0], self.n_samples
        x = x.detach()
        at_x = None
        if plan.fn is None:
            with torch.no_grad():
                at_x = resolve_targets(plan, self.model(x), n)
            if plan.indices is None:  # the top classes, where the output is
                plan = TargetPlan(at_x.indices, None, plan.multi, from_output=True)
        b = distribution(self.baselines, x)
        idx, alpha, noise = draw(n, s, b.shape[0], tuple(x.shape[1:]), self.stdevs, self.generator)
        rows = torch.arange(n).repeat_interleave(s)
        # the draws, made on the host, go to the device without a wait; cast first (the same numbers, fewer bytes)
        dev = x.device
        xs = x[to_device(rows, dev)]
        if noise is not None:
            xs = xs + to_device(noise.to(x.dtype), dev)
        bs = b[to_device(idx, dev)]
        a = to_device(alpha.to(x.dtype), dev).view(-1, *(1,) * (x.dim() - 1))
        points = (bs + a * (xs - bs)).requires_grad_(True)
        row_plan = plan.take(rows)  # a callable sees the user's inputs: one call per draw
        targets = resolve_targets(row_plan, self.model(points), n * s)
        (grads,) = batched_grad(targets.scores, [points], strategy=self.backward)
        per_draw = (xs - bs).unsqueeze(1).to(grads.dtype) * grads
        attribution = per_draw.view(n, s, *per_draw.shape[1:]).mean(1)
        if at_x is None:  # a callable target: the scores of each input's first draw
            k = targets.scores.shape[1]
            scores = targets.scores.detach().view(n, s, k)[:, 0]
            return attribution, Targets(scores, None, targets.multi)
        return attribution, Targets(at_x.scores.detach(), at_x.indices, at_x.multi)
