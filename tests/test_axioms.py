"""The sums the attribution methods promise, on families of the architecture sweep, in float64 with random weights
(issue 34, part 2). Every family of the sweep is in ``benchmarks/axiom_sweep.py`` (its table:
``benchmarks/results/axioms.md``); these are the fast few: ResNets (overlapping max pools), GoogLeNet (ceil-mode
pools), EfficientNet and MobileNetV3 (squeeze-and-excitation gates, SiLU, Hardswish), DenseNet, ConvNeXt
(LayerNorm, GELU), RegNet, ViT, DeiT, DINOv2 (register tokens), Swin, MLP-Mixer, ResMLP (addcmul), Hiera (amax),
Hugging Face's ViT.

- DeepLift (Shrikumar et al. 2017) and DeepLiftShap: ``sum(A) = f_c(x) - f_c(x')`` (the mean over the baselines for
  DeepLiftShap), zero and random baselines, two inputs, two targets.
- LRP-epsilon with epsilon and stabilizer 0 on the model with every bias and BatchNorm running mean zero:
  ``sum(R) = f_c(x)`` where the composite runs and every operation has a rule; where one has none (the SE gates'
  products), the warning names it.
- Integrated Gradients (trapezoid rule): its sum equals the quadrature of the path integrand computed here, and that
  quadrature is within its error bound of ``f_c(x) - f_c(x')`` (`test_integrated_gradients_within_quadrature_error`).

Rounding bound of an exact sum in float64 (`axiom_sweep.rounding`): every operation rounds each term it adds once
(relative u = 2^-53), so the computed sum differs from the exact one by at most about L u S, L the operations a term
passes and S the sum of the magnitudes involved (|A| summed over the input, |f(x)|, |f(x')|); L is taken as 4 times
the model's module count. Measured: the worst family stays below 0.15 L u S.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import composite

pytest.importorskip("timm")
pytest.importorskip("transformers")

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "axiom_sweep.py"
_spec = importlib.util.spec_from_file_location("axiom_sweep", _PATH)
axioms = importlib.util.module_from_spec(_spec)
sys.modules["axiom_sweep"] = axioms
_spec.loader.exec_module(axioms)

ARCHS = {a.name: a for a in axioms.sweep.subset_archs()}
ARCHS.update({a.name: a for a in axioms.sweep.all_archs() if a.name in ("tv/googlenet", "tv/efficientnet_b0")})
ARCHS.update({a.name: a for a in axioms.sweep.all_archs() if a.name in ("tv/mobilenet_v3_small", "tv/densenet121")})
U = axioms.U
TARGETS = torch.tensor([[0, 1], [0, 1]])
rounding = axioms.rounding  # the rounding bound of an exact sum (module docstring)


def inputs(name: str) -> Tensor:
    size = ARCHS[name].size
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def attribute(method: hv.Attribution, x: Tensor) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact method gives no summation-to-delta warning
        return method.attribute(x, target=TARGETS)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_deeplift_and_deeplift_shap_sum_to_delta(name: str) -> None:
    model, x = axioms.build(ARCHS[name]), inputs(name)
    gen = torch.Generator().manual_seed(2)
    for base in (torch.zeros_like(x[:1]), 0.5 * torch.randn(x[:1].shape, generator=gen, dtype=x.dtype)):
        dl = hv.DeepLift(model, base)
        a = attribute(dl, x)
        fx, fb = axioms.scores(model, x), axioms.scores(model, base)
        err = (a.flatten(2).sum(2) - (fx - fb)).abs()
        assert bool((err <= rounding(model, a, fx, fb)).all()), (err, rounding(model, a, fx, fb))
        assert dl.rule_coverage.uncovered == {}
    bases = 0.5 * torch.randn((3, *x.shape[1:]), generator=gen, dtype=x.dtype)
    a = attribute(hv.DeepLiftShap(model, bases), x)
    fx, fb = axioms.scores(model, x), axioms.scores(model, bases)
    err = (a.flatten(2).sum(2) - (fx - fb.mean(0))).abs()
    assert bool((err <= rounding(model, a, fx, fb.abs().mean(0))).all())


# what the epsilon composite does on each family: conserve (the SE gates held: their products are scalings) or refuse
# (a layer with parameters it has no rule for: LayerNorm, attention)
LRP_EXPECTED = {
    "resnet10t": "conserves",
    "regnetx_002": "conserves",
    "tv/resnet18": "conserves",
    "tv/googlenet": "conserves",
    "tv/densenet121": "conserves",
    "mobilenetv3_small_050": "conserves",
    "tv/efficientnet_b0": "conserves",
    "tv/mobilenet_v3_small": "conserves",
}


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_lrp_epsilon_zero_conserves_on_bias_free_networks(name: str) -> None:
    model, x = axioms.bias_free(axioms.build(ARCHS[name])), inputs(name)
    rules = composite("epsilon", epsilon=0.0, stabilizer=0.0)
    expected = LRP_EXPECTED.get(name, "refuses")
    if expected == "refuses":
        with pytest.raises(ValueError, match=r"LRP composite 'epsilon' has no rule for these layers with parameters"):
            hv.LRP(model, rules).attribute(x, target=TARGETS)
        return
    lrp = hv.LRP(model, rules)
    r = attribute(lrp, x)  # warnings are errors: every operation covered
    fx = axioms.scores(model, x)
    err = (r.flatten(2).sum(2) - fx).abs()
    assert bool((err <= rounding(model, r, fx)).all()), (err, rounding(model, r, fx))
    assert bool(torch.isfinite(r).all())


def path_integrand(model: nn.Module, x: Tensor, base: Tensor, alphas: Tensor, target: int) -> Tensor:
    """h(alpha) = grad f_c(x' + alpha (x - x')) . (x - x') at each alpha, (len(alphas), N): plain autograd."""
    n = x.shape[0]
    points = (base + alphas.view(-1, 1, 1, 1, 1) * (x - base)).flatten(0, 1).requires_grad_(True)
    (g,) = torch.autograd.grad(axioms.logits(model(points))[:, target].sum(), points)
    return (g.view(len(alphas), n, -1) * (x - base).flatten(1)).sum(-1)


@pytest.mark.parametrize("name", ["tv/resnet18", "convnext_atto", "vit_tiny_patch16_224", "mixer_s16_224"])
def test_integrated_gradients_within_quadrature_error(name: str) -> None:
    """IG with the trapezoid rule on m nodes, alpha_k = k / (m - 1), weights delta = 1 / (m - 1) (halved at the
    ends). Its sum is the quadrature Q of the path integrand h (computed here by plain autograd, at the same nodes)
    to rounding; and the trapezoid rule's error on [0, 1] for an integrand of bounded variation V is at most
    delta V (on each interval h stays within its variation there of both end values), against the exact integral
    f(x) - f(x') (the fundamental theorem of calculus). V is measured on a grid 8 times finer than the nodes, which
    can only see less variation than there is: the bound takes twice it."""
    model, x = axioms.build(ARCHS[name]), inputs(name)
    base = torch.zeros_like(x)
    m, fine = 9, 8
    alphas = torch.linspace(0, 1, fine * (m - 1) + 1, dtype=x.dtype)
    h = path_integrand(model, x, base, alphas, target=1)  # (P, N)
    weights = torch.full((m,), 1.0 / (m - 1), dtype=x.dtype)
    weights[[0, -1]] /= 2
    quadrature = (weights[:, None] * h[::fine]).sum(0)
    ig = hv.IntegratedGradients(model, steps=m, method="riemann_trapezoid")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its completeness warning: the quadrature error, bounded below
        a = ig.attribute(x, target=1)
    sums = a.flatten(1).sum(1)
    scale = (weights[:, None] * h[::fine].abs()).sum(0) + a.abs().flatten(1).sum(1)
    assert bool(((sums - quadrature).abs() <= 4 * len(list(model.modules())) * U * scale).all())
    fx, fb = axioms.scores(model, x)[:, 1], axioms.scores(model, base)[:, 1]
    variation = (h[1:] - h[:-1]).abs().sum(0)
    assert bool(((quadrature - (fx - fb)).abs() <= 2 * variation / (m - 1)).all())


def test_lrp_conserves_through_a_batchnorm_with_its_activation_inside() -> None:
    """timm's BatchNormAct2d (a BatchNorm2d subclass whose forward applies its activation too, as in EfficientNet-Lite
    and MobileNetV3): folding it took the activation's output for the folded convolution's and skipped the
    activation, and LRP-epsilon-0 lost 13% of the relevance on efficientnet_lite0; it passes relevance now."""
    from timm.layers import BatchNormAct2d

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, bias=False), BatchNormAct2d(8, act_layer=nn.ReLU6), nn.Conv2d(8, 4, 3, bias=False),
        BatchNormAct2d(4, act_layer=nn.ReLU), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3, bias=False),
    ).double()  # fmt: skip
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, BatchNormAct2d):
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 2.0)
    model = axioms.bias_free(model.eval())
    x = 3 * torch.randn(2, 3, 9, 9, dtype=torch.float64)
    r = attribute(hv.LRP(model, composite("epsilon", epsilon=0.0, stabilizer=0.0)), x)
    with torch.no_grad():
        fx = model(x)[:, :2]
    err = (r.flatten(2).sum(2) - fx).abs()
    assert bool((err <= rounding(model, r, fx)).all()), err
