"""The CNN composites in gradient-times-input form (issue 35, part 2): the layer rules as modified gradients in one
ordinary backward pass (`hookviz.methods.lrp.layers`) give the relevance form's maps and audit on torchvision's
ResNet, VGG, DenseNet, GoogLeNet and MobileNetV3 in float64, and what the form cannot carry (relevance at an exact
zero) is what the docs say.

Tolerance: float64 on both sides, the same rules with the divisions in another place (g times z / stab(z) where the
relevance form divides R by stab(z)): rounding (u = 1.1e-16) amplified along the chain of stabilized divisions; with
LRP-epsilon on every layer, whose relevance mostly leaks away, the largest relevance is small against the terms that
cancel (measured 7e-13 of it on resnet18), elsewhere 1e-15. 1e-10 and 1e-12 of the largest relevance."""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
import torchvision
from lrp_relevance_form import relevance_form_lrp
from test_lrp import HIGH, LOW, _arch, _seeded
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import COMPOSITES, Composite, Flat, Pass, RelevanceAudit, composite

TARGETS = torch.tensor([[1, 3], [2, 0]])


def _both(model: nn.Module, x: Tensor, comp: str | Composite, **kw) -> tuple[hv.LRP, Tensor, RelevanceAudit, Tensor]:
    """hookviz's LRP (gradient form) and the relevance form (tests/lrp_relevance_form/: each rule an autograd
    Function carrying R): (gradient form's LRP, its map, the relevance form's audit, its map)."""
    fast = hv.LRP(model, comp, low=LOW.double(), high=HIGH.double(), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MobileNetV3's SE gates: the relevance form has no rule for them (it warns)
        got = fast.attribute(x, TARGETS)
        want, slow = relevance_form_lrp(model, comp, x, TARGETS, low=LOW.double(), high=HIGH.double(), **kw)
    return fast, got, slow, want


def _family(arch: str) -> nn.Module:
    if arch in ("resnet18", "vgg11_bn"):
        model = copy.deepcopy(_arch(arch)).double()  # test_lrp's (VGG's classifier narrowed), random statistics
    else:
        torch.manual_seed(0)
        kw = {"aux_logits": False, "init_weights": True} if arch == "googlenet" else {}
        model = _seeded(getattr(torchvision.models, arch)(weights=None, num_classes=10, **kw)).double()
    if arch == "densenet121":
        # DenseNet normalises concatenations of ReLU'd, max-pooled features: a BatchNorm with nothing to fold into,
        # whose pass rule in the relevance form gave its shift's relevance to the zeros of its input (and on through
        # the max pool to negative pre-activations); in gradient-times-input form a zero carries none
        # (`test_an_unfolded_batchnorm_gives_a_zero_input_no_relevance`). Without shifts both forms agree
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.zero_()
                    m.bias.zero_()
    if arch == "mobilenet_v3_small":
        # the relevance form has no rule for the SE gates' products (its plain gradient, which is not hookviz's); held
        # by hand, the product is a scaling in both (hookviz holds them itself: test_squeeze_excitation_gates_are_held)
        from torchvision.ops.misc import SqueezeExcitation

        def held(self: nn.Module, x: Tensor) -> Tensor:
            return self._scale(x).detach() * x

        for m in model.modules():
            if isinstance(m, SqueezeExcitation):
                m.forward = types.MethodType(held, m)
    return model


# every composite on ResNet (residual sums, folding) and VGG with BatchNorm; three on the families that add operations
# (concatenations, unfolded BatchNorm, average pools, Hardswish)
_CASES = [(a, n) for a in ("resnet18", "vgg11_bn") for n in COMPOSITES] + [
    (a, n)
    for a in ("densenet121", "googlenet", "mobilenet_v3_small")
    for n in ("epsilon", "epsilon-plus-flat", "epsilon-gamma-box")
]


@pytest.mark.parametrize("arch, name", _CASES)
def test_equals_the_relevance_form_on_cnn_families(arch: str, name: str) -> None:
    model = _family(arch)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fast, got, slow, want = _both(model, x, name)
    big = float(want.abs().max())
    tol = 1e-10 if name == "epsilon" else 1e-12
    torch.testing.assert_close(got, want, rtol=0, atol=tol * big)
    assert big > 0
    assert fast.audit is not None
    assert [(e.name, e.rule) for e in fast.audit.entries] == [(e.name, e.rule) for e in slow.entries]
    for e, f in zip(fast.audit.entries, slow.entries, strict=True):
        if f.entered is None:
            assert e.entered is None, e.name
            continue
        scale = float(f.entered.abs().max() + f.left.abs().max())
        torch.testing.assert_close(e.entered, f.entered, rtol=0, atol=1e-8 * scale, msg=e.name)
        torch.testing.assert_close(e.left, f.left, rtol=0, atol=1e-8 * scale, msg=e.name)


def test_an_unfolded_batchnorm_gives_a_zero_input_no_relevance() -> None:
    """A BatchNorm after a ReLU passes relevance (the pass rule): where its input is 0, its output is its shift t,
    whose relevance y g the relevance form handed to the zero; in gradient-times-input form R = x g is 0 there.
    By hand, LRP-epsilon on the linear layers: R_h = y * W2^T (R_out / stab(z2)) elsewhere."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.BatchNorm1d(6), nn.Linear(6, 2)).double().eval()
    with torch.no_grad():
        model[2].running_mean.uniform_(-0.5, 0.5)
        model[2].bias.uniform_(0.5, 1.0)
    x = torch.randn(3, 4, dtype=torch.float64)
    h = model[1](model[0](x))
    assert (h == 0).any() and (h > 0).any()
    y = model[2](h)
    z2 = model[3](y)

    def stab(z: Tensor) -> Tensor:
        return z + torch.where(z >= 0, 1e-6, -1e-6).to(z.dtype)

    r_out = torch.zeros_like(z2)
    r_out[:, 1] = z2[:, 1]
    r_y = y * ((r_out / stab(z2)) @ model[3].weight)
    r_h = torch.where(h == 0, 0.0, r_y)  # the pass rule; a zero input carries none
    z1 = model[0](x)
    r_z1 = torch.where(z1 > 0, r_h, 0.0)  # the ReLU (its own gradient: relevance passes where it is on)
    want = x * ((r_z1 / stab(z1)) @ model[0].weight)
    got = hv.LRP(model, "epsilon").attribute(x, 1)
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)  # float64, the formulas in another order


def test_a_first_layer_rule_keeps_the_relevance_of_zero_pixels() -> None:
    """Flat spreads relevance over its whole receptive field, zero pixels included (a black background): on the
    explained input itself that relevance goes to it whole (`layer_fn`'s sink), not through x g, so the map equals
    the relevance form's and conserves, black pixels included."""
    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(64, 4, bias=False)
    ).double().eval()  # fmt: skip
    x = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    x[:, :, :2] = 0.0  # the upper half black
    comp = composite("epsilon", epsilon=0.0, stabilizer=0.0, name_map=[("0", Flat(stabilizer=0.0))])
    fast, got, slow, want = _both(model, x, comp)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))
    assert float(got[:, :, :2].abs().sum()) > 0  # the black half has relevance
    fx = model(x)[torch.arange(2)[:, None], TARGETS].detach()
    torch.testing.assert_close(got.flatten(2).sum(2), fx, rtol=1e-10, atol=1e-12)  # Flat and LRP-0 conserve


def test_pass_rule_on_an_activation_whose_zero_is_not_zero() -> None:
    """A sigmoid passes relevance (the pass rule): in gradient-times-input form its gradient is y / x, and a
    sigmoid input of exactly 0 (output 0.5) passes none; elsewhere the map equals the relevance form's."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 4)).double().eval()
    x = torch.randn(2, 3, dtype=torch.float64)
    fast, got, slow, want = _both(model, x, Composite(type_map=[(nn.Linear, hv.methods.lrp.Epsilon()),
                                                                 (nn.Sigmoid, Pass())]))  # fmt: skip
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))


class _Excite(nn.Module):
    """A squeeze-excitation block without biases: the gate a module (sigmoid, hard sigmoid) or a function."""

    def __init__(self, c: int, gate: nn.Module | None, fn: object = None) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, 2, 1, bias=False), nn.Conv2d(2, c, 1, bias=False)
        self.gate, self.fn = gate, fn
        self.held = False  # the gate detached by hand: the reference

    def forward(self, x: Tensor) -> Tensor:
        z = self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True))))
        g = self.gate(z) if self.gate is not None else self.fn(z)  # type: ignore[operator]
        return x * (g.detach() if self.held else g)


class _SENet(nn.Module):
    def __init__(self, se: nn.Module) -> None:
        super().__init__()
        self.c1, self.se = nn.Conv2d(3, 4, 3, padding=1, bias=False), se
        self.c2, self.fc = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.Linear(4, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.se(torch.relu(self.c1(x)))
        return self.fc(torch.relu(self.c2(h)).mean((2, 3)))


_GATES = {
    "nn.Sigmoid": lambda: _Excite(4, nn.Sigmoid()),
    "nn.Hardsigmoid": lambda: _Excite(4, nn.Hardsigmoid()),
    "torch.sigmoid": lambda: _Excite(4, None, torch.sigmoid),
    "F.hardsigmoid": lambda: _Excite(4, None, torch.nn.functional.hardsigmoid),
}


@pytest.mark.parametrize("gate", list(_GATES))
def test_squeeze_excitation_gates_are_held(gate: str) -> None:
    """A CNN composite holds a squeeze-excitation gate (LRP-all: the scaled signal takes all the relevance, the gate's
    branch none): no operation is left uncovered, LRP-0 on this bias-free network conserves to float64 rounding
    (1e-12: a few dozen roundings of 1.1e-16), and the map equals the same network's with the gate detached by hand."""
    torch.manual_seed(0)
    model = _SENet(_GATES[gate]()).double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lrp = hv.LRP(model, composite("epsilon", epsilon=0.0, stabilizer=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the product is covered
        rel = lrp.attribute(x, 1)
    assert lrp.audit is not None and lrp.rule_coverage is not None and not lrp.rule_coverage.uncovered
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    held = copy.deepcopy(model)
    held.se.held = True
    for name in ("epsilon-plus-flat", composite("epsilon", epsilon=0.0, stabilizer=0.0)):
        want = hv.LRP(held, name).attribute(x, 1)
        got = rel if not isinstance(name, str) else hv.LRP(model, name).attribute(x, 1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))


def test_torchvision_squeeze_excitation_is_covered() -> None:
    """torchvision's MobileNetV3 and EfficientNet (`SqueezeExcitation`, hard sigmoid and sigmoid gates) run with no
    operation left uncovered and equal the maps with their gates detached by hand (as `_arch_model` holds them for the
    relevance form, which has no gate rule)."""
    from torchvision.ops.misc import SqueezeExcitation

    for arch in ("mobilenet_v3_small", "efficientnet_b0"):
        torch.manual_seed(0)
        model = getattr(torchvision.models, arch)(weights=None, num_classes=5).double().eval()
        x = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = hv.LRP(model, "epsilon-plus-flat").attribute(x, 1)
        held = copy.deepcopy(model)
        for m in held.modules():
            if isinstance(m, SqueezeExcitation):
                m.forward = types.MethodType(lambda self, h: self._scale(h).detach() * h, m)
        want = hv.LRP(held, "epsilon-plus-flat").attribute(x, 1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))
        assert float(want.abs().max()) > 0
