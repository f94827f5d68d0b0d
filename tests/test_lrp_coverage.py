"""Operations LRP's rules cover beyond layers (issue 35's architecture sweep, benchmarks/lrp_coverage.py:
`hv.LRP(model)` with every operation covered on 75 of 78 image architectures, 59 before): F.normalize and GroupNorm
by the identity rule with their norm or std held, a difference of two branches by the sum rule, linear and routing
maps without parameters by their gradient (LRP-0 in gradient-times-input form), and computations on parameters
alone not reported as uncovered.

Tolerance: float64, the same arithmetic summed in another order: 1e-12 of the largest value (u = 1.1e-16 times the
few dozen operations of these small models)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import composite

LRP0 = {"attn-lrp": composite("attn-lrp", epsilon=0.0, stabilizer=0.0), "epsilon": composite("epsilon", epsilon=0.0,
        stabilizer=0.0)}  # fmt: skip


def _attribute(model: nn.Module, comp: object, x: Tensor, target: int) -> hv.LRP:
    lrp = hv.LRP(model, comp)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every operation covered: the engine's warning would raise
        lrp.last = lrp.attribute(x, target)  # type: ignore[attr-defined]
    assert lrp.rule_coverage is not None and not lrp.rule_coverage.uncovered
    return lrp


class _Cosine(nn.Module):
    """Bias-free linear maps around an L2 normalisation (cosine attention's, XCiT's)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 4, bias=False), nn.Linear(4, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(F.normalize(self.a(x), dim=-1))


@pytest.mark.parametrize("comp", ["attn-lrp", "cp-lrp"])
def test_normalize_takes_the_identity_rule_with_its_norm_held(comp: str) -> None:
    """LRP-0: the map is x times the gradient of the model with the norm held constant, computed here by hand, and
    it conserves f_c(x) (every map linear, no bias); with the default stabilizers it is covered too. Before, the call
    took its own gradient (the norm's derivative), reported uncovered."""
    torch.manual_seed(0)
    model = _Cosine().double().eval()
    x = torch.randn(3, 5, dtype=torch.float64)
    lrp = _attribute(model, composite(comp, epsilon=0.0, stabilizer=0.0), x, 1)
    leaf = x.clone().requires_grad_(True)
    h = model.a(leaf)
    held = h / h.detach().norm(2, -1, keepdim=True).clamp_min(1e-12)
    (grad,) = torch.autograd.grad(model.b(held)[:, 1].sum(), leaf)
    want = leaf.detach() * grad
    torch.testing.assert_close(lrp.last, want, rtol=0, atol=1e-12 * float(want.abs().max()))
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)
    default = _attribute(model, comp, x, 1)
    assert "identity-norm" in {e.rule for e in default.audit.entries}


class _Difference(nn.Module):
    """Two branches subtracted (PoolFormer's ``pool(x) - x``), or the same written as a sum of the negation."""

    def __init__(self, as_sum: bool) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)
        self.as_sum = as_sum

    def forward(self, x: Tensor) -> Tensor:
        a, b = torch.relu(self.c1(x)), torch.relu(self.c2(x))
        h = a + b * -1.0 if self.as_sum else a - b
        return self.fc(h.mean((2, 3)))


@pytest.mark.parametrize("comp", ["epsilon-plus-flat", "attn-lrp"])
def test_a_difference_of_two_branches_takes_the_sum_rule(comp: str) -> None:
    """``a - b`` with both branches depending on the input is the sum ``a + (-b)`` (the same values): the same map,
    audited as the sum rule's entry "-"; before, it was reported uncovered and took its plain gradient."""
    torch.manual_seed(0)
    model = _Difference(as_sum=False).double().eval()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    lrp = _attribute(model, comp, x, 1)
    as_sum = _Difference(as_sum=True).double().eval()
    as_sum.load_state_dict(model.state_dict())
    want = _attribute(as_sum, comp, x, 1).last
    torch.testing.assert_close(lrp.last, want, rtol=0, atol=1e-12 * float(want.abs().max()))
    assert ("-", "norm") in {(e.name, e.rule) for e in lrp.audit.entries}


class _Routing(nn.Module):
    """Maps without parameters that route or combine linearly (upsampling, a sum over a group, a maximum, swapped
    axes, an unfold, a zero tensor made from the input's), and a trainable scale whose exp is computed from the
    parameter alone."""

    def __init__(self, scale: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        # a parameter of the model itself: a CNN composite refuses it (it maps layers), the transformer ones see it
        self.log_scale = nn.Parameter(torch.tensor(0.3, dtype=torch.float64)) if scale else None
        self.fc = nn.Linear(4, 2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.conv(x))  # (N, 4, 4, 4)
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)  # (N, 4, 8, 8)
        h = h.unfold(3, 2, 2).sum(-1)  # (N, 4, 8, 4): pairs of columns summed
        h = h.swapaxes(2, 3).amax(-1)  # (N, 4, 4)
        h = h + h.new_zeros(h.shape)
        h = h.mean(-1)
        return self.fc(h if self.log_scale is None else h * self.log_scale.exp())


@pytest.mark.parametrize("comp", ["epsilon", "attn-lrp"])
def test_routing_and_linear_maps_without_parameters_are_covered(comp: str) -> None:
    """Every operation covered (none reported: the exp of the parameter alone routes no relevance; before,
    interpolate, unfold, sum, swapaxes, amax, new_zeros and exp were), and LRP-0 on this bias-free model conserves
    f_c(x): each map is linear, the maximum routes to its winner."""
    torch.manual_seed(0)
    model = _Routing(scale=comp == "attn-lrp").double().eval()
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    lrp = _attribute(model, LRP0[comp], x, 1)
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    _attribute(model, comp, x, 1)  # with the composite's default stabilizers, whose rules report what they miss


class _Grouped(nn.Module):
    """Bias-free convolutions around a GroupNorm (BiT's, PoolFormer's), its bias zero: the map is linear with the
    groups' std held."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.gn = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.GroupNorm(2, 4)
        self.c2, self.fc = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.Linear(4, 2, bias=False)
        with torch.no_grad():
            self.gn.weight.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
            self.gn.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.gn(self.c1(x))))).mean((2, 3)))


@pytest.mark.parametrize("comp", ["attn-lrp", "cp-lrp"])
def test_group_norm_takes_the_identity_rule_with_its_groups_std_held(comp: str) -> None:
    """LRP-0: x times the gradient of the model with each group's std held, by hand; it conserves f_c(x); the model's
    output is the model's own (the rule keeps F.group_norm's output). Before, GroupNorm took its own gradient, reported
    uncovered (timm's BiT ResNet conserved 0.0008 of f_c(x), now 0.999)."""
    torch.manual_seed(0)
    model = _Grouped().double().eval()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    lrp = _attribute(model, composite(comp, epsilon=0.0, stabilizer=0.0), x, 1)
    leaf = x.clone().requires_grad_(True)
    h = model.c1(leaf)
    hg = h.reshape(2, 2, -1)
    rstd = torch.rsqrt(hg.detach().var(-1, unbiased=False, keepdim=True) + model.gn.eps)
    held = ((hg - hg.mean(-1, keepdim=True)) * rstd).reshape(h.shape) * model.gn.weight.view(1, -1, 1, 1)
    out = model.fc(torch.relu(model.c2(torch.relu(held))).mean((2, 3)))
    (grad,) = torch.autograd.grad(out[:, 1].sum(), leaf)
    want = x * grad
    torch.testing.assert_close(lrp.last, want, rtol=0, atol=1e-12 * float(want.abs().max()))
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    default = _attribute(model, comp, x, 1)
    assert "identity-norm" in {e.rule for e in default.audit.entries}
