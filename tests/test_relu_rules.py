"""ReLU rules see every ReLU call (module and functional), report coverage, and stay scoped to the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from refs import reference
from torch import nn
from torchvision import models
from torchvision.models.densenet import DenseNet
from torchvision.models.inception import BasicConv2d

import hookviz as hv
from hookviz import hook_counts
from hookviz.methods.guided import Deconvnet, GuidedBackprop, ReLUCoverage

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from reference import relu_rules as ref  # noqa: E402
from reference import same_precision as same  # noqa: E402
from test_hooks import SeedNet  # noqa: E402
from test_methods import image_batch, make, rel_l2  # noqa: E402


class Net(nn.Module):
    """Four ReLUs in every form a forward can call them; `functional=False` swaps them all for nn.ReLU modules."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.functional = functional
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 3)
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 4)
        self.relus = nn.ModuleList(nn.ReLU() for _ in range(5))

    def forward(self, x):
        if self.functional:
            x = F.relu(self.c1(x))
            x = torch.relu(self.c2(x))
            x = self.c3(x).relu_()
            x = F.relu(self.fc1(x.mean((2, 3))), inplace=True)
            x = torch.relu_(x * 1.5)
        else:
            x = self.relus[0](self.c1(x))
            x = self.relus[1](self.c2(x))
            x = self.relus[2](self.c3(x))
            x = self.relus[3](self.fc1(x.mean((2, 3))))
            x = self.relus[4](x * 1.5)
        return self.fc2(x)


@pytest.mark.parametrize("cls", [GuidedBackprop, Deconvnet])
def test_functional_relus_equal_module_relus(cls) -> None:
    x = image_batch(n=2, size=16)
    func, mod = Net(functional=True), Net(functional=False)
    method = cls(func)
    a = method.attribute(x, target=[1, 2])
    b = cls(mod).attribute(x, target=[1, 2])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert method.coverage.calls == 5 and method.coverage.overridden == 5
    assert method.coverage.by_kind == {"module": 0, "functional": 5}
    # and the module version equals captum (which sees modules only)
    ref_cls = captum_attr.GuidedBackprop if cls is GuidedBackprop else captum_attr.Deconvolution
    ref = ref_cls(mod).attribute(x.clone(), target=[1, 2])
    assert rel_l2(b, ref) < 1e-5
    # and it differs from the plain gradient
    plain = captum_attr.Saliency(mod).attribute(x.clone(), target=[1, 2], abs=False)
    assert rel_l2(a, plain) > 0.05


def test_deconvnet_hand_computed() -> None:
    # incoming gradient at the relu output is fc2's weight [1, -2, -3, 4]; deconvnet clamps it, no forward mask:
    # [1, 0, 0, 4] -> W1^T [1, 0, 0, 4] = [1 - 40, 2 - 44, 3 - 48]
    model = SeedNet(inplace=True)
    with torch.no_grad():
        model.fc2.weight.copy_(torch.tensor([[1.0, -2, -3, 4]]))
    d = Deconvnet(model)
    assert torch.equal(d.attribute(torch.ones(1, 3), target=0), torch.tensor([[-39.0, -42, -45]]))
    assert model.relu1.inplace is True  # switched out of place only during the call


@pytest.mark.parametrize(("arch", "inplace"), [("resnet18", True), ("vgg11", True), ("alexnet", False)])
def test_deconvnet_matches_captum(arch: str, inplace: bool) -> None:
    model = make(arch, inplace=inplace)
    x = image_batch()
    ours = Deconvnet(model).attribute(x, target=[3, 7])
    ref = captum_attr.Deconvolution(make(arch, inplace=False)).attribute(x.clone(), target=[3, 7])
    assert rel_l2(ours, ref) < 1e-4
    assert all(m.inplace is inplace for m in model.modules() if isinstance(m, nn.ReLU))


class DenseNetModuleReLU(DenseNet):
    """torchvision DenseNet with its final functional F.relu replaced by an nn.ReLU module (same numbers)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.final_relu = nn.ReLU()

    def forward(self, x):
        out = self.final_relu(self.features(x))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def test_densenet_final_functional_relu_is_covered() -> None:
    cfg = dict(growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=10)
    torch.manual_seed(0)
    functional = DenseNet(**cfg).eval()
    module = DenseNetModuleReLU(**cfg).eval()
    module.load_state_dict(functional.state_dict())
    x = image_batch(n=2, size=32)
    gb = GuidedBackprop(functional)
    ours = gb.attribute(x, target=[1, 2])
    assert gb.coverage.by_kind["functional"] == 1
    ref = captum_attr.GuidedBackprop(module).attribute(x.clone(), target=[1, 2])
    assert rel_l2(ours, ref) < 1e-4
    # captum on the unmodified DenseNet misses the functional ReLU: a different, wrong map
    missed = captum_attr.GuidedBackprop(functional).attribute(x.clone(), target=[1, 2])
    assert rel_l2(missed, ref) > 1e-3


def test_inception_basicconv2d_functional_relus() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        BasicConv2d(3, 8, kernel_size=3), BasicConv2d(8, 8, kernel_size=3), nn.Flatten(), nn.LazyLinear(4)
    ).eval()
    x = image_batch(n=1, size=12)
    model(x)  # materialize the lazy layer
    gb = GuidedBackprop(model)
    gb.attribute(x, target=0)
    assert gb.coverage.calls == 2 and gb.coverage.by_kind == {"module": 0, "functional": 2}


def test_coverage_report_resnet_reused_modules() -> None:
    gb = GuidedBackprop(make("resnet18"))
    gb.attribute(image_batch(n=1), target=0)
    cov = gb.coverage
    assert isinstance(cov, ReLUCoverage)
    # stem relu once + 8 basic blocks x 2 calls of their single relu module
    assert cov.calls == 17 and cov.overridden == 17 and cov.by_kind == {"module": 17, "functional": 0}
    assert cov.repeated == {f"layer{i}.{j}.relu": 2 for i in range(1, 5) for j in range(2)}
    assert cov.left_alone == {}
    assert str(cov).startswith("17/17 ReLU calls overridden (17 module, 0 functional); modules run more than once")


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)
        self.act = nn.GELU()
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = F.silu(self.relu(self.fc2(x)))
        return self.fc3(x)


def test_other_activations_left_alone_and_reported() -> None:
    x = torch.randn(3, 4)
    gb = GuidedBackprop(Mixed())
    default = gb.attribute(x, target=0)
    assert gb.coverage.calls == 1 and gb.coverage.overridden == 1
    assert gb.coverage.left_alone == {"act": 1, "F.silu": 1}
    gb_all = GuidedBackprop(Mixed(), activations="all")
    everything = gb_all.attribute(x, target=0)
    assert gb_all.coverage.left_alone == {}
    assert not torch.allclose(default, everything)


def test_activations_all_matches_a_hand_reference() -> None:
    # guided rule on a GELU: the incoming gradient is clamped, then multiplied by GELU's own derivative
    model = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 1))
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    got = GuidedBackprop(model, activations="all").attribute(x, target=0)
    w1, w2 = model[0].weight, model[2].weight
    pre = model[0](x).detach().requires_grad_(True)
    (dgelu,) = torch.autograd.grad(F.gelu(pre).sum(), pre)
    expected = (w2.clamp(min=0) * dgelu) @ w1
    torch.testing.assert_close(got, expected.detach())


def test_no_relu_raises_and_restores() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh())
    with pytest.raises(ValueError, match="no ReLU ran in the forward pass of Sequential: the result would silently"):
        GuidedBackprop(model).attribute(torch.ones(1, 3))
    assert all(v == 0 for v in hook_counts(model).values())
    gelu_only = nn.Sequential(nn.Linear(3, 2), nn.GELU())
    with pytest.raises(ValueError, match=r"activations left alone: 1\)"):
        Deconvnet(gelu_only).attribute(torch.ones(1, 3))
    # with activations='all' a GELU-only model is fine
    Deconvnet(gelu_only, activations="all").attribute(torch.ones(1, 3))
    with pytest.raises(ValueError, match="activations must be 'relu' or 'all'"):
        GuidedBackprop(model, activations="gelu")  # type: ignore[arg-type]


def test_functional_mode_is_scoped_to_the_forward() -> None:
    class Spy(nn.Module):
        def forward(self, x):
            self.inside = torch._C._is_torch_function_mode_enabled()
            return F.relu(x).sum(1, keepdim=True)

    spy = Spy()
    outside_before = torch._C._is_torch_function_mode_enabled()
    GuidedBackprop(spy).attribute(torch.randn(2, 3))
    assert spy.inside and not outside_before and not torch._C._is_torch_function_mode_enabled()

    class Boom(nn.Module):
        def forward(self, x):
            F.relu(x)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        GuidedBackprop(Boom()).attribute(torch.randn(2, 3))
    assert not torch._C._is_torch_function_mode_enabled()


def test_explanation_carries_coverage() -> None:
    model = make("resnet18")
    exp = GuidedBackprop(model).visualize(torch.rand(1, 3, 32, 32))
    assert exp.coverage.calls == 17
    assert "relu=17/17" in repr(exp)


def test_densenet121_full_coverage() -> None:
    torch.manual_seed(0)
    model = models.densenet121(weights=None).eval()
    gb = GuidedBackprop(model)
    gb.attribute(image_batch(n=1, size=32), target=0)
    assert gb.coverage.overridden == gb.coverage.calls == 121
    assert gb.coverage.by_kind == {"module": 120, "functional": 1}


@pytest.mark.parametrize(
    ("cls", "rule"), [(GuidedBackprop, "guided"), (Deconvnet, "deconvnet"), (hv.Saliency, "plain")]
)
def test_autocast_bf16_equals_the_rule_applied_by_hand_in_bf16(cls, rule: str) -> None:
    # Whether bf16 stays near float32 is a property of bf16 (its kernels round differently per CPU instruction set),
    # not of hookviz: compare with the same bf16 backward done by hand on a copy whose ReLU modules apply the rule,
    # whole batch in one pass as hookviz runs it. The map is the gradient at the float32 input, with no float32
    # accumulation after the backward pass and a rule that only clamps and masks (exact in any precision), so the
    # two agree exactly.
    model = make("resnet18")
    x = image_batch(n=2)
    targets = torch.tensor([1, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = cls(model).attribute(x, target=targets)
        want = same.batch_gradient(same.same_dtype_rule_copy(model, rule), x, targets)
    assert got.dtype == torch.float32 and torch.isfinite(got).all() and got.abs().amax() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("cls", "reference"),
    [(GuidedBackprop, ref.guided_backprop), (Deconvnet, ref.deconvnet), (hv.Saliency, ref.saliency)],
)
@pytest.mark.parametrize("functional", [False, True])
def test_against_float64_reference(cls, reference, functional: bool) -> None:
    x = image_batch(n=3, size=16)
    targets = torch.tensor([0, 3, 1])
    ours = cls(Net(functional=functional)).attribute(x, target=targets)
    # the reference swaps ReLU modules, so it always runs on the module twin (same weights)
    expected = reference(Net(functional=False), x, targets)
    assert rel_l2(ours.double(), expected) < 1e-5


@pytest.mark.parametrize(("cls", "reference"), [(GuidedBackprop, ref.guided_backprop), (Deconvnet, ref.deconvnet)])
def test_against_float64_reference_resnet(cls, reference) -> None:
    torch.manual_seed(0)
    model = models.resnet18(weights=None, num_classes=10).eval()  # in-place ReLUs, each run twice per block
    x = image_batch(n=2, size=32)
    ours = cls(model).attribute(x, target=[2, 9])
    assert rel_l2(ours.double(), reference(model, x, torch.tensor([2, 9]))) < 1e-4
