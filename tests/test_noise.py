"""SmoothGrad over any method, SmoothGrad-Squared and VarGrad: against float64 noise tunnels on the same noise draws.

captum's NoiseTunnel draws its noise from the global generator with an absolute standard deviation, hookviz from
its own generator scaled by each sample's range, so the two cannot share draws. Instead, one float64 reference
(`reference.noise.noise_tunnel`) is checked twice: fed captum's draws (replayed from the seed) it gives captum's
NoiseTunnel (smoothgrad, smoothgrad_sq, vargrad), and fed hookviz's draws it gives hookviz's SmoothGrad/VarGrad.
"""

from __future__ import annotations

import pytest
import torch
from refs import reference
from torch import nn

import hookviz as hv

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from reference import cam as ref_cam  # noqa: E402
from reference import gradient as ref  # noqa: E402
from reference import noise as ref_noise  # noqa: E402
from test_invariants import assert_same, snapshot  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:IntegratedGradients. attributions:UserWarning")

REDUCTIONS = {"smoothgrad": "mean", "smoothgrad_sq": "mean_sq", "vargrad": "var"}


class TwoIn(nn.Module):
    """x (N, 4) and z (N, 3), and a per-sample gain (N,) passed as an extra forward argument."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(3, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, z: torch.Tensor, gain: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.tanh(self.a(x)) + torch.relu(self.b(z))
        return self.out(h if gain is None else h * gain[:, None])


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def data() -> torch.Tensor:
    return torch.randn(3, 5, generator=torch.Generator().manual_seed(2))


def ig_fn(steps: int):
    def fn(model: nn.Module, x: torch.Tensor, cls: int) -> torch.Tensor:
        return ref.integrated_gradients(model, x, torch.tensor([[cls]]), torch.zeros_like(x), steps=steps,
                                        method="gausslegendre")[:, 0]  # fmt: skip

    return fn


def two_input_gradient(gain: torch.Tensor):
    """attr_fn over (x, z) of one sample i: gradients w.r.t. both, with that sample's gain (found by its row)."""

    def fn(model: nn.Module, xz: tuple[torch.Tensor, torch.Tensor], cls: int, *, i: int) -> tuple:
        x, z = (t.detach().double().requires_grad_(True) for t in xz)
        return torch.autograd.grad(model(x, z, gain[i : i + 1].double())[0, cls], (x, z))

    return fn


# -- the reference means what captum means ------------------------------------------------------------------------
@pytest.mark.parametrize("nt_type", sorted(REDUCTIONS))
@pytest.mark.parametrize("base", ["saliency", "integrated-gradients"])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_reference_on_captums_draws_equals_captum_noise_tunnel(nt_type: str, base: str) -> None:
    model, x, target = mlp(), data(), torch.tensor([0, 2, 1])
    if base == "saliency":
        method, kwargs, fn = captum_attr.Saliency(model), {"abs": False}, ref.gradient
    else:
        method, kwargs, fn = captum_attr.IntegratedGradients(model), {"n_steps": 6}, ig_fn(6)
    torch.manual_seed(11)
    want = captum_attr.NoiseTunnel(method).attribute(
        x, nt_type=nt_type, nt_samples=5, stdevs=0.3, target=target, **kwargs
    )
    copies = ref_noise.captum_copies([x], 5, 0.3, seed=11)
    got = ref_noise.noise_tunnel(ref.double_copy(model), copies, target[:, None], fn, REDUCTIONS[nt_type])[:, 0]
    assert float((got - want.double()).abs().max()) < 1e-5


@pytest.mark.parametrize("nt_type", sorted(REDUCTIONS))
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_reference_on_captums_draws_with_two_inputs_and_extra_args(nt_type: str) -> None:
    model, gain = TwoIn(), torch.tensor([1.0, -2.0, 0.5])
    x, z = torch.randn(3, 4), torch.randn(3, 3)
    torch.manual_seed(5)
    want = captum_attr.NoiseTunnel(captum_attr.Saliency(model)).attribute(
        (x, z), nt_type=nt_type, nt_samples=4, stdevs=0.2, target=1, additional_forward_args=(gain,), abs=False
    )
    copies = ref_noise.captum_copies([x, z], 4, 0.2, seed=5)
    for e in range(2):
        got = _two_input_reference(model, copies, gain, REDUCTIONS[nt_type], e)
        assert float((got - want[e].double()).abs().max()) < 1e-5


def _two_input_reference(model, copies, gain, reduction, element):
    m64, fn = ref.double_copy(model), two_input_gradient(gain)
    rows = []
    for i in range(3):  # per sample, so the attr_fn knows its gain
        one = [[t[i : i + 1] for t in row] for row in copies]
        r = ref_noise.noise_tunnel(m64, one, torch.tensor([[1]]), lambda m, s, c, i=i: fn(m, s, c, i=i), reduction,
                                   element)  # fmt: skip
        rows.append(r[0, 0])
    return torch.stack(rows)


# -- hookviz on its own draws -------------------------------------------------------------------------------------
def build(kind: str, model: nn.Module, reduction: str, batch_size: int | None, seed: int):
    methods = {
        "saliency": lambda: hv.Saliency(model),
        "input-x-gradient": lambda: hv.InputXGradient(model),
        "integrated-gradients": lambda: hv.IntegratedGradients(model, steps=6, batch_size=4),
    }
    g = torch.Generator().manual_seed(seed)
    if reduction == "var":
        return hv.VarGrad(methods[kind](), n=5, sigma=0.2, batch_size=batch_size, generator=g)
    return hv.SmoothGrad(methods[kind](), n=5, sigma=0.2, batch_size=batch_size, squared=reduction == "mean_sq",
                         generator=g)  # fmt: skip


REFERENCE_FNS = {"saliency": ref.gradient, "input-x-gradient": ref.input_x_gradient, "integrated-gradients": ig_fn(6)}


@pytest.mark.parametrize("reduction", ["mean", "mean_sq", "var"])
@pytest.mark.parametrize("kind", sorted(REFERENCE_FNS))
@pytest.mark.parametrize("batch_size", [None, 4])
def test_hookviz_noise_tunnels_equal_the_reference_on_their_draws(kind: str, reduction: str, batch_size) -> None:
    model, x = mlp(), data()
    targets = torch.tensor([[0, 2], [1, 1], [2, 0]])
    before = snapshot(model)
    got = build(kind, model, reduction, batch_size, seed=3).attribute(x, target=targets)
    assert_same(before, model)
    copies = ref_noise.hookviz_copies([x], 5, 0.2, seed=3)
    want = ref_noise.noise_tunnel(ref.double_copy(model), copies, targets, REFERENCE_FNS[kind], reduction)
    assert got.shape == (3, 2, 5)
    assert float((got.double() - want).abs().max()) < 1e-5
    if reduction != "mean":
        assert bool((got >= 0).all())


@pytest.mark.parametrize("reduction", ["mean", "var"])
def test_noise_over_gradcam_equals_the_reference(reduction: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(3, 2))  # fmt: skip
    x = torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(9)
    cam = hv.GradCAM(model, layer="0")
    method = (
        hv.VarGrad(cam, n=4, generator=g, batch_size=3)
        if reduction == "var"
        else hv.SmoothGrad(cam, n=4, generator=g, batch_size=3)
    )
    got = method.attribute(x, target=[1, 0])

    def gradcam_fn(m64: nn.Module, xi: torch.Tensor, cls: int) -> torch.Tensor:
        a, grad = ref_cam.acts_and_grads(m64, "0", xi, torch.tensor([cls]))
        return ref_cam.gradcam(a, grad)

    copies = ref_noise.hookviz_copies([x], 4, 0.15, seed=9)
    want = ref_noise.noise_tunnel(model, copies, torch.tensor([[1], [0]]), gradcam_fn, reduction)[:, 0]
    assert got.shape == (2, 1, 5, 5)
    assert float((got.double() - want).abs().max()) < 1e-5


@pytest.mark.parametrize("reduction", ["mean", "var"])
def test_noise_over_two_inputs_with_extra_args_equals_the_reference(reduction: str) -> None:
    model, gain = TwoIn(), torch.tensor([1.0, -2.0, 0.5])
    g = torch.Generator()
    x, z = torch.randn(3, 4, generator=g.manual_seed(1)), torch.randn(3, 3, generator=g.manual_seed(2))
    cls = hv.VarGrad if reduction == "var" else hv.SmoothGrad
    got = cls(hv.Saliency(model), n=4, sigma=0.2, batch_size=5, generator=torch.Generator().manual_seed(6)).attribute(
        (x, z), target=1, additional_forward_args=gain
    )
    copies = ref_noise.hookviz_copies([x, z], 4, 0.2, seed=6)
    for e in range(2):
        want = _two_input_reference(model, copies, gain, reduction, e)
        assert float((got[e].double() - want).abs().max()) < 1e-5


def test_smoothgrad_over_integrated_gradients_with_a_baseline_per_input() -> None:
    """IG's per-input baselines follow their input's noisy copies through SmoothGrad's chunks."""
    model, x = mlp(), data()
    base = torch.randn(3, 5, generator=torch.Generator().manual_seed(8))
    outs = [
        hv.SmoothGrad(
            hv.IntegratedGradients(model, steps=4, baseline=base),
            n=3,
            batch_size=bs,
            generator=torch.Generator().manual_seed(1),
        ).attribute(x, target=0)  # fmt: skip
        for bs in (None, 2)
    ]
    copies = ref_noise.hookviz_copies([x], 3, 0.15, seed=1)
    want = []
    for i in range(3):

        def fn(m, xi, c, i=i):
            return ref.integrated_gradients(m, xi, torch.tensor([[c]]), base[i : i + 1], steps=4,
                                            method="gausslegendre")[:, 0]  # fmt: skip

        one = [[t[i : i + 1] for t in row] for row in copies]
        want.append(ref_noise.noise_tunnel(ref.double_copy(model), one, torch.tensor([[0]]), fn, "mean")[0, 0])
    for out in outs:
        assert float((out.double() - torch.stack(want)).abs().max()) < 1e-5


def test_vargrad_is_registered_exported_and_builds_from_a_model() -> None:
    assert hv.get_method("vargrad") is hv.VarGrad
    v = hv.VarGrad(mlp(), n=3)
    assert isinstance(v.method, hv.Saliency)
    assert repr(v) == "VarGrad(Saliency(Sequential), n=3, sigma=0.15)"
    assert hv.VarGrad(hv.IntegratedGradients(mlp())).display_defaults["cmap"] == "inferno"


def test_noise_errors() -> None:
    with pytest.raises(TypeError, match=r"the class IntegratedGradients; pass e.g. VarGrad\(IntegratedGradients"):
        hv.VarGrad(hv.IntegratedGradients)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="method must be an attribution method instance .* got str"):
        hv.VarGrad("saliency")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'squared'"):
        hv.VarGrad(mlp(), squared=True)  # type: ignore[call-arg]
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2))
    with pytest.raises(TypeError, match="VarGrad does not take a tuple of inputs"):
        hv.VarGrad(hv.ScoreCAM(conv, layer="0")).attribute((torch.randn(1, 3, 6, 6),))
