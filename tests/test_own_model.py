"""The user's own model: Hugging Face outputs and keyword arguments, uint8 and EXIF-rotated images, the explicit token
path, float32 results for half-precision models, and ``preprocess="auto"`` (the model's own preprocessing)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from PIL import Image
from reference import cam as cam_ref
from reference import same_precision as same
from torch import nn

import hookviz as hv
from hookviz.images import IMAGENET, auto_preprocess, load_images
from hookviz.targets import class_logits

transformers = pytest.importorskip("transformers")


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


# -- Hugging Face outputs and forward_kwargs ------------------------------------------------------------------------
def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, num_labels=3
    )
    return BertForSequenceClassification(config).eval()


def token_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[2, 7, 9, 11, 3, 0], [2, 5, 3, 0, 0, 0]])
    return ids, (ids != 0).long()


def test_bert_logits_read_and_attention_mask_passed() -> None:
    model = tiny_bert()
    ids, mask = token_batch()
    sal = hv.Saliency(model, layer=model.bert.embeddings)
    got = sal.attribute(ids, target=[1, 2], forward_kwargs={"attention_mask": mask})
    # reference: the gradient of logits[i, c_i] at the embeddings' output, by hand
    store = {}
    handle = model.bert.embeddings.register_forward_hook(lambda m, a, out: store.update(a=out))
    try:
        logits = model(ids, attention_mask=mask).logits
    finally:
        handle.remove()
    (expected,) = torch.autograd.grad(logits[[0, 1], [1, 2]].sum(), store["a"])
    assert got.shape == (2, 6, 16) and rel_l2(got, expected) < 1e-5
    # the mask mattered: without it the padded positions change the scores
    assert rel_l2(sal.attribute(ids, target=[1, 2]), expected) > 1e-3
    # the same as the hand-written callable target users needed before
    by_hand = sal.attribute(ids, target=lambda out: out.logits[:, 1], forward_kwargs={"attention_mask": mask})
    torch.testing.assert_close(by_hand[0], got[0])


def test_bert_token_explanation_with_mask() -> None:
    model = tiny_bert()
    ids, mask = token_batch()
    method = hv.IntegratedGradients(model, steps=4, layer=model.bert.embeddings)
    out = method.visualize(ids, target=0, forward_kwargs={"attention_mask": mask}, vocab=[f"t{i}" for i in range(40)])
    assert type(out).__name__ == "TokenExplanation" and out.attribution.shape == (2, 6, 16)
    expected = method.attribute(ids, target=0, forward_kwargs={"attention_mask": mask})
    torch.testing.assert_close(out.attribution, expected)


class Masked(nn.Module):
    """forward(x, *, mask): the masked mean of ReLU'd (N, T, D) features -> linear; the mask is keyword-only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x, *, mask):
        m = mask[:, :, None].to(x.dtype)
        return self.fc(torch.relu(x * m).sum(1) / m.sum(1))


@pytest.mark.parametrize(
    "build",
    [
        lambda m: hv.IntegratedGradients(m, steps=5, batch_size=3),
        lambda m: hv.SmoothGrad(hv.Saliency(m), n=4, sigma=0.3, generator=torch.Generator().manual_seed(0)),
        lambda m: hv.Occlusion(m, window=(1, 4), baseline=0.0),
        lambda m: hv.InputXGradient(m),
        lambda m: hv.GuidedBackprop(m),
    ],
    ids=["ig", "smoothgrad", "occlusion", "ixg", "guided"],
)
def test_forward_kwargs_follow_their_rows(build) -> None:
    """Batched with per-sample masks == each sample alone with the mask bound into the model (functools.partial)."""
    model = Masked()
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    batched = build(model).attribute(x, target=[0, 2, 1], forward_kwargs={"mask": mask})
    if isinstance(build(model), hv.SmoothGrad):
        # its noise is drawn for the whole batch: compare with the mask passed positionally (the rows mechanism of
        # additional_forward_args) instead of sample by sample
        class Positional(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, xi, m):
                return self.inner(xi, mask=m)

        expected = build(Positional()).attribute(x, target=[0, 2, 1], additional_forward_args=(mask,))
        torch.testing.assert_close(batched, expected)
        return
    for i, c in enumerate([0, 2, 1]):

        class Bound(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, xi, row=i):
                return functools.partial(self.inner, mask=mask[row : row + 1])(xi)

        alone = build(Bound()).attribute(x[i : i + 1], target=c)
        torch.testing.assert_close(batched[i : i + 1], alone, rtol=1e-5, atol=1e-6)


class TupleOut(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        feats = torch.relu(self.conv(x))
        logits = self.fc(feats.mean((2, 3)))
        if self.kind == "tuple":
            return logits, feats
        if self.kind == "dict":
            return {"logits": logits, "features": feats}
        if self.kind == "model_output":
            from transformers.modeling_outputs import ImageClassifierOutput

            return ImageClassifierOutput(logits=logits, hidden_states=(feats,))
        return {"logits": logits[:, :, None]}  # a bad logits: 3-D


@pytest.mark.parametrize("kind", ["tuple", "dict", "model_output"])
@pytest.mark.parametrize("cls", [hv.GradCAM, hv.Saliency, hv.ScoreCAM, hv.RISE])
def test_output_forms_read_as_class_scores(kind: str, cls) -> None:
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    kwargs = {"n_masks": 8, "cell": 2, "seed": 0} if cls is hv.RISE else {}
    plain = TupleOut("tuple")

    def first(out):
        return out[0][:, 3]

    expected = cls(plain, **kwargs).attribute(x, target=first) if cls is not hv.ScoreCAM else None
    got = cls(TupleOut(kind), **kwargs).attribute(x, target=3)
    if expected is not None and cls is not hv.RISE:  # RISE scores class targets by softmax, a callable raw
        torch.testing.assert_close(got, expected)
    assert torch.isfinite(got).all() and got.abs().sum() > 0


def test_output_rule_errors() -> None:
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(ValueError, match=r"\(N, classes\) \(a tensor \(N, classes\), an output with a `logits` attr"):
        hv.Saliency(TupleOut("bad")).attribute(x, target=0)
    with pytest.raises(ValueError, match=r"the output's 'logits' key is a tensor of shape \(1, 5, 1\)"):
        class_logits({"logits": torch.zeros(1, 5, 1)})
    with pytest.raises(ValueError, match=r"but the model output is str"):
        class_logits("nope")


def test_forward_kwargs_errors_before_any_forward() -> None:
    model = Masked()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    x = torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match=r"forward_kwargs must be a dict of keyword arguments of forward.*got list"):
        hv.Saliency(model).attribute(x, forward_kwargs=[("mask", 1)])
    with pytest.raises(ValueError, match=r"forward_kwargs\['mask'\] has shape \(3, 5\).*first dimension N = 2"):
        hv.IntegratedGradients(model, steps=2).attribute(x, forward_kwargs={"mask": torch.ones(3, 5)})
    with pytest.raises(ValueError, match=r"forward_kwargs\['mask'\] has shape \(3, 5\)"):
        hv.GradCAM(TupleOut("tuple"), layer="conv").attribute(
            torch.randn(2, 3, 8, 8), forward_kwargs={"mask": torch.ones(3, 5)}
        )
    assert not calls


def test_explain_dataset_slices_forward_kwargs(tmp_path) -> None:
    model = Masked()
    x = torch.randn(5, 5, 4, generator=torch.Generator().manual_seed(2))
    mask = (torch.rand(5, 5, generator=torch.Generator().manual_seed(3)) > 0.3).long()
    mask[:, 0] = 1
    method = hv.Saliency(model)
    store = hv.explain_dataset(
        method, list(x), tmp_path / "run", target=1, batch_size=2, dtype="float32", forward_kwargs={"mask": mask}
    )
    torch.testing.assert_close(store[:], method.attribute(x, target=1, forward_kwargs={"mask": mask}))
    with pytest.raises(ValueError, match=r"forward_kwargs\['mask'\] has shape \(4, 5\); tensors among explain_data"):
        hv.explain_dataset(method, list(x), tmp_path / "bad", forward_kwargs={"mask": mask[:4]})


# -- float32 results -------------------------------------------------------------------------------------------------
RULES = {hv.Saliency: "plain", hv.InputXGradient: "plain", hv.GuidedBackprop: "guided", hv.Deconvnet: "deconvnet"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls", [hv.Saliency, hv.InputXGradient, hv.GuidedBackprop, hv.Deconvnet, hv.GradCAM])
def test_half_precision_models_give_float32_maps(cls, dtype) -> None:
    # Whether a half model stays near its float32 original is a property of fp16 / bf16 (whose kernels round
    # differently per CPU instruction set), not of hookviz: compare with the same computation done by hand on the
    # half model, the input cast to its dtype as hookviz documents, the whole batch in one pass.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 1])
    half, xh = model.to(dtype), x.to(dtype)
    got = cls(half, **({"layer": "1"} if cls is hv.GradCAM else {})).attribute(x, target=1)
    assert got.dtype == torch.float32 and torch.isfinite(got).all() and got.abs().amax() > 0
    if cls is hv.GradCAM:
        a, g = (t.double() for t in same.layer_acts_and_grads(half, "1", xh, targets))
        # hookviz's float32 Grad-CAM arithmetic on the same half values against float64: float32 rounding of sums
        # over 4 channels and 36 positions, far below 1e-4
        assert got.shape == (2, 1, 6, 6) and rel_l2(got, cam_ref.gradcam(a, g)) < 1e-4
        return
    grad = same.batch_gradient(same.same_dtype_rule_copy(half, RULES[cls]), xh, targets)
    # the map is computed in the half dtype (gradient, and input x gradient's product) and cast to float32, which
    # is exact: the two agree exactly
    want = (xh * grad if cls is hv.InputXGradient else grad).float()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- images as users have them ---------------------------------------------------------------------------------------
def test_uint8_tensors_are_images() -> None:
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (2, 3, 20, 30), dtype=torch.uint8, generator=g)
    batch = load_images(pixels, preprocess=IMAGENET)
    expected = load_images([pixels[0].float() / 255, pixels[1].float() / 255], preprocess=None)
    assert batch.tensor.shape == (2, 3, 224, 224)
    torch.testing.assert_close(batch.tensor, IMAGENET(expected.tensor))
    single = load_images(pixels[1], preprocess=None)  # (C, H, W), torchvision.io.read_image's layout
    torch.testing.assert_close(single.tensor, pixels[1:].float() / 255)
    with pytest.raises(ValueError, match=r"uint8 tensors are read as images.*it looks channels-last .*permute"):
        load_images(pixels[0].permute(1, 2, 0))


def test_visualize_takes_uint8_images_and_explicit_tokens() -> None:
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    pixels = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    e = hv.GradCAM(cnn, layer="1").visualize(pixels, preprocess=None)
    torch.testing.assert_close(e.inputs, pixels[None].float() / 255)
    emb = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))
    ids = torch.tensor([[1, 2, 3]], dtype=torch.uint8)  # a small vocabulary in uint8: tokens only when told
    tok = hv.Saliency(emb, layer="0").visualize(ids.long(), tokens=True)
    assert type(tok).__name__ == "TokenExplanation"
    with pytest.raises(TypeError, match=r"tokens=True needs an integer tensor of token ids \(N, T\), got a torch"):
        hv.Saliency(emb, layer="0").visualize(torch.zeros(1, 3), tokens=True)
    with pytest.raises(TypeError, match="tokens must be None"):
        hv.Saliency(emb, layer="0").visualize(ids, tokens="yes")


def test_exif_orientation_is_applied(tmp_path) -> None:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (6, 10, 3), dtype=np.uint8)
    im = Image.fromarray(arr)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    path = tmp_path / "phone.png"
    im.save(path, exif=exif)
    upright = np.rot90(arr, k=-1)  # clockwise
    batch = load_images(str(path), preprocess=None)
    assert batch.tensor.shape == (1, 3, 10, 6)
    torch.testing.assert_close(batch.tensor[0], torch.from_numpy(upright.copy()).permute(2, 0, 1).float() / 255)
    with Image.open(path) as opened:  # a PIL image opened by the user gets the same treatment
        torch.testing.assert_close(load_images(opened, preprocess=None).tensor, batch.tensor)


# -- preprocess="auto" -----------------------------------------------------------------------------------------------
def test_shapes_model_uses_its_own_preset(tmp_path) -> None:
    from hookviz import zoo

    model = zoo.shapes_model()
    data = zoo.shapes(2, seed=5)
    path = tmp_path / "shape.png"
    Image.fromarray((data.images[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(path)
    e = hv.GradCAM(model).visualize(str(path))
    assert e.inputs.shape == (1, 3, 64, 64) and 0 <= e.inputs.min() and e.inputs.max() <= 1
    assert "the model's own preset: shapes (resize 64, crop 64, [0, 1])" in repr(e)
    torch.testing.assert_close(e.inputs, data.images[:1], atol=1 / 255, rtol=0)  # the PNG's rounding only
    explicit = hv.GradCAM(model).visualize(str(path), preprocess="imagenet")  # an explicit choice always wins
    assert explicit.inputs.shape == (1, 3, 224, 224) and explicit.preprocess.startswith("given: imagenet")


def test_auto_preprocess_for_torchvision_weights_and_timm() -> None:
    from torchvision.models import ResNet18_Weights, resnet18

    model = resnet18(weights=None, num_classes=1000)
    transform, how = auto_preprocess(model, ResNet18_Weights.IMAGENET1K_V1)
    assert type(transform).__name__ == "ImageClassification" and how.startswith("ResNet18_Weights.IMAGENET1K_V1")
    assert auto_preprocess(model)[0] is IMAGENET
    with pytest.raises(TypeError, match="weights must be a torchvision weights enum member"):
        auto_preprocess(model, "resnet18")
    timm = pytest.importorskip("timm")
    vit = timm.create_model("vit_tiny_patch16_384", pretrained=False)
    transform, how = auto_preprocess(vit)
    assert how == "timm data config (384x384, crop_pct 1.0, bicubic, mean (0.5, 0.5, 0.5), std (0.5, 0.5, 0.5))"
    img = torch.rand(3, 400, 500, generator=torch.Generator().manual_seed(0))
    out = transform(img)
    assert out.shape == (3, 384, 384)
    # resize the shorter side to 384 (bicubic, antialiased), center crop, then (x - 0.5) / 0.5
    import torchvision.transforms.functional as TF

    ref = TF.center_crop(TF.resize(img, [384], interpolation=TF.InterpolationMode.BICUBIC, antialias=True), [384])
    torch.testing.assert_close(out, (ref - 0.5) / 0.5, rtol=0, atol=1e-5)
