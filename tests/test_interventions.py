"""`hv.intervene`, the provided edits and `hv.cache`: exact values on hand-built models, reused modules, tuple outputs,
layouts, and the errors (never fired, wrong shape / dtype, unknown names), with the model left as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hookviz as hv
from hookviz.interventions import add, mean_ablate, replace, scale, zero
from hookviz.zoo import shapes, shapes_model


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


class Identity4(nn.Module):
    """x -> conv (identity weights, 3 channels) -> relu (in place) -> sum over everything but the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(3).reshape(3, 3, 1, 1))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.conv(x))


class Pair(nn.Module):
    """A module returning a tuple (as nn.MultiheadAttention and transformer blocks do)."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x * 2, x.sum()


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()

    def forward(self, x: Tensor) -> Tensor:
        a, s = self.pair(x)
        return a + s


@pytest.fixture
def x() -> Tensor:
    return torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))


def test_zero_channels_and_region_exact(x) -> None:
    model = Identity4()
    with hv.intervene(model, {"conv": zero(channels=[1])}) as state:
        out = model(x)
    expected = x.clone()
    expected[:, 1] = 0
    assert torch.equal(out, expected) and state.fired == {"conv": 1}
    with hv.intervene(model, {"conv": zero(channels=[0, 2], region=(1, 3, 0, 2))}):
        out = model(x)
    expected = x.clone()
    expected[:, [0, 2], 1:3, 0:2] = 0
    assert torch.equal(out, expected)
    assert hook_count(model) == 0 and torch.equal(model(x), x)


def test_scale_add_mean_ablate_exact(x) -> None:
    model = Identity4()
    with hv.intervene(model, {"conv": scale(3.0, channels=2)}):
        out = model(x)
    assert torch.allclose(out[:, 2], 3 * x[:, 2]) and torch.equal(out[:, :2], x[:, :2])
    direction = torch.tensor([1.0, -10.0, 0.5])
    with hv.intervene(model, {"conv": add(direction, alpha=2.0)}):
        out = model(x)  # relu after the edit: the -20 channel is cut to 0
    assert torch.allclose(out, F.relu(x + 2 * direction.reshape(1, 3, 1, 1)))
    with hv.intervene(model, {"conv": mean_ablate(channels=[0])}):
        out = model(x)
    assert torch.allclose(out[:, 0], x[:, 0].mean(0, keepdim=True).expand(2, 4, 5))
    mean = torch.full((3, 4, 5), 0.25)
    with hv.intervene(model, {"conv": mean_ablate(mean)}):
        assert torch.allclose(model(x), mean.expand(2, 3, 4, 5))


def test_function_edits_get_the_call_index_of_a_reused_module() -> None:
    """ShapesCNN calls its one `relu` module twice per forward (16 channels at 64x64, then 64 at 16x16)."""
    model = shapes_model()
    x = shapes(2, seed=3).images
    seen: list[tuple[int, tuple[int, ...]]] = []

    def record(a: Tensor, call: int) -> Tensor:
        seen.append((call, tuple(a.shape)))
        return a

    with hv.intervene(model, {"relu": record}) as state:
        model(x)
        model(x)
    assert seen == [(0, (2, 16, 64, 64)), (1, (2, 64, 16, 16))] * 2 and state.fired == {"relu": 4}
    # "relu#1": only the second call; zeroed, the rest of the network sees zeros whatever the input
    with torch.no_grad():
        with hv.intervene(model, {"relu#1": zero()}) as state:
            out = model(x)
        expected = model.head(model.features(torch.zeros(2, 64, 16, 16)).mean((2, 3)))
    assert state.fired == {"relu#1": 1}
    assert torch.allclose(out, expected, atol=1e-6)
    with hv.intervene(model, {"relu#0": lambda a: a}) as state:
        model(x)
    assert state.fired == {"relu#0": 1} and hook_count(model) == 0


def test_replace_from_cache_restores_the_clean_run_and_survives_inplace_relu() -> None:
    model = shapes_model()
    data = shapes(4, seed=4).images
    clean, corrupt = data[:2], data[2:]
    acts = hv.cache(model, clean, layers=["features.1", "relu#1"])
    assert set(acts) == {"features.1", "relu", "relu#1"} and acts["features.1"].shape == (2, 96, 16, 16)
    before = acts["features.1"].clone()
    assert (before < 0).any()  # read before the in-place ReLU features.2 overwrote it
    with torch.no_grad():
        clean_out = model(clean)
        with hv.intervene(model, {"features.1": replace(acts)}):
            patched = model(corrupt)
    assert torch.allclose(patched, clean_out, atol=1e-5)
    assert torch.equal(acts["features.1"], before)  # the in-place ReLU after the patched layer left the cache alone
    with torch.no_grad(), hv.intervene(model, {"relu#1": replace(acts["relu#1"][:1])}):  # one sample, broadcast
        out = model(corrupt)
    assert torch.allclose(out, clean_out[:1].expand(2, -1), atol=1e-5)


def test_tuple_outputs_edit_the_first_element() -> None:
    model = TupleNet()
    x = torch.arange(6.0).reshape(1, 2, 3)
    with hv.intervene(model, {"pair": lambda a: a + 1}):
        out = model(x)
    assert torch.equal(out, x * 2 + 1 + x.sum())


def test_layouts_tokens_and_nhwc() -> None:
    model = nn.Sequential(nn.Identity())
    t = torch.rand(2, 5, 4)
    with hv.intervene(model, {"0": zero(tokens=[0, 4])}):
        out = model(t)
    assert torch.equal(out[:, 1:4], t[:, 1:4]) and (out[:, [0, 4]] == 0).all()
    with hv.intervene(model, {"0": zero(channels=[1])}):  # tokens: the feature axis is the last one
        assert (model(t)[..., 1] == 0).all()
    nhwc = torch.rand(2, 3, 3, 6)
    with hv.intervene(model, {"0": zero(channels=[5], region=(0, 1, 0, 3))}, layout="nhwc"):
        out = model(nhwc)
    expected = nhwc.clone()
    expected[:, 0:1, 0:3, 5] = 0
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="tokens= needs a tokens layout"):
        with hv.intervene(model, {"0": zero(tokens=[0])}):
            model(torch.rand(1, 2, 3, 3))
    assert hook_count(model) == 0


def test_never_fired_is_an_error_naming_it(x) -> None:
    model = shapes_model()
    with pytest.raises(ValueError, match=r"never fired: 'relu#2'"):
        with hv.intervene(model, {"relu#2": zero(), "relu": lambda a: a}):
            model(shapes(1, seed=0).images)
    assert hook_count(model) == 0
    with pytest.raises(ValueError, match="never fired: 'conv1'"):
        with hv.intervene(model, {"conv1": zero()}):
            pass
    with hv.intervene(model, {"conv1": zero()}, strict=False) as state:
        pass
    assert state.fired == {"conv1": 0}


def test_bad_edits_are_rejected_and_the_model_restored(x) -> None:
    model = Identity4()
    with pytest.raises(ValueError, match=r"edit for 'conv' returned a torch.float32 tensor of shape \(2, 3, 4\)"):
        with hv.intervene(model, {"conv": lambda a: a[..., 0]}):
            model(x)
    with pytest.raises(ValueError, match="must keep its shape, dtype and device"):
        with hv.intervene(model, {"conv": lambda a: a.double()}):
            model(x)
    with pytest.raises(TypeError, match="returned NoneType; an edit must return a tensor"):
        with hv.intervene(model, {"conv": lambda a: None}):
            model(x)
    assert hook_count(model) == 0 and torch.equal(model(x), x)
    with pytest.raises(ValueError, match="closest module names: 'conv'"):
        hv.intervene(model, {"convv": zero()}).__enter__()
    with pytest.raises(TypeError, match=r"edits\['conv'\] must be a callable"):
        hv.intervene(model, {"conv": 3}).__enter__()
    with pytest.raises(TypeError, match="edits must be a non-empty dict"):
        hv.intervene(model, {}).__enter__()
    with pytest.raises(ValueError, match="channels index 3 is out of range for an axis of size 3"):
        with hv.intervene(model, {"conv": zero(channels=[3])}):
            model(x)
    with pytest.raises(ValueError, match="layout must be None"):
        hv.intervene(model, {"conv": zero()}, layout="nwhc").__enter__()
    with pytest.raises(TypeError, match="region must be"):
        zero(region=(0, 1))
    with pytest.raises(ValueError, match=r"source for 'conv' has shape \(3, 4\)"):
        with hv.intervene(model, {"conv": replace(torch.zeros(3, 4))}):
            model(x)
    assert hook_count(model) == 0


def test_cache_errors() -> None:
    model = shapes_model()
    with pytest.raises(ValueError, match="closest module names"):
        hv.cache(model, shapes(1, seed=0).images, layers="feature.1")
    with pytest.raises(ValueError, match="'relu#3'"):
        hv.cache(model, shapes(1, seed=0).images, layers=["relu#3"])
    assert hook_count(model) == 0
