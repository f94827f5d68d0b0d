"""AttnLRP / CP-LRP in gradient-times-input form (`hookviz.methods.lrp.gradient_form`): with zero stabilizers the
transformer composites run as one plain backward pass; the maps equal the relevance form's on every family, lxt's
(through tests/test_attnlrp.py::test_equals_lxt, whose composite has zero stabilizers), and a hand computation."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch
from lrp_relevance_form import relevance_form_lrp
from test_attnlrp import _LAST, FAMILIES, MHABlock, StyledBlock, _family
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import RelevanceAudit
from hookviz.methods.lrp import composite as composite_of
from hookviz.methods.lrp.gradient_form import check_gradient_form
from hookviz.methods.lrp.rules import Rule


def _both(
    model: nn.Module, x: Tensor, comp: str, target, eps: float = 0.0, **kw
) -> tuple[Tensor, Tensor, hv.LRP, RelevanceAudit]:
    """hookviz's LRP (gradient form) and the relevance form (tests/lrp_relevance_form/: each rule its own autograd
    function): (gradient form's map, the relevance form's, the gradient form's LRP, the relevance form's audit)."""
    fast = hv.LRP(model, composite_of(comp, epsilon=eps, stabilizer=eps), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every operation covered
        got = fast.attribute(x, target=target)
    want, slow = relevance_form_lrp(model, composite_of(comp, epsilon=eps, stabilizer=eps), x, target, **kw)
    return got, want, fast, slow


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("family", FAMILIES)
def test_equals_the_relevance_form_on_every_family(family: str, composite: str) -> None:
    model, x, kw = _family(family)
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    got, want, fast, _ = _both(model, x, composite, _LAST.get(family.split("-")[0], 1), **kw)
    big = float(want.abs().max())
    # the same rules in float64, applied in another order (relevance over activation carried instead of relevance):
    # float64 rounding, except that Hugging Face's eager attention computes its softmax in float32 even in a float64
    # model (1e-7 relative on the probabilities, 1e-9 of the largest relevance measured): 1e-8 of the largest
    tol = 1e-8 if family.endswith("eager") else 1e-12
    torch.testing.assert_close(got, want, rtol=0, atol=tol * big)
    assert big > 0
    # the audit holds the totals: the same conservation as the relevance form's
    # (a sum over the map's elements: at most their count times the maps' bound)
    per_input = want.flatten(1).shape[1]
    torch.testing.assert_close(fast.audit.total, want.flatten(1).sum(1), rtol=0, atol=tol * big * per_input)


@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("family", FAMILIES)
def test_default_stabilizers_equal_the_relevance_form_on_every_family(family: str, composite: str) -> None:
    """The default composites (epsilon and stabilizers 1e-6) in gradient form, their stabilizers factors on the
    gradient (`gradient_ops`, `gradient_attention`), against the relevance form, each rule dividing R by stab(z)."""
    model, x, kw = _family(family)
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    got, want, fast, slow = _both(model, x, composite, _LAST.get(family.split("-")[0], 1), eps=1e-6, **kw)
    big = float(want.abs().max())
    # float64, the same rules, the factor applied to g = R / a instead of R divided: rounding (1e-12 of the largest),
    # but for Hugging Face's eager attention, whose softmax is float32 in a float64 model (see above): 1e-8
    tol = 1e-8 if family.endswith("eager") else 1e-12
    torch.testing.assert_close(got, want, rtol=0, atol=tol * big)
    assert big > 0
    # the audit: an entry per call of the rules that change relevance (linear layers, sums, norms, products,
    # AttnLRP's softmax; the attention's entries against the relevance form's: tests/test_lrp_memory.py), and the
    # totals of the relevance form (a sum over the map's elements: at most their count times the maps' bound)
    per_input = want.flatten(1).shape[1]
    torch.testing.assert_close(fast.audit.total, slow.total, rtol=0, atol=tol * big * per_input)
    rules = {e.rule for e in fast.audit.entries}
    assert {"epsilon", "uniform", "identity-norm"} <= rules and ("softmax" in rules) == (composite == "attn-lrp")
    # only the calls the backward pass reached, each with its sums (a mean only a held std reads, as in Hugging Face's
    # RMSNorm, takes a rule in the forward pass and no relevance: it is not listed)
    assert all(e.entered is not None and e.left is not None for e in fast.audit.entries)


def _bias_kv_block() -> nn.Module:
    block = MHABlock()
    # add_bias_kv without add_zero_attn: the zero key's scores are exactly 0, which the relevance form with epsilon 0
    # divides by (NaN there; the gradient form has no division)
    block.attn = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    return block


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("make", [lambda: StyledBlock("einsum"), lambda: StyledBlock("baddbmm"), _bias_kv_block])
def test_einsum_baddbmm_and_bias_kv_attention(make, composite: str, eps: float) -> None:
    torch.manual_seed(13)
    model = make().double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    got, want, _, _ = _both(model, x, composite, 1, eps=eps)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))  # float64 rounding


def test_by_hand_on_a_gated_product() -> None:
    """y = head(silu(a x) * (b x)): AttnLRP gives each factor half of the product's relevance and passes relevance
    through SiLU unchanged; CP-LRP holds the gate silu(a x), so b x gets all of it. By hand, with R = y at the output
    and the linear layers by LRP-0: R_x = x * W^T (R_z / z) for each of a, b."""

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 4, bias=False), nn.Linear(3, 4, bias=False)
            self.act, self.head = nn.SiLU(), nn.Linear(4, 1, bias=False)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.act(self.a(x)) * self.b(x))

    torch.manual_seed(14)
    model = Gated().double()
    x = torch.randn(2, 3, dtype=torch.float64)
    za, zb = model.a(x), model.b(x)
    g = model.act(za) * zb
    r_g = g * model.head.weight[0]  # the head: LRP-0, R of each product term
    for comp, (wa, wb) in (("attn-lrp", (0.5, 0.5)), ("cp-lrp", (0.0, 1.0))):
        r_a, r_b = wa * r_g, wb * r_g  # SiLU: relevance unchanged
        want = x * ((r_a / za) @ model.a.weight) + x * ((r_b / zb) @ model.b.weight)
        lrp = hv.LRP(model, composite_of(comp, epsilon=0.0, stabilizer=0.0))
        got = lrp.attribute(x, target=0)
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-14)  # float64 rounding


class _Custom(Rule):
    """A user's rule of a kind with no gradient-times-input form."""

    name = "custom"


def test_which_composites_it_carries() -> None:
    """Every named composite has a gradient-times-input form (`check_gradient_form` passes); a transformer composite
    with a user's rule of another kind has none."""
    check_gradient_form(composite_of("attn-lrp", epsilon=0.0, stabilizer=0.0))
    check_gradient_form(composite_of("cp-lrp", epsilon=0.0, stabilizer=0.0))
    # the stabilizers as factors on the gradient (`gradient_ops`), gamma on linear layers (`layers`)
    check_gradient_form(composite_of("attn-lrp"))
    check_gradient_form(composite_of("cp-lrp", epsilon=0.0))
    check_gradient_form(composite_of("attn-lrp", linear_gamma=0.25))

    # a rule of another kind: none
    with pytest.raises(ValueError, match="'custom' \\(_Custom\\), which has no gradient-times-input form"):
        check_gradient_form(composite_of("attn-lrp", type_map=[(nn.GELU, _Custom())]))
    for name in ("epsilon", "epsilon-plus-flat", "epsilon-gamma-box"):  # the CNN composites: every rule (`layers`)
        check_gradient_form(composite_of(name, low=-1.0, high=1.0))


class _Counted(nn.Module):
    """Linear, GELU, linear; counts its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.act, self.b = nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.b(self.act(self.a(x)))


# a transformer composite with a rule of another kind in each place one can stand, and what the error says of it
_REJECTED = {
    "type_map": (lambda: composite_of("attn-lrp", type_map=[(nn.GELU, _Custom())]), "its type_map gives GELU"),
    "name_map": (lambda: composite_of("attn-lrp", name_map=[("act", _Custom())]), "its name_map gives 'act'"),
    "sum_rule": (
        lambda: dataclasses.replace(composite_of("attn-lrp"), sum_rule=_Custom()),
        "its sum_rule gives additions of branches",
    ),
}


@pytest.mark.parametrize("method", ["LRP", "CRP"])
@pytest.mark.parametrize("where", sorted(_REJECTED))
def test_a_rule_without_a_gradient_form_fails_at_construction(method: str, where: str) -> None:
    """A transformer composite holding a rule of a kind with no gradient-times-input form: `ValueError` from
    ``LRP(...)`` / ``CRP(...)`` naming the rule, what it maps and the rule kinds expected, before any work (no
    forward pass, no hook left on the model)."""
    make, said = _REJECTED[where]
    model = _Counted()
    with pytest.raises(ValueError, match=re.escape(f"{said} the rule 'custom' (_Custom), which has no")) as err:
        getattr(hv, method)(model, make())
    expected = "the kind Norm" if where == "sum_rule" else "one of the kinds LinearRule, NormIdentity, Norm, Pass,"
    assert "LRP composite 'attn-lrp'" in str(err.value) and expected in str(err.value)
    assert model.calls == 0
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_model_left_as_it_came_when_interrupted() -> None:
    model, x, _ = _family("timm-fused")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]

    def boom(out: Tensor) -> Tensor:
        raise KeyboardInterrupt

    lrp = hv.LRP(model, composite_of("attn-lrp", epsilon=0.0, stabilizer=0.0))
    with pytest.raises(KeyboardInterrupt):
        lrp.attribute(x, target=boom)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert torch.overrides._get_current_function_mode_stack() == []  # no TorchFunctionMode left active


# -- what the speed work changed (docs/relevance.md, "Gradient form: what it costs") ------------------------------
class _TwoGates(nn.Module):
    """Two gated MLPs, then the same activation type on a path that is not a gate: CP-LRP's gate guess (the second
    gate's ratio left to a backward pass that never comes, the last SiLU's taken in that pass) must not move a value."""

    def __init__(self) -> None:
        super().__init__()
        self.a1, self.b1, self.a2, self.b2 = (nn.Linear(4, 4, bias=False) for _ in range(4))
        self.act1, self.act2, self.act3 = nn.SiLU(), nn.SiLU(), nn.SiLU()
        self.head = nn.Linear(4, 2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act1(self.a1(x)) * self.b1(x)
        h = self.act2(self.a2(h)) * self.b2(h)
        return self.head(self.act3(h))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
def test_gates_guessed_and_zero_inputs_to_activations_keep_the_values(composite: str, eps: float) -> None:
    torch.manual_seed(21)
    model = _TwoGates().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    x[0, :] = 0.0  # the first row's activation inputs are exactly 0 (bias-free layers): the identity rule's mask
    got, want, _, _ = _both(model, x, composite, 1, eps=eps)
    # the relevance form with epsilon 0 divides by the zero row's zero pre-activations (NaN there): rows 1, 2 only
    big = float(want[1:].abs().max())
    torch.testing.assert_close(got[1:], want[1:], rtol=0, atol=1e-12 * big)  # float64 rounding
    assert torch.equal(got[0], torch.zeros_like(got[0])) and big > 0


def test_the_mask_where_an_activation_input_is_exactly_zero() -> None:
    """y = w2 . gelu(W1 x) with some (W1 x)_j exactly 0: their quotient y / x is 0 / 0, and the rule passes 0 there
    (relevance 0 either way); on the other units relevance passes unchanged. By hand: R_x = x * W1^T (R_z / z)."""
    w1 = torch.tensor([[1.0, -1.0], [2.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    w2 = torch.tensor([[1.5, -0.5, 2.0]], dtype=torch.float64)
    model = nn.Sequential(nn.Linear(2, 3, bias=False), nn.GELU(), nn.Linear(3, 1, bias=False)).double().eval()
    with torch.no_grad():
        model[0].weight.copy_(w1)
        model[2].weight.copy_(w2)
    x = torch.tensor([[1.0, 1.0], [0.5, -2.0]], dtype=torch.float64)  # unit 0 of row 0 and unit 2 of both: 0
    z = x @ w1.T
    r_z = torch.nn.functional.gelu(z) * w2[0]  # LRP-0 at the head, then the identity rule
    want = x * (torch.where(z == 0, 0.0, r_z / z) @ w1)
    got = hv.LRP(model, composite_of("attn-lrp", epsilon=0.0, stabilizer=0.0)).attribute(x, target=0)
    assert (z == 0).any() and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)  # float64 rounding


def test_the_output_is_let_go_before_the_backward_pass() -> None:
    """A callable target's scores that are a view of the output are copied, and LRP drops the output: when the
    backward pass reaches the input, nothing holds the logits (a language model's (N, T, V) would stay alive through
    the pass and its gradient be allocated beside them)."""
    import weakref

    model, ids, kw = _family("llama-sdpa")
    logits: list[weakref.ref] = []
    seen: list[bool] = []

    def target(out) -> Tensor:
        logits.append(weakref.ref(out.logits))
        return out.logits[:, -1, 3]  # a view

    def watch(module: nn.Module, args: tuple, out) -> None:  # the first layer's output: reached late in the backward
        (out if isinstance(out, Tensor) else out[0]).register_hook(lambda g: seen.append(logits[0]() is None))

    handle = model.model.layers[0].register_forward_hook(watch)
    try:
        hv.LRP(model, composite_of("attn-lrp", epsilon=0.0, stabilizer=0.0), **kw).attribute(ids, target=target)
    finally:
        handle.remove()
    assert seen == [True]


class HandRMSNorm(nn.Module):
    """An RMSNorm written out in the input's own dtype (HF's casts to float32): its std is held inside its forward."""

    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(weight.detach().clone()), eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class HandLayerNorm(nn.Module):
    """A LayerNorm written out with ``Tensor.var`` and ``torch.sqrt`` (the variance is the call held)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d, dtype=torch.float64))
        self.bias = nn.Parameter(torch.linspace(-0.1, 0.1, d, dtype=torch.float64))
        self.eps = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        c = x - x.mean(-1, keepdim=True)
        return c / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps) * self.weight + self.bias


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("composite", ["attn-lrp", "cp-lrp"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norms_written_out_hold_their_std_in_their_own_forward(
    norm: str, composite: str, eps: float, monkeypatch
) -> None:
    """A normalisation module written out takes the identity rule whole, with the default stabilizers too: inside it
    only the std is held; its centring mean and its bias take no sum rule of their own (with them, the written-out
    LayerNorm's map was 3.9e-3 of the largest relevance away from the relevance form's, which rules the module whole),
    and the audit lists the module, not its parts."""
    from hookviz.methods.lrp import gradient_form

    model, x, kw = _family("llama-sdpa")
    model = model.double()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "LlamaRMSNorm":
                d = child.weight.shape[0]
                setattr(parent, name, HandRMSNorm(child.weight, 1e-6) if norm == "rms" else HandLayerNorm(d))
    fns = []
    apply = gradient_form._NormFn.apply
    monkeypatch.setattr(gradient_form._NormFn, "apply", lambda *a: fns.append(1) or apply(*a))
    got, want, fast, _ = _both(model, x, composite, _LAST["llama"], eps=eps, **kw)
    assert fns == []  # the held std is the rule: no Function of its own on any normalisation
    big = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * big)  # float64 rounding, as above
    assert big > 0
    if eps:
        names = [e.name for e in fast.audit.entries]
        assert sum("layernorm" in n for n in names) == 4 and not any(n.startswith("Tensor.mean") for n in names)


def test_a_norm_computed_below_its_input_precision_keeps_the_transpose(monkeypatch) -> None:
    """HF's RMSNorm computes in float32 in a float64 model: its transpose is taken in float64 (`_NormFn`)."""
    from hookviz.methods.lrp import gradient_form

    model, x, kw = _family("llama-sdpa")
    model = model.double()
    fns = []
    apply = gradient_form._NormFn.apply
    monkeypatch.setattr(gradient_form._NormFn, "apply", lambda *a: fns.append(1) or apply(*a))
    got, want, _, _ = _both(model, x, "attn-lrp", _LAST["llama"], **kw)
    assert len(fns) == 2 * 2 + 1  # two layers of two norms and the final norm
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))


def test_sqrt_outside_a_norm_is_its_plain_gradient() -> None:
    class SqrtModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3).double()

        def forward(self, x: Tensor) -> Tensor:
            return self.lin(torch.sqrt(x * x + 1.0))

    torch.manual_seed(0)
    model = SqrtModel()
    x = torch.randn(2, 4, dtype=torch.float64)
    lrp = hv.LRP(model, composite_of("attn-lrp", epsilon=0.0, stabilizer=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lrp.attribute(x, target=1)
    # sqrt's own derivative 1 / (2 sqrt(x^2 + 1)), and the product x * x passes half the gradient to each factor
    # (uniform rule: x, not 2x): x times the gradient is the map
    w = model.lin.weight.detach()[1]
    want = x * (x / (2 * torch.sqrt(x * x + 1.0))) * w
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


class _LayerScale(nn.Module):
    """A leaf with a parameter that no composite maps: a scaling by a constant (DINOv2's, timm's layer scale)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, d, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class _ScaledBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc, self.ls, self.head = nn.LayerNorm(6), nn.Linear(6, 6), _LayerScale(6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x + self.ls(self.fc(self.norm(x))))


def test_a_leaf_with_a_parameter_is_seen_call_by_call_by_the_transformer_composites() -> None:
    """A transformer composite's rules cover functional calls, so a leaf layer with a parameter it does not map is
    seen call by call (its product with the parameter: a scaling by a constant), not refused; a CNN composite, whose
    rules go by layer, still refuses it, naming it."""
    torch.manual_seed(3)
    model = _ScaledBlock().double().eval()
    x = torch.randn(2, 6, dtype=torch.float64)
    for comp in ("attn-lrp", "cp-lrp"):
        got, want, fast, _ = _both(model, x, comp, 1, eps=1e-6)  # warnings are errors: every call covered
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))  # float64 rounding
        assert fast.rule_coverage is not None and not fast.rule_coverage.uncovered
    with pytest.raises(
        ValueError, match=r"has no rule for these layers with parameters: norm \(LayerNorm\), ls \(_LayerScale\)"
    ):
        hv.LRP(model, "epsilon-plus-flat")
