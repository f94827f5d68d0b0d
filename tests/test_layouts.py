"""Layer layouts (NCHW, NHWC, tokens with prefix tokens, Hiera's unrolled tokens, callables), the automatic CAM layer
on modern families (Swin, MLP-Mixer, ResMLP, Hiera, XCiT, CaiT, torchvision swin_t) and the all-zero-map warning.

Every map is checked against a float64 Grad-CAM computed by hand (`reference.cam`) on the layer's output folded by
an independent rearrangement (or timm's own ``forward_intermediates`` for Hiera)."""

from __future__ import annotations

import pytest
import torch
from reference import cam as ref
from torch import nn

import hookviz as hv
from hookviz.layouts import Layout, resolve_layout
from hookviz.methods.cam_layer import choose_layer

timm = pytest.importorskip("timm")


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def batch(n: int = 2, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


def live_head(model: nn.Module) -> nn.Module:
    """timm zero-initializes some classifiers (Mixer, Hiera): random weights so gradients reach the features."""
    torch.manual_seed(1)
    head = model.get_classifier()
    nn.init.normal_(head.weight, std=0.5)
    return model.eval()


def tiny(name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return live_head(timm.create_model(name, pretrained=False, num_classes=5, **kwargs))


def nhwc_to_nchw(t: torch.Tensor) -> torch.Tensor:
    """(N, h, w, C) -> (N, C, h, w), written with explicit loops (not a permute)."""
    out = torch.zeros(t.shape[0], t.shape[3], t.shape[1], t.shape[2], dtype=t.dtype)
    for i in range(t.shape[1]):
        for j in range(t.shape[2]):
            out[:, :, i, j] = t[:, i, j, :]
    return out


def tokens_to_grid(t: torch.Tensor, prefix: int, h: int, w: int) -> torch.Tensor:
    out = torch.zeros(t.shape[0], t.shape[2], h, w, dtype=t.dtype)
    for i in range(h):
        for j in range(w):
            out[:, :, i, j] = t[:, prefix + i * w + j, :]
    return out


# -- channels-last stages ------------------------------------------------------------------------------------------
def test_swin_chooses_channels_last_norm_and_matches_reference() -> None:
    model = tiny(
        "swin_tiny_patch4_window7_224", img_size=32, window_size=4, embed_dim=8, depths=(1, 1), num_heads=(1, 1)
    )
    x = batch(h=32, w=32)
    target = torch.tensor([1, 3])
    cam = hv.GradCAM(model)
    out = cam.attribute(x, target=target)
    assert cam.layer == "norm" and str(cam.layout_used) == "nhwc"
    expected = ref.gradcam(*ref.acts_and_grads(model, "norm", x, target, fold=nhwc_to_nchw))
    assert out.shape == (2, 1, 4, 4) and expected.abs().sum() > 0
    assert rel_l2(out, expected) < 1e-4
    # given explicitly, and as a callable (pytorch-grad-cam's reshape_transform), the same maps
    torch.testing.assert_close(hv.GradCAM(model, layer="norm", layout="nhwc").attribute(x, target=target), out)
    as_callable = hv.GradCAM(model, layer="norm", layout=lambda t: t.permute(0, 3, 1, 2))
    torch.testing.assert_close(as_callable.attribute(x, target=target), out)


def test_torchvision_swin_features_read_channels_last() -> None:
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)  # swin_t's architecture at toy width (swin_t itself runs in benchmarks/arch_sweep.py)
    model = SwinTransformer([4, 4], 8, [1, 1], [1, 1], [2, 2], num_classes=4).eval()
    nn.init.normal_(model.head.weight, std=0.5)
    x = batch(n=1, h=32, w=32)
    auto = hv.GradCAM(model)
    out = auto.attribute(x, target=2)
    assert auto.layer == "permute" and str(auto.layout_used) == "nchw"
    # `features` ends channels-last (N, 4, 4, 16)
    feats = hv.GradCAM(model, layer="features")
    fmap = feats.attribute(x, target=2)
    assert str(feats.layout_used) == "nhwc" and fmap.shape == out.shape == (1, 1, 4, 4)
    expected = ref.gradcam(*ref.acts_and_grads(model, "features", x, torch.tensor([2]), fold=nhwc_to_nchw))
    assert expected.abs().sum() > 0 and rel_l2(fmap, expected) < 1e-4


class ChannelsLast(nn.Module):
    """conv -> (N, h, w, C) -> LayerNorm over C -> mean -> linear; the Swin stage pattern in three lines."""

    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, channels, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, 4)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x).permute(0, 2, 3, 1)).mean((1, 2)))


@pytest.mark.parametrize(("h", "w"), [(16, 16), (16, 24)])
def test_nhwc_inferred_for_square_and_non_square_inputs(h: int, w: int) -> None:
    model = ChannelsLast()
    x = batch(h=h, w=w)
    cam = hv.LayerCAM(model, layer="norm")
    out = cam.attribute(x, target=[0, 2])
    assert str(cam.layout_used) == "nhwc" and out.shape == (2, 1, h // 2, w // 2)
    expected = ref.layercam(*ref.acts_and_grads(model, "norm", x, torch.tensor([0, 2]), fold=nhwc_to_nchw))
    assert rel_l2(out, expected) < 1e-4


def test_ambiguous_4d_shapes_follow_pytorch_unless_the_module_says_channels_last() -> None:
    out = torch.zeros(1, 8, 8, 8)
    assert resolve_layout("x", out, input_size=(8, 8)).kind == "nchw"
    assert resolve_layout("x", out, input_size=(8, 8), module=nn.LayerNorm(8)).kind == "nhwc"
    timm_like = nn.Module()
    timm_like.output_fmt = "NHWC"
    assert resolve_layout("x", out, input_size=(8, 8), model=timm_like).kind == "nhwc"


# -- tokens ----------------------------------------------------------------------------------------------------------
class PatchTokens(nn.Module):
    """Patchify (stride 8) -> optional prefix tokens -> `act` (the CAM layer) -> mean of patch tokens -> linear."""

    def __init__(self, prefix: int = 1, dim: int = 6, attr_prefix: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.prefix = prefix
        self.embed = nn.Conv2d(3, dim, 8, stride=8)
        self.cls = nn.Parameter(torch.randn(1, prefix, dim))
        self.act = nn.Sequential(nn.Linear(dim, dim), nn.Tanh())
        self.fc = nn.Linear(dim, 3)
        if attr_prefix is not None:
            self.num_prefix_tokens = attr_prefix

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = self.act(torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1))
        return self.fc(t[:, self.prefix :].mean(1) + t[:, : self.prefix].mean(1))


def test_non_square_token_grid_from_the_input_size() -> None:
    model = PatchTokens(prefix=1)
    x = batch(h=32, w=48)  # 4x6 patches + 1 class token = 25 tokens, also a 5x5 square without the class token
    cam = hv.GradCAM(model, layer="act")
    out = cam.attribute(x, target=[0, 1])
    assert str(cam.layout_used) == "tokens (1 prefix + 4x6)"
    fold = lambda t: tokens_to_grid(t, 1, 4, 6)  # noqa: E731
    expected = ref.gradcam(*ref.acts_and_grads(model, "act", x, torch.tensor([0, 1]), fold=fold))
    assert out.shape == (2, 1, 4, 6) and rel_l2(out, expected) < 1e-4


def test_model_num_prefix_tokens_is_read() -> None:
    # 8 register tokens + 3x3 patches = 17 tokens; alone, the smallest prefix that leaves a square (1 + 4x4) wins
    x = batch(h=24, w=24)
    inferred = hv.GradCAM(PatchTokens(prefix=8), layer="act")
    inferred.attribute(x, target=0)
    assert str(inferred.layout_used) == "tokens (1 prefix + 4x4)"
    model = PatchTokens(prefix=8, attr_prefix=8)
    cam = hv.GradCAM(model, layer="act")
    out = cam.attribute(x, target=0)
    assert str(cam.layout_used) == "tokens (8 prefix + 3x3)"
    expected = ref.gradcam(
        *ref.acts_and_grads(model, "act", x, torch.tensor([0, 0]), fold=lambda t: tokens_to_grid(t, 8, 3, 3))
    )
    assert rel_l2(out, expected) < 1e-4


def mixer(resmlp: bool) -> nn.Module:
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

    extra = {"block_layer": ResBlock, "norm_layer": Affine, "mlp_ratio": 4} if resmlp else {}
    torch.manual_seed(0)
    return live_head(MlpMixer(num_classes=5, img_size=32, patch_size=8, num_blocks=2, embed_dim=16, **extra))


@pytest.mark.parametrize("resmlp", [False, True], ids=["mixer", "resmlp"])
def test_mlp_token_models_choose_the_last_block(resmlp: bool) -> None:
    model = mixer(resmlp)
    x = batch(h=32, w=32)
    assert choose_layer(model, x)[0] == "blocks.1"  # not the patch embedding stem.proj
    out = hv.GradCAM(model).attribute(x, target=[2, 4])
    fold = lambda t: tokens_to_grid(t, 0, 4, 4)  # noqa: E731
    expected = ref.gradcam(*ref.acts_and_grads(model, "blocks.1", x, torch.tensor([2, 4]), fold=fold))
    assert expected.abs().sum() > 0 and rel_l2(out, expected) < 1e-4


@pytest.mark.parametrize(
    "name, kwargs, expected",
    [
        ("xcit_nano_12_p16_224", {"depth": 2}, "cls_attn_blocks.1.norm1"),
        ("cait_xxs24_224", {"depth": 2, "depth_token_only": 2}, "blocks_token_only.1.norm1"),
    ],
    ids=["xcit", "cait"],
)
def test_class_attention_models_choose_the_norm_before_the_last_class_attention(name, kwargs, expected) -> None:
    """XCiT and CaiT end in class-attention blocks where only the class token attends: after the last one the patch
    tokens no longer reach the head (every map would be zero), before it they do, as in a ViT."""
    model = tiny(name, img_size=64, **kwargs)
    x = batch(h=64, w=64)
    auto = hv.GradCAM(model)
    out = auto.attribute(x, target=[1, 3])
    assert auto.layer == expected and str(auto.layout_used) == "tokens (1 prefix + 4x4)"
    fold = lambda t: tokens_to_grid(t, 1, 4, 4)  # noqa: E731
    expected_map = ref.gradcam(*ref.acts_and_grads(model, expected, x, torch.tensor([1, 3]), fold=fold))
    assert expected_map.abs().sum() > 0 and rel_l2(out, expected_map) < 1e-4


def test_hiera_unrolled_tokens_read_through_its_reroll() -> None:
    model = tiny("hiera_tiny_224", img_size=(64, 64), embed_dim=8, num_heads=1, stages=(1, 1, 1, 1))
    x = batch(n=1, h=64, w=64)
    auto = hv.GradCAM(model)
    auto.attribute(x, target=1)
    # the last attention block pools: its input (norm1) is the 4x4 stage, still one mask-unit level unrolled
    assert auto.layer == "blocks.3.norm1" and str(auto.layout_used) == "tokens (Hiera reroll), 4x4"
    # an early stage keeps Hiera's mask-unit order: the map must be read in timm's own spatial order
    cam = hv.GradCAM(model, layer="blocks.0")
    out = cam.attribute(x, target=1)
    assert cam.layout_used.kind == "tokens (Hiera reroll)" and out.shape == (1, 1, 16, 16)
    a, g = ref.acts_and_grads(model, "blocks.0", x, torch.tensor([1]))
    rolled = [model.reroll(t.float(), 0).permute(0, 3, 1, 2).double() for t in (a, g)]
    (spatial,) = model.forward_intermediates(x, indices=[0], intermediates_only=True)
    torch.testing.assert_close(rolled[0].float(), spatial, rtol=1e-4, atol=1e-5)  # timm's reroll is spatial order
    assert rel_l2(out, ref.gradcam(*rolled)) < 1e-4


# -- errors ----------------------------------------------------------------------------------------------------------
class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Identity()
        self.fc = nn.Linear(5 * 100 * 3, 2)

    def forward(self, x):
        return self.fc(self.act(x.mean((1, 2, 3)).view(-1, 1, 1, 1) * torch.ones(1, 5, 100, 3)).flatten(1))


def test_layout_errors_name_layer_shape_and_argument() -> None:
    x = batch(n=1, h=16, w=3)
    with pytest.raises(ValueError, match=r"layer 'act' outputs shape \(1, 5, 100, 3\), which is neither.*layout="):
        hv.GradCAM(Odd(), layer="act").attribute(x, target=0)
    with pytest.raises(ValueError, match=r"layout='tokens' needs a 3-D \(N, T, D\) output, but layer 'norm'"):
        hv.GradCAM(ChannelsLast(), layer="norm", layout="tokens").attribute(batch(h=16, w=16), target=0)
    with pytest.raises(
        ValueError, match=r"layout='nhwc' needs a 4-D output, but layer 'act' outputs shape \(2, 17, 6\)"
    ):
        hv.GradCAM(PatchTokens(), layer="act", layout="nhwc").attribute(batch(h=32, w=32), target=0)
    with pytest.raises(ValueError, match=r"layout must be None \(inferred\), 'nchw', 'nhwc', 'tokens' or a callable"):
        hv.GradCAM(ChannelsLast(), layout="NHWC")
    with pytest.raises(ValueError, match="pass the callable as layout= or as reshape=, not both"):
        hv.GradCAM(ChannelsLast(), layout=lambda t: t, reshape=lambda t: t)
    with pytest.raises(ValueError, match=r"layout must return an \(N, C, h, w\) tensor with N = 2"):
        hv.GradCAM(ChannelsLast(), layer="norm", layout=lambda t: t[0]).attribute(batch(h=16, w=16), target=0)
    # a 25-token output of a 32x48 input with prefix_tokens=0: 25 is no grid of that aspect
    with pytest.raises(ValueError, match=r"with prefix_tokens=0 the other 25 do not make a grid with the input's"):
        hv.GradCAM(PatchTokens(), layer="act", prefix_tokens=0).attribute(batch(h=32, w=48), target=0)


def test_layout_folds_gradient_batches() -> None:
    lay = Layout("tokens", prefix=1, grid=(2, 3))
    t = torch.arange(2 * 7 * 4.0).view(2, 7, 4)
    torch.testing.assert_close(lay(t), tokens_to_grid(t, 1, 2, 3))


# -- all-zero maps ---------------------------------------------------------------------------------------------------
def test_all_zero_map_warns_with_the_reason() -> None:
    model = ChannelsLast()
    nn.init.zeros_(model.fc.weight)  # an untrained classifier: no gradient reaches the features
    with pytest.warns(UserWarning, match=r"every map is zero: the target's gradient at layer 'norm' is zero"):
        out = hv.GradCAM(model, layer="norm").attribute(batch(h=16, w=16), target=1)
    assert torch.equal(out, torch.zeros_like(out))
    negative = ChannelsLast()
    with torch.no_grad():
        negative.fc.weight.fill_(-1.0)
        negative.norm.weight.fill_(0.0)
        negative.norm.bias.fill_(1.0)  # constant positive activations, negative gradient: the ReLU leaves nothing
    with pytest.warns(UserWarning, match=r"at layer 'norm' the weighted sum of the channels is <= 0 everywhere"):
        hv.GradCAM(negative, layer="norm").attribute(batch(h=16, w=16), target=1)


# -- recorders' spatial views ------------------------------------------------------------------------------------------
def test_recorder_spatial_view_reads_layouts() -> None:
    model = ChannelsLast()
    x = batch(h=16, w=24)
    with hv.ActivationRecorder(model, "norm") as rec:
        model(x)
    raw = rec["norm"]
    assert raw.shape == (2, 8, 12, 6)
    torch.testing.assert_close(rec.spatial("norm", input_size=(16, 24)), nhwc_to_nchw(raw))
    tokens = PatchTokens(prefix=1)
    with hv.ActivationRecorder(tokens, "act") as rec:
        tokens(batch(h=32, w=48))
    torch.testing.assert_close(rec.spatial("act", input_size=(32, 48)), tokens_to_grid(rec["act"], 1, 4, 6))
    with pytest.raises(ValueError, match=r"layout='tokens' needs a 3-D \(N, T, D\) output, but layer 'norm'"):
        with hv.ActivationRecorder(model, "norm") as rec:
            model(x)
        rec.spatial("norm", layout="tokens")
