"""Input checks before any work (issue 10, defect 3): rank against the first convolution, dtype, NaN/Inf, inference
tensors, PIL decompression bombs, grid's up-front validation, numpy targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cheap import ON_CNNS, cheap_method
from PIL import Image
from torch import nn

import hookviz as hv
from hookviz.cli import main
from hookviz.figures import grid

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_POOL = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}


class Counted(nn.Module):
    """conv -> ReLU -> global pool -> linear (5 classes); counts its forward calls, so tests can see nothing ran."""

    def __init__(self, dims: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = _CONV[dims](3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = _POOL[dims](1)
        self.fc = nn.Linear(4, 5)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


def batch(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def small(name: str, model: nn.Module) -> hv.methods.base.Attribution:
    """The registered method `name` with few samples / steps, so every method runs in milliseconds."""
    return cheap_method(name, model)


# -- rank against the first convolution -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dims", "shape", "match"),
    [
        (2, (2, 3, 4, 8, 8), r"inputs have shape \(2, 3, 4, 8, 8\) \(5-D\) but the model's first convolution 'conv' "
         r"\(Conv2d\) takes 4-D batches \(N, C, H, W\)"),
        (2, (3, 8, 8), r"\(3-D\) but .* takes 4-D batches \(N, C, H, W\); add the batch axis with x.unsqueeze\(0\)"),
        (1, (2, 3, 8, 8), r"\(4-D\) but .* 'conv' \(Conv1d\) takes 3-D batches \(N, C, L\)"),
        (3, (2, 3, 8, 8), r"\(4-D\) but .* 'conv' \(Conv3d\) takes 5-D batches \(N, C, D, H, W\); add the batch"),
        (2, (3,), r"inputs need a batch axis first, \(N, \.\.\.\); got shape \(3,\)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("name", ["saliency", "guided-backprop", "gradcam", "integrated-gradients"])
def test_rank_is_checked_against_the_first_convolution_before_the_model_runs(dims, shape, match, name) -> None:
    model = Counted(dims)
    with pytest.raises(ValueError, match=match):
        small(name, model).attribute(batch(*shape))
    assert model.calls == 0


@pytest.mark.parametrize("dims", [1, 3])
def test_conv1d_and_conv3d_models_take_their_rank(dims: int) -> None:
    x = batch(2, 3, *([6] * dims))
    grad = hv.Saliency(Counted(dims)).attribute(x, target=1)
    assert grad.shape == x.shape and grad.abs().sum() > 0


class Unflatten(Counted):
    """Takes flat (N, 3 * 8 * 8) features and folds them into images before its convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.view(-1, 3, 8, 8))


def test_flat_batches_and_tuples_are_not_held_to_the_first_convolution() -> None:
    # a model that reshapes flat features into images, and a tuple (image, metadata): which tensor feeds the
    # convolution, and in which layout, is the forward's business; the gradient is that of the folded image
    flat = batch(2, 3 * 8 * 8)
    want = hv.Saliency(Counted()).attribute(flat.view(2, 3, 8, 8), target=1)
    got = hv.Saliency(Unflatten()).attribute(flat, target=1)
    torch.testing.assert_close(got, want.view(2, -1))

    class WithMeta(Counted):
        def forward(self, x: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + meta.sum(dim=1, keepdim=True)

    image_grad, meta_grad = hv.Saliency(WithMeta()).attribute((batch(2, 3, 8, 8), batch(2, 4)), target=1)
    assert image_grad.shape == (2, 3, 8, 8) and torch.equal(meta_grad, torch.ones(2, 4))


def test_a_model_without_convolution_gets_the_batch_axis_checks() -> None:
    mlp = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"inputs hold an empty batch \(N = 0\), shape \(0, 6\); expected N >= 1"):
        hv.Saliency(mlp).attribute(torch.zeros(0, 6))
    with pytest.raises(ValueError, match=r"inputs need a batch axis first, \(N, \.\.\.\); got shape \(6,\)"):
        hv.Saliency(mlp).attribute(torch.zeros(6))
    assert hv.Saliency(mlp).attribute(batch(2, 6)).shape == (2, 6)


# -- dtype: inputs are cast to the model's parameter dtype ---------------------------------------------------------
@pytest.mark.parametrize("name", ON_CNNS)  # the attention methods: test_attention_rollout.py
def test_float64_inputs_on_a_float32_model_are_explained_in_float32(name: str) -> None:
    model = Counted()
    x = batch(2, 3, 8, 8)
    want = small(name, model).attribute(x, target=[1, 3])
    got = small(name, model).attribute(x.double(), target=[1, 3])
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # float64 -> float32 gives back x exactly


def test_float32_images_on_a_float64_model_are_explained_in_float64() -> None:
    model = Counted().double()
    image = (np.random.default_rng(0).random((8, 8, 3)) * 255).astype(np.uint8)
    exp = hv.Saliency(model).visualize(image, target=2, preprocess=None)  # load_images gives float32
    assert exp.attribution.dtype == torch.float64
    x = hv.load_images(image, preprocess=None).tensor.double()
    torch.testing.assert_close(exp.attribution, hv.Saliency(model).attribute(x, target=2))


# -- NaN / Inf -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ON_CNNS)  # the attention methods: test_attention_rollout.py
def test_non_finite_inputs_are_refused_with_their_count(name: str) -> None:
    model = Counted()
    x = batch(2, 3, 8, 8)
    x[0, 0, 0, 0], x[1, 2, 3, 4], x[1, 1, 1, 1] = float("nan"), float("inf"), -float("inf")
    with pytest.raises(ValueError, match=r"inputs: found 3 non-finite value\(s\) \(NaN or Inf\) among 384"):
        small(name, model).attribute(x)
    assert model.calls == 0


def test_visualize_refuses_non_finite_tensors_before_drawing() -> None:
    x = batch(1, 3, 8, 8)
    x[0, 1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"images: found 1 non-finite value\(s\) \(NaN or Inf\) among 192"):
        hv.GradCAM(Counted()).visualize(x)


@pytest.mark.parametrize(
    ("baseline", "error", "match"),
    [
        (float("nan"), ValueError, r"baseline must be a finite number \(a constant image\), got nan"),
        (float("-inf"), ValueError, r"baseline must be a finite number \(a constant image\), got -inf"),
        (torch.full((3, 8, 8), float("nan")), ValueError, r"baseline: found 192 non-finite value\(s\)"),
    ],
)
def test_integrated_gradients_refuses_a_non_finite_baseline(baseline, error, match) -> None:
    with pytest.raises(error, match=match):
        hv.IntegratedGradients(Counted(), baseline=baseline)


def test_integrated_gradients_checks_the_baseline_again_at_call_time() -> None:
    baseline = torch.zeros(3, 8, 8)
    model = Counted()
    ig = hv.IntegratedGradients(model, steps=2, baseline=baseline)
    baseline[0, 0, 0] = float("nan")  # changed in place after __init__
    with pytest.raises(ValueError, match=r"baseline: found 1 non-finite value\(s\) \(NaN or Inf\) among 192"):
        ig.attribute(batch(1, 3, 8, 8))
    assert model.calls == 0


# -- inference tensors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ON_CNNS)  # the attention methods: test_attention_rollout.py
def test_tensors_made_under_inference_mode_work_with_every_method(name: str) -> None:
    model = Counted()
    x = batch(2, 3, 8, 8)
    with torch.inference_mode():
        xi = x.clone()
    assert xi.is_inference()
    got = small(name, model).attribute(xi, target=[0, 4])
    torch.testing.assert_close(got, small(name, model).attribute(x, target=[0, 4]), rtol=0, atol=0)
    assert xi.is_inference() and torch.equal(xi, x)  # the caller's tensor is left as it was


# -- PIL decompression bombs ----------------------------------------------------------------------------------------
@pytest.fixture
def bomb(tmp_path, monkeypatch) -> str:
    """A 32x32 PNG that PIL refuses once its limit is 100 pixels (refused above 2 * 100)."""
    path = tmp_path / "bomb.png"
    Image.new("RGB", (32, 32)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    return str(path)


def test_decompression_bomb_is_wrapped_with_file_pixels_limit_and_fix(bomb: str) -> None:
    with pytest.raises(ValueError) as info:
        hv.load_images(bomb)
    message = str(info.value)
    assert "bomb.png" in message and "1,024 pixels" in message and "200" in message
    assert "PIL.Image.MAX_IMAGE_PIXELS = 100" in message and "if you trust the file" in message
    assert isinstance(info.value.__cause__, Image.DecompressionBombError)


def test_decompression_bomb_in_hookviz_explain_is_one_line(bomb: str, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", bomb, "--model", "torchvision:resnet18", "--method", "saliency", "--size", "32",
              "--out", str(tmp_path / "fig.png")])  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hookviz explain: error: images[0]: ") and err.count("\n") == 1, err
    assert "1,024 pixels" in err and "MAX_IMAGE_PIXELS" in err and "Traceback" not in err


# -- grid validates everything before running a method ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"methods": ["saliency", "gradcamm"]},
            ValueError,
            r"unknown method 'gradcamm'; did you mean 'gradcam'\? available: .*gradcam",
        ),
        ({"methods": ["saliency", 3]}, TypeError, r"methods must hold registry names \(str\), .* got int"),
        ({"methods": ["saliency"], "cmap": "jte"}, ValueError, r"cmap 'jte' is not a matplotlib colour map.*'jet'"),
        ({"methods": ["saliency"], "rc": {"font.sizee": 3}}, ValueError, r"rc: 'font.sizee' is not a matplotlib .*"
         r"'font.size'"),
        ({"methods": ["saliency"], "rc": {"font.size": "big"}}, ValueError, r"rc: Key font.size: .*'big'"),
        ({"methods": ["saliency"], "out": "fig.gif"}, ValueError,
         r"out must end with one of .* got suffix '.gif' in 'fig.gif'"),
    ],
)  # fmt: skip
def test_grid_checks_methods_colormaps_and_options_before_running_any(kwargs, error, match) -> None:
    model = Counted()
    with pytest.raises(error, match=match):
        grid(batch(1, 3, 8, 8), model=model, **kwargs)
    assert model.calls == 0


# -- numpy targets ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("numpy_target", "torch_target"),
    [
        (np.int64(3), 3),
        (np.int32(0), 0),
        (np.uint8(4), 4),
        (np.array(2), 2),
        (np.array([3, 1]), torch.tensor([3, 1])),
        (np.array([[1, 2], [3, 4]], dtype=np.int32), torch.tensor([[1, 2], [3, 4]])),
        ([np.int64(4), np.int64(0)], [4, 0]),
    ],
)
@pytest.mark.parametrize("name", ["saliency", "gradcam"])
def test_numpy_integer_targets_are_accepted_like_ints_and_tensors(numpy_target, torch_target, name) -> None:
    model, x = Counted(), batch(2, 3, 8, 8)
    got = small(name, model).attribute(x, target=numpy_target)
    torch.testing.assert_close(got, small(name, model).attribute(x, target=torch_target), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("target", "match"),
    [
        (np.array([1.0, 2.0]), r"target must hold integer class indices; got a numpy float64 array of shape \(2,\)"),
        (np.float64(3.0), r"target must hold integer class indices; got a numpy float64 scalar"),
        (np.array([True, False]), r"got a numpy bool array of shape \(2,\)"),
        (np.bool_(True), r"got a numpy bool scalar"),
        (np.array(["a", "b"]), r"got a numpy <U1 array"),
    ],
)
def test_numpy_non_integer_targets_are_refused(target, match) -> None:
    model = Counted()
    with pytest.raises(TypeError, match=match):
        hv.Saliency(model).attribute(batch(2, 3, 8, 8), target=target)
    assert model.calls == 0


def test_negative_numpy_targets_are_refused() -> None:
    with pytest.raises(ValueError, match=r"target classes must be >= 0; got -1"):
        hv.Saliency(Counted()).attribute(batch(2, 3, 8, 8), target=np.array([-1, 2]))
