"""`hv.FeatureVisualization`: the parameterisation and objectives against lucent's (torch-lucent 0.1.8) numbers, the
transforms, and renders on a tiny model: the objective rises, seeded and reproducible, hooks only on the named
layers, the pre-ReLU value read before an in-place ReLU, the model and the global random state left alone."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.interventions import objectives as obj
from hookviz.interventions import transforms as tf
from hookviz.interventions.parameterization import ImageParam, color_matrix, fft_frequencies

lucent_color = pytest.importorskip("lucent.optvis.param.color")
lucent_spatial = pytest.importorskip("lucent.optvis.param.spatial")
lucent_objectives = pytest.importorskip("lucent.optvis.objectives")


class Probe(nn.Module):
    """Identity that records, at every forward, which modules of its model carry forward hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[set[str]] = []
        self.root: list[nn.Module] = []

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append({n for n, m in self.root[0].named_modules() if m._forward_hooks})
        return x


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)  # overwrites conv's output in place
        self.probe = Probe()
        self.conv2 = nn.Conv2d(4, 5, 3, padding=1)
        self.head = nn.Linear(5, 3)
        self.probe.root.append(self)

    def forward(self, x: Tensor) -> Tensor:
        h = self.probe(self.relu(self.conv(x)))
        return self.head(torch.relu(self.conv2(h)).mean((2, 3)))


@pytest.mark.parametrize("h, w", [(8, 8), (7, 9), (64, 64)])
def test_fft_parameterisation_matches_lucent(h: int, w: int) -> None:
    assert torch.allclose(fft_frequencies(h, w), torch.from_numpy(lucent_spatial.rfft2d_freqs(h, w)))
    ours = ImageParam(2, h, w, fft=True, decorrelate=True, generator=torch.Generator().manual_seed(0))
    params, image_f = lucent_spatial.fft_image((2, 3, h, w))
    with torch.no_grad():
        params[0].copy_(ours.raw)
    theirs = lucent_color.to_valid_rgb(image_f, decorrelate=True)()
    assert torch.allclose(ours(), theirs, atol=1e-6) and ours().shape == (2, 3, h, w)


def test_pixel_parameterisation_and_colour_matrix_match_lucent() -> None:
    assert torch.allclose(color_matrix(), torch.from_numpy(lucent_color.color_correlation_normalized))
    ours = ImageParam(1, 6, 5, fft=False, decorrelate=True, generator=torch.Generator().manual_seed(1))
    params, image_f = lucent_spatial.pixel_image((1, 3, 6, 5))
    with torch.no_grad():
        params[0].copy_(ours.raw)
    assert torch.allclose(ours(), lucent_color.to_valid_rgb(image_f, decorrelate=True)(), atol=1e-6)
    plain = ImageParam(1, 6, 5, fft=False, decorrelate=False, generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain(), torch.sigmoid(plain.raw))


def test_objectives_match_lucent_and_combine() -> None:
    g = torch.Generator().manual_seed(0)
    acts = {"a": torch.randn(3, 4, 5, 5, generator=g), "b": torch.randn(3, 6, generator=g)}
    channel = obj.channel("a", 2)
    assert torch.allclose(channel(acts), acts["a"][:, 2].mean((1, 2)))
    assert torch.allclose(-channel(acts).mean(), lucent_objectives.channel("a", 2)(acts.__getitem__))
    assert torch.allclose(obj.as_objective("b:5")(acts), acts["b"][:, 5])
    combined = obj.as_objective("a:1") - 0.5 * obj.as_objective("b:0") + obj.neuron("a", 3)
    expected = acts["a"][:, 1].mean((1, 2)) - 0.5 * acts["b"][:, 0] + acts["a"][:, 3, 2, 2]
    assert torch.allclose(combined(acts), expected) and set(combined.layers) == {"a", "b"}
    div = obj.diversity("a")(acts)
    assert div.shape == (3,)
    assert torch.allclose(div.sum(), lucent_objectives.diversity("a")(acts.__getitem__), atol=1e-6)
    v = torch.randn(4, generator=g)
    assert torch.allclose(
        -obj.direction("a", v)(acts).mean(), lucent_objectives.direction("a", v)(acts.__getitem__), atol=1e-6
    )
    with pytest.raises(ValueError, match="must read 'layer:channel'"):
        obj.as_objective("conv")
    with pytest.raises(ValueError, match="channel 9 is out of range; 'a' has 4 channels"):
        obj.channel("a", 9).check({"a": torch.Size([3, 4, 5, 5])})


def test_transforms() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, 10, 12)
    assert tf.pad(2)(x, g).shape == (1, 3, 14, 16) and (tf.pad(2)(x, g)[..., 0, :] == 0.5).all()
    assert torch.allclose(tf.random_rotate([0])(x, g), x, atol=1e-6)
    assert torch.allclose(tf.random_scale([1.0])(x, g), x, atol=1e-6)
    assert tf.random_scale([0.9])(x, g).shape[-2:] == (11, 13)  # ceil(9) + 2 * 1, ceil(10.8) + 2 * 1
    j = tf.jitter(3)(x, torch.Generator().manual_seed(5))
    dx, dy = (int(v) for v in torch.randint(3, (2,), generator=torch.Generator().manual_seed(5)))
    assert torch.equal(j[..., dy:, dx:], x[..., : 10 - dy, : 12 - dx]) and (j[..., :dy, :] == 0).all()
    r90 = tf.random_rotate([90])(torch.arange(9.0).reshape(1, 1, 3, 3), g)
    assert torch.allclose(r90[0, 0], torch.tensor([[2.0, 5, 8], [1, 4, 7], [0, 3, 6]]), atol=1e-5) or torch.allclose(
        r90[0, 0], torch.tensor([[6.0, 3, 0], [7, 4, 1], [8, 5, 2]]), atol=1e-5
    )
    assert len(tf.standard_transforms()) == 5


def test_render_raises_the_objective_reproducibly_and_leaves_everything_alone() -> None:
    model = Tiny().train()
    model.conv.weight.requires_grad_(False)
    rng = torch.random.get_rng_state()
    fv = hv.FeatureVisualization(model, size=16, steps=30, transforms=[tf.jitter(2)], sd=0.1, eval_mode=True)
    start = ImageParam(1, 16, 16, sd=0.1, generator=torch.Generator().manual_seed(3))()
    images = fv.render("conv:1", seed=3)
    assert images.shape == (1, 3, 16, 16) and images.min() >= 0 and images.max() <= 1
    before, after = fv.score("conv:1", start), fv.score("conv:1", images)
    assert after > before + 0.05, (before, after)
    assert torch.allclose(fv.last_values, after)
    assert torch.equal(fv.render("conv:1", seed=3), images)  # seeded
    assert not torch.equal(fv.render("conv:1", seed=4, steps=2), fv.render("conv:1", seed=3, steps=2))
    # hooks only on the named layer while it runs, none after; early stop: the probe after conv never ran
    model.probe.seen.clear()
    fv.render(["head:0", "head:2"], steps=2)
    assert model.probe.seen and all(s == {"head"} for s in model.probe.seen)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
    assert model.training and all(m.training for m in model.modules())
    assert not model.conv.weight.requires_grad and model.conv2.weight.requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_pre_relu_values_are_read_before_an_inplace_relu() -> None:
    model = Tiny().eval()
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    fv = hv.FeatureVisualization(model, size=8)
    with torch.no_grad():
        expected = model.conv(x)[:, 1].mean((1, 2))
    got = fv.score("conv:1", x)
    assert (expected < 0).any() and torch.allclose(got, expected, atol=1e-6)
    assert model.relu.inplace is True


def test_bad_objectives_fail_before_any_step() -> None:
    model = Tiny()
    fv = hv.FeatureVisualization(model, size=16, steps=10_000)
    with pytest.raises(ValueError, match="channel 7 is out of range; 'conv2' has 5 channels"):
        fv.render("conv2:7")
    with pytest.raises(ValueError, match="closest module names"):
        fv.render("conv3:0")
    with pytest.raises(ValueError, match="batch= applies to one objective"):
        fv.render(["conv:0"], batch=2)
    with pytest.raises(ValueError, match="size must be"):
        hv.FeatureVisualization(model, size=2)
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
