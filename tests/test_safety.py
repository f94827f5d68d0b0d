"""Interrupted calls leave nothing behind, explainers nest without interfering, the CAM layer probe is mode- and
batch-independent, and HookManagers share ``inplace`` flags by counting owners (issue 10, defects 1, 2 and 4)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torchvision import models

import hookviz as hv
from hookviz import HookManager
from hookviz.methods.cam import choose_layer


def resnet(inplace_relus: bool = True) -> nn.Module:
    torch.manual_seed(0)
    model = models.resnet18(weights=None, num_classes=10).eval()
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = inplace_relus
    return model


def relu_gradient_is_plain() -> bool:
    """Whether F.relu in this process has its true gradient (-1 where y > 0 for the seed -1)."""
    y = torch.tensor([1.0, -0.5, 2.0], requires_grad=True)
    (F.relu(y) * -1).sum().backward()
    return y.grad.tolist() == [-1.0, 0.0, -1.0]


# -- defect 1: Ctrl-C -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["guided-backprop", "deconvnet", "guided-gradcam"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_interrupt_in_the_rule_pass_leaves_no_mode_and_no_flag(name: str, exc: type[BaseException]) -> None:
    model = resnet()
    flags = [m.inplace for m in model.modules() if isinstance(m, nn.ReLU)]

    def interrupt(module, args, out):
        if _get_current_function_mode_stack():  # only in the pass with the ReLU rules (Guided Grad-CAM's second)
            raise exc

    handle = model.layer3.register_forward_hook(interrupt)
    kwargs = {"layer": "layer4"} if name == "guided-gradcam" else {}
    try:
        with pytest.raises(exc):
            hv.get_method(name)(model, **kwargs).attribute(torch.randn(1, 3, 32, 32), 1)
    finally:
        handle.remove()
    assert _get_current_function_mode_stack() == []
    assert relu_gradient_is_plain()
    assert [m.inplace for m in model.modules() if isinstance(m, nn.ReLU)] == flags
    assert hv.hook_counts(model) == {"forward": 0, "forward_pre": 0, "backward": 0, "backward_pre": 0}


# -- defect 2: nesting ------------------------------------------------------------------------------------------------
def nested(model: nn.Module, outer: hv.Attribution, inner: hv.Attribution, x: torch.Tensor, x_in: torch.Tensor):
    """Run `outer` on x with a user hook on layer2 that runs `inner` on x_in once; both results."""
    inner_results: list[torch.Tensor] = []

    def hook(module, args, out):
        if not inner_results:
            inner_results.append(torch.zeros(()))  # guard: the inner forward runs this hook too
            inner_results[0] = inner.attribute(x_in, 3)

    handle = model.layer2.register_forward_hook(hook)
    try:
        outer_result = outer.attribute(x, 1)
    finally:
        handle.remove()
    return outer_result, inner_results[0]


PAIRS = {
    "saliency-in-guided": (lambda m: hv.GuidedBackprop(m), lambda m: hv.Saliency(m)),
    "gradcam-in-guided": (lambda m: hv.GuidedBackprop(m), lambda m: hv.GradCAM(m, layer="layer3")),
    "guided-in-gradcam": (lambda m: hv.GradCAM(m, layer="layer3", call=0), lambda m: hv.GuidedBackprop(m)),
    "guided-in-guided": (lambda m: hv.GuidedBackprop(m), lambda m: hv.GuidedBackprop(m)),
    "deconvnet-in-guided": (lambda m: hv.GuidedBackprop(m), lambda m: hv.Deconvnet(m)),
    "guided-in-deconvnet": (lambda m: hv.Deconvnet(m), lambda m: hv.GuidedBackprop(m)),
    "autocam-in-guided-gradcam": (lambda m: hv.GuidedGradCAM(m, layer="layer4"), lambda m: hv.GradCAM(m)),
    "smoothgrad-in-gradcampp": (
        lambda m: hv.GradCAMPlusPlus(m, layer="layer4"),
        lambda m: hv.SmoothGrad(hv.GuidedBackprop(m), n=2, generator=torch.Generator().manual_seed(0)),
    ),
}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_nested_explainers_equal_unnested(pair: str) -> None:
    import warnings

    model = resnet()
    make_outer, make_inner = PAIRS[pair]
    torch.manual_seed(1)
    x, x_in = torch.randn(2, 3, 32, 32), torch.randn(1, 3, 32, 32)
    alone_outer = make_outer(model).attribute(x, 1)
    alone_inner = make_inner(model).attribute(x_in, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "layer ran 2 times" would be the outer CAM seeing the inner forward
        # the outer Guided Grad-CAM's map on this random resnet is all zero alone too (its warning says so): not a
        # sign of interference
        warnings.filterwarnings("ignore", message=r"GuidedGradCAM: every map is zero")
        outer, inner = nested(model, make_outer(model), make_inner(model), x, x_in)
    torch.testing.assert_close(outer, alone_outer, rtol=0, atol=1e-6)
    torch.testing.assert_close(inner, alone_inner, rtol=0, atol=1e-6)
    assert _get_current_function_mode_stack() == []
    assert relu_gradient_is_plain()


def test_guided_coverage_counts_only_its_own_forward() -> None:
    model = resnet()
    alone = hv.GuidedBackprop(model)
    alone.attribute(torch.randn(1, 3, 32, 32), 1)
    outer = hv.GuidedBackprop(model)
    nested(model, outer, hv.Saliency(model), torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32))
    assert str(outer.coverage) == str(alone.coverage)


def test_inplace_flag_switched_back_only_when_its_last_owner_goes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    seen: list[str] = []
    a, b = HookManager(model), HookManager(model)
    a.backward(nn.ReLU, lambda m, gi, go: seen.append("a"))
    b.backward(nn.ReLU, lambda m, gi, go: seen.append("b"))
    a.remove()  # not in LIFO order: b's hook is still live
    assert model[1].inplace is False
    model(torch.randn(2, 3)).sum().backward()  # PyTorch raises (pytorch#61519) if inplace came back on
    assert seen == ["b"]
    b.remove()
    assert model[1].inplace is True
    # a module that was out of place to begin with stays so
    model[1].inplace = False
    with HookManager(model) as c, HookManager(model) as d:
        c.backward(nn.ReLU, lambda m, gi, go: None)
        d.backward(nn.ReLU, lambda m, gi, go: None)
        c.remove()
    assert model[1].inplace is False


# -- defect 4: the CAM layer probe ------------------------------------------------------------------------------------
def test_automatic_layer_with_eval_mode_false_and_batchnorm_in_the_head() -> None:
    torch.manual_seed(0)
    model = models.mobilenet_v3_small(weights=None, num_classes=10).train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = choose_layer(model.eval(), torch.randn(1, 3, 32, 32))[0]
    model.train()
    cam = hv.GradCAM(model, eval_mode=False)
    out = cam.attribute(torch.randn(2, 3, 32, 32), 1)
    assert cam.layer == expected and out.shape[:2] == (2, 1)
    assert all(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k  # BatchNorm statistics untouched by the probe and the call


def test_probe_does_not_depend_on_batch_or_mode() -> None:
    torch.manual_seed(0)
    model = models.mobilenet_v3_small(weights=None, num_classes=10)
    x = torch.randn(3, 3, 40, 40)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    chosen = {choose_layer(model.train(), x[:1])[0], choose_layer(model.train(), x)[0]}
    chosen.add(choose_layer(model.eval(), x)[0])
    assert len(chosen) == 1
    model.train()
    choose_layer(model, x[:1])
    assert model.training and all(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_probe_runs_the_input_as_given() -> None:
    """A 3-D input (C, H, W) without a batch axis: the probe fails exactly as the model's own forward does, with a
    note saying what hookviz was doing, not with an error of its own (slicing x[:1] used to give "1 channels")."""
    model = resnet()
    x = torch.randn(3, 32, 32)
    with pytest.raises(Exception) as direct:
        model(x)
    with pytest.raises(Exception) as probed:
        choose_layer(model, x)
    assert type(probed.value) is type(direct.value) and str(probed.value) == str(direct.value)
    assert "channels" not in str(probed.value)
    assert any("(3, 32, 32)" in note and "CAM layer" in note for note in probed.value.__notes__)
