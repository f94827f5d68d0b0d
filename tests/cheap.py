"""Every registered method with options that keep it cheap on tiny inputs (few samples, steps, masks, small windows).

Shared by the test files that run every method in `hookviz.METHODS`, so a new method needs one entry here at most.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import hookviz as hv

CHEAP_OPTIONS: dict[str, dict[str, Any]] = {
    "smoothgrad": {"n": 3},
    "vargrad": {"n": 3},
    "integrated-gradients": {"steps": 4},
    "occlusion": {"window": (2, 2)},
    "rise": {"n_masks": 8, "cell": 2},
    "gradient-shap": {"n_samples": 2},
    # the coalition methods: few coalitions (images get an 8 x 8 grid of groups by default; exact Shapley a 3 x 3 one)
    "kernel-shap": {"n_samples": 70},
    "lime": {"n_samples": 16},
    "shapley-sampling": {"n_samples": 2},
    "partition-shap": {"max_evals": 32},
}


# methods that read a transformer's attention: they refuse models without attention modules (the CNNs that the
# every-method tests use), so those tests run them on small transformers of their own (test_attention_rollout.py,
# test_invariants.py, the invariant suite's ViT)
NEEDS_ATTENTION: frozenset[str] = frozenset(
    name for name, cls in hv.METHODS.items() if issubclass(cls, hv.methods.RolloutAttribution)
)
ON_CNNS: list[str] = sorted(name for name in hv.METHODS if name not in NEEDS_ATTENTION)


def cheap_method(name: str, model: nn.Module, **options: Any) -> hv.Attribution:
    """The registered method `name` on `model`, with cheap options (overridden by `options`)."""
    kwargs = {**CHEAP_OPTIONS.get(name, {}), **options}
    if name in ("smoothgrad", "vargrad", "gradient-shap") and "generator" not in kwargs:
        kwargs["generator"] = torch.Generator().manual_seed(0)
    return hv.get_method(name)(model, **kwargs)
