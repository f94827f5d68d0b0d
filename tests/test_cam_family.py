"""The CAM family: hand-computed values, float64 textbook references, captum, token layers, layer choice, AMP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference import cam as ref
from reference import same_precision as same
from refs import reference
from torch import nn
from torchvision import models

import hookviz as hv
from hookviz.methods.cam import (
    GradCAM,
    GradCAMPlusPlus,
    GuidedGradCAM,
    HiResCAM,
    LayerCAM,
    ScoreCAM,
    XGradCAM,
    choose_layer,
)

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from test_methods import FlatHead  # noqa: E402


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def image_batch(n: int = 2, size: int = 32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


def resnet(inplace: bool = True) -> nn.Module:
    torch.manual_seed(0)
    model = models.resnet18(weights=None, num_classes=10).eval()
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = inplace
    return model


class TinyCNN(nn.Module):
    """conv -> relu -> conv (stride 2) -> relu ("act", 6 x 8 x 8 on 16 x 16 inputs) -> mean -> linear (5 classes)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 6, 3, stride=2, padding=1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(6 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a 2x2 pool before the linear head: gradients at the layer vary over space (unlike a global mean)
        a = self.act(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(a, 2).flatten(1))


def vit() -> nn.Module:
    torch.manual_seed(0)
    model = models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    ).eval()
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision zero-initializes the head: all maps would be 0
    return model


VIT_LAYER = "encoder.layers.encoder_layer_1.ln_1"

GRAD_METHODS = {
    "gradcam": (GradCAM, ref.gradcam),
    "gradcam++": (GradCAMPlusPlus, ref.gradcam_pp),
    "layercam": (LayerCAM, ref.layercam),
    "xgradcam": (XGradCAM, ref.xgradcam),
    "hirescam": (HiResCAM, ref.hirescam),
}
ALL_CAMS = [GradCAM, GradCAMPlusPlus, LayerCAM, XGradCAM, HiResCAM, ScoreCAM]


# -- hand-computed values ------------------------------------------------------------------------------------------
X_HAND = torch.tensor([[[[1.0, 2], [3, 4]], [[2.0, 0], [0, 2]]]])  # (1, 2, 2, 2): A0 sums to 10, A1 to 4


def hand(cls, x=X_HAND, target=0):
    return cls(FlatHead(), layer="act").attribute(x, target=target)


def test_gradcam_plus_plus_hand_computed() -> None:
    # alpha = g^2 / (2 g^2 + sum(A) g^3) = 1 / (2 + sum(A) g) where g != 0
    # class 0, channel 0 (sum 10, g = 1, 2, 3, 4): w0 = 1/12 * 1 + 1/22 * 2 + 1/32 * 3 + 1/42 * 4
    # channel 1: g = -1, relu(g) = 0 -> w1 = 0; map = w0 * A0
    w0 = 1 / 12 + 2 / 22 + 3 / 32 + 4 / 42
    torch.testing.assert_close(hand(GradCAMPlusPlus), w0 * X_HAND[:, :1], rtol=1e-6, atol=0)
    # class 1: g = 0 on channel 0 -> alpha = 0; channel 1 (sum 4, g = 1): alpha = 1/6, w1 = 4 * 1/6; map = 2/3 A1
    torch.testing.assert_close(hand(GradCAMPlusPlus, target=1), 2 / 3 * X_HAND[:, 1:], rtol=1e-6, atol=0)
    # a zero denominator: channel 1 sums to -2, so 2 g^2 + sum(A) g^3 = 2 - 2 = 0 -> alpha = 0, no NaN
    x = torch.tensor([[[[1.0, 2], [3, 4]], [[-1.0, -1], [0, 0]]]])
    out = hand(GradCAMPlusPlus, x, target=1)
    assert torch.equal(out, torch.zeros(1, 1, 2, 2))


def test_layercam_hand_computed() -> None:
    x = torch.tensor([[[[1.0, 2], [3, -4]], [[2.0, 0], [0, -2]]]])
    # class 0: relu(g) = [[1, 2], [3, 4]] on channel 0, 0 on channel 1: relu([[1, 4], [9, -16]]) = [[1, 4], [9, 0]]
    assert torch.equal(hand(LayerCAM, x), torch.tensor([[[[1.0, 4], [9, 0]]]]))
    # class 1: relu(g) = 1 on channel 1 only: relu(A1)
    assert torch.equal(hand(LayerCAM, x, target=1), torch.tensor([[[[2.0, 0], [0, 0]]]]))


def test_hirescam_hand_computed() -> None:
    x = torch.tensor([[[[1.0, 2], [3, -4]], [[2.0, 0], [0, -2]]]])
    # class 0: g0 * A0 + g1 * A1 = [[1, 4], [9, -16]] - [[2, 0], [0, -2]] = [[-1, 4], [9, -14]] -> relu
    assert torch.equal(hand(HiResCAM, x), torch.tensor([[[[0.0, 4], [9, 0]]]]))


def test_xgradcam_hand_computed() -> None:
    # class 0: w0 = (1 + 4 + 9 + 16) / 10 = 3, w1 = (-2 - 2) / 4 = -1; relu(3 A0 - A1) = [[1, 6], [9, 10]]
    torch.testing.assert_close(hand(XGradCAM), torch.tensor([[[[1.0, 6], [9, 10]]]]), rtol=1e-6, atol=0)


# -- float64 textbook references -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GRAD_METHODS))
@pytest.mark.parametrize(("model_fn", "layer", "size"), [(TinyCNN, "act", 16), (resnet, "layer3", 32)])
def test_gradient_cams_match_reference(name, model_fn, layer, size) -> None:
    cls, reference = GRAD_METHODS[name]
    model = model_fn()
    x = image_batch(size=size)
    target = torch.tensor([1, 3])
    ours = cls(model, layer=layer).attribute(x, target=target)
    expected = reference(*ref.acts_and_grads(model, layer, x, target))
    assert ours.shape == expected.shape == (2, 1, *expected.shape[-2:]) and ours.dtype == torch.float32
    assert expected.abs().sum() > 0
    assert rel_l2(ours, expected) < 1e-4


def test_scorecam_matches_reference_and_chunking() -> None:
    model = TinyCNN()
    x = image_batch(n=2, size=16)
    target = torch.tensor([0, 4])
    expected = ref.scorecam(model, "act", x, target)
    assert expected.abs().sum() > 0
    results = [ScoreCAM(model, layer="act", batch_size=b).attribute(x, target=target) for b in (1, 5, 64)]
    for out in results:
        assert out.shape == (2, 1, 8, 8) and out.dtype == torch.float32
        assert rel_l2(out, expected) < 1e-5
    torch.testing.assert_close(results[0], results[2], rtol=1e-5, atol=1e-7)


def test_scorecam_callable_target_uses_raw_score() -> None:
    model = TinyCNN()
    x = image_batch(n=2, size=16)
    expected = ref.scorecam(model, "act", x, lambda out: out[:, 2])
    out = ScoreCAM(model, layer="act", batch_size=4).attribute(x, target=lambda out: out[:, 2])
    assert rel_l2(out, expected) < 1e-5
    # and it is not the softmax weighting
    assert rel_l2(out, ScoreCAM(model, layer="act").attribute(x, target=2)) > 1e-2


def test_scorecam_constant_channel_masks_with_zeros() -> None:
    model = TinyCNN()
    with torch.no_grad():  # channel 0 of the layer: weights 0, bias 1 -> constant 1 after the ReLU
        model.conv2.weight[0] = 0
        model.conv2.bias[0] = 1
    x = image_batch(n=1, size=16)
    out = ScoreCAM(model, layer="act").attribute(x, target=1)
    assert torch.isfinite(out).all()
    assert rel_l2(out, ref.scorecam(model, "act", x, torch.tensor([1]))) < 1e-5


def test_guided_gradcam_matches_reference() -> None:
    model = resnet()
    x = image_batch()
    target = torch.tensor([3, 9])
    ours = GuidedGradCAM(model, layer="layer3").attribute(x, target=target)
    expected = ref.guided_gradcam(model, "layer3", x, target)
    assert ours.shape == x.shape and expected.abs().sum() > 0
    assert rel_l2(ours, expected) < 1e-4


# -- captum ----------------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::UserWarning:captum.*")
@pytest.mark.parametrize(("arch", "layer", "size"), [("resnet18", "layer4", 64), ("vgg11", "features.18", 32)])
def test_guided_gradcam_matches_captum(arch: str, layer: str, size: int) -> None:
    torch.manual_seed(0)
    model = getattr(models, arch)(weights=None, num_classes=10).eval()
    x = image_batch(size=size)
    target = torch.tensor([1, 6])
    ours = GuidedGradCAM(model, layer=layer).attribute(x, target=target)
    for m in model.modules():  # captum's module backward hooks need out-of-place ReLUs
        if isinstance(m, nn.ReLU):
            m.inplace = False
    reference = captum_attr.GuidedGradCam(model, dict(model.named_modules())[layer]).attribute(
        x.clone(), target=target, interpolate_mode="bilinear"
    )
    assert ours.shape == reference.shape == x.shape and reference.abs().sum() > 0
    assert rel_l2(ours, reference) < 1e-4


@pytest.mark.filterwarnings("ignore::UserWarning:captum.*")
def test_upsample_nearest_matches_captum_defaults() -> None:
    torch.manual_seed(0)
    model = models.resnet18(weights=None, num_classes=10).eval()
    x, target = image_batch(size=64), torch.tensor([1, 6])
    gg = GuidedGradCAM(model, layer="layer4", upsample="nearest").attribute(x, target=target)
    cam = GradCAM(model, layer="layer3").attribute(x, target=target, upsample="nearest")
    for m in model.modules():  # captum's module backward hooks need out-of-place ReLUs
        if isinstance(m, nn.ReLU):
            m.inplace = False
    theirs = captum_attr.GuidedGradCam(model, model.layer4).attribute(x.clone(), target=target)  # "nearest"
    assert gg.shape == theirs.shape == x.shape and theirs.abs().sum() > 0
    assert rel_l2(gg, theirs) < 1e-4
    layer_cam = captum_attr.LayerGradCam(model, model.layer3).attribute(x.clone(), target, relu_attributions=True)
    theirs = captum_attr.LayerAttribution.interpolate(layer_cam, (64, 64))
    assert cam.shape == theirs.shape == (2, 1, 64, 64) and theirs.abs().sum() > 0
    assert rel_l2(cam, theirs) < 1e-4


def test_upsample_modes() -> None:
    model, x = TinyCNN(), image_batch(n=2, size=16)
    cam = GradCAM(model, layer="act")
    small = cam.attribute(x, target=1)
    for mode in ("nearest", "bilinear", "bicubic"):
        kwargs = {} if mode == "nearest" else {"align_corners": False}
        expected = F.interpolate(small, size=(16, 16), mode=mode, **kwargs)
        torch.testing.assert_close(cam.attribute(x, target=1, upsample=mode), expected)
    torch.testing.assert_close(cam.attribute(x, target=1, upsample=True), cam.attribute(x, 1, upsample="bilinear"))
    nearest = cam.attribute(x, target=1, upsample="nearest")  # 8x8 -> 16x16: every cell repeated 2x2
    torch.testing.assert_close(nearest, small.repeat_interleave(2, -1).repeat_interleave(2, -2))
    default = GuidedGradCAM(model, layer="act").attribute(x, target=1)
    torch.testing.assert_close(GuidedGradCAM(model, layer="act", upsample=True).attribute(x, target=1), default)
    near = GuidedGradCAM(model, layer="act", upsample="nearest").attribute(x, target=1)
    guided = hv.GuidedBackprop(model).attribute(x, target=1)
    torch.testing.assert_close(near, guided * nearest)
    with pytest.raises(ValueError, match=r"upsample must be False, True \(bilinear\) or one of 'bilinear', 'near"):
        cam.attribute(x, target=1, upsample="linear")
    with pytest.raises(ValueError, match=r"upsample must be True \(bilinear\) or one of .*; got False"):
        GuidedGradCAM(model, layer="act", upsample=False)
    with pytest.raises(ValueError, match=r"upsample must be .*got 'area'"):
        GuidedGradCAM(model, layer="act", upsample="area")


# -- several targets per input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [*ALL_CAMS, GuidedGradCAM], ids=lambda c: c.key)
def test_nk_targets_equal_k_separate_calls(cls) -> None:
    model = TinyCNN()
    x = image_batch(n=2, size=16)
    targets = torch.tensor([[1, 4, 0], [2, 2, 3]])
    method = cls(model, layer="act")
    multi = method.attribute(x, target=targets)
    assert multi.shape[:2] == (2, 3)
    for k in range(3):
        torch.testing.assert_close(multi[:, k], method.attribute(x, target=targets[:, k]), rtol=1e-5, atol=1e-7)


# -- token layers (vision transformers) ----------------------------------------------------------------------------
def test_vit_layer_chosen_and_tokens_folded() -> None:
    model = vit()
    x = image_batch(n=2)
    target = torch.tensor([3, 8])
    cam = GradCAM(model)
    out = cam.attribute(x, target=target)
    assert cam.layer == VIT_LAYER
    a, g = ref.acts_and_grads(model, VIT_LAYER, x, target, fold=lambda t: ref.fold_vit_tokens(t, 4))
    expected = ref.gradcam(a, g)
    assert out.shape == (2, 1, 4, 4) and expected.abs().sum() > 0
    assert rel_l2(out, expected) < 1e-4
    # the same with the grid, the prefix or the whole reshape given
    for kwargs in ({"reshape": (4, 4)}, {"prefix_tokens": 1}, {"reshape": lambda t: ref.fold_vit_tokens(t, 4)}):
        torch.testing.assert_close(GradCAM(model, layer=VIT_LAYER, **kwargs).attribute(x, target=target), out)


@pytest.mark.parametrize("name", ["gradcam++", "layercam", "hirescam"])
def test_vit_methods_match_reference(name: str) -> None:
    cls, reference = GRAD_METHODS[name]
    model = vit()
    x = image_batch(n=2)
    target = torch.tensor([0, 5])
    out = cls(model).attribute(x, target=target)
    expected = reference(*ref.acts_and_grads(model, VIT_LAYER, x, target, fold=lambda t: ref.fold_vit_tokens(t, 4)))
    assert expected.abs().sum() > 0
    assert rel_l2(out, expected) < 1e-4


def test_vit_scorecam_matches_reference() -> None:
    model = vit()
    x = image_batch(n=1)
    out = ScoreCAM(model).attribute(x, target=4)
    expected = ref.scorecam(model, VIT_LAYER, x, torch.tensor([4]), fold=lambda t: ref.fold_vit_tokens(t, 4))
    assert out.shape == (1, 1, 4, 4)
    assert rel_l2(out, expected) < 1e-5


def test_vit_final_norm_has_no_patch_gradient() -> None:
    """Why the automatic choice is not encoder.ln: only the class token reaches the head from there."""
    out = GradCAM(vit(), layer="encoder.ln").attribute(image_batch(n=1), target=1)
    assert torch.equal(out, torch.zeros(1, 1, 4, 4))


class TokenHead(nn.Module):
    """Takes (N, T, D) tokens: act (Identity, the CAM layer) -> mean over tokens -> linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.act = nn.Identity()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.act(x).mean(1))


@pytest.mark.parametrize(
    ("tokens", "kwargs", "match"),
    [
        (3, {}, r"outputs 3 tokens: no number of prefix tokens in 0..8 leaves a square grid.*pass reshape="),
        (11, {}, r"11 tokens, which is ambiguous \(2 prefix \+ 3x3, 7 prefix \+ 2x2\).*prefix_tokens="),
        (17, {"reshape": (3, 3), "prefix_tokens": 1}, r"reshape=\(3, 3\) with 1 prefix tokens cannot fold"),
        (17, {"prefix_tokens": 2}, r"with prefix_tokens=2 the other 15 do not make a square grid"),
        (17, {"reshape": lambda t: t}, r"reshape must return an \(N, C, h, w\) tensor"),
    ],
)
def test_token_folding_errors(tokens, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        GradCAM(TokenHead(), layer="act", **kwargs).attribute(torch.randn(2, tokens, 4), target=0)


def test_token_prefix_chosen() -> None:
    x = torch.randn(1, 20, 4)  # 4 register tokens + 4x4 grid: the smallest prefix that leaves a square is 4
    out = LayerCAM(TokenHead(), layer="act").attribute(x, target=0)
    torch.testing.assert_close(out, LayerCAM(TokenHead(), layer="act", prefix_tokens=4).attribute(x, target=0))
    assert out.shape == (1, 1, 4, 4)


class Permute(nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 3, 1)


def test_callable_reshape_reads_channels_last_layers() -> None:
    """A layer with an (N, H, W, C) output (Swin-like) explained through reshape=callable equals the NCHW layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), Permute(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
    x = image_batch(n=2, size=8)
    for cls in (GradCAM, LayerCAM, ScoreCAM):
        nhwc = cls(model, layer="1", reshape=lambda t: t.permute(0, 3, 1, 2)).attribute(x, target=[[0, 2], [1, 1]])
        nchw = cls(model, layer="0").attribute(x, target=[[0, 2], [1, 1]])
        assert nchw.abs().sum() > 0
        torch.testing.assert_close(nhwc, nchw)


# -- automatic layer choice ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("resnet18", "layer4"),
        ("vgg11", "features.19"),
        ("densenet121", "features"),
        ("mobilenet_v3_small", "features"),
        ("efficientnet_b0", "features"),
        ("convnext_tiny", "features"),
    ],
)
def test_automatic_layer_choice(arch: str, expected: str) -> None:
    torch.manual_seed(0)
    model = getattr(models, arch)(weights=None).eval()
    x = image_batch(n=1, size=64)
    assert choose_layer(model, x)[0] == expected
    cam = GradCAM(model)
    assert repr(cam).endswith("layer=None (chosen on the first call))")
    out = cam.attribute(x)
    assert cam.layer == expected and f"layer='{expected}' (chosen automatically)" in repr(cam)
    assert out.shape[-2:] == ((4, 4) if arch == "vgg11" else (2, 2))
    assert out.amax() > 0 and out.amax() > out.amin()  # not empty, not constant


# -- autocast --------------------------------------------------------------------------------------------------------
def score_cam_by_hand(model: nn.Module, layer: str, x: torch.Tensor, target: int) -> torch.Tensor:
    """Score-CAM (N = 1) in the caller's precision: the layer's output, each channel upsampled bilinearly and
    min-max normalised in float32, the masked inputs run as one batch (hookviz's batch_size=64 holds them all), the
    target's softmax probability in float32 as the weight, and the weighted channel sum in float64."""
    a, _ = same.layer_acts_and_grads(model, layer, x, torch.tensor([target]))
    a = a.float()
    masks = []
    for k in range(a.shape[1]):
        up = F.interpolate(a[:, k : k + 1], size=x.shape[-2:], mode="bilinear", align_corners=False)
        masks.append((up - up.min()) / (up.max() - up.min()).clamp_min(1e-8))
    with torch.no_grad():
        probs = torch.softmax(model(x * torch.cat(masks)).float(), dim=1)[:, target]
    return ref._cam(a.double(), lambda n, k: probs[k].item())


@pytest.mark.parametrize("cls", [*ALL_CAMS, GuidedGradCAM], ids=lambda c: c.key)
def test_bfloat16_autocast_equals_the_formula_on_the_same_bf16_pass(cls) -> None:
    # Whether bf16 stays near float32 is a property of bf16 (its kernels round differently per CPU instruction set),
    # not of hookviz: the activations and gradients at the layer (and Guided Grad-CAM's guided gradient) are taken
    # by hand from the same bf16 autocast pass, and the paper's formula applied to them in float64.
    # Score-CAM on the tiny net: 6 masked forwards in bf16 instead of 256 on the resnet
    model, layer, x = (
        (TinyCNN(), "act", image_batch(n=1, size=16)) if cls is ScoreCAM else (resnet(), "layer3", image_batch(n=1))
    )
    target = torch.tensor([3])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cls(model, layer=layer).attribute(x, target=3)
        if cls is ScoreCAM:
            expected = score_cam_by_hand(model, layer, x, 3)
        else:
            a, g = (t.double() for t in same.layer_acts_and_grads(model, layer, x, target))
            formula = dict(GRAD_METHODS.values()).get(cls, ref.gradcam)
            expected = formula(a, g)
            if cls is GuidedGradCAM:
                guided = same.batch_gradient(same.same_dtype_rule_copy(model, "guided"), x, target)
                up = F.interpolate(expected, size=x.shape[-2:], mode="bilinear", align_corners=False)
                expected = guided.double() * up
    assert out.dtype == torch.float32 and torch.isfinite(out).all() and expected.abs().sum() > 0
    assert out.shape == expected.shape
    # hookviz's float32 arithmetic on the same bf16 values against float64: float32 rounding of sums over at most
    # 256 channels and the positions (about 260 u = 1.5e-5 of the sum of magnitudes), the bound used against the
    # float64 references above
    assert rel_l2(out, expected) < 1e-4


# -- errors and registry ---------------------------------------------------------------------------------------------
def test_constructor_errors() -> None:
    model = TinyCNN()
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1 \(masked inputs per forward pass\), got 0"):
        ScoreCAM(model, batch_size=0)
    with pytest.raises(TypeError, match=r"reshape must be None, a \(h, w\) tuple of positive ints or a callable"):
        GradCAM(model, reshape=(4, 0))
    with pytest.raises(ValueError, match="prefix_tokens must be None or an int >= 0, got -1"):
        GradCAM(model, prefix_tokens=-1)
    tanh_net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 14 * 14, 2))
    with pytest.raises(ValueError, match="GuidedBackprop rewrites the gradient at ReLU"):
        GuidedGradCAM(tanh_net, layer="0").attribute(image_batch(n=1, size=16), target=0)


def test_call_errors() -> None:
    model = TinyCNN()
    x = image_batch(n=2, size=16)
    with pytest.raises(ValueError, match=r"layer 'act' outputs a 4-D map .*; reshape=\(h, w\) and prefix_tokens="):
        GradCAM(model, layer="act", reshape=(8, 8)).attribute(x)
    with pytest.raises(ValueError, match=r"layer 'fc' outputs shape \(2, 5\); CAM methods need"):
        GradCAM(model, layer="fc").attribute(x)
    with pytest.raises(ValueError, match=r"ScoreCAM masks images: inputs must be \(N, C, H, W\)"):
        ScoreCAM(TokenHead(), layer="act").attribute(torch.randn(1, 17, 4), target=0)
    # the callable sees the N inputs' rows on the masked passes too (issue 27); a result that changes shape between
    # the clean pass and the masked ones is refused
    calls: list[int] = []

    def changing(out: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return out[:, 0] if len(calls) == 1 else out[:, :2]

    with pytest.raises(ValueError, match=r"returned 2 scores per input on the masked inputs but 1 on the inputs"):
        ScoreCAM(model, layer="act").attribute(x, target=changing)
    with pytest.raises(TypeError, match="unexpected keyword argument 'upsample'"):
        GuidedGradCAM(model, layer="act").attribute(x, upsample=True)  # type: ignore[call-arg]


def test_upsample_and_model_untouched() -> None:
    model = TinyCNN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = image_batch(n=2, size=16)
    for cls in ALL_CAMS:
        up = cls(model, layer="act").attribute(x, target=1, upsample=True)
        assert up.shape == (2, 1, 16, 16)
    assert hv.hook_counts(model) == {"forward": 0, "forward_pre": 0, "backward": 0, "backward_pre": 0}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())


def test_registry() -> None:
    expected = {
        "gradcam++": GradCAMPlusPlus,
        "layercam": LayerCAM,
        "xgradcam": XGradCAM,
        "hirescam": HiResCAM,
        "scorecam": ScoreCAM,
        "guided-gradcam": GuidedGradCAM,
    }
    for name, cls in expected.items():
        assert hv.get_method(name) is cls and cls.key == name
        assert "$$" in cls.__doc__ and "Example::" in cls.__doc__
