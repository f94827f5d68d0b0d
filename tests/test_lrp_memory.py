"""What the AttnLRP / CP-LRP rules keep for the backward pass: attention as one Function that recomputes its scores
and probabilities (equal to the decomposed calls, map and audit), and what the rules hold after the forward pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lrp_relevance_form import relevance_form_lrp
from lrp_relevance_form.transformer_ops import TransformerOps
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import composite as composite_of


class SdpaBlock(nn.Module):
    """One attention block on (N, T, D) tokens through F.scaled_dot_product_attention, with a mask of `mask` kind."""

    def __init__(self, mask: str, d: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.mask, self.h = mask, heads
        self.qkv, self.proj, self.head = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 3)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        kw: dict = {}
        if self.mask == "causal":
            kw["is_causal"] = True
        elif self.mask == "bool":
            keep = torch.ones(t, t, dtype=torch.bool)
            keep[:, -2:] = False  # the last two keys masked out for every query
            kw["attn_mask"] = keep
        elif self.mask == "float":
            kw["attn_mask"] = torch.linspace(-1.0, 1.0, t * t, dtype=x.dtype).reshape(t, t)
        o = F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2).reshape(n, t, d)
        return self.head((x + self.proj(o)).mean(1))


def _run(
    model: nn.Module, composite: object, x: Tensor, relevance_form: bool = True
) -> tuple[Tensor, list[tuple[str, str, Tensor, Tensor]]]:
    if relevance_form:  # each rule its own Function carrying relevance (tests/lrp_relevance_form/)
        r, found = relevance_form_lrp(model, composite, x, 1)
    else:
        lrp = hv.LRP(model, composite)
        r = lrp.attribute(x, target=1)
        assert lrp.audit is not None
        found = lrp.audit
    audit = [(e.name, e.rule, e.entered, e.left) for e in found.entries]
    return r, audit


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_fused_attention_equals_the_decomposed_calls(
    mask: str, composite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-Function attention (scores and probabilities recomputed in the backward pass) against the q kᵀ, mask,
    softmax and p v calls it replaces, with the default epsilon and stabilizer (1e-6), maps and audit entries."""
    torch.manual_seed(0)
    model = SdpaBlock(mask).double().eval()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    fused, fused_audit = _run(model, composite, x)
    monkeypatch.setattr(TransformerOps, "attention", lambda self, *args: None)  # every attention decomposed
    decomposed, decomposed_audit = _run(model, composite, x)
    # float64, the same operations on the same numbers in the same order: equal up to rounding
    torch.testing.assert_close(fused, decomposed, rtol=1e-12, atol=1e-15)
    assert float(fused.abs().sum()) > 0
    assert [a[:2] for a in fused_audit] == [a[:2] for a in decomposed_audit]
    assert any("softmax" in a[0] for a in fused_audit)
    assert (mask == "none") != any("mask" in a[0] for a in fused_audit)
    for (name, _, ent, left), (_, _, ent2, left2) in zip(fused_audit, decomposed_audit, strict=True):
        assert (ent is None) == (ent2 is None), name
        if ent is not None:
            torch.testing.assert_close(ent, ent2, rtol=1e-12, atol=1e-15, msg=name)
            torch.testing.assert_close(left, left2, rtol=1e-12, atol=1e-15, msg=name)


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_gradient_form_attention_equals_its_parts_and_the_relevance_form(
    mask: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AttnLRP with its stabilizers in gradient form: the one Function that keeps q, k, v alone
    (`gradient_attention`) against the parts it replaces (q kᵀ, mask, softmax, p v, each with its factor), and both
    against the relevance form: maps and the attention's audit entries, float64."""
    from hookviz.methods.lrp.gradient_ops import GradientOps

    torch.manual_seed(0)
    model = SdpaBlock(mask).double().eval()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    one, one_audit = _run(model, "attn-lrp", x, relevance_form=False)
    want, want_audit = _run(model, "attn-lrp", x)
    monkeypatch.setattr(GradientOps, "attention", lambda self, *args: None)  # every attention decomposed
    parts, parts_audit = _run(model, "attn-lrp", x, relevance_form=False)
    assert float(want.abs().sum()) > 0
    # float64, the same rules, the factor z / stab(z) applied to g instead of R divided by stab(z): rounding
    for got in (one, parts):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15 * float(want.abs().max()))
    assert [a[:2] for a in one_audit] == [a[:2] for a in parts_audit]
    want_by_name = {a[0]: a for a in want_audit}
    names = [a[0] for a in one_audit if "sdpa" in a[0] or "scaled_dot_product" in a[0]]
    assert len(names) == 4 - (mask == "none")  # q@k, mask, softmax, p@v
    for audit in (one_audit, parts_audit):
        for name, _, ent, left in audit:
            if name in names:
                ref = want_by_name[name.replace("F.scaled_dot_product_attention", "sdpa")]
                torch.testing.assert_close(ent, ref[2], rtol=1e-10, atol=1e-14, msg=name)
                torch.testing.assert_close(left, ref[3], rtol=1e-10, atol=1e-14, msg=name)


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_fused_attention_in_float32_without_epsilon_is_the_decomposed_calls_bit_for_bit(
    composite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With epsilon 0 the rules divide by the outputs themselves, so the output the backward pass computes again must
    be the forward pass's, bit for bit (an output from another kernel differs by rounding, which near zero is large):
    in float32 the one Function and the decomposed calls give the same map exactly."""
    torch.manual_seed(0)
    model = SdpaBlock("float").eval()
    x = torch.randn(2, 6, 8)
    comp = composite_of(composite, epsilon=0.0, stabilizer=0.0)
    fused, _ = _run(model, comp, x)
    monkeypatch.setattr(TransformerOps, "attention", lambda self, *args: None)
    decomposed, _ = _run(model, comp, x)
    assert float(fused.abs().sum()) > 0
    torch.testing.assert_close(fused, decomposed, rtol=0, atol=0)  # the same float32 operations in the same order


def _kept_storages(scores: Tensor) -> dict[int, tuple[int, ...]]:
    """data pointer -> shape of every tensor the rules' autograd Functions keep (``ctx.call``) in the graph of
    `scores` (a `Recompute` keeps its source only)."""
    from lrp_relevance_form.rulecall import Recompute

    kept: dict[int, tuple[int, ...]] = {}

    def add(obj: object, depth: int = 0) -> None:
        if isinstance(obj, Tensor):
            kept[obj.untyped_storage().data_ptr()] = tuple(obj.shape)
        elif isinstance(obj, Recompute):
            add(obj.source, depth + 1)
        elif isinstance(obj, (tuple, list)) and depth < 3:
            for o in obj:
                add(o, depth + 1)
        elif hasattr(obj, "__slots__") and depth < 2:
            for name in obj.__slots__:
                if name not in ("entry", "rule", "layer", "fn"):
                    add(getattr(obj, name, None), depth + 1)

    seen, stack = set(), [scores.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        add(getattr(node, "call", None))
        stack.extend(f for f, _ in node.next_functions)
    return kept


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_rules_keep_no_probabilities_activations_or_norm_outputs(
    composite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a timm ViT (fused attention): after the forward pass the rules keep no (N, heads, T, T) tensor and no output
    of a block's LayerNorm or GELU (computed again in the backward pass), but do keep the first MLP layer's outputs
    (the input the GELU is computed again from)."""
    timm = pytest.importorskip("timm")
    import lrp_relevance_form as relevance_form

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
        mlp_ratio=2, num_classes=5,
    ).eval()  # fmt: skip
    outputs: dict[str, list[Tensor]] = {"recomputed": [], "fc1": []}  # held here: no address is reused
    handles = []
    for name, m in model.named_modules():
        if name.startswith("blocks.") and isinstance(m, (nn.LayerNorm, nn.GELU)):
            handles.append(m.register_forward_hook(lambda m, a, out: outputs["recomputed"].append(out)))
        elif name.endswith("mlp.fc1"):
            handles.append(m.register_forward_hook(lambda m, a, out: outputs["fc1"].append(out)))
    found: dict[int, tuple[int, ...]] = {}
    grad = relevance_form.batched_grad

    def spy(scores: Tensor, inputs: list[Tensor], **kw: object) -> list[Tensor]:
        found.update(_kept_storages(scores))
        return grad(scores, inputs, **kw)

    # the relevance form (each rule a Function whose ``ctx.call`` holds what it keeps)
    monkeypatch.setattr(relevance_form, "batched_grad", spy)
    x = torch.randn(2, 3, 32, 32)
    r, _ = relevance_form.relevance_form_lrp(model, composite, x, 1)
    for h in handles:
        h.remove()
    assert r.shape == x.shape and found
    assert len(outputs["recomputed"]) == 2 * 3 and len(outputs["fc1"]) == 2
    assert not [s for s in found.values() if s == (2, 2, 17, 17)]  # attention probabilities / scores
    ptrs = {o.untyped_storage().data_ptr() for o in outputs["recomputed"]}
    assert not ptrs & set(found)
    assert {o.untyped_storage().data_ptr() for o in outputs["fc1"]} <= set(found)


def test_audit_sums_in_one_buffer_equal_separate_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's per-entry sums, written into one buffer per pass (`AuditBook`), equal the sums kept as separate
    tensors, also accumulated over K = 2 targets (two backward passes)."""
    from hookviz.methods.lrp.audit import AuditBook

    torch.manual_seed(1)
    model = SdpaBlock("float").double().eval()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    targets = torch.tensor([[0, 2], [1, 0]])
    lrp = hv.LRP(model, "attn-lrp")
    lrp.attribute(x, target=targets)
    assert lrp.audit is not None
    booked = [(e.name, e.entered, e.left) for e in lrp.audit.entries]
    assert all(
        e.book is not None and e.entered is not None and e.entered._base is e.book.buffer for e in lrp.audit.entries
    )
    # every sum its own tensor, as before (no buffer rows: neither `add`'s nor `add_dots`' sums written into them)
    monkeypatch.setattr(AuditBook, "rows_of", lambda self, row, n, dtype, device: None)
    lrp.attribute(x, target=targets)
    assert [e.name for e in lrp.audit.entries] == [b[0] for b in booked]
    for (name, ent, left), e in zip(booked, lrp.audit.entries, strict=True):
        assert e.entered is not None and e.entered._base is None
        torch.testing.assert_close(ent, e.entered, rtol=0, atol=0, msg=name)  # float64, the same additions
        torch.testing.assert_close(left, e.left, rtol=0, atol=0, msg=name)


def test_random_activation_in_training_mode_is_not_computed_again() -> None:
    """nn.RReLU in training mode draws its slopes at random: the rules read the output the forward pass drew (a
    float64 LRP-epsilon reference from the hooked forward values), never a second draw."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.RReLU(0.1, 0.9), nn.Linear(8, 3)).double().train()
    seen: dict[str, Tensor] = {}
    for i in range(3):
        model[i].register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(str(i), out.detach().clone()))
    x = torch.randn(4, 6, dtype=torch.float64) - 0.5  # negative inputs: the random slopes matter
    r = hv.LRP(model, "attn-lrp", eval_mode=False).attribute(x, target=1)
    assert model.training

    def stab(z: Tensor) -> Tensor:
        return z + torch.where(z >= 0, 1e-6, -1e-6).to(z.dtype)

    z2, h, z1 = seen["2"], seen["1"], seen["0"]
    r_out = torch.zeros_like(z2)
    r_out[:, 1] = z2[:, 1]  # relevance starts at the target's score
    r_h = h * ((r_out / stab(z2)) @ model[2].weight)  # epsilon on the last layer, with the drawn activation
    want = x * ((r_h / stab(z1)) @ model[0].weight)  # the activation passes relevance; epsilon on the first layer
    torch.testing.assert_close(r, want, rtol=1e-10, atol=1e-12)  # float64, the paper's formulas
