"""Every "did you mean" and suggested fix of issue 27, point 8, checked for being right on the case that triggers it:
the suggestion is applied and the call then works."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import hookviz as hv
from hookviz.panels import PRETTY_NAMES


def _net(channels: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(channels, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("grad-cam", "gradcam"),
        ("Grad-CAM", "gradcam"),
        ("Grad-CAM++", "gradcam++"),
        ("GuidedBackprop", "guided-backprop"),
        ("guided_backprop", "guided-backprop"),
        ("Integrated Gradients", "integrated-gradients"),
        ("Input \u00d7 Gradient", "input-x-gradient"),
        ("score-cam", "scorecam"),
        ("guided-backprob", "guided-backprop"),
    ],
)
def test_get_method_suggests_the_registry_name(name, meant):
    with pytest.raises(
        ValueError, match=rf"unknown method {re.escape(repr(name))}; did you mean '{re.escape(meant)}'\?"
    ):
        hv.get_method(name)
    assert hv.get_method(meant) is hv.METHODS[meant]


def test_every_figure_title_leads_back_to_its_method():
    # the column titles of hv.grid (PRETTY_NAMES) are the spellings a user copies from a figure
    for label, title in PRETTY_NAMES.items():
        with pytest.raises(ValueError, match="did you mean") as info:
            hv.get_method(title)
        meant = re.search(r"did you mean '([^']+)'", str(info.value)).group(1)
        cls = hv.get_method(meant)
        assert cls.__name__ == label.split(" ")[0]
        if "(" in label:  # an LRP composite: the suggestion names that composite
            assert meant.endswith(label[label.index("(") + 1 : -1])


def test_no_suggestion_for_a_name_that_means_nothing():
    with pytest.raises(ValueError, match=r"unknown method 'banana'; available: attention-rollout"):
        hv.get_method("banana")
    with pytest.raises(ValueError, match=r"unknown method 3; available: "):
        hv.get_method(3)


@pytest.mark.parametrize(
    ("expected", "got", "fix"),
    [
        (3, 1, r"repeat its one channel: (.+)$"),
        (1, 3, r"average its channels to one: (x\.mean\(dim=1, keepdim=True\))"),
        (3, 4, r"drop its 4th \(alpha\) channel: (.+)$"),
    ],
)
def test_channel_hint_names_a_fix_for_the_tensor_passed(expected, got, fix):
    model = _net(expected)
    x = torch.rand(2, got, 16, 16)
    for call in (hv.Saliency(model).attribute, hv.Saliency(model).visualize):
        with pytest.raises(ValueError, match=rf"has {got} channels .* expects {expected}; ") as info:
            call(x)
        message = str(info.value)
        assert "load_images" not in message  # the user passed a tensor and never called it
        fixed = eval(re.search(fix, message).group(1), {"x": x})  # noqa: S307 - the hint's own expression
        assert fixed.shape == (2, expected, 16, 16)
        assert call(fixed) is not None  # the suggested fix works


def test_one_channel_model_takes_an_image_path(tmp_path):
    path = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(0).random((40, 30)) * 255).astype(np.uint8)).save(path)
    e = hv.Saliency(_net(1)).visualize(str(path))
    assert e.inputs.shape == (1, 1, 224, 224)
    assert "imagenet-gray" in e.preprocess


def test_preset_channel_mismatch_suggests_a_preset_that_fits(tmp_path):
    path = tmp_path / "digit.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(path)
    with pytest.raises(ValueError, match=r"normalizes 3 channels but the images are loaded with channels=1") as info:
        hv.Saliency(_net(1)).visualize(str(path), preprocess="imagenet")
    assert "load_images" not in str(info.value)
    suggested = eval(re.search(r"e\.g\. (Preset\(.*\))$", str(info.value)).group(1), {"Preset": hv.Preset})  # noqa: S307
    assert hv.Saliency(_net(1)).visualize(str(path), preprocess=suggested).inputs.shape == (1, 1, 224, 224)


def test_cli_suggests_by_the_same_rule():
    from hookviz.cli.common import UsageError, _parse_methods

    with pytest.raises(UsageError, match=r"unknown method 'Grad-CAM'; did you mean 'gradcam'\? available: "):
        _parse_methods("saliency,Grad-CAM")  # on main: no suggestion for the figures' spelling
    assert _parse_methods("saliency,gradcam") == ["saliency", "gradcam"]
