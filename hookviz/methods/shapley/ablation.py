"""FeatureAblation: the score drop when one group of features is replaced by the baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from ..base import register
from .coalitions import CoalitionAttribution, Coalitions


def one_out(m: int) -> Tensor:
    """The (M, M) coalitions "every group but group i", row i."""
    return ~torch.eye(m, dtype=torch.bool)


@register("feature-ablation")
class FeatureAblation(CoalitionAttribution):
    r"""Feature ablation (captum's `FeatureAblation`; the leave-one-out attribution of e.g. Zeiler & Fergus, 2014,
    over groups of features): $$ A_i = f(x) - f(x \text{ with group } i \text{ replaced by the baseline}) $$.
    Forward passes only.

    Result shaped like the inputs (N, ...), or (N, K, ...) with K targets: every element of group i holds $A_i$ (as
    captum). Equal to captum's ``FeatureAblation(model).attribute(x, baselines=b, target=t, feature_mask=mask)`` up to
    float rounding of the model's batched forward passes. Not efficient: the $A_i$ need not add up to
    f(x) - f(b) (they do for additive models).

    Args and conventions (groups, baselines, budget, seed): `CoalitionAttribution`. Cost: M coalitions x N inputs
    (x B with a `Background`) rows forward, plus N for the clean inputs.

    Example::

        attr = FeatureAblation(model).attribute(x, target=3, feature_mask=grid_mask((224, 224), 16))
    """

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        ablated = engine.values(one_out(engine.m), "groups")  # (M, N, K)
        return (clean.unsqueeze(0) - ablated).permute(1, 2, 0)
