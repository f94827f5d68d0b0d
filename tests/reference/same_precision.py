"""Hand computations in the model's own precision, for tests of reduced precision (autocast, half models).

The float64 references elsewhere in this package answer "is the method right"; under bf16 or fp16 a float32 or
float64 result is not what hookviz should give, since bf16 kernels round differently per CPU instruction set
(AVX512 against ``ATEN_CPU_CAPABILITY=default``). These helpers redo hookviz's computation independently, in the
caller's precision (run them under the same ``torch.autocast`` as hookviz, on the same half model), with the same
batch arrangement, so a test compares like with like: the same kernels on the same rows. Nothing is shared with
hookviz. The ReLU rules are those of `relu_rules` (module swaps), on a copy that keeps the model's dtype.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from .relu_rules import swap_relus

U32 = 2.0**-24  # unit roundoff of float32


def same_dtype_rule_copy(model: nn.Module, rule: str) -> nn.Module:
    """An eval-mode copy in the model's own dtype with every nn.ReLU module swapped for the rule's ReLU ("guided"
    or "deconvnet"; "plain" swaps nothing); the caller's model is untouched."""
    return swap_relus(copy.deepcopy(model).eval(), rule)


def batch_gradient(model: nn.Module, x: Tensor, targets: Tensor) -> Tensor:
    """d sum_i model(x)[i, targets[i]] / dx for the whole batch x (N, ...) in one forward and one backward: row i's
    gradient, as the rows are independent in eval mode. Runs in whatever precision the caller set up."""
    xi = x.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(model(xi)[torch.arange(x.shape[0]), targets].sum(), xi)
    return g


def assert_within(got: Tensor, want: Tensor, bound: Tensor | float) -> None:
    """|got - want| <= bound element-wise (computed in float64), with the worst element in the message."""
    err = (got.double() - want.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(err)
    excess = err - bound
    worst = int(excess.flatten().argmax())
    assert bool((excess <= 0).all()), (
        f"|got - want| = {err.flatten()[worst].item():.3g} > bound {bound.flatten()[worst].item():.3g} at flat index "
        f"{worst} (got {got.flatten()[worst].item():.6g}, want {want.flatten()[worst].item():.6g})"
    )


def layer_acts_and_grads(model: nn.Module, layer: str, x: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """A = the layer's output and G = d sum_i y[i, targets[i]] / dA, from one forward and one backward of the whole
    batch x (N, ...), in the layer's own dtype (bf16 under a bf16 autocast): (N, C, h, w) each."""
    store: dict[str, Tensor] = {}

    def keep(module: nn.Module, args: object, out: Tensor) -> None:
        store["a"] = out

    handle = dict(model.named_modules())[layer].register_forward_hook(keep)
    try:
        y = model(x.detach())
    finally:
        handle.remove()
    (g,) = torch.autograd.grad(y[torch.arange(x.shape[0]), targets].sum(), store["a"])
    return store["a"].detach(), g
