"""AttnLRP and CP-LRP (`hv.LRP(model, "attn-lrp" | "cp-lrp")`): against a float64 reference written from the papers
on one transformer block, fused attention against the explicit form, the transformer families, errors, and lxt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from refs import require
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import composite as composite_of

EPS = 1e-6  # the composites' default stabilizer, used by the reference too


# the audit entries of the softmax rule: AttnLRP's; CP-LRP holds the probabilities (no relevance reaches the logits)
_SOFTMAX = {"attn-lrp": {"softmax"}, "cp-lrp": set()}


def stab(z: Tensor, eps: float = EPS) -> Tensor:
    return z + torch.where(z >= 0, eps, -eps).to(z.dtype)


# -- a transformer block written out, and its relevance computed by hand from the papers ----------------------------
class Block(nn.Module):
    """Pre-norm block with explicit attention (q kᵀ, softmax, p v) and a GELU or a gated SiLU MLP, mean pooling, a
    linear head. Input (N, T, D) float tokens."""

    def __init__(self, d: int = 8, heads: int = 2, gated: bool = False, rms: bool = False) -> None:
        super().__init__()
        self.h, self.gated = heads, gated
        self.norm1 = nn.RMSNorm(d, eps=1e-5) if rms else nn.LayerNorm(d)
        self.norm2 = nn.RMSNorm(d, eps=1e-5) if rms else nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        if gated:
            self.gate, self.up, self.down, self.act = (
                nn.Linear(d, 2 * d),
                nn.Linear(d, 2 * d),
                nn.Linear(2 * d, d),
                nn.SiLU(),
            )
        else:
            self.fc1, self.fc2, self.act = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.GELU()
        self.head = nn.Linear(d, 3)
        for p in self.parameters():  # norm affine parameters and biases away from their defaults
            nn.init.normal_(p, std=0.5) if p.dim() == 1 else None

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).reshape(n, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-2, -1)) * (d // self.h) ** -0.5
        p = s.softmax(dim=-1)
        o = (p @ v).transpose(1, 2).reshape(n, t, d)
        x = x + self.proj(o)
        h2 = self.norm2(x)
        m = self.down(self.act(self.gate(h2)) * self.up(h2)) if self.gated else self.fc2(self.act(self.fc1(h2)))
        x = x + m
        return self.head(x.mean(1))


def _norm_t(norm: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    """A^T g for the normalisation with 1/std held constant (the identity rule)."""
    if isinstance(norm, nn.LayerNorm):
        sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
        h = g * norm.weight / sigma
        return h - h.mean(-1, keepdim=True)
    sigma = (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
    return g * norm.weight / sigma


def reference(model: Block, x: Tensor, target: int, cp: bool) -> Tensor:
    """The relevance of `x`, by the AttnLRP rules (Achtibat et al., 2024) or CP-LRP (Ali et al., 2022), by hand."""
    with torch.no_grad():
        n, t, d = x.shape
        hd = d // model.h
        lin = lambda layer, a: a @ layer.weight.T + layer.bias  # noqa: E731
        h = model.norm1(x)
        qkv = lin(model.qkv, h)
        q, k, v = qkv.reshape(n, t, 3, model.h, hd).permute(2, 0, 3, 1, 4)
        qk = q @ k.transpose(-2, -1)
        s = qk * hd**-0.5
        p = s.softmax(-1)
        pv = p @ v
        o = pv.transpose(1, 2).reshape(n, t, d)
        y = lin(model.proj, o)
        x1 = x + y
        h2 = model.norm2(x1)
        if model.gated:
            gz, u = lin(model.gate, h2), lin(model.up, h2)
            a = model.act(gz)
            gm = a * u
            m = lin(model.down, gm)
        else:
            z1 = lin(model.fc1, h2)
            a = model.act(z1)
            m = lin(model.fc2, a)
        x2 = x1 + m
        pool = x2.mean(1)
        out = lin(model.head, pool)

        eps_linear = lambda layer, a, z, r: a * ((r / stab(z)) @ layer.weight)  # noqa: E731  LRP-epsilon
        r = torch.zeros_like(out)
        r[:, target] = out[:, target]
        r_pool = eps_linear(model.head, pool, out, r)
        r_x2 = x2 * (r_pool / stab(pool)).unsqueeze(1) / t  # mean pooling: Norm rule
        r_x1 = x1 * r_x2 / stab(x2)  # residual sum: Norm rule
        r_m = m * r_x2 / stab(x2)
        if model.gated:
            r_gm = eps_linear(model.down, gm, m, r_m)
            g = r_gm / stab(gm)
            r_a, r_u = (torch.zeros_like(a), u * g * a) if cp else (0.5 * a * g * u, 0.5 * u * g * a)
            r_h2 = eps_linear(model.gate, h2, gz, r_a) + eps_linear(model.up, h2, u, r_u)  # SiLU: identity rule
        else:
            r_a = eps_linear(model.fc2, a, m, r_m)
            r_h2 = eps_linear(model.fc1, h2, z1, r_a)  # GELU: identity rule
        r_x1 = r_x1 + x1 * _norm_t(model.norm2, x1, r_h2 / stab(h2))
        r_x = x * r_x1 / stab(x1)
        r_y = y * r_x1 / stab(x1)
        r_o = eps_linear(model.proj, o, y, r_y)
        r_pv = r_o.reshape(n, t, model.h, hd).transpose(1, 2)
        g = r_pv / stab(pv)
        if cp:  # attention probabilities held constant: all to v, nothing to the logits
            r_p, r_v = torch.zeros_like(p), v * (p.transpose(-2, -1) @ g)
        else:  # uniform rule on p v
            r_p, r_v = 0.5 * p * (g @ v.transpose(-2, -1)), 0.5 * v * (p.transpose(-2, -1) @ g)
        r_s = s * (r_p - p * r_p.sum(-1, keepdim=True))  # softmax rule; the scaling passes relevance unchanged
        gs = r_s / stab(qk)
        r_q, r_k = 0.5 * q * (gs @ k), 0.5 * k * (gs.transpose(-2, -1) @ q)  # uniform rule on q kᵀ
        r_qkv = torch.stack([r_q, r_k, r_v]).permute(1, 3, 0, 2, 4).reshape(n, t, 3 * d)
        r_h = eps_linear(model.qkv, h, qkv, r_qkv)
        return r_x + x * _norm_t(model.norm1, x, r_h / stab(h))


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("gated, rms", [(False, False), (True, True)], ids=["layernorm-gelu", "rmsnorm-gated-silu"])
def test_equals_float64_reference_on_one_block(composite: str, gated: bool, rms: bool) -> None:
    torch.manual_seed(0)
    model = Block(gated=gated, rms=rms).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    lrp = hv.LRP(model, composite)
    got = lrp.attribute(x, target=1)
    want = reference(model, x, 1, cp=composite == "cp-lrp")
    # float64 on both sides, the same formulas in another order: agreement to float64 rounding amplified by the
    # stabilized divisions (1e-9 relative to the largest relevance)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * float(want.abs().max()))
    assert float(want.abs().sum()) > 0
    rules = {e.rule for e in lrp.audit.entries}
    # CP-LRP holds the probabilities: its softmax passes nothing and has no entry in gradient form
    assert {"identity-norm", "uniform", "epsilon", "norm", *_SOFTMAX[composite]} <= rules


def test_cp_lrp_conserves_without_biases() -> None:
    """CP-LRP is conservative where nothing absorbs relevance: no biases, no norm offsets (Ali et al., 2022)."""
    torch.manual_seed(1)
    model = Block(gated=True, rms=True).double().eval()
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            nn.init.zeros_(mod.bias)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    lrp = hv.LRP(model, "cp-lrp", epsilon=0.0)
    lrp.attribute(x, target=0)
    # only the sums' stabilizer (1e-6) leaks
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-5)


# -- fused attention equals the explicit form ------------------------------------------------------------------------
def _timm_vit(fused: bool, **kw) -> nn.Module:
    timm = require("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
        mlp_ratio=2, num_classes=5, **kw,
    )  # fmt: skip
    for blk in model.blocks:
        blk.attn.fused_attn = fused
    return model.eval()


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_timm_sdpa_equals_explicit_attention(composite: str) -> None:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    fused = hv.LRP(_timm_vit(True).double(), composite, epsilon=0.0).attribute(x, target=2)
    explicit = hv.LRP(_timm_vit(False).double(), composite, epsilon=0.0).attribute(x, target=2)
    # float64, the same rules on the same numbers (timm scales q before q kᵀ, the decomposition after: rounding)
    torch.testing.assert_close(fused, explicit, rtol=1e-9, atol=1e-12)


class ExplicitMHA(nn.Module):
    """nn.MultiheadAttention (batch_first) written out with the same parameters."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.h = mha.num_heads
        e = mha.embed_dim
        self.q, self.k, self.v, self.o = (nn.Linear(e, e).double() for _ in range(4))
        with torch.no_grad():
            for lin, w, b in zip(
                (self.q, self.k, self.v), mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3), strict=True
            ):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
            self.o.weight.copy_(mha.out_proj.weight)
            self.o.bias.copy_(mha.out_proj.bias)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, need_weights: bool = False) -> tuple[Tensor, None]:
        n, t, e = query.shape
        split = lambda a: a.reshape(n, t, self.h, e // self.h).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(query)), split(self.k(key)), split(self.v(value))
        p = ((q @ k.transpose(-2, -1)) * (e // self.h) ** -0.5).softmax(-1)
        return self.o((p @ v).transpose(1, 2).reshape(n, t, e)), None


def _torchvision_vit() -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5
    )
    nn.init.normal_(model.heads.head.weight, std=0.2)  # torchvision starts the head at zero (a zero output)
    return model.eval()


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_multihead_attention_equals_explicit_attention(composite: str) -> None:
    model = _torchvision_vit().double()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    fused = hv.LRP(model, composite, epsilon=0.0).attribute(x, target=1)
    for layer in model.encoder.layers:
        layer.self_attention = ExplicitMHA(layer.self_attention)
    explicit = hv.LRP(model, composite, epsilon=0.0).attribute(x, target=1)
    torch.testing.assert_close(fused, explicit, rtol=1e-9, atol=1e-12)  # float64 rounding, as above


def _hf(kind: str, impl: str = "eager") -> nn.Module:
    tf = require("transformers")
    torch.manual_seed(0)
    if kind == "llama":
        cfg = tf.LlamaConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=32,
        )  # fmt: skip
        model = tf.LlamaForCausalLM._from_config(cfg, attn_implementation=impl)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0
        )
        model = tf.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl)
    elif kind == "bert":
        cfg = tf.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, num_labels=3,
        )  # fmt: skip
        model = tf.BertForSequenceClassification._from_config(cfg, attn_implementation=impl)
    elif kind in _DECODERS:
        # the LLaMA's relatives: Qwen2 (q, k, v biases), Gemma ((1 + w) RMSNorm, GELU-tanh gate, scaled embeddings),
        # Mistral (sliding window), Phi-3 (fused qkv and gate-up projections), Qwen3 (q and k RMSNorms)
        config, causal_lm, extra = _DECODERS[kind]
        cfg = getattr(tf, config)(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=32, **extra,
        )  # fmt: skip
        model = getattr(tf, causal_lm)._from_config(cfg, attn_implementation=impl)
    elif kind == "dinov2":  # layer scale (a leaf with a parameter), register-free, class token and position embeddings
        cfg = tf.Dinov2Config(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, num_labels=5,
        )  # fmt: skip
        model = tf.Dinov2ForImageClassification._from_config(cfg, attn_implementation=impl)
    elif kind == "swin":  # windows, shifted windows, relative position bias (a leaf with a parameter), patch merging
        cfg = tf.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[1, 2], window_size=4, num_labels=5
        )
        model = tf.SwinForImageClassification._from_config(cfg, attn_implementation=impl)
    else:
        cfg = tf.ViTConfig(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, num_labels=5,
        )  # fmt: skip
        model = tf.ViTForImageClassification._from_config(cfg, attn_implementation=impl)
    return model.eval()


_DECODERS: dict[str, tuple[str, str, dict]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
}


_LAST = {k: (lambda out: out.logits[:, -1, 5]) for k in ("llama", "gpt2", *_DECODERS)}
_EMBED = {"llama": "model.embed_tokens", "gpt2": "transformer.wte", "bert": "bert.embeddings.word_embeddings"}
_EMBED |= dict.fromkeys(_DECODERS, "model.embed_tokens")


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert", "vit"])
def test_hugging_face_sdpa_equals_eager(kind: str) -> None:
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(4))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = {}
    for impl in ("eager", "sdpa"):
        model = _hf(kind, impl).double()
        inp = x if kind == "vit" else ids
        lrp = hv.LRP(model, "attn-lrp", epsilon=0.0, layer=_EMBED.get(kind))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every operation covered
            got[impl] = lrp.attribute(inp, target=_LAST.get(kind, 1))
    # Hugging Face's eager attention computes its softmax in float32 even in a float64 model (softmax(...,
    # dtype=torch.float32)): 1e-7 relative on the probabilities, 1e-6 of the largest relevance after two layers
    big = float(got["eager"].abs().max())
    torch.testing.assert_close(got["sdpa"], got["eager"], rtol=0, atol=1e-6 * big)
    assert big > 0


# -- the families: shapes, finite, conservation reported -------------------------------------------------------------
def _family(name: str) -> tuple[nn.Module, Tensor, dict]:
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(5))
    img = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    if name.startswith("timm"):
        return _timm_vit(name.endswith("fused")), img, {}
    if name == "deit":
        return _deit(), img, {}
    if name == "torchvision":
        return _torchvision_vit(), img, {}
    kind, impl = name.split("-")
    return _hf(kind, impl), (img if kind in ("vit", "dinov2", "swin") else ids), {"layer": _EMBED.get(kind)}


def _deit() -> nn.Module:
    timm = require("timm")
    torch.manual_seed(0)
    return timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2,
        num_heads=2, mlp_ratio=2, num_classes=5,
    ).eval()  # fmt: skip


FAMILIES = [
    "timm-fused", "timm-explicit", "deit", "torchvision", "vit-eager", "vit-sdpa", "bert-eager", "bert-sdpa",
    "gpt2-eager", "gpt2-sdpa", "llama-eager", "llama-sdpa", "qwen2-sdpa", "gemma-sdpa", "mistral-sdpa", "phi3-sdpa",
    "qwen3-sdpa", "dinov2-sdpa", "swin-eager",
]  # fmt: skip


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("family", FAMILIES)
def test_families_run_with_every_operation_covered(family: str, composite: str) -> None:
    model, x, kw = _family(family)
    lrp = hv.LRP(model, composite, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no operation left to a plain gradient
        rel = lrp.attribute(x, target=_LAST.get(family.split("-")[0], 1))
    layer_shape = (2, 8, 32) if kw.get("layer") else tuple(x.shape)
    assert tuple(rel.shape) == layer_shape and bool(torch.isfinite(rel).all()) and float(rel.abs().sum()) > 0
    cons = lrp.audit.conservation
    assert cons.shape == (2,) and bool(torch.isfinite(cons).all())
    rules = {e.rule for e in lrp.audit.entries}
    assert {"identity-norm", "uniform", *_SOFTMAX[composite]} <= rules
    if family.startswith("llama") and composite == "cp-lrp":
        # no biases, no position embeddings, rotary and RMSNorm linear without offset: CP-LRP conserves (the sums'
        # stabilizer 1e-6 aside)
        torch.testing.assert_close(cons, torch.ones(2), rtol=0, atol=2e-3)


_AFTER_EMBEDDINGS = {
    "bert-eager": "bert.embeddings", "vit-eager": "vit.embeddings", "gpt2-eager": "transformer.drop",
    "timm-fused": "pos_drop", "torchvision": "encoder.dropout", "llama-eager": "model.embed_tokens",
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(_AFTER_EMBEDDINGS))
def test_cp_lrp_conserves_after_the_embeddings(family: str) -> None:
    """Past the embeddings (class token and position embeddings added) CP-LRP conserves on every family: the models
    are built with zero biases (timm, Hugging Face, torchvision initialise them so), so only the stabilizers leak."""
    model, x, _ = _family(family)
    lrp = hv.LRP(model, "cp-lrp", layer=_AFTER_EMBEDDINGS[family])
    lrp.attribute(x, target=_LAST.get(family.split("-")[0], 1))
    # 5e-3: the 1e-6 stabilizers on the small activations of random tiny models (HF ViT measured 0.996)
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(2), rtol=0, atol=5e-3)


def test_token_explanation_for_a_language_model() -> None:
    model = _hf("bert")
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    lrp = hv.LRP(model, "attn-lrp", layer="bert.embeddings.word_embeddings")
    exp = lrp.visualize(ids, target=1, forward_kwargs={"attention_mask": mask})
    assert isinstance(exp, hv.TokenExplanation) and exp.token_scores.shape == (2, 1, 8)
    direct = lrp.attribute(ids, target=1, forward_kwargs={"attention_mask": mask})
    torch.testing.assert_close(exp.token_scores[:, 0], direct.sum(-1))


def test_linear_gamma_uses_the_gamma_rule_on_linear_layers() -> None:
    model = _timm_vit(True)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    lrp = hv.LRP(model, "attn-lrp", linear_gamma=0.25)
    lrp.attribute(x, target=0)
    rules = {e.name: e.rule for e in lrp.audit.entries}
    assert rules["blocks.0.attn.qkv"] == "gamma" and rules["head"] == "gamma"
    with pytest.raises(ValueError, match="linear_gamma is an option of the transformer composites"):
        hv.LRP(model, "epsilon", linear_gamma=0.25)
    with pytest.raises(ValueError, match="linear_gamma must be None or a finite number >= 0"):
        hv.LRP(model, "attn-lrp", linear_gamma=-1.0)


def test_registered_names() -> None:
    for name in ("attn-lrp", "cp-lrp"):
        lrp = hv.get_method(f"lrp-{name}")(_timm_vit(True))
        assert isinstance(lrp, hv.LRP) and lrp.composite.name == name
        assert f"lrp-{name}" in hv.METHODS


# -- attention the engine cannot see: a clear error ------------------------------------------------------------------
class KernelAttention(nn.Module):
    """An attention computed by an op the rules do not know (here a custom autograd Function: a "kernel")."""

    class _Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # noqa: ANN001, ANN205
            p = torch.exp(q @ k.transpose(-2, -1))
            return (p / p.sum(-1, keepdim=True)) @ v

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            return g, g, g

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        return self._Kernel.apply(q, k, v)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_attention_the_engine_cannot_see_raises_naming_the_module() -> None:
    model = nn.Sequential(nn.Linear(8, 8), KernelAttention(), nn.Flatten(), nn.Linear(40, 3)).eval()
    with pytest.raises(RuntimeError, match=r"attention module '1' \(KernelAttention\) ran without any operation"):
        hv.LRP(model, "attn-lrp").attribute(torch.randn(2, 5, 8), target=0)
    scripted = nn.Sequential(torch.jit.script(nn.Linear(8, 8)), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"'0' \(RecursiveScriptModule\) is a TorchScript module"):
        hv.LRP(scripted, "attn-lrp")


def test_unidentifiable_normalisation_raises() -> None:
    class OddNorm(nn.Module):  # a "norm" by name whose output is neither a LayerNorm nor an RMSNorm
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x: Tensor) -> Tensor:
            return x * self.weight / x.abs().amax(-1, keepdim=True)

    OddNorm.__name__ = "OddRMSNorm"
    model = nn.Sequential(nn.Linear(8, 8), OddNorm(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match="looks like a normalisation layer, but its output is neither"):
        hv.LRP(model, "attn-lrp").attribute(torch.randn(2, 8), target=0)


# -- lxt (Achtibat et al.'s reference implementation) ---------------------------------------------------------------
_LXT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, types, torch
    sys.path[:0] = [{root!r}, {tests!r}]
    import lxt
    from test_attnlrp import _hf, _torchvision_vit, _LAST
    # lxt.efficient's __init__ imports its BERT copy, written for transformers 4 (transformers.modeling_attn_mask_utils
    # is gone in 5): the packages are entered without their __init__ to reach lxt 2.1's own rules and forwards
    base = os.path.join(os.path.dirname(lxt.__file__), "efficient")
    for name, path in (("lxt.efficient", base), ("lxt.efficient.models", os.path.join(base, "models"))):
        pkg = types.ModuleType(name)
        pkg.__path__ = [path]
        sys.modules[name] = pkg
    import lxt.efficient.patches as P
    from lxt.efficient.models.gpt2 import mlp_forward
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.llama import modeling_llama
    variant = sys.argv[1]
    attn = variant == "attn"
    wrap = P.wrap_attention_forward if attn else P.cp_wrap_attention_forward
    modeling_llama.LlamaRMSNorm.forward = P.rms_norm_forward
    modeling_llama.LlamaMLP.forward = P.gated_mlp_forward if attn else P.cp_gated_mlp_forward
    modeling_gpt2.GPT2MLP.forward = mlp_forward
    torch.nn.LayerNorm.forward = P.layer_norm_forward
    torch.nn.GELU.original_forward = torch.nn.GELU.forward
    torch.nn.GELU.forward = P.non_linear_forward
    torch.nn.MultiheadAttention.original_forward = torch.nn.MultiheadAttention.forward
    torch.nn.MultiheadAttention.forward = P.cp_multi_head_attention_forward
    for mod in (modeling_llama, modeling_gpt2):
        # lxt's patch_attention swaps ALL_ATTENTION_FUNCTIONS for a plain dict, which transformers 5 cannot use
        # (it calls .get_interface): lxt's own attention wrappers are installed into the registry instead
        mod.eager_attention_forward = wrap(mod.eager_attention_forward)
        for key in list(mod.ALL_ATTENTION_FUNCTIONS.keys()):
            mod.ALL_ATTENTION_FUNCTIONS[key] = wrap(mod.ALL_ATTENTION_FUNCTIONS[key])
    results = {{}}
    for kind in ("llama", "gpt2") + (() if attn else ("vit",)):
        if kind != "vit":
            model = _hf(kind, "eager").double()
            ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(8))
            emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            score = _LAST[kind](model(inputs_embeds=emb))
        else:  # lxt's torchvision ViT map is CP-LRP only
            model = _torchvision_vit().double()
            emb = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
            emb.requires_grad_(True)
            score = model(emb)[:, 1]
        score.sum().backward()
        results[kind] = (emb * emb.grad).tolist()
    print(json.dumps(results))
    """
)

_LXT_RESULTS: dict[str, dict] = {}


def _lxt(variant: str) -> dict:
    """lxt's relevance per model for `variant` ("attn" or "cp"), computed once in a process of its own: lxt patches
    classes globally (torch.nn.LayerNorm included)."""
    if variant not in _LXT_RESULTS:
        tests = os.path.dirname(os.path.abspath(__file__))
        script = _LXT_SCRIPT.format(root=os.path.dirname(tests), tests=tests)
        done = subprocess.run(
            [sys.executable, "-c", script, variant], capture_output=True, text=True,
            timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        _LXT_RESULTS[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    return _LXT_RESULTS[variant]


@pytest.mark.parametrize("kind, composite", [("llama", "attn-lrp"), ("llama", "cp-lrp"), ("gpt2", "attn-lrp"),
                                             ("gpt2", "cp-lrp"), ("vit", "cp-lrp")])  # fmt: skip
def test_equals_lxt(kind: str, composite: str) -> None:
    require("lxt")
    want = torch.tensor(_lxt("attn" if composite == "attn-lrp" else "cp")[kind], dtype=torch.float64)
    # lxt divides by activations without a stabilizer: so do the rules here (epsilon and the sums' stabilizer 0)
    comp = composite_of(composite, epsilon=0.0, stabilizer=0.0)
    if kind == "vit":
        model = _torchvision_vit().double()
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        got = hv.LRP(model, comp).attribute(x, target=1)
    else:
        model = _hf(kind, "eager").double()
        ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(8))
        got = hv.LRP(model, comp, layer=_EMBED[kind]).attribute(ids, target=_LAST[kind])
    print(kind, composite, float((got - want).abs().max() / want.abs().max()))
    # float64 both; lxt's RMSNorm computes in float32 (its rms_norm_forward casts), as does Hugging Face's eager
    # softmax on both sides; lxt's identity rule on activations divides by (x + 1e-10): 1e-6 of the largest relevance
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    assert float(want.abs().max()) > 0


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_language_model_restored_when_interrupted(kind: str, exc: type[BaseException]) -> None:
    """The model and the process come back as they were when the call is interrupted mid-forward."""
    from torch.overrides import _get_current_function_mode_stack

    model = _hf(kind).train()
    model.get_submodule("model.layers.1" if kind == "llama" else "transformer.h.1").eval()  # mixed modes
    training = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(9))
    lrp = hv.LRP(model, "attn-lrp", layer=_EMBED[kind])
    middle = model.get_submodule("model.layers.0.mlp" if kind == "llama" else "transformer.h.0.mlp")

    def boom(module: nn.Module, args: tuple, out: Tensor) -> None:
        raise exc("stop")

    handle = middle.register_forward_hook(boom)
    try:
        with pytest.raises(exc):
            lrp.attribute(ids, target=_LAST[kind])
    finally:
        handle.remove()
    assert _get_current_function_mode_stack() == []
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
    assert [m.training for m in model.modules()] == training
    assert all(p.requires_grad for p in model.parameters()) and all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    lrp.attribute(ids, target=_LAST[kind])  # and the explainer works again


class InPlaceBlock(nn.Module):
    """Attention whose intermediate outputs the model changes afterwards, in place or not: the rules' outputs are
    handed on without a copy, so a rule must notice the change and use the output as it computed it."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace
        self.norm, self.qkv, self.head = nn.LayerNorm(8), nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        h = h.add_(0.25) if self.inplace else h + 0.25  # the norm's output
        q, k, v = self.qkv(h).chunk(3, -1)
        s = q @ k.transpose(-2, -1)
        s = s.add_(0.5) if self.inplace else s + 0.5  # the product's output
        p = s.softmax(-1)
        p = p.add_(0.0) if self.inplace else p.clone()  # the softmax's output (still the probabilities for CP-LRP)
        o = p @ v
        o = o.add_(1.0) if self.inplace else o + 1.0  # the second product's output
        return self.head((o + x).mean(1))


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_outputs_changed_in_place_later_are_recomputed(composite: str) -> None:
    torch.manual_seed(3)
    plain = InPlaceBlock(inplace=False).double().eval()
    inplace = InPlaceBlock(inplace=True).double().eval()
    inplace.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    want = hv.LRP(plain, composite).attribute(x, target=1)
    got = hv.LRP(inplace, composite).attribute(x, target=1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)  # float64: the same numbers, recomputed
    assert float(want.abs().sum()) > 0


class ScaledBlock(nn.Module):
    """A residual branch scaled by a learned per-channel constant, in place (timm's LayerScale(inplace=True)) or not."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace
        self.fc, self.gamma, self.head = nn.Linear(8, 8), nn.Parameter(torch.full((8,), 0.3)), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc(x)
        y = y.mul_(self.gamma) if self.inplace else y * self.gamma
        return self.head((x + y).mean(1))


def test_scaling_by_a_constant_in_place_passes_relevance() -> None:
    torch.manual_seed(4)
    plain, inplace = ScaledBlock(False).double(), ScaledBlock(True).double()
    inplace.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    want = hv.LRP(plain, "attn-lrp").attribute(x, target=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # covered: no plain gradient through mul_
        got = hv.LRP(inplace, "attn-lrp").attribute(x, target=0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)  # float64, the same rules


def test_k_targets_equal_separate_calls() -> None:
    model = _timm_vit(True)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(10))
    lrp = hv.LRP(model, "attn-lrp")
    both = lrp.attribute(x, target=torch.tensor([[0, 3], [2, 1]]))
    assert both.shape == (2, 2, 3, 32, 32)
    for j in range(2):
        one = lrp.attribute(x, target=torch.tensor([[0, 3], [2, 1]])[:, j])
        torch.testing.assert_close(both[:, j], one, rtol=1e-5, atol=1e-7)  # float32; the same forward values


# -- the map does not depend on which parameters the user trains -----------------------------------------------------
@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("family", ["timm-fused", "torchvision", "vit-eager", "bert-eager", "gpt2-sdpa", "llama-eager"])
def test_map_is_the_same_with_frozen_parameters(family: str, composite: str) -> None:
    """A frozen position or token-type embedding is the same constant as a trainable one: the sum rule gives it its
    share either way (read from the graph, never from ``requires_grad``); the flags are left as they came."""
    model, x, kw = _family(family)
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    target = _LAST.get(family.split("-")[0], 1)
    trained = hv.LRP(model, composite, **kw).attribute(x, target=target)
    frozen_names = [name for i, (name, p) in enumerate(model.named_parameters()) if i % 2 == 0]
    for name, p in model.named_parameters():
        p.requires_grad_(name not in frozen_names)  # half frozen: the embeddings and some weights of each kind
    half = hv.LRP(model, composite, **kw).attribute(x, target=target)
    model.requires_grad_(False)
    frozen = hv.LRP(model, composite, **kw).attribute(x, target=target)
    assert not any(p.requires_grad for p in model.parameters())
    # the same rules on the same float64 numbers; autograd may sum a tensor's relevance contributions in another
    # order when parameters take part in the graph: float64 rounding of a few terms, 1e-12 of the largest relevance
    # (a constant handled differently moves the map by 1e-2 to 1, as the frozen position embedding did)
    big = float(trained.abs().max())
    torch.testing.assert_close(half, trained, rtol=0, atol=1e-12 * big)
    torch.testing.assert_close(frozen, trained, rtol=0, atol=1e-12 * big)
    assert big > 0


def test_frozen_position_embedding_gets_the_sum_rule_share() -> None:
    """By hand, on one addition: R_x = x R / (x + p) for a position embedding p, frozen or not (as lxt's gradient form
    gives it); relevance does not pass through the addition unchanged."""

    class PosAdd(nn.Module):  # a container with parameters of its own, as timm's and torchvision's ViTs are
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Parameter(torch.tensor([[0.5, -2.0, 1.0]], dtype=torch.float64))
            self.head = nn.Linear(3, 2, bias=False).double()
            nn.init.ones_(self.head.weight)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(x + self.pos)

    x = torch.tensor([[1.0, 3.0, -0.5]], dtype=torch.float64)
    for frozen in (False, True):
        model = PosAdd().requires_grad_(not frozen)
        got = hv.LRP(model, composite_of("attn-lrp", epsilon=0.0, stabilizer=0.0)).attribute(x, target=0)
        # the score is the sum of z = x + p (a linear layer of ones: z_i carries relevance z_i), x's share is x_i
        torch.testing.assert_close(got, x, rtol=1e-15, atol=0)


# -- attention written with einsum or baddbmm, and nn.MultiheadAttention's extra keys -------------------------------
class StyledBlock(Block):
    """`Block` with an additive attention bias (ALiBi-like: a constant) and its scores and mixing written as
    ``@`` (the reference), ``torch.einsum``, or ``torch.baddbmm`` / ``torch.bmm`` (GPT-2's and Bloom's style)."""

    def __init__(self, style: str) -> None:
        super().__init__(d=8, heads=2)
        self.style = style
        t = 5
        self.register_buffer("bias", -0.3 * (torch.arange(t)[None, :] - torch.arange(t)[:, None]).abs().double())

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        hd, scale = d // self.h, (d // self.h) ** -0.5
        q, k, v = self.qkv(self.norm1(x)).reshape(n, t, 3, self.h, hd).permute(2, 0, 3, 1, 4)
        if self.style == "matmul":
            p = ((q @ k.transpose(-2, -1)) * scale + self.bias).softmax(-1)
            o = p @ v
        elif self.style == "einsum":
            p = (torch.einsum("nhqd,nhkd->nhqk", q, k) * scale + self.bias).softmax(-1)
            o = torch.einsum("nhqk,nhkd->nhqd", p, v)
        else:
            flat = lambda a: a.reshape(n * self.h, t, hd)  # noqa: E731
            s = torch.baddbmm(self.bias.expand(n * self.h, t, t), flat(q), flat(k).transpose(1, 2), alpha=scale)
            o = torch.bmm(s.softmax(-1), flat(v)).reshape(n, self.h, t, hd)
        x = x + self.proj(o.transpose(1, 2).reshape(n, t, d))
        x = x + self.fc2(self.act(self.fc1(self.norm2(x))))
        return self.head(x.mean(1))


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("style", ["einsum", "baddbmm"])
def test_einsum_and_baddbmm_attention_equal_matmul(style: str, composite: str) -> None:
    torch.manual_seed(11)
    ref = StyledBlock("matmul").double()
    model = StyledBlock(style).double()
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    # epsilon 0: the product's stabilizer sees the scaled scores in baddbmm (alpha) and the unscaled ones in the
    # reference (scaled after), which with epsilon 1e-6 differ by 1e-6 relative
    want = hv.LRP(ref, composite, epsilon=0.0).attribute(x, target=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every operation covered
        lrp = hv.LRP(model, composite, epsilon=0.0)
        got = lrp.attribute(x, target=1)
    assert {"uniform", *_SOFTMAX[composite]} <= {e.rule for e in lrp.audit.entries}
    # float64, the same rules; the scale enters the product's stabilized denominator in one form and is applied
    # after it in the other: float64 rounding
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * float(want.abs().max()))


class ExplicitBiasKV(nn.Module):
    """nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True, batch_first=True) written out: the learned key
    and value and then a zero key and value appended to every sequence's keys and values."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.inner = ExplicitMHA(mha)
        self.bias_k, self.bias_v = mha.bias_k, mha.bias_v

    def forward(self, query: Tensor, key: Tensor, value: Tensor, need_weights: bool = False) -> tuple[Tensor, None]:
        m = self.inner
        n, t, e = query.shape
        zero = torch.zeros(n, 1, e, dtype=query.dtype)
        k = torch.cat([m.k(key), self.bias_k.expand(n, 1, e), zero], 1)
        v = torch.cat([m.v(value), self.bias_v.expand(n, 1, e), zero], 1)
        split = lambda a: a.reshape(n, a.shape[1], m.h, e // m.h).transpose(1, 2)  # noqa: E731
        q, k, v = split(m.q(query)), split(k), split(v)
        # q scaled first: the product's stabilizer then sees the same scaled scores as in the decomposed call
        p = ((q * (e // m.h) ** -0.5) @ k.transpose(-2, -1)).softmax(-1)
        return m.o((p @ v).transpose(1, 2).reshape(n, t, e)), None


class MHABlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, batch_first=True)
        self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        return self.head((x + self.attn(h, h, h, need_weights=False)[0]).mean(1))


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_multihead_attention_with_bias_kv_and_zero_attn_equals_explicit(composite: str) -> None:
    torch.manual_seed(12)
    model = MHABlock().double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    # the default epsilon: the zero key's scores are exactly 0, which epsilon 0 would divide by
    fused = hv.LRP(model, composite).attribute(x, target=2)
    model.attn = ExplicitBiasKV(model.attn)
    explicit = hv.LRP(model, composite).attribute(x, target=2)
    torch.testing.assert_close(fused, explicit, rtol=1e-9, atol=1e-12)  # float64 rounding, as above
    assert float(fused.abs().max()) > 0


def test_module_kind_by_name_and_own_members() -> None:
    """`module_kind` (read on every module at every call, so it reads a module's own dicts and its class once):
    what it says for each kind of module it tells apart."""
    require("transformers")
    from transformers.activations import GELUActivation
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.pytorch_utils import Conv1D

    from hookviz.methods.lrp.transformer import module_kind

    class T5LayerNorm(nn.Module):  # found by name: a norm with no children
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

    class MyGroupNorm(T5LayerNorm):  # "Group": not a last-axis norm
        pass

    class LayerNormBlock(nn.Module):  # a norm's name, but children: a container
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(4)

    class Embeddings(nn.Module):  # own parameters and children: constants absorbed like a bias
        def __init__(self) -> None:
            super().__init__()
            self.cls = nn.Parameter(torch.zeros(1, 1, 4))
            self.proj = nn.Linear(4, 4)

    holder = Embeddings()
    holder.register_parameter("unused", None)  # a None entry is not a parameter
    cases = [
        (LlamaRMSNorm(4), "norm"), (T5LayerNorm(), "norm"), (MyGroupNorm(), None), (LayerNormBlock(), None),
        (Conv1D(4, 3), "conv1d"), (GELUActivation(), "activation"), (Embeddings(), "parameters"),
        (holder, "parameters"), (nn.LayerNorm(4), None), (nn.RMSNorm(4), None), (nn.Linear(3, 4), None),
        (nn.Sequential(nn.Linear(3, 4)), None),
    ]  # fmt: skip
    assert [module_kind(m) for m, _ in cases] == [kind for _, kind in cases]
