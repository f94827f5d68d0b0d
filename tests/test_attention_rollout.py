"""AttentionRollout and GradientRollout: hand-computed rollouts, fused attention against the eager path (timm, Hugging
Face, torchvision against a forward written by hand from its weights), Chefer et al.'s formula in float64, shapes
for images and tokens, errors before any work.

Tolerances. float64 against float64 holds to 1e-10 (the paths differ only in the order of float64 operations; the
largest difference measured is 4e-15). float32 comparisons of fused against eager attention: the two paths compute
the same logits in a different order (timm's eager path scales q before the matmul, the decomposition of the fused
call after it; PyTorch's own multi-head path uses baddbmm), so a logit differs by a few float32 ulps and a
probability by less; the rollouts are products and sums of them over 2 layers, gradient rollout also of the
gradients at them. Gradient rollout's values are as small as the gradients of an untrained model (~1e-3 to 1e-5), so
maps are compared relative to each sample's largest value (`assert_maps_close`). 1e-5 (and 1e-4 relative) is eight
times the largest difference measured (1.2e-6, with ATEN_CPU_CAPABILITY=default; 7e-7 with 1 or 2 threads).
Hugging Face's ViT computes its eager softmax in float32 whatever the model's dtype, so its float64 case holds to
the float32 tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import _get_current_function_mode_stack
from torchvision import models

import hookviz as hv
from hookviz.hooks import HookManager, hook_counts
from hookviz.methods.attention import AttentionCapture, AttentionNotVisible, discard_lowest
from hookviz.methods.scope import active_call, current_call

F32 = {"atol": 1e-5, "rtol": 1e-4}  # float32 fused vs eager (see the module docstring)
F64 = {"atol": 1e-10, "rtol": 1e-10}  # float64 against float64
METHODS = (hv.AttentionRollout, hv.GradientRollout)


# -- models ------------------------------------------------------------------------------------------------------------
def timm_vit(fused: bool, dtype: torch.dtype = torch.float32, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    options = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0}
    options["num_classes"] = 10
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**options, **kwargs})
    for block in model.blocks:
        block.attn.fused_attn = fused
    return model.to(dtype).eval()


def torchvision_vit(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    )
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at zero: no gradient would pass
    return model.to(dtype).eval()


def hf_vit(impl: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=10, attn_implementation=impl,
    )  # fmt: skip
    return ViTForImageClassification(config).to(dtype).eval()


def hf_bert(impl: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=3, attn_implementation=impl,
    )  # fmt: skip
    return BertForSequenceClassification(config).to(dtype).eval()


def images(n: int = 2, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(dtype)


def tokens() -> tuple[Tensor, Tensor]:
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0  # padding at the end of the second sequence
    return ids, mask


def captured(model: nn.Module, *args, **kwargs) -> list[Tensor]:
    """The probabilities hookviz's capture reads in one forward pass (no gradient needed)."""
    with HookManager(model) as hooks, active_call():
        capture = AttentionCapture(model, hooks)
        capture.place_hooks()
        with capture.forward_pass():
            model(*args, **kwargs)
    return [c.probs.detach() for c in capture.captured]


# -- independent references --------------------------------------------------------------------------------------------
def ref_rollout(probs: list[Tensor], fusion: str = "mean", ratio: float = 0.0, row: int = 0) -> np.ndarray:
    """Abnar & Zuidema's rollout per sample in numpy float64, discarding as jacobgil/vit-explain does."""
    arrays = [p.detach().double().numpy() for p in probs]
    n, _, t, _ = arrays[0].shape
    out = []
    for b in range(n):
        r = np.eye(t)
        for a in arrays:
            fused = {"mean": a[b].mean(0), "max": a[b].max(0), "min": a[b].min(0)}[fusion].copy()
            flat = fused.reshape(-1)
            idx = np.argsort(flat, kind="stable")[: int(t * t * ratio)]
            flat[idx[idx != 0]] = 0
            step = 0.5 * fused + 0.5 * np.eye(t)
            step = step / step.sum(axis=1, keepdims=True)
            r = step @ r
        out.append(r[row])
    return np.stack(out)


def ref_chefer(probs: list[Tensor], grads: list[Tensor], row: int = 0) -> np.ndarray:
    """Chefer et al. 2021 (their ``avg_heads`` and ``apply_self_attention_rules``) per sample, numpy float64."""
    n, _, t, _ = probs[0].shape
    out = []
    for b in range(n):
        r = np.eye(t)
        for a, g in zip(probs, grads, strict=True):
            cam = np.clip(g[b].detach().double().numpy() * a[b].detach().double().numpy(), 0, None).mean(0)
            r = r + cam @ r
        out.append(r[row])
    return np.stack(out)


def timm_eager_reference(model: nn.Module, x: Tensor, target: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Probabilities and the target's gradients at them on timm's eager path: the input of each ``attn_drop``."""
    assert not any(b.attn.fused_attn for b in model.blocks)
    probs: list[Tensor] = []
    handles = [b.attn.attn_drop.register_forward_hook(lambda m, a, o: probs.append(a[0])) for b in model.blocks]
    try:
        logits = model(x)
    finally:
        for h in handles:
            h.remove()
    score = logits.gather(1, torch.tensor(target)[:, None]).sum()
    return probs, list(torch.autograd.grad(score, probs))


def torchvision_by_hand(model: nn.Module, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """torchvision's VisionTransformer forward written out from its weights (eval mode: dropout is the identity)."""
    n = x.shape[0]
    h = model.conv_proj(x).flatten(2).transpose(1, 2)
    h = torch.cat([model.class_token.expand(n, -1, -1), h], dim=1) + model.encoder.pos_embedding
    probs = []
    for layer in model.encoder.layers:
        att = layer.self_attention
        q, k, v = F.linear(layer.ln_1(h), att.in_proj_weight, att.in_proj_bias).chunk(3, dim=-1)
        d = q.shape[-1] // att.num_heads
        q, k, v = (t.unflatten(-1, (att.num_heads, d)).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
        probs.append(a)
        h = h + att.out_proj((a @ v).transpose(1, 2).flatten(2))
        h = h + layer.mlp(layer.ln_2(h))
    return model.heads(model.encoder.ln(h)[:, 0]), probs


def assert_maps_close(got: Tensor, want: Tensor | np.ndarray, tol: dict[str, float]) -> None:
    """Maps equal to `tol` relative to each sample's largest |value| of `want` (gradient rollout's values are as
    small as the gradients of an untrained model)."""
    want = torch.as_tensor(want).to(got.dtype)
    scale = want.flatten(1).abs().amax(1).clamp_min(1e-30).view(-1, *[1] * (want.dim() - 1))
    assert want.abs().amax() > 0
    torch.testing.assert_close(got / scale, want / scale, **tol)


def as_map(rows: np.ndarray, prefix: int = 1, side: int = 4) -> Tensor:
    return torch.from_numpy(rows[:, prefix:]).reshape(-1, 1, side, side)


# -- hand-computed rollouts on a toy with known attention --------------------------------------------------------------
class KnownAttention(nn.Module):
    """Attention whose probabilities are given (H, T, T): softmax(log P) = P, mixing the values of every head."""

    def __init__(self, probs: list[list[list[float]]]) -> None:
        super().__init__()
        self.register_buffer("logits", torch.tensor(probs, dtype=torch.float64).log())
        self.value = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, h: Tensor) -> Tensor:
        a = torch.softmax(self.logits.expand(h.shape[0], -1, -1, -1), dim=-1)
        return h + (a @ self.value(h).unsqueeze(1)).mean(dim=1)


class Toy(nn.Module):
    def __init__(self, layers: list[list[list[list[float]]]]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4, dtype=torch.float64)
        self.layers = nn.ModuleList(KnownAttention(p) for p in layers)
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(dim=1))


TWO_HEADS = [
    [[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]],
    [[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.5], [1.0, 0.0]]],
]


@pytest.mark.parametrize(
    ("fusion", "expected"),
    [
        # mean: layer 1 fuses to [[.5, .5], [.5, .5]] -> 0.5 A + 0.5 I = [[.75, .25], [.25, .75]]; layer 2 to
        # [[.75, .25], [.5, .5]] -> [[.875, .125], [.25, .75]]; R = L2 L1, row 0 = [.6875, .3125]
        ("mean", [0.6875, 0.3125]),
        # max: [[1, 1], [.5, .5]] -> rows of [[1, .5], [.25, .75]] = [[2/3, 1/3], [.25, .75]]; [[1, .5], [1, 1]] ->
        # rows of [[1, .25], [.5, 1]] = [[.8, .2], [1/3, 2/3]]; row 0 of L2 L1 = [7/12, 5/12]
        ("max", [7 / 12, 5 / 12]),
        # min: [[0, 0], [.5, .5]] -> rows of [[.5, 0], [.25, .75]] = [[1, 0], [.25, .75]]; [[.5, 0], [0, 0]] -> I
        ("min", [1.0, 0.0]),
    ],
)
def test_rollout_by_hand_on_two_layers_with_known_attention(fusion: str, expected: list[float]) -> None:
    toy = Toy(TWO_HEADS)
    ids = torch.tensor([[1, 2], [3, 4]])
    got = hv.AttentionRollout(toy, head_fusion=fusion).attribute(ids)
    assert got.dtype == torch.float64 and got.shape == (2, 2)
    torch.testing.assert_close(got, torch.tensor([expected, expected], dtype=torch.float64), rtol=0, atol=1e-15)


ONE_HEAD = [[[[0.25, 0.75], [0.375, 0.625]]], [[[0.625, 0.375], [0.125, 0.875]]]]


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        # no discarding: L1 = [[.625, .375], [.1875, .8125]], L2 = [[.8125, .1875], [.0625, .9375]]; row 0 of L2 L1
        (0.0, [0.54296875, 0.45703125]),
        # ratio 0.5 drops the 2 lowest of 4: layer 1 [.25 (0, 0), .375 (1, 0)]: (0, 0) is spared, so only (1, 0) ->
        # [[.25, .75], [0, .625]] -> rows of [[.625, .375], [0, .8125]] = [[.625, .375], [0, 1]]; layer 2 [.125 (1, 0),
        # .375 (0, 1)] -> [[.625, 0], [0, .875]] -> I; R = L1, row 0 = [.625, .375]
        (0.5, [0.625, 0.375]),
    ],
)
def test_discard_ratio_by_hand_spares_the_class_tokens_own_weight(ratio: float, expected: list[float]) -> None:
    got = hv.AttentionRollout(Toy(ONE_HEAD), discard_ratio=ratio).attribute(torch.tensor([[1, 2]]))
    torch.testing.assert_close(got, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-15)


def test_discard_lowest_zeroes_the_lowest_entries_of_each_sample_on_its_own() -> None:
    fused = torch.tensor([[[0.1, 0.6, 0.3], [0.2, 0.5, 0.3], [0.05, 0.15, 0.8]]]).repeat(2, 1, 1)
    fused[1, 0, 0] = 0.9  # the second sample's lowest are others
    out = discard_lowest(fused, 0.4)  # int(9 * 0.4) = 3 lowest
    first = fused[0].clone()
    first[2, 0] = first[2, 1] = 0  # 0.05 and 0.15 zeroed; 0.1 at (0, 0) spared
    second = fused[1].clone()
    second[2, 0] = second[2, 1] = second[1, 0] = 0  # 0.05, 0.15, 0.2
    assert torch.equal(out[0], first) and torch.equal(out[1], second)
    assert torch.equal(discard_lowest(fused, 0.0), fused)


# -- fused against eager -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_timm_fused_attention_gives_the_eager_probabilities_and_maps(dtype) -> None:
    fused, eager = timm_vit(True, dtype), timm_vit(False, dtype)
    x = images(dtype=dtype)
    tol = F32 if dtype == torch.float32 else F64
    probs, grads = timm_eager_reference(eager, x, [1, 2])
    got = captured(fused, x)
    assert len(got) == 2 and got[0].shape == (2, 2, 17, 17)
    for a, b in zip(got, probs, strict=True):
        torch.testing.assert_close(a, b.detach(), **tol)
    roll = hv.AttentionRollout(fused).attribute(x, target=[1, 2])
    torch.testing.assert_close(roll, as_map(ref_rollout(probs)).to(dtype), **tol)
    torch.testing.assert_close(roll, hv.AttentionRollout(eager).attribute(x, target=[1, 2]), **tol)
    grad = hv.GradientRollout(fused).attribute(x, target=[1, 2])
    assert_maps_close(grad, as_map(ref_chefer(probs, grads)), tol)
    assert_maps_close(grad, hv.GradientRollout(eager).attribute(x, target=[1, 2]), tol)
    assert grad.abs().sum() > 0


def test_torchvision_vit_against_a_forward_written_from_its_weights() -> None:
    model = torchvision_vit(torch.float64)
    x = images(dtype=torch.float64)
    logits, probs = torchvision_by_hand(model, x)
    torch.testing.assert_close(logits, model(x), **F64)  # the hand-written forward is torchvision's
    grads = torch.autograd.grad(logits.gather(1, torch.tensor([[3], [4]])).sum(), probs)
    for a, b in zip(captured(model, x), probs, strict=True):
        torch.testing.assert_close(a, b.detach(), **F64)
    roll = hv.AttentionRollout(model, head_fusion="max", discard_ratio=0.3).attribute(x, target=[3, 4])
    torch.testing.assert_close(roll, as_map(ref_rollout(probs, "max", 0.3)), **F64)
    grad = hv.GradientRollout(model).attribute(x, target=[3, 4])
    assert_maps_close(grad, as_map(ref_chefer(probs, grads)), F64)
    # and in float32, the fused module against the float64 hand-written forward, to float32 rounding
    model32 = torchvision_vit()
    assert_maps_close(hv.GradientRollout(model32).attribute(x.float(), target=[3, 4]), grad, F32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hugging_face_vit_sdpa_gives_the_eager_probabilities_and_maps(dtype) -> None:
    sdpa, eager = hf_vit("sdpa", dtype), hf_vit("eager", dtype)
    x = images(dtype=dtype)
    tol = F32  # ViT's eager path computes its softmax in float32 whatever the model's dtype (softmax(dtype=float32))
    out = eager(x, output_attentions=True)
    probs = list(out.attentions)
    grads = torch.autograd.grad(out.logits[:, 5].sum(), probs)
    for a, b in zip(captured(sdpa, x), probs, strict=True):
        torch.testing.assert_close(a, b.detach(), **tol)
    torch.testing.assert_close(hv.AttentionRollout(sdpa).attribute(x, 5), as_map(ref_rollout(probs)).to(dtype), **tol)
    grad = hv.GradientRollout(sdpa).attribute(x, 5)
    assert_maps_close(grad, as_map(ref_chefer(probs, grads)), tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bert_sdpa_gives_the_eager_probabilities_and_token_scores(dtype) -> None:
    sdpa, eager = hf_bert("sdpa", dtype), hf_bert("eager", dtype)
    ids, mask = tokens()
    tol = F32 if dtype == torch.float32 else F64
    out = eager(ids, attention_mask=mask, output_attentions=True)
    probs = list(out.attentions)
    grads = torch.autograd.grad(out.logits[:, 2].sum(), probs)
    for a, b in zip(captured(sdpa, ids, attention_mask=mask), probs, strict=True):
        torch.testing.assert_close(a, b.detach(), **tol)
    kw = {"forward_kwargs": {"attention_mask": mask}}
    roll = hv.AttentionRollout(sdpa).attribute(ids, 2, **kw)
    assert roll.shape == (2, 8) and torch.all(roll[1, 6:] == 0)  # padded keys get no attention
    torch.testing.assert_close(roll, torch.from_numpy(ref_rollout(probs)).to(dtype), **tol)
    # R = I + (what the gradients add, ~1e-5 for this untrained model): the read-out token's own entry, 1 + ~1e-5,
    # holds that in float32 to 1e-7 only, so it is compared on its own and the others relative to their largest
    grad = hv.GradientRollout(sdpa).attribute(ids, 2, **kw)
    want = torch.from_numpy(ref_chefer(probs, grads))
    assert_maps_close(grad[:, 1:], want[:, 1:], tol)
    torch.testing.assert_close(grad[:, 0], want[:, 0].to(dtype), **tol)
    last = hv.GradientRollout(sdpa, token=-1).attribute(ids, 2, **kw)
    want = torch.from_numpy(ref_chefer(probs, grads, row=-1))
    assert_maps_close(last[:, :-1], want[:, :-1], tol)


def causal_lm(kind: str, impl: str) -> nn.Module:
    from transformers import GPT2Config, GPT2ForSequenceClassification, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16, num_labels=3, pad_token_id=0,
            bos_token_id=1, eos_token_id=1, attn_implementation=impl,
        )  # fmt: skip
        return GPT2ForSequenceClassification(config).eval()
    # grouped-query attention (4 query heads share 2 key/value heads), rotary embeddings
    config = LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, attn_implementation=impl,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_causal_language_models_sdpa_against_eager_read_at_the_last_token(kind) -> None:
    sdpa, eager = causal_lm(kind, "sdpa"), causal_lm(kind, "eager")
    ids = torch.randint(1, 50, (2, 8), generator=torch.Generator().manual_seed(3))

    def target(out):  # the next-token logit of token 3 at the last position (GPT-2's classifier: class 1)
        return out.logits[:, -1, 3] if out.logits.dim() == 3 else out.logits[:, 1]

    out = eager(ids, output_attentions=True)
    probs = list(out.attentions)
    assert all(torch.all(p.triu(1) == 0) for p in probs)  # causal: no attention to later tokens
    grads = torch.autograd.grad(target(out).sum(), probs)
    for a, b in zip(captured(sdpa, ids), probs, strict=True):
        torch.testing.assert_close(a, b.detach(), **F32)
    roll = hv.AttentionRollout(sdpa, token=-1).attribute(ids, target)
    torch.testing.assert_close(roll, torch.from_numpy(ref_rollout(probs, row=-1)).float(), **F32)
    grad = hv.GradientRollout(sdpa, token=-1).attribute(ids, target)
    assert_maps_close(grad[:, :-1], ref_chefer(probs, grads, row=-1)[:, :-1], F32)


def test_frozen_weights_and_a_plain_input_still_give_the_gradient_at_the_attention() -> None:
    # nothing upstream of the first attention needs a gradient: the probabilities become leaves that do
    model = timm_vit(True).requires_grad_(False)
    eager = timm_vit(False)
    x = images()
    torch.testing.assert_close(
        hv.GradientRollout(model).attribute(x, 1), hv.GradientRollout(eager).attribute(x, 1), **F32
    )
    # nn.MultiheadAttention: its query, key and value become the leaves
    tv = torchvision_vit().requires_grad_(False)
    want = hv.GradientRollout(torchvision_vit()).attribute(x, 1)
    assert_maps_close(hv.GradientRollout(tv).attribute(x, 1), want, F32)
    assert all(not p.requires_grad for p in tv.parameters())


# -- shapes, prefix tokens, K targets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_k_targets_come_from_one_forward_pass_and_equal_single_targets(method) -> None:
    model = timm_vit(True)
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    x = images()
    try:
        both = method(model).attribute(x, target=torch.tensor([[1, 2], [3, 4]]))
        assert len(calls) == 1 and both.shape == (2, 2, 1, 4, 4) and both.is_contiguous()
        first = method(model).attribute(x, target=[1, 3])
        second = method(model).attribute(x, target=[2, 4])
    finally:
        handle.remove()
    torch.testing.assert_close(both[:, 0], first, rtol=0, atol=1e-6)
    torch.testing.assert_close(both[:, 1], second, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_register_and_distillation_tokens_are_dropped_from_the_map(method) -> None:
    model = timm_vit(True, reg_tokens=3)  # 1 class + 3 register tokens + 16 patches
    x = images()
    probs, grads = timm_eager_reference(timm_vit(False, reg_tokens=3), x, [0, 0])
    got = method(model).attribute(x, 0)
    assert got.shape == (2, 1, 4, 4)
    ref = ref_rollout(probs) if method is hv.AttentionRollout else ref_chefer(probs, grads)
    assert_maps_close(got, as_map(ref, prefix=4), F32)


def test_a_model_without_prefix_tokens_reads_the_mean_of_the_rows() -> None:
    model = timm_vit(True, class_token=False, global_pool="avg")
    x = images()
    probs, _ = timm_eager_reference(timm_vit(False, class_token=False, global_pool="avg"), x, [0, 0])
    rows = np.stack([ref_rollout(probs, row=i) for i in range(16)]).mean(0)
    got = hv.AttentionRollout(model).attribute(x, 0)
    torch.testing.assert_close(got, as_map(rows, prefix=0).float(), **F32)


def test_text_token_scores_go_to_a_token_explanation() -> None:
    model = hf_bert("sdpa")
    ids, mask = tokens()
    method = hv.GradientRollout(model)
    exp = method.visualize(
        ids, target=[0, 1], vocab=[f"w{i}" for i in range(50)], forward_kwargs={"attention_mask": mask}
    )
    assert isinstance(exp, hv.TokenExplanation) and exp.token_scores.shape == (2, 1, 8)
    want = method.attribute(ids, target=[0, 1], forward_kwargs={"attention_mask": mask})
    torch.testing.assert_close(exp.token_scores[:, 0], want, rtol=0, atol=0)
    assert "w" in exp.to_html()


def test_visualize_and_grid_on_images() -> None:
    model = timm_vit(True)
    exp = hv.AttentionRollout(model).visualize(images(), preprocess=None)
    assert isinstance(exp, hv.Explanation) and exp.attribution.shape == (2, 1, 4, 4)
    fig = hv.grid([exp, hv.GradientRollout(model).visualize(images(), preprocess=None)])
    assert len(fig.axes) >= 6
    assert repr(hv.AttentionRollout(model, head_fusion="max")) == (
        "AttentionRollout(VisionTransformer, head_fusion='max', discard_ratio=0.0)"
    )


# -- errors before any work; the model left as it came -----------------------------------------------------------------
def _state(model: nn.Module) -> tuple:
    return (hook_counts(model), [m.training for m in model.modules()], [p.requires_grad for p in model.parameters()])


@pytest.mark.parametrize("method", METHODS)
def test_a_model_without_attention_is_refused(method) -> None:
    cnn = models.resnet18(weights=None, num_classes=10)
    with pytest.raises(ValueError, match=r"no attention found in ResNet: .*no nn.MultiheadAttention"):
        method(cnn)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_fusion": "median"}, r"head_fusion must be one of 'mean', 'max', 'min'; got 'median'"),
        ({"head_fusion": None}, r"head_fusion must be one of 'mean', 'max', 'min'; got None"),
        ({"discard_ratio": 1.0}, r"discard_ratio must be a number in \[0, 1\) .* got 1.0"),
        ({"discard_ratio": -0.1}, r"discard_ratio must be a number in \[0, 1\) .* got -0.1"),
        ({"discard_ratio": True}, r"discard_ratio must be a number in \[0, 1\) .* got True"),
        ({"discard_ratio": "0.5"}, r"discard_ratio must be a number in \[0, 1\) .* got '0.5'"),
    ],
)
def test_bad_options_are_refused_before_any_work(kwargs, match) -> None:
    model = timm_vit(True)
    with pytest.raises(ValueError, match=match):
        hv.AttentionRollout(model, **kwargs)


def test_a_bad_token_is_refused() -> None:
    model = timm_vit(True)
    with pytest.raises(TypeError, match="token must be None"):
        hv.GradientRollout(model, token=1.5)
    with pytest.raises(ValueError, match=r"token=17 is out of range for 17 tokens \(valid: -17..16\)"):
        hv.GradientRollout(model, token=17).attribute(images())


class ScriptedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, h: Tensor) -> Tensor:
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


class FusedKernelAttention(nn.Module):
    """Attention through an op the capture does not know (a stand-in for a custom kernel)."""

    def forward(self, h: Tensor) -> Tensor:
        return torch.ops.aten._scaled_dot_product_attention_math(h, h, h)[0]


class Wrapper(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attention = attention
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.attention(self.embed(x)).mean(dim=1))


@pytest.mark.parametrize(
    ("attention", "kind"),
    [(torch.jit.script(ScriptedAttention()), "a TorchScript module"), (FusedKernelAttention(), "FusedKernelAttention")],
    ids=["torchscript", "custom-kernel"],
)
@pytest.mark.parametrize("method", METHODS)
def test_an_attention_the_capture_cannot_see_is_named(method, attention, kind) -> None:
    model = Wrapper(attention)
    before = _state(model)
    x = torch.randn(2, 5, 4)
    with pytest.raises(AttentionNotVisible, match=rf"the attention module 'attention' \({kind}\) r[au]n"):
        method(model).attribute(x)
    assert _state(model) == before and _get_current_function_mode_stack() == [] and current_call() is None


def test_cross_attention_shapes_are_refused_with_the_module_named() -> None:
    class PoolAttention(nn.Module):  # a learned query attends to the tokens: (1, T) probabilities
        def __init__(self) -> None:
            super().__init__()
            self.query = nn.Parameter(torch.randn(1, 1, 8))

        def forward(self, h: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(self.query.expand(h.shape[0], -1, -1), h, h)

    model = Wrapper(PoolAttention())
    with pytest.raises(
        ValueError, match=r"the attention in 'attention' \(sdpa\) has probabilities of shape \(2, 1, 1, 5\)"
    ):
        hv.AttentionRollout(model).attribute(torch.randn(2, 5, 4))


# -- what every method does (the every-method tests run on CNNs, which these methods refuse) -------------------------
@pytest.mark.parametrize("method", METHODS)
def test_non_finite_inputs_are_refused_before_the_forward_pass(method) -> None:
    model = timm_vit(True)
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    x = images()
    x[0, 0, 0, 0] = float("nan")
    try:
        with pytest.raises(ValueError, match=r"inputs: found 1 non-finite value\(s\) \(NaN or Inf\)"):
            method(model).attribute(x)
    finally:
        handle.remove()
    assert not calls


@pytest.mark.parametrize("method", METHODS)
def test_float64_and_inference_inputs_are_explained_like_float32_ones(method) -> None:
    model = timm_vit(True)
    x = images()
    want = method(model).attribute(x, target=[1, 2])
    got = method(model).attribute(x.double(), target=[1, 2])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # float64 -> float32 gives x back exactly
    with torch.inference_mode():
        xi = x.clone()
    torch.testing.assert_close(method(model).attribute(xi, target=[1, 2]), want, rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_a_deep_copy_explains_like_the_original(method) -> None:
    import copy

    explainer = method(timm_vit(True))
    twin = copy.deepcopy(explainer)
    assert twin.model is not explainer.model
    torch.testing.assert_close(twin.attribute(images(), 1), explainer.attribute(images(), 1))


# -- everywhere a method goes ------------------------------------------------------------------------------------------
def test_data_set_report_evaluate_and_sanity_check_take_the_rollouts(tmp_path) -> None:
    from hookviz.cli.common import _parse_methods
    from hookviz.zoo import CLASSES, ShapesDataset, shapes

    assert _parse_methods("attention-rollout,gradient-rollout") == ["attention-rollout", "gradient-rollout"]
    vit = timm_vit(True, img_size=64, patch_size=16, num_classes=len(CLASSES))
    data = ShapesDataset(4, seed=5)
    stores = []
    for name in ("attention-rollout", "gradient-rollout"):
        store = hv.explain_dataset(hv.METHODS[name](vit), data, tmp_path / name, target="label", progress=False)
        direct = hv.METHODS[name](vit).attribute(data.shapes.images[:4], target=data.shapes.labels[:4])
        assert len(store) == 4 and store[:].shape == (4, 1, 4, 4)
        torch.testing.assert_close(store[:].float(), direct, rtol=1e-2, atol=1e-3 * direct.abs().max())  # float16
        stores.append(tmp_path / name)
    assert hv.report(stores, tmp_path / "report", data=data, model=vit, workers=1).is_file()
    fresh = shapes(4, seed=9)
    evaluation = hv.evaluate(["attention-rollout", "gradient-rollout"], vit, fresh, steps=4, sanity_n=2, progress=False)
    assert evaluation.methods == ["attention-rollout", "gradient-rollout"] and torch.isfinite(evaluation.table).any()
    sanity = hv.sanity_check(hv.GradientRollout(vit), fresh.images[:2], target=fresh.labels[:2])
    assert len(sanity.layers) > 2


def test_two_threads_explain_at_once_each_with_its_own_capture() -> None:
    # the function mode and the hooks act only for their own call's thread: a fused ViT and an eager BERT explained
    # at the same time give what they give alone
    import threading

    vit, (bert, (ids, mask)) = timm_vit(True), (hf_bert("sdpa"), tokens())
    x = images()
    alone = (
        hv.GradientRollout(vit).attribute(x, 1),
        hv.GradientRollout(bert).attribute(ids, 1, forward_kwargs={"attention_mask": mask}),
    )
    got: dict[str, Tensor] = {}

    def run(key: str) -> None:
        for _ in range(3):
            if key == "vit":
                got[key] = hv.GradientRollout(vit).attribute(x, 1)
            else:
                got[key] = hv.GradientRollout(bert).attribute(ids, 1, forward_kwargs={"attention_mask": mask})

    threads = [threading.Thread(target=run, args=(k,)) for k in ("vit", "bert")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert_maps_close(got["vit"], alone[0], F32)  # the same computation; the tolerance covers a thread split
    assert_maps_close(got["bert"][:, 1:], alone[1][:, 1:], F32)
