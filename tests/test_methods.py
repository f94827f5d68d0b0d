"""Attribution methods: hand-computed values, captum references on torchvision models, batched targets."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from refs import reference
from torch import nn
from torchvision import models

import hookviz as hv
from hookviz import GradCAM, GuidedBackprop, Saliency

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from test_hooks import SeedNet  # noqa: E402


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def make(arch: str, inplace: bool = True, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = getattr(models, arch)(weights=None).eval()
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = inplace
    return model


def image_batch(n: int = 2, size: int = 64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


# -- hand-computed values -----------------------------------------------------------------------------------------
def seed_net_with_signed_head() -> SeedNet:
    model = SeedNet()
    with torch.no_grad():
        model.fc2.weight.copy_(torch.tensor([[1.0, -2, -3, 4]]))
    return model


def test_saliency_hand_computed() -> None:
    # relu mask at x = 1 is [1, 0, 1, 0]; gradient at the relu output is fc2's weight [1, -2, -3, 4]
    # input gradient = W1^T ([1, -2, -3, 4] * mask) = W1^T [1, 0, -3, 0] = [1 - 21, 2 - 24, 3 - 27]
    grad = Saliency(seed_net_with_signed_head()).attribute(torch.ones(1, 3), target=0)
    assert torch.equal(grad, torch.tensor([[-20.0, -22, -24]]))


@pytest.mark.parametrize("inplace", [False, True])
def test_guided_backprop_hand_computed(inplace: bool) -> None:
    # guided: clamp([1, -2, -3, 4], 0) * mask = [1, 0, 0, 0] -> W1^T [1, 0, 0, 0] = [1, 2, 3]
    model = seed_net_with_signed_head()
    model.relu1.inplace = inplace
    grad = GuidedBackprop(model).attribute(torch.ones(1, 3), target=0)
    assert torch.equal(grad, torch.tensor([[1.0, 2, 3]]))


class FlatHead(nn.Module):
    """x -> act (Identity, the CAM layer) -> flatten -> linear: dy/dA is the linear weight, known by hand.

    Class 0: g = [[[1, 2], [3, 4]], [[-1, -1], [-1, -1]]]; class 1: g = [[[0, 0], [0, 0]], [[1, 1], [1, 1]]].
    """

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Identity()
        self.fc = nn.Linear(8, 2, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, 2, 3, 4, -1, -1, -1, -1], [0, 0, 0, 0, 1, 1, 1, 1]]))

    def forward(self, x):
        return self.fc(self.act(x).flatten(1))


def test_gradcam_hand_computed() -> None:
    x = torch.tensor([[[[1.0, 2], [3, 4]], [[2.0, 0], [0, 2]]]])  # (1, 2, 2, 2)
    # class 0: alpha = [mean(1, 2, 3, 4), mean(-1, -1, -1, -1)] = [2.5, -1]
    # map = relu(2.5 * [[1, 2], [3, 4]] - [[2, 0], [0, 2]]) = [[0.5, 5], [7.5, 8]]
    cam = GradCAM(FlatHead(), layer="act").attribute(x, target=0)
    assert torch.equal(cam, torch.tensor([[[[0.5, 5.0], [7.5, 8.0]]]]))
    # class 1: alpha = [0, 1] -> map = channel 1
    cam1 = GradCAM(FlatHead(), layer="act").attribute(x, target=1)
    assert torch.equal(cam1, x[:, 1:2])
    up = GradCAM(FlatHead(), layer="act").attribute(x, target=0, upsample=True)
    assert up.shape == (1, 1, 2, 2)  # already at input resolution


# -- captum references ---------------------------------------------------------------------------------------------
GB_ARCHS = [("resnet18", True), ("resnet18", False), ("vgg11", True), ("alexnet", True)]


@pytest.mark.parametrize(("arch", "inplace"), GB_ARCHS)
def test_guided_backprop_matches_captum(arch: str, inplace: bool) -> None:
    model = make(arch, inplace=inplace)
    x = image_batch()
    target = torch.tensor([3, 7])
    ours = GuidedBackprop(model).attribute(x, target=target)
    # captum rewrites ReLU backward with module hooks; give it an out-of-place copy when ours ran in place
    ref_model = make(arch, inplace=False)
    ref = captum_attr.GuidedBackprop(ref_model).attribute(x.clone(), target=target)
    assert ours.shape == x.shape
    assert rel_l2(ours, ref) < 1e-4
    # and it is not the plain gradient
    plain = Saliency(model).attribute(x, target=target)
    assert rel_l2(ours, plain) > 0.1


@pytest.mark.parametrize("arch", ["resnet18", "vgg11", "alexnet"])
def test_saliency_matches_captum(arch: str) -> None:
    model = make(arch)
    x = image_batch()
    ours = Saliency(model).attribute(x, target=5)
    ref = captum_attr.Saliency(make(arch, inplace=False)).attribute(x.clone(), target=5, abs=False)
    assert rel_l2(ours, ref) < 1e-4


@pytest.mark.parametrize(
    ("arch", "layer"),
    [
        ("resnet18", "layer4"),
        ("resnet18", "layer3.1"),
        ("vgg11", "features.18"),
        ("alexnet", "features.11"),
        ("vgg11", "features"),
    ],
)
def test_gradcam_matches_captum(arch: str, layer: str) -> None:
    model = make(arch)
    x = image_batch(size=128 if arch == "alexnet" else 64)
    target = torch.tensor([1, 9])
    ours = GradCAM(model, layer=layer).attribute(x, target=target)
    ref_model = make(arch, inplace=False)
    ref_layer = dict(ref_model.named_modules())[layer]
    ref = captum_attr.LayerGradCam(ref_model, ref_layer).attribute(x.clone(), target=target, relu_attributions=True)
    assert ours.shape == ref.shape and ours.shape[:2] == (2, 1)
    assert ref.abs().sum() > 0
    assert rel_l2(ours, ref) < 1e-4


def test_gradcam_densenet_features_true_output() -> None:
    """DenseNet.forward does F.relu(features, inplace=True): the map must use the features' true output."""
    torch.manual_seed(0)
    model = models.densenet121(weights=None).eval()
    x = image_batch(n=1, size=64)
    ours = GradCAM(model, layer="features").attribute(x, target=4)
    ref = captum_attr.LayerGradCam(model, model.features).attribute(x.clone(), target=4, relu_attributions=True)
    assert rel_l2(ours, ref) < 1e-4
    # independent check: A = features(x) before the in-place ReLU; dy/dA by autograd on the head alone
    with torch.no_grad():
        a = model.features(x)
    a.requires_grad_(True)
    y = model.classifier(F.adaptive_avg_pool2d(F.relu(a), 1).flatten(1))[:, 4]
    (g,) = torch.autograd.grad(y.sum(), a)
    manual = F.relu((g.mean((2, 3), keepdim=True) * a).sum(1, keepdim=True))
    assert rel_l2(ours, manual.detach()) < 1e-5
    # the post-ReLU activation would give a different map (what libraries that hook the modified tensor show)
    wrong = F.relu((g.mean((2, 3), keepdim=True) * F.relu(a)).sum(1, keepdim=True))
    assert rel_l2(wrong.detach(), manual.detach()) > 1e-3


# -- automatic layer choice ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "expected"),
    [("resnet18", "layer4"), ("vgg11", "features.19"), ("alexnet", "features.11"), ("densenet121", "features")],
)
def test_automatic_layer_choice(arch: str, expected: str) -> None:
    model = make(arch)
    cam = GradCAM(model)
    assert "chosen on the first call" in repr(cam)
    out = cam.attribute(image_batch(n=1, size=128), target=0)
    assert cam.layer == expected
    assert f"layer='{expected}' (chosen automatically)" in repr(cam)
    assert out.dim() == 4 and out.shape[-1] > 1


# -- batched targets ---------------------------------------------------------------------------------------------------
METHODS = [
    ("saliency", lambda m: Saliency(m)),
    ("guided", lambda m: GuidedBackprop(m)),
    ("gradcam", lambda m: GradCAM(m, layer="layer3")),
]


@pytest.mark.parametrize(("name", "build"), METHODS)
@pytest.mark.parametrize("strategy", ["vmap", "loop"])
def test_nk_targets_equal_k_separate_calls(name, build, strategy) -> None:
    model = make("resnet18")
    x = image_batch(n=2)
    targets = torch.tensor([[1, 5, 9], [2, 2, 700]])
    method = build(model)
    method.backward = strategy
    multi = method.attribute(x, target=targets)
    assert multi.shape[:2] == (2, 3)
    for k in range(3):
        single = method.attribute(x, target=targets[:, k])
        torch.testing.assert_close(multi[:, k], single, rtol=1e-5, atol=1e-6)


def test_target_forms_agree() -> None:
    model = make("resnet18")
    x = image_batch(n=2)
    s = Saliency(model)
    top = model(x).argmax(1)
    by_none = s.attribute(x)
    torch.testing.assert_close(by_none, s.attribute(x, target=top))
    torch.testing.assert_close(by_none, s.attribute(x, target=top.tolist()))
    torch.testing.assert_close(s.attribute(x, target=7), s.attribute(x, target=lambda out: out[:, 7]), rtol=0, atol=0)
    nested = s.attribute(x, target=[[7, 3], [7, 3]])
    assert nested.shape == (2, 2, 3, 64, 64)


def test_callable_target_on_dict_output() -> None:
    class DictModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = SeedNet()

        def forward(self, x):
            return {"logits": self.net(x)}

    grad = Saliency(DictModel()).attribute(torch.ones(1, 3), target=lambda out: out["logits"][:, 0])
    assert torch.equal(grad, torch.tensor([[22.0, 26, 30]]))


# -- errors ----------------------------------------------------------------------------------------------------
def test_target_out_of_range_names_target_and_classes() -> None:
    model = make("resnet18")
    with pytest.raises(ValueError, match=r"target class 1000 is out of range: the model has 1000 classes \(valid"):
        Saliency(model).attribute(image_batch(n=1), target=1000)


@pytest.mark.parametrize(
    ("target", "exc", "match"),
    [
        ([1, 2, 3], ValueError, "target has 3 entries but the batch has 2 inputs"),
        (-1, ValueError, "target classes must be >= 0"),
        (torch.tensor([0.5, 1.0]), TypeError, "must hold integer class indices"),
        ("cat", TypeError, "target must be None, an int"),
        (True, TypeError, "not a bool"),
        (torch.zeros(2, 2, 2, dtype=torch.long), ValueError, "0-, 1- or 2-D"),
        (lambda out: out[0], ValueError, r"callable target must return a tensor of shape \(N,\) or \(N, K\)"),
    ],
)
def test_bad_targets(target, exc, match) -> None:
    with pytest.raises(exc, match=match):
        Saliency(SeedNet()).attribute(torch.ones(2, 3), target=target)


def test_class_target_on_non_classifier_output() -> None:
    seg = nn.Conv2d(3, 4, 1)
    with pytest.raises(ValueError, match=r"class targets need a model output of shape \(N, classes\)"):
        Saliency(seg).attribute(torch.ones(1, 3, 4, 4), target=1)
    # and the callable form works: sum of class 1's logits over a mask
    mask = torch.zeros(4, 4)
    mask[:2] = 1
    grad = Saliency(seg).attribute(torch.ones(1, 3, 4, 4), target=lambda out: (out[:, 1] * mask).sum((1, 2)))
    assert torch.equal(grad[0, :, :2], seg.weight[1, :, 0, 0].view(3, 1, 1).expand(3, 2, 4))
    assert torch.equal(grad[0, :, 2:], torch.zeros(3, 2, 4))


def test_guided_backprop_requires_relu() -> None:
    with pytest.raises(ValueError, match="no ReLU ran in the forward pass of Sequential: the result would silently be"):
        GuidedBackprop(nn.Sequential(nn.Linear(3, 2), nn.Tanh())).attribute(torch.ones(1, 3))


def test_gradcam_layer_errors() -> None:
    model = make("resnet18")
    with pytest.raises(ValueError, match="layer: selector 'layer5' matches no module.*'layer1'"):
        GradCAM(model, layer="layer5")
    with pytest.raises(ValueError, match="layer 'fc' outputs shape"):
        GradCAM(model, layer="fc").attribute(image_batch(n=1))
    with pytest.raises(TypeError, match="layer must be a dotted module name"):
        GradCAM(model, layer=3)  # type: ignore[arg-type]


def test_input_errors() -> None:
    model = make("resnet18")
    with pytest.raises(ValueError, match=r"inputs has 1 channels .* expects 3; repeat its one channel"):
        Saliency(model).attribute(torch.ones(1, 1, 32, 32))
    with pytest.raises(TypeError, match="floating-point"):
        Saliency(model).attribute(torch.ones(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(TypeError, match="use visualize"):
        Saliency(model).attribute("cat.png")  # type: ignore[arg-type]


def test_reused_layer_warns_and_uses_chosen_call() -> None:
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(self.conv(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    model = Twice()
    x = image_batch(n=1, size=8)
    with pytest.warns(UserWarning, match="layer 'conv' ran 2 times in one forward pass; explaining call -1"):
        last = GradCAM(model, layer="conv").attribute(x, target=0)
    with pytest.warns(UserWarning, match="explaining call 0"):
        first = GradCAM(model, layer="conv", call=0).attribute(x, target=0)
    # reference for the first call: A1 = conv(x), y = fc(mean(conv(A1)))
    a1 = model.conv(x).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(model.fc(model.conv(a1).mean((2, 3)))[:, 0].sum(), a1)
    torch.testing.assert_close(first, F.relu((g.mean((2, 3), keepdim=True) * a1).sum(1, keepdim=True)).detach())
    assert not torch.allclose(first, last)


def test_works_under_no_grad_and_detects_inference_mode() -> None:
    model = make("resnet18")
    x = image_batch(n=1)
    expected = GuidedBackprop(model).attribute(x, target=3)
    with torch.no_grad():
        got = GuidedBackprop(model).attribute(x, target=3)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="outside inference_mode"):
        Saliency(model).attribute(x)


def test_caller_tensor_untouched() -> None:
    model = make("resnet18")
    x = image_batch(n=1)
    before = x.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GuidedBackprop(model).attribute(x, target=1)
    assert not x.requires_grad and x.grad is None and torch.equal(x, before)


def test_registry() -> None:
    assert hv.get_method("guided-backprop") is GuidedBackprop
    assert hv.get_method("gradcam") is GradCAM
    with pytest.raises(
        ValueError,
        match=r"unknown method 'gradkam'; did you mean 'gradcam'\? available: .*\bgradcam, .*guided-backprop",
    ):
        hv.get_method("gradkam")
