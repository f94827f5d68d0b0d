"""Every registered method on CUDA against the same method on the CPU: resnet18 and the shapes ViT, float32, TF32 off.

The CPU and CUDA runs get the same model (the same seeded weights, moved), the same inputs and the same random
draws, and compare relative to the CPU map's largest magnitude, ``max|cuda - cpu| <= tol * max|cpu|``, per method.
CI has no GPU: ``OUT=<folder> bash tools/gpu_check.sh`` runs these and the other CUDA-only tests on a machine with one.

Random draws. GradientShap and RISE draw on the CPU whatever the device (their documented behaviour), so a fresh
generator with the same seed gives both runs the same draws. SmoothGrad and VarGrad draw their noise on the inputs'
device, and a CUDA generator gives other numbers than a CPU one with the same seed; here their ``_noise`` draws from a
seeded CPU generator and moves the noise to the device, so the comparison covers everything after the draw.

Tolerance. float32 rounds each operation by at most u = 2**-24 (relative). A dot product of K terms summed in
another order (cuDNN's and cuBLAS's algorithms against the CPU's) differs by about sqrt(K) * u of the sum of the
terms' magnitudes (random rounding errors; K * u at worst); the difference goes through the d dot-product stages of
the forward pass and the d of the backward pass, each adding its own, so the map differs by about
2 * d * sqrt(K) * u * kappa, where kappa is how much the method amplifies a relative error (its conditioning).
resnet18: d = 18 (conv1, 16 convs, fc), K up to 512 * 9 = 4608: 2 * 18 * 68 * u = 1.5e-4. The shapes ViT: d = 28 (3
stem convs, 6 per block (qkv, scores, probabilities times values, proj, fc1, fc2) in 4 blocks, the head), K up to
48 * 9 = 432 (its last stem conv): 2 * 28 * 21 * u = 6.9e-5.
kappa = 1 where the method's arithmetic after the passes is sums and products of the gradients, activations and
inputs (gradients, their products with inputs, Grad-CAM, HiResCAM, LayerCAM, the rollouts, differences of outputs).
kappa = 8 (`RATIOS`) where it divides by a data-dependent quantity that can come near 0 and so amplifies the relative
error by |terms| / |denominator|: LRP's rules (z_ij / (z_j + eps), with a stabiliser of 1e-6), DeepLift's rescale rule
(dy / dx of the differences from the baseline), Grad-CAM++'s alpha (g^2 / (2 g^2 + sum(A) g^3)), XGrad-CAM's
normalisation by sum(A), Score-CAM's min-max scaling of the masks.
On an H100 (torch 2.11) the kappa = 1 methods agreed to 9.2e-6 of the largest value or better on resnet18 (16 times
below their tolerance; most about 1e-6) and to 3.0e-6 on the ViT; the kappa = 8 ones to 1.7e-4 (LRP-epsilon, AttnLRP
and CP-LRP composites on resnet18: every conv gets the epsilon rule; 7 times below) and 2.3e-5 (Grad-CAM++ on the ViT).
DeepLift and DeepLiftShap as of db065f5 differed by 0.85 to 0.93 of the largest value on resnet18, another amount in
each run (the bug of their CUDA path that their rewrite fixes: it measured 1e-6 there and 2.2e-5 on the ViT); they
keep the same tolerance. The first H200 run measured 3e-4 of the largest value at most.

Ties. Three operations are discontinuous where values tie: max pooling's argmax (resnet18's stem), ReLU's gradient
at 0, and a top-k (attention rollout's ``discard_ratio``, left at 0 here). Where two values of a max-pool window lie
within rounding of each other, the devices may route that window's gradient to another pixel, a difference no
rounding tolerance covers. With continuous random inputs it is rare: the two largest of a window's 9 values lie
within the devices' difference (about 1e-6 of their spread) with a chance of a few 1e-6, and the stem has 2 * 64 *
16 * 16 windows here, so about 0.1 such windows per forward pass (a ReLU's input within rounding of 0 is as rare and
moves one unit's gradient only). So the rule stays the same for every
method; `_argmax_flips` counts the windows whose argmax differs at the input, and a failure reports them, so that a
tie is told apart from a bug (0 on the H100).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision import models

import hookviz as hv
from hookviz import zoo

U = 2.0**-24  # float32's unit roundoff
# (dot-product stages of the forward pass, the largest number of terms of one dot product) per model (docstring)
SHAPE = {"resnet18": (18, 512 * 9), "vit": (28, 48 * 9)}
# methods that divide by a data-dependent quantity: kappa = 8 (module docstring); the others kappa = 1
RATIOS = {"deeplift", "deeplift-shap", "gradcam++", "xgradcam", "scorecam"} | {
    n for n in hv.METHODS if n.startswith("lrp")
}


def tolerance(model_name: str, name: str) -> float:
    """2 d sqrt(K) u kappa: the difference float32 rounding in another summation order makes (module docstring)."""
    d, k = SHAPE[model_name]
    return 2 * d * math.sqrt(k) * U * (8 if name in RATIOS else 1)


# cheap settings, as benchmarks/arch_sweep.py's OPTIONS at 64 x 64
OPTIONS: dict[str, dict[str, Any]] = {
    "smoothgrad": {"n": 4},
    "vargrad": {"n": 4},
    "integrated-gradients": {"steps": 8},
    "scorecam": {"batch_size": 128},
    "occlusion": {"window": (16, 16)},
    "rise": {"n_masks": 16, "cell": 4, "seed": 0},
    "gradient-shap": {"n_samples": 2, "stdevs": 0.1},
}
ATTENTION = sorted(name for name, cls in hv.METHODS.items() if issubclass(cls, hv.methods.RolloutAttribution))
ON_RESNET = sorted(name for name in hv.METHODS if name not in ATTENTION)
# the ViT has no ReLU (guided backprop and deconvnet refuse it) and LayerNorms, which only the transformer composites
# (AttnLRP, CP-LRP) have rules for; every other method runs on it
REFUSE_VIT = {"guided-backprop", "deconvnet", "guided-gradcam"} | {
    name for name in hv.METHODS if name.startswith("lrp") and name not in ("lrp-attn-lrp", "lrp-cp-lrp")
}
ON_VIT = sorted(name for name in hv.METHODS if name not in REFUSE_VIT)


def resnet18(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return models.resnet18(weights=None).to(dtype).eval()


def vit(dtype: torch.dtype = torch.float32) -> nn.Module:
    return zoo.shapes_vit().to(dtype).eval()


MODELS: dict[str, Callable[[torch.dtype], nn.Module]] = {"resnet18": resnet18, "vit": vit}


def inputs(dtype: torch.dtype = torch.float32, size: int = 64) -> Tensor:
    """Two seeded images (2, 3, size, size)."""
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)


def build(name: str, model: nn.Module, options: dict[str, dict[str, Any]] = OPTIONS) -> hv.Attribution:
    """The registered method `name` with cheap options and seeded draws that are the same on every device."""
    kwargs = dict(options.get(name, {}))
    if name == "gradient-shap":
        kwargs["generator"] = torch.Generator().manual_seed(0)  # GradientShap draws on the CPU on every device
    method = hv.get_method(name)(model, **kwargs)
    if name in ("smoothgrad", "vargrad"):
        g = torch.Generator().manual_seed(0)
        # the noise of a CPU generator, moved: the same draws on both devices (a CUDA generator gives other numbers)
        method._noise = lambda t: torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)  # type: ignore[method-assign]
    return method


@contextmanager
def no_tf32() -> Iterator[None]:
    """TF32 off for cuBLAS and cuDNN (TF32 keeps 10 mantissa bits: 1e-3 differences), restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)")


def _argmax_flips(model: nn.Module, x: Tensor) -> int:
    """resnet18's max-pool windows (of the forward pass at `x`) whose argmax differs between the CPU and CUDA."""
    seen: dict[str, Tensor] = {}
    handle = model.maxpool.register_forward_hook(lambda m, args, out: seen.__setitem__("in", args[0]))
    try:
        indices = []
        for device in ("cpu", "cuda"):
            with torch.no_grad():
                model.to(device)(x.to(device))
            indices.append(F.max_pool2d(seen["in"], 3, 2, 1, return_indices=True)[1].cpu())
    finally:
        handle.remove()
        model.cpu()
    return int((indices[0] != indices[1]).sum())


@cuda
@pytest.mark.parametrize(("model_name", "name"), [("resnet18", n) for n in ON_RESNET] + [("vit", n) for n in ON_VIT])
def test_cuda_matches_cpu(model_name: str, name: str) -> None:
    model, x = MODELS[model_name](torch.float32), inputs()
    with no_tf32():
        flips = _argmax_flips(model, x) if model_name == "resnet18" else 0
        on_cpu = build(name, model).attribute(x, target=[1, 2])
        on_cuda = build(name, model.cuda()).attribute(x.cuda(), target=[1, 2])
    assert on_cuda.is_cuda and on_cuda.dtype == on_cpu.dtype and on_cuda.shape == on_cpu.shape
    scale = on_cpu.abs().max()
    assert scale > 0, f"{name}: an all-zero map compares nothing"
    err = float((on_cuda.cpu() - on_cpu).abs().max() / scale)
    tol = tolerance(model_name, name)
    print(f"\n{model_name} {name}: max|cuda - cpu| / max|cpu| = {err:.2e} (tolerance {tol:.1e}, argmax flips {flips})")
    assert err <= tol, (
        f"{name} on {model_name}: CUDA differs from the CPU by {err:.3g} of the largest value, more than {tol:.3g} "
        f"(2 d sqrt(K) u kappa); max-pool windows with another argmax on CUDA: {flips}"
    )
