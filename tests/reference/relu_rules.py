"""Float64 references for the ReLU rules: a copy of the model whose nn.ReLU modules are swapped for autograd
Functions that implement each rule literally, and a per-input loop of `torch.autograd.grad`. Only for tests; nothing
is shared with `hookviz.methods.guided` (which uses hooks, not module swaps). Functional ReLUs are not covered here:
tests compare a functional model with its module twin."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


def double_copy(model: nn.Module) -> nn.Module:
    """A float64 eval-mode copy; the caller's model is untouched."""
    return copy.deepcopy(model).double().eval()


class _RuleReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, masked: bool) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.masked = masked
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        out = grad.clamp(min=0)  # both rules pass back only positive gradient
        return (out * (x > 0).to(grad.dtype) if ctx.masked else out), None


class RuleReLU(nn.Module):
    """ReLU whose backward is Guided Backprop's rule (``masked=True``) or Deconvnet's (``masked=False``)."""

    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.masked = masked

    def forward(self, x: Tensor) -> Tensor:
        return _RuleReLU.apply(x, self.masked)


def swap_relus(m: nn.Module, rule: str) -> nn.Module:
    """`m` itself with every nn.ReLU module swapped: rule "guided" or "deconvnet" ("plain" swaps nothing)."""
    if rule == "plain":
        return m
    masked = {"guided": True, "deconvnet": False}[rule]
    for parent in list(m.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(parent, name, RuleReLU(masked))
    return m


def rule_copy(model: nn.Module, rule: str) -> nn.Module:
    """`double_copy` with every nn.ReLU module swapped (`swap_relus`)."""
    return swap_relus(double_copy(model), rule)


def input_attribution(model: nn.Module, x: Tensor, targets: Tensor, rule: str) -> Tensor:
    """d y_target / dx under `rule`, one input at a time, float64: (N, ...) for targets (N,)."""
    m = rule_copy(model, rule)
    rows = []
    for i in range(x.shape[0]):
        xi = x[i : i + 1].detach().double().requires_grad_(True)
        (g,) = torch.autograd.grad(m(xi)[0, int(targets[i])], xi)
        rows.append(g)
    return torch.cat(rows)


def guided_backprop(model: nn.Module, x: Tensor, targets: Tensor) -> Tensor:
    """Springenberg et al. (2015): at every ReLU, backward = [x > 0] * max(grad, 0)."""
    return input_attribution(model, x, targets, "guided")


def deconvnet(model: nn.Module, x: Tensor, targets: Tensor) -> Tensor:
    """Zeiler & Fergus (2014): at every ReLU, backward = max(grad, 0)."""
    return input_attribution(model, x, targets, "deconvnet")


def saliency(model: nn.Module, x: Tensor, targets: Tensor) -> Tensor:
    """Simonyan et al. (2014): the plain input gradient."""
    return input_attribution(model, x, targets, "plain")
