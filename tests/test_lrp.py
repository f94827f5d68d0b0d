"""LRP (issue 17): zennit's maps on torchvision VGG / ResNet per composite, hand-computed rules, conservation, the
audit, run-time canonization, execution-order first layer, K targets, bad input, the model left as it came."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import hookviz as hv
from hookviz.hooks import hook_counts
from hookviz.methods.lrp import (
    COMPOSITES,
    AlphaBeta,
    Composite,
    Epsilon,
    Flat,
    Gamma,
    Norm,
    Pass,
    WSquare,
    ZBox,
    ZPlus,
    composite,
    stabilize,
)

zennit = pytest.importorskip("zennit")
from zennit.attribution import Gradient as ZGradient  # noqa: E402
from zennit.composites import (  # noqa: E402
    EpsilonAlpha2Beta1,
    EpsilonAlpha2Beta1Flat,
    EpsilonGammaBox,
    EpsilonPlus,
    EpsilonPlusFlat,
    LayerMapComposite,
    NameMapComposite,
    layer_map_base,
)
from zennit.torchvision import ResNetCanonizer, VGGCanonizer  # noqa: E402
from zennit.types import Convolution  # noqa: E402

LOW = torch.tensor([-2.1, -2.0, -1.8]).view(1, 3, 1, 1)
HIGH = torch.tensor([2.2, 2.4, 2.6]).view(1, 3, 1, 1)


def _seeded(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights, and BatchNorm statistics far from (0, 1) so that folding matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
    return model.eval()


def _zennit_composite(name: str, canonizer: type | None):
    c = [canonizer()] if canonizer is not None else []
    if name == "epsilon":
        return LayerMapComposite(
            layer_map_base() + [(Convolution, zennit.rules.Epsilon()), (nn.Linear, zennit.rules.Epsilon())],
            canonizers=c,
        )
    return {
        "epsilon-plus": lambda: EpsilonPlus(canonizers=c),
        "epsilon-plus-flat": lambda: EpsilonPlusFlat(canonizers=c),
        "epsilon-alpha2-beta1": lambda: EpsilonAlpha2Beta1(canonizers=c),
        "epsilon-alpha2-beta1-flat": lambda: EpsilonAlpha2Beta1Flat(canonizers=c),
        "epsilon-gamma-box": lambda: EpsilonGammaBox(low=LOW, high=HIGH, canonizers=c),
    }[name]()


def _zennit(model: nn.Module, x: torch.Tensor, comp, target: torch.Tensor) -> torch.Tensor:
    """zennit's relevance, started at the target's score (captum's convention, as hookviz)."""
    with torch.no_grad():
        out = model(x)
    seed = torch.zeros_like(out)
    rows = torch.arange(len(x))
    seed[rows, target] = out[rows, target]
    with ZGradient(model=model, composite=comp) as attributor:
        _, rel = attributor(x, seed)
    return rel


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


_ARCHS = {"vgg11": VGGCanonizer, "vgg11_bn": VGGCanonizer, "resnet18": ResNetCanonizer}
_MODELS: dict[str, nn.Module] = {}


def _arch(name: str) -> nn.Module:
    """torchvision's VGG / ResNet with weights=None; VGG's 4096-wide classifier (120M parameters, seconds to
    initialize) is narrowed to 64 units with the same layer types, so the tests stay fast."""
    if name not in _MODELS:
        torch.manual_seed(0)
        if name.startswith("vgg"):
            with torch.device("meta"):
                model = getattr(torchvision.models, name)(weights=None, num_classes=10)
            model.features.to_empty(device="cpu")
            for m in model.features.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
            model.classifier = nn.Sequential(
                nn.Linear(512 * 7 * 7, 64), nn.ReLU(True), nn.Dropout(), nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(),
                nn.Linear(64, 10),
            )  # fmt: skip
        else:
            model = getattr(torchvision.models, name)(weights=None)
        _MODELS[name] = _seeded(model)
    return _MODELS[name]


# every composite on VGG with BatchNorm and on ResNet (folding, residual sums); plain VGG once
_CASES = [("vgg11", "epsilon-plus-flat")] + [(a, n) for a in ("vgg11_bn", "resnet18") for n in COMPOSITES]


@pytest.mark.parametrize("arch, name", _CASES)
def test_equals_zennit_on_torchvision(arch: str, name: str) -> None:
    model = _arch(arch)
    size = 16 if arch.startswith("resnet") else 32  # the smallest inputs the architectures take
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([3])
    if name == "epsilon" and arch.endswith("_bn"):
        # zennit's folded BatchNorm is not quite the identity: it keeps dividing by sqrt(1 + eps), a 5e-6 change
        # per layer that LRP-epsilon everywhere (whose relevance mostly leaks away) amplifies to 4e-3. With eps = 0
        # both compute the same model, so the rules are compared
        model = copy.deepcopy(model)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps = 0.0
    ref = _zennit(model, x, _zennit_composite(name, _ARCHS[arch]), target)
    ours = hv.LRP(model, name, low=LOW, high=HIGH).attribute(x, target)
    assert ours.dtype == x.dtype and ours.shape == x.shape
    assert _rel_err(ours, ref) <= 1e-3


@pytest.mark.parametrize("arch", ["vgg11", "resnet18"])
@pytest.mark.parametrize("name", ["epsilon-plus-flat", "epsilon-alpha2-beta1", "epsilon-gamma-box"])
def test_sign_split_known_from_the_forward_pass(monkeypatch, arch: str, name: str) -> None:
    """z+, alpha-beta and gamma skip their x- terms where the forward pass showed x >= 0 (a ReLU's output, pooled,
    flattened, concatenated; `LayerRules.nonnegative`) instead of reading x's values (a GPU wait per layer, issue 35):
    on VGG and ResNet every layer after the first, and the map equals the one with both terms computed everywhere
    (an x- of zeros adds zeros)."""
    from hookviz.methods.lrp import layers, rules

    model = _arch(arch)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    seen: list[tuple[bool, bool]] = []
    split = rules._split

    def spy(t: torch.Tensor, nonnegative: bool):
        seen.append((nonnegative, bool(t.min() >= 0)))
        return split(t, nonnegative)

    monkeypatch.setattr(rules, "_split", spy)
    known = hv.LRP(model, name, low=LOW, high=HIGH).attribute(x, target=3)
    # known exactly where x >= 0: every split but alpha-beta's on the first layer (the image; flat and z^B split
    # nothing there)
    assert seen and all(k == actual for k, actual in seen) and sum(k for k, _ in seen) >= len(seen) - 1
    monkeypatch.setattr(layers.LayerRules, "nonnegative", lambda self, t: False)
    both = hv.LRP(model, name, low=LOW, high=HIGH).attribute(x, target=3)
    assert torch.equal(known, both)


def _hand_epsilon(w1, b1, w2, b2, x, c, eps):
    """LRP-epsilon through Linear -> ReLU -> Linear, written out in float64 (Bach et al., eq. 58)."""
    x = x.double()
    a = (x @ w1.T + b1).clamp(min=0)
    z2 = a @ w2.T + b2
    r2 = torch.zeros_like(z2)
    r2[:, c] = z2[:, c]
    stab = lambda z: z + eps * torch.where(z >= 0, 1.0, -1.0).double()  # noqa: E731
    r1 = a * ((r2 / stab(z2)) @ w2)
    z1 = x @ w1.T + b1
    return x * ((r1 / stab(z1)) @ w1)


def test_epsilon_by_hand() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    x = torch.randn(2, 5, dtype=torch.float64)
    eps = 0.25
    ours = hv.LRP(model, "epsilon", epsilon=eps).attribute(x, 1)
    w1, b1, w2, b2 = (p.detach() for p in model.parameters())
    torch.testing.assert_close(ours, _hand_epsilon(w1, b1, w2, b2, x, 1, eps), rtol=1e-10, atol=1e-12)


def test_stabilize_sign_of_zero_is_positive() -> None:
    z = torch.tensor([-2.0, 0.0, 3.0])
    assert stabilize(z, 0.5).tolist() == [-2.5, 0.5, 3.5]


class _Small(nn.Module):
    """conv -> relu -> conv -> bn -> relu -> avgpool -> linear; registered out of execution order."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6 * 2 * 2, 4)
        self.conv1 = nn.Conv2d(3, 5, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(5, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.AdaptiveAvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = torch.relu(self.bn(self.conv2(x)))
        return self.fc(self.pool(x).flatten(1))


def test_custom_composite_equals_zennit_and_first_layer_is_execution_order() -> None:
    torch.manual_seed(0)
    model = _seeded(_Small())
    x = torch.randn(2, 3, 8, 8)
    # zennit would give the first-layer rule to `fc` (first in named_modules); hookviz gives it to conv1, which runs
    # first; the zennit reference names it explicitly
    ours = hv.LRP(
        model,
        Composite(
            type_map=[
                (nn.Conv2d, Gamma(0.5)),
                (nn.Linear, Epsilon(0.01)),
                (nn.AdaptiveAvgPool2d, Norm()),
                (nn.BatchNorm2d, Pass()),
            ],
            first_map=[((nn.Conv2d, nn.Linear), WSquare())],
        ),
        canonize=False,
    ).attribute(x, 2)
    ref_comp = NameMapComposite(
        [
            (("conv1",), zennit.rules.WSquare()),
            (("conv2",), zennit.rules.Gamma(0.5)),
            (("fc",), zennit.rules.Epsilon(0.01)),
            (("pool",), zennit.rules.Norm()),
            (("bn",), zennit.rules.Pass()),
        ]
    )
    assert _rel_err(ours, _zennit(model, x, ref_comp, torch.tensor([2, 2]))) <= 1e-5


_RULE_CASES = [
    ("zplus", ZPlus(), lambda: zennit.rules.ZPlus()),
    ("alpha1-beta0", AlphaBeta(1.0, 0.0), lambda: zennit.rules.AlphaBeta(1.0, 0.0)),
    ("alpha2-beta1", AlphaBeta(2.0, 1.0), lambda: zennit.rules.AlphaBeta(2.0, 1.0)),
    ("flat", Flat(), lambda: zennit.rules.Flat()),
    ("wsquare", WSquare(), lambda: zennit.rules.WSquare()),
    ("zbox-pixels", ZBox(LOW, HIGH), lambda: zennit.rules.ZBox(LOW, HIGH)),
    ("zbox", ZBox(-1.5, 2.0), lambda: zennit.rules.ZBox(-1.5, 2.0)),
    ("gamma", Gamma(1.0), lambda: zennit.rules.Gamma(1.0)),
]


# per-channel pixel bounds (zbox-pixels) fit only the first layer
@pytest.mark.parametrize(
    "rule, zrule, at",
    [pytest.param(r, z, "0", id=f"{n}-signed-input") for n, r, z in _RULE_CASES]
    + [pytest.param(r, z, "2", id=f"{n}-after-relu") for n, r, z in _RULE_CASES if n != "zbox-pixels"],
)
def test_rules_by_name_map_equal_zennit(rule, zrule, at) -> None:
    """On the signed input every term of the rule counts; after a ReLU the input has no negative entry and z+,
    alpha-beta and gamma skip their x- terms: both must give zennit's map."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 3 * 3, 3)
    ).eval()
    x = torch.randn(2, 3, 7, 7)
    other = "2" if at == "0" else "0"
    ours = hv.LRP(
        model,
        Composite(name_map=[(at, rule), (other, Epsilon()), ("5", Epsilon())], type_map=[(nn.ReLU, Pass())]),
    )
    ref_map = [((at,), zrule()), ((other,), zennit.rules.Epsilon()), (("5",), zennit.rules.Epsilon())]
    if at == "0" or rule.proportional:
        ref_map += [((relu,), zennit.rules.Pass()) for relu in ("1", "3")]  # as ours: relevance passes through
    # else flat, w² and z^B after a ReLU spread relevance over its zeros too, which in gradient-times-input form
    # (relevance = activation x gradient) carry none: zennit's ReLU then passes its gradient, which drops it there
    ref = _zennit(model, x, NameMapComposite(ref_map), torch.tensor([0, 1]))
    assert _rel_err(ours.attribute(x, [0, 1]), ref) <= 1e-5


class _Residual(nn.Module):
    """Additions written three ways (+, torch.add, +=), functional activations and pooling; with ``stacked`` it is
    zennit's canonical form of the same network: a ``Sum`` module over stacked branches and a pooling module."""

    def __init__(self, stacked: bool = False) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
        self.c = nn.Conv2d(4, 4, 3, padding=1)
        self.d = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4, 3)
        self.stacked = stacked
        if stacked:
            from zennit.layer import Sum

            self.sums = nn.ModuleList([Sum(), Sum(), Sum()])
            self.pool = nn.AdaptiveAvgPool2d(1)

    def _add(self, u: torch.Tensor, v: torch.Tensor, k: int) -> torch.Tensor:
        if self.stacked:
            return self.sums[k](torch.stack([u, v], dim=-1))
        if k == 0:
            return u + v
        if k == 1:
            return torch.add(u, v)
        u += v
        return u

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        h = torch.relu(self._add(h, self.b(h), 0))
        h = self._add(self.c(h), h, 1).relu()
        h = F.relu(self._add(self.d(h), h, 2))
        pooled = self.pool(h) if self.stacked else F.adaptive_avg_pool2d(h, 1)
        return self.fc(pooled.flatten(1))


def test_residual_additions_found_at_run_time_equal_zennit_sum() -> None:
    torch.manual_seed(0)
    model = _Residual().eval()
    x = torch.randn(2, 3, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every functional op here has a rule: no warning
        lrp = hv.LRP(model, "epsilon-plus")
        ours = lrp.attribute(x, 1)
    names = [e.name for e in lrp.audit.entries]
    assert names.count("+") == 1 and "torch.add" in names and "+=" in names and "F.adaptive_avg_pool2d" in names
    ref_model = _Residual(stacked=True).eval()
    ref_model.load_state_dict(model.state_dict())
    ref = _zennit(ref_model, x, EpsilonPlus(), torch.tensor([1, 1]))
    assert _rel_err(ours, ref) <= 1e-5


def _bias_free(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1, bias=False),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5, bias=False),
    ).eval()
    with torch.no_grad():  # scores of order 1, so that the 1e-6 stabilizers stay negligible
        for p in model.parameters():
            p.mul_(4)
    return model


@pytest.mark.parametrize("name", ["epsilon", "epsilon-plus", "epsilon-alpha2-beta1"])
def test_conservation_without_biases(name: str) -> None:
    """Without biases (and a tiny stabilizer) these rules conserve: the input relevance sums to f_c(x)."""
    model = _bias_free()
    x = torch.randn(3, 3, 8, 8)
    lrp = hv.LRP(model, name)
    rel = lrp.attribute(x, 2)
    fx = model(x)[:, 2].detach()
    torch.testing.assert_close(rel.flatten(1).sum(1), fx, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lrp.audit.conservation, torch.ones(3), rtol=1e-4, atol=1e-6)
    for e in lrp.audit.entries:  # every layer conserves on its own
        torch.testing.assert_close(e.entered, e.left, rtol=1e-4, atol=1e-6)


def test_audit_shows_bias_leak_and_folded_names_on_resnet18() -> None:
    model = _arch("resnet18")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    lrp = hv.LRP(model, "epsilon-plus-flat")
    rel = lrp.attribute(x, [1, 4])
    audit = lrp.audit
    torch.testing.assert_close(audit.total, rel.flatten(1).sum(1))
    torch.testing.assert_close(audit.start, model(x)[[0, 1], [1, 4]].detach())
    names = [e.name for e in audit.entries]
    assert names[0] == "conv1 + bn1"  # BatchNorm folded into the convolution before it
    assert "layer1.0.downsample.0" not in names and "layer2.0.downsample.0 + layer2.0.downsample.1" in names
    assert sum(n.startswith("+=") for n in names) == 8  # one residual sum per BasicBlock, found at run time
    assert names[-1] == "fc" and "avgpool" in names
    # the relevance leaving one layer enters the next: chained sums agree along the trunk
    by_name = {e.name: e for e in audit.entries}
    torch.testing.assert_close(by_name["fc"].left, by_name["avgpool"].entered, rtol=1e-4, atol=1e-6)
    assert "relevance audit" in str(audit) and "leak" in str(audit)


def test_one_forward_and_layers_run_once() -> None:
    model = _arch("resnet18")
    calls = {"model": 0, "conv": 0}

    def count(key):
        def hook(*_):
            calls[key] += 1

        return hook

    h1 = model.register_forward_hook(count("model"))
    h2 = model.layer1[0].conv1.register_forward_hook(count("conv"))
    try:
        hv.LRP(model, "epsilon-gamma-box", low=LOW, high=HIGH).attribute(torch.randn(1, 3, 16, 16), [[1, 2, 3]])
    finally:
        h1.remove()
        h2.remove()
    assert calls == {"model": 1, "conv": 1}  # zennit runs each layer again in its backward hook


def test_k_targets_equal_single_targets() -> None:
    model = _bias_free()
    x = torch.randn(2, 3, 8, 8)
    lrp = hv.LRP(model, "epsilon-plus-flat")
    multi = lrp.attribute(x, torch.tensor([[0, 3], [2, 1]]))
    assert multi.shape == (2, 2, 3, 8, 8)
    torch.testing.assert_close(multi[:, 0], lrp.attribute(x, [0, 2]))
    torch.testing.assert_close(multi[:, 1], lrp.attribute(x, [3, 1]))


class _Matmul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.w = nn.Parameter(torch.randn(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(F.relu(self.conv(x)).mean((2, 3)), self.w)


def test_uncovered_functional_ops_warn() -> None:
    model = _Matmul().eval()
    with pytest.raises(ValueError, match=r"no rule for these layers with parameters: \(model\) \(_Matmul\)"):
        hv.LRP(model, "epsilon")
    comp = composite("epsilon", name_map=[(lambda n, m: n == "", Pass())])
    lrp = hv.LRP(model, comp)
    # the rule engine's one warning, naming LRP; the mean's pooling rule and the ReLU's pass rule are not in it
    with pytest.warns(UserWarning, match=r"^LRP: operations that no rule covers ran in the forward pass of _Matmul: "
                      r"matmul x1; "):  # fmt: skip
        lrp.attribute(torch.randn(1, 3, 5, 5), 0)
    assert lrp.rule_coverage is not None and lrp.rule_coverage.uncovered == {"matmul": 1}
    assert lrp.rule_coverage.covered["norm"] == {"Tensor.mean": 1}
    assert lrp.rule_coverage.covered["pass"] == {"F.relu": 1}


def test_bad_input_errors() -> None:
    model = _bias_free()
    with pytest.raises(ValueError, match=r"unknown LRP composite 'epsilon-pluss'; valid composites: epsilon, "):
        hv.LRP(model, "epsilon-pluss")
    with pytest.raises(ValueError, match=r"alpha - beta must equal 1 \(conservation\); got alpha=3, beta=1"):
        AlphaBeta(3, 1)
    with pytest.raises(ValueError, match=r"'epsilon-gamma-box' needs the input bounds low= and high="):
        hv.LRP(model, "epsilon-gamma-box")
    with pytest.raises(ValueError, match=r"ZBox needs the input bounds"):
        ZBox(None, 1.0)
    lrp = hv.LRP(model, "epsilon-gamma-box", low=torch.zeros(1, 4, 1, 1), high=1.0)
    with pytest.raises(ValueError, match=r"ZBox: low of shape \(1, 4, 1, 1\) does not broadcast"):
        lrp.attribute(torch.randn(1, 3, 8, 8), 0)
    with pytest.raises(ValueError, match=r"epsilon must be a finite number >= 0, got -1"):
        Epsilon(-1)
    with pytest.raises(TypeError, match=r"composite must be a composite name or a Composite, got int"):
        hv.LRP(model, 3)
    with pytest.raises(TypeError, match=r"type_map entries must be \(module type\(s\), Rule\) pairs"):
        Composite(type_map=[(nn.Conv2d, "epsilon")])
    ln = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"has no rule for these layers with parameters: 1 \(LayerNorm\)"):
        hv.LRP(ln, "epsilon-plus-flat")  # named: refused (with none named, AttnLRP is chosen)


def test_model_restored_and_parameters_untouched() -> None:
    model = _arch("vgg11_bn")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    hv.LRP(model, "epsilon-plus-flat").attribute(torch.randn(1, 3, 32, 32), 0)
    assert model.training and all(m.training for m in model.modules())
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert sum(hook_counts(model).values()) == 0
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert relus and all(m.inplace for m in relus)  # switched off during the call only
    assert all(p.grad is None for p in model.parameters())
    model.eval()


def test_keyboard_interrupt_restores() -> None:
    model = _Residual().eval()

    def boom(*_):
        raise KeyboardInterrupt

    handle = model.c.register_forward_hook(boom)
    try:
        with pytest.raises(KeyboardInterrupt):
            hv.LRP(model, "epsilon-plus").attribute(torch.randn(1, 3, 6, 6), 0)
    finally:
        handle.remove()
    assert sum(hook_counts(model).values()) == 0
    assert torch._C._is_torch_function_mode_enabled() is False or not torch.overrides._get_current_function_mode()
    # the functional mode is gone: additions outside the call are plain again
    a = torch.ones(2, requires_grad=True)
    assert (a + a).grad_fn.name() == "AddBackward0"


def test_registry_names() -> None:
    for name in COMPOSITES:
        cls = hv.get_method(f"lrp-{name}")
        lrp = cls(_bias_free())
        assert isinstance(lrp, hv.LRP) and lrp.composite.name == name


def test_cli_explain_and_visualize_with_diverging_map(tmp_path, capsys) -> None:
    import numpy as np
    from PIL import Image

    from hookviz.cli import main

    img = tmp_path / "img.png"
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(img)
    model_path = tmp_path / "model.pt"
    torch.save(_bias_free(), model_path)
    out = tmp_path / "fig.png"
    args = ["explain", str(img), "--model", str(model_path), "--method", "lrp-epsilon-plus-flat,deeplift"]
    assert main([*args, "--size", "32", "--out", str(out), "--dpi", "40"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    expl = hv.LRP(_bias_free()).visualize(torch.randn(1, 3, 8, 8), target=1)
    assert expl.display["cmap"] == "bwr" and expl.display["reduce"] == "sum"  # signed relevance, 0 in the middle


def test_no_composite_named_picks_one_that_fits_the_model() -> None:
    """``hv.LRP(model)`` (issue 35): zennit's EpsilonPlusFlat for a convolutional network, AttnLRP where attention or
    a LayerNorm is found (torchvision's vit_b_16 was refused: no rule for LayerNorm); the repr says which and why,
    and the maps are those of the composite named."""
    torch.manual_seed(0)
    cnn = torchvision.models.resnet18(weights=None, num_classes=5).eval()
    lrp = hv.LRP(cnn)
    assert lrp.composite.name == "epsilon-plus-flat"
    assert repr(lrp) == (
        "LRP(ResNet, composite='epsilon-plus-flat' (chosen: no attention or LayerNorm: a convolutional network))"
    )
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(lrp.attribute(x, 1), hv.LRP(cnn, "epsilon-plus-flat").attribute(x, 1))
    from torchvision.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(32, 16, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=5).eval()
    lrp = hv.LRP(vit)
    assert lrp.composite.name == "attn-lrp"
    assert "(chosen: attention found: encoder.layers.encoder_layer_0.self_attention (MultiheadAttention))" in repr(lrp)
    assert torch.equal(lrp.attribute(x, 2), hv.LRP(vit, "attn-lrp").attribute(x, 2))
    mixer = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))
    assert "(chosen: a normalisation found: 1 (LayerNorm))" in repr(hv.LRP(mixer))
    assert "chosen" not in repr(hv.LRP(cnn, "epsilon"))

    class HaloAttn(nn.Module):  # timm's names: "attn", not "attention"
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    halo = nn.Sequential(nn.Conv2d(3, 4, 3), HaloAttn(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    assert "(chosen: attention found: 1 (HaloAttn))" in repr(hv.LRP(halo))

    class LayerScale2d(nn.Module):  # a leaf with a parameter (FastViT): the CNN composites refuse it
        def __init__(self) -> None:
            super().__init__()
            self.gamma = nn.Parameter(torch.full((4, 1, 1), 0.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.gamma

    scaled = nn.Sequential(nn.Conv2d(3, 4, 3), LayerScale2d(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"no rule for these layers with parameters: 1 \(LayerScale2d\)"):
        hv.LRP(scaled, "epsilon-plus-flat")
    lrp = hv.LRP(scaled)
    assert "(chosen: a layer the CNN composites have no rule for: 1 (LayerScale2d))" in repr(lrp)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every call covered
        assert torch.isfinite(lrp.attribute(torch.randn(1, 3, 8, 8), 1)).all()
