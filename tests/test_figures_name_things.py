"""Figures name things (issue 27, point 5): class names from the model, scores labelled, a colour bar that says what
the colours mean, and overlays of Guided Backprop that tint only where the map is."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import hookviz as hv
from hookviz.zoo import CLASSES, shapes, shapes_model


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return shapes_model()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return shapes(2, seed=5).images  # (2, 3, 64, 64) in [0, 1], as the model takes them


def _colorbars(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_titles_name_the_class_and_label_the_score(model, images):
    e = hv.GradCAM(model).visualize(images)
    assert e.labels == CLASSES  # the zoo model supplies its class names; nothing was passed
    with torch.no_grad():
        logits = model(images)
    titles = [ax.get_title() for ax in e.figure().axes[::3]]
    for i, title in enumerate(titles):
        c = int(logits[i].argmax())
        assert title.startswith(f"{CLASSES[c]}  logit ")
        # three significant digits of a logit near 10: rounded to 0.05 at most
        assert float(title.rsplit(" ", 1)[1]) == pytest.approx(logits[i, c].item(), abs=0.05)
    # the method's panel is titled as the grid's column is (not the class name "GradCAM")
    assert e.figure().axes[1].get_title() == "Grad-CAM"
    # names the user passes still win
    named = hv.GradCAM(model).visualize(images, labels=[f"c{i}" for i in range(8)])
    assert named.figure().axes[0].get_title().startswith(f"c{int(logits[0].argmax())}  logit ")


def test_colorbar_says_what_the_colours_mean(model, images, tmp_path):
    cam = hv.GradCAM(model).visualize(images)
    assert _colorbars(cam.figure()) == []  # off by default
    (bar,) = _colorbars(cam.figure(colorbar=True))
    assert bar.get_ylabel() == "normalised magnitude"
    assert [t.get_text() for t in bar.get_yticklabels()] == ["min", "max"]
    ig = hv.InputXGradient(model).visualize(images)  # signed display: percentile, "bwr"
    (bar,) = _colorbars(ig.figure(colorbar=True))
    assert bar.get_ylabel() == "signed relevance"
    assert [t.get_text() for t in bar.get_yticklabels()] == ["\u2212", "0", "+"]
    (bar,) = _colorbars(ig.figure(colorbar=True, sign="absolute"))
    assert bar.get_ylabel() == "normalised magnitude"
    path = cam.save(tmp_path / "cam.png", colorbar=True)
    assert path.stat().st_size > 0


def test_colorbar_refused_without_a_colour_map(model, images):
    gb = hv.GuidedBackprop(model).visualize(images)  # an RGB map and no overlay column
    with pytest.raises(ValueError, match=r"figure\(colorbar=True\): the map has 3 channels drawn as RGB.*overlay=True"):
        gb.figure(colorbar=True)
    (bar,) = _colorbars(gb.figure(colorbar=True, overlay=True))
    assert bar.get_ylabel() == "standardised value"
    with pytest.raises(TypeError, match="colorbar must be a bool, got str"):
        gb.figure(colorbar="yes")


def _half_zero_guided(images: torch.Tensor) -> hv.Explanation:
    """A Guided Backprop explanation whose map is zero on the left half of each image."""
    g = torch.Generator().manual_seed(0)
    attr = torch.randn(2, 3, 64, 64, generator=g)
    attr[..., :32] = 0
    return hv.Explanation(
        attribution=attr,
        images=images,
        inputs=images,
        targets=torch.zeros(2, 1, dtype=torch.long),
        scores=torch.zeros(2, 1),
        method="GuidedBackprop",
        display=dict(hv.GuidedBackprop.display_defaults),
    )


def test_guided_backprop_overlay_tints_only_where_the_map_is(images):
    e = _half_zero_guided(images)
    over = e.overlay()
    torch.testing.assert_close(over[..., :32], images[..., :32], rtol=0, atol=0)  # opacity 0 where the map is 0
    tinted = (over[..., 32:] - images[..., 32:]).abs().amax(1)
    assert (tinted > 0).float().mean() > 0.9  # and a tint where it is not
    # the figure's overlay column and the grid's overlay cells follow the same rule
    fig = e.figure(overlay=True)  # image | map | overlay
    shown = np.asarray(fig.axes[2].images[0].get_array())
    image = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_array_equal(shown[:, :32], image[:, :32])
    cells = [np.asarray(ax.images[0].get_array()) for ax in hv.grid(e, overlay=True).axes if ax.images]
    np.testing.assert_allclose(cells[1][:, :32], images[0, :, :, :32].permute(1, 2, 0).numpy(), rtol=0, atol=1e-6)


def test_guided_backprop_overlay_of_a_real_map(model, images):
    e = hv.GuidedBackprop(model).visualize(images)
    assert e.display["alpha_by_map"] is True
    zero = e.attribution.abs().amax(1, keepdim=True) == 0  # (N, 1, H, W): where the map is exactly zero
    over = e.overlay()
    same = (over == e._rgb_images()).all(1, keepdim=True)
    assert bool(same[zero].all())  # on main every pixel was tinted with alpha 0.5


def test_grid_with_torchvision_weights_names_their_categories(tmp_path):
    from torchvision.models import ResNet18_Weights, resnet18

    torch.manual_seed(0)
    model = resnet18(weights=None).eval()  # the weights' names and transforms, without downloading the weights
    path = tmp_path / "image.png"
    Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8)).save(path)
    weights = ResNet18_Weights.IMAGENET1K_V1
    fig = hv.grid([str(path)], ["saliency"], model=model, targets=1, weights=weights)
    assert fig.axes[0].get_ylabel() == "goldfish"  # class 1 of weights.meta["categories"]
    assert fig.axes[0].images[0].get_array().shape[:2] == (224, 224)  # weights.transforms(): crop 224
