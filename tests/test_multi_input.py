"""Several inputs and additional_forward_args: every gradient method and the CAMs against captum; errors first."""

from __future__ import annotations

import pytest
import torch
from refs import reference
from torch import nn

import hookviz as hv

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from test_invariants import assert_same, snapshot  # noqa: E402


class ImageAndMeta(nn.Module):
    """An image (N, 3, 6, 6) and its metadata (N, 5); `scale` (N,) and `flag` (bool) are extra forward arguments."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.meta = nn.Linear(5, 4)
        self.head = nn.Linear(8, 3)

    def forward(self, img: torch.Tensor, meta: torch.Tensor, scale: torch.Tensor, flag: bool = True) -> torch.Tensor:
        a = self.relu(self.conv(img)).mean((2, 3)) * scale[:, None]
        b = torch.relu(self.meta(meta)) if flag else self.meta(meta)
        return self.head(torch.cat([a, b], 1))


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(3, 3, 6, 6, generator=g), torch.randn(3, 5, generator=g), torch.tensor([0.5, 2.0, -1.0])


def max_err(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> float:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(ours, theirs, strict=True))


GRADIENT_METHODS = [
    ("saliency", lambda m: hv.Saliency(m), lambda m: captum_attr.Saliency(m), {"abs": False}),
    ("input-x-gradient", lambda m: hv.InputXGradient(m), lambda m: captum_attr.InputXGradient(m), {}),
    ("guided-backprop", lambda m: hv.GuidedBackprop(m), lambda m: captum_attr.GuidedBackprop(m), {}),
    ("deconvnet", lambda m: hv.Deconvnet(m), lambda m: captum_attr.Deconvolution(m), {}),
    (
        "integrated-gradients",
        lambda m: hv.IntegratedGradients(m, steps=24, batch_size=10),
        lambda m: captum_attr.IntegratedGradients(m),
        {"n_steps": 24, "method": "gausslegendre"},
    ),
]


@pytest.mark.parametrize(("name", "ours", "theirs", "kwargs"), GRADIENT_METHODS, ids=[g[0] for g in GRADIENT_METHODS])
@pytest.mark.filterwarnings("ignore::UserWarning")  # captum's "did not already require gradients"
def test_gradient_methods_with_two_inputs_and_extra_args_equal_captum(name, ours, theirs, kwargs) -> None:
    model = ImageAndMeta()
    img, meta, scale = batch()
    before = snapshot(model)
    got = ours(model).attribute((img, meta), target=[0, 2, 1], additional_forward_args=(scale, False))
    want = theirs(model).attribute((img, meta), target=[0, 2, 1], additional_forward_args=(scale, False), **kwargs)
    assert isinstance(got, tuple) and len(got) == 2
    assert max_err(got, want) < 1e-6
    assert_same(before, model)
    assert float(got[0].abs().sum()) > 0 and float(got[1].abs().sum()) > 0  # both inputs get attributions


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_integrated_gradients_tuple_baselines_and_completeness() -> None:
    model = ImageAndMeta()
    img, meta, scale = batch()
    baselines = (torch.full_like(img, 0.1), torch.ones(5))
    ig = hv.IntegratedGradients(model, steps=256, baseline=baselines)
    got = ig.attribute((img, meta), target=1, additional_forward_args=scale)
    want = captum_attr.IntegratedGradients(model).attribute(
        (img, meta),
        baselines=(baselines[0], baselines[1].expand(3, 5)),
        target=1,
        additional_forward_args=(scale,),
        n_steps=256,
    )
    assert max_err(got, want) < 1e-6
    with torch.no_grad():
        expected = model(img, meta, scale)[:, 1] - model(*baselines[:1], baselines[1].expand(3, 5), scale)[:, 1]
    total = got[0].flatten(1).sum(1) + got[1].sum(1)
    assert torch.allclose(total, expected, atol=2e-3)  # completeness over both inputs (ReLU kinks: loose)
    assert torch.allclose(ig.last_delta[:, 0], total - expected, atol=1e-6)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_integrated_gradients_expands_per_sample_extra_args_in_chunks() -> None:
    """A per-sample tensor among additional_forward_args follows its input through the path points."""
    model = ImageAndMeta()
    img, meta, scale = batch()
    one = hv.IntegratedGradients(model, steps=8).attribute((img, meta), 0, additional_forward_args=scale)
    for batch_size in (1, 5, 7):
        chunked = hv.IntegratedGradients(model, steps=8, batch_size=batch_size)
        got = chunked.attribute((img, meta), 0, additional_forward_args=scale)
        assert max_err(got, one) < 1e-6
    # sample by sample, with its own scale: the same rows
    for i in range(3):
        alone = hv.IntegratedGradients(model, steps=8).attribute(
            (img[i : i + 1], meta[i : i + 1]), 0, additional_forward_args=scale[i : i + 1]
        )
        assert max_err(alone, (one[0][i : i + 1], one[1][i : i + 1])) < 1e-6


def test_single_tensor_in_gives_a_tensor_out() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    x = torch.randn(2, 4)
    for method in (hv.Saliency(model), hv.IntegratedGradients(model, steps=4), hv.SmoothGrad(model, n=2)):
        out = method.attribute(x, target=0)
        assert isinstance(out, torch.Tensor) and out.shape == x.shape
        one = method.attribute((x,), target=0)  # a 1-tuple in, a 1-tuple out
        assert isinstance(one, tuple) and len(one) == 1 and one[0].shape == x.shape


def test_k_targets_with_two_inputs() -> None:
    model = ImageAndMeta()
    img, meta, scale = batch()
    both = hv.Saliency(model).attribute((img, meta), target=torch.tensor([[0, 1]] * 3), additional_forward_args=scale)
    assert both[0].shape == (3, 2, 3, 6, 6) and both[1].shape == (3, 2, 5)
    for k in range(2):
        one = hv.Saliency(model).attribute((img, meta), target=k, additional_forward_args=scale)
        assert max_err((both[0][:, k], both[1][:, k]), one) == 0


@pytest.mark.parametrize("cls", [hv.GradCAM, hv.HiResCAM, hv.LayerCAM])
def test_cam_with_a_tuple_of_inputs_equals_captum(cls) -> None:
    model = ImageAndMeta()
    img, meta, scale = batch()
    got = cls(model, layer="conv").attribute((img, meta), target=[0, 1, 2], additional_forward_args=scale)
    assert got.shape == (3, 1, 6, 6)
    if cls is hv.GradCAM:
        want = captum_attr.LayerGradCam(model, model.conv).attribute(
            (img, meta), target=[0, 1, 2], additional_forward_args=(scale,), relu_attributions=True
        )
        assert float((got - want).abs().max()) < 1e-6
    up = cls(model, layer="conv").attribute((img, meta), target=0, upsample=True, additional_forward_args=scale)
    assert up.shape == (3, 1, 6, 6)


def test_cam_chooses_its_layer_through_the_tuple() -> None:
    model = ImageAndMeta()
    img, meta, scale = batch()
    cam = hv.GradCAM(model)
    cam.attribute((img, meta), target=0, additional_forward_args=scale)
    assert cam.layer == "relu"


# -- errors, before any work ---------------------------------------------------------------------------------------
class Counting(ImageAndMeta):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, *args, **kwargs):  # type: ignore[override]
        self.calls += 1
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize(
    ("build", "inputs", "extra", "exc", "match"),
    [
        (
            hv.Saliency,
            lambda img, meta: (img, meta[:2]),
            None,
            ValueError,
            r"inputs: the tensors of a tuple must share the batch size N .*got sizes \[3, 2\]",
        ),
        (
            lambda m: hv.IntegratedGradients(m, steps=4),
            lambda img, meta: (img, meta),
            torch.ones(2),
            ValueError,
            r"additional_forward_args\[0\] has shape \(2,\), but IntegratedGradients .* first dimension N = 3",
        ),
        (
            lambda m: hv.SmoothGrad(m, n=2),
            lambda img, meta: (img, meta),
            torch.ones(4),
            ValueError,
            r"additional_forward_args\[0\] has shape \(4,\), but SmoothGrad",
        ),
        (
            hv.Saliency,
            lambda img, meta: (img, meta.long()),
            torch.ones(3),
            TypeError,
            r"inputs\[1\] is an integer tensor \(torch.int64\); .* pass layer=",
        ),
        (
            hv.ScoreCAM,
            lambda img, meta: (img, meta),
            torch.ones(3),
            TypeError,
            "ScoreCAM does not take a tuple of inputs",
        ),
        (
            hv.Saliency,
            lambda img, meta: (),
            None,
            ValueError,
            "inputs is an empty tuple",
        ),
        (
            hv.Saliency,
            lambda img, meta: (img, "meta"),
            None,
            TypeError,
            r"inputs\[1\]: attribute\(\) takes a batch tensor",
        ),
    ],
    ids=[
        "batch-sizes",
        "ig-extra-batch",
        "smoothgrad-extra-batch",
        "integer-no-layer",
        "scorecam-tuple",
        "empty",
        "str",
    ],
)
def test_bad_inputs_raise_before_any_work(build, inputs, extra, exc, match) -> None:
    model = Counting()
    img, meta, _ = batch()
    before = snapshot(model)
    with pytest.raises(exc, match=match):
        build(model).attribute(inputs(img, meta), target=0, additional_forward_args=extra)
    assert model.calls == 0
    assert_same(before, model)


def test_additional_forward_args_on_a_single_input_method_raise() -> None:
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2))
    with pytest.raises(TypeError, match="GuidedGradCAM does not take additional_forward_args"):
        hv.GuidedGradCAM(model, layer="0").attribute(torch.randn(1, 3, 6, 6), additional_forward_args=1)


def test_extra_args_of_another_size_are_fine_for_methods_that_do_not_expand() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
            return self.lin(x @ table)

    model, x, table = Shared(), torch.randn(3, 4), torch.randn(4, 4)
    got = hv.Saliency(model).attribute(x, target=1, additional_forward_args=table)
    want = captum_attr.Saliency(model).attribute(x, target=1, additional_forward_args=(table,), abs=False)
    assert torch.allclose(got, want)


def test_model_restored_when_the_forward_raises_with_extra_args() -> None:
    model = ImageAndMeta()
    img, meta, _ = batch()
    before = snapshot(model)
    with pytest.raises(RuntimeError):  # scale of the wrong length breaks the forward itself
        hv.GuidedBackprop(model).attribute((img, meta), target=0, additional_forward_args=torch.ones(3, 2))
    assert_same(before, model)
