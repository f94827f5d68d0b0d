"""Generated invariant suite: every registered method x seven torchvision architectures and the zoo's ViT x four
ways a call ends x ``eval_mode`` True / False. After each call, whatever happened, the model and the process are
exactly as before.

Dimensions: ``hookviz.METHODS`` (a method registered later joins automatically; one with a constructor other than
``cls(model, eval_mode=...)`` gets a line in `OPTIONS`) x `ARCHS` x `SCENARIOS` x eval_mode. The models are built
once per session in the middle of a training step (train mode with one submodule in eval mode, the first block
frozen, ``.grad`` on some parameters and None on others) and checked against one snapshot taken when built: every
case must leave them exactly so. Cases with ``eval_mode=False`` run under ``torch.no_grad()`` (hookviz must switch
grad on for itself and back off), the others with grad enabled.

What "exactly as before" means (`check_untouched`): no hook anywhere (module forward, forward-pre, backward,
backward-pre hooks, with-kwargs and always-called tables, the global module hooks, tensor hooks on parameters),
empty TorchFunctionMode and TorchDispatchMode stacks, no hookviz call left active, no ``inplace`` flag held, grad
mode as before, every module's ``training``, every parameter's ``requires_grad``, every ``inplace`` flag, the
state_dict bit for bit (BatchNorm statistics too), existing ``.grad`` tensors the same objects with the same values
(and None stays None), and a plain ``model(x)`` giving the same output as before.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.modules.module as module_globals
from torch import Tensor, nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.hooks import RemovableHandle
from torchvision import models

import hookviz as hv
from hookviz.hooks import _INPLACE_HOLDS
from hookviz.methods.cam import GuidedGradCAM
from hookviz.methods.guided import ReLURuleAttribution
from hookviz.methods.scope import current_call
from hookviz.zoo import ShapesViT


def _vgg11() -> nn.Module:
    # vgg11's classifier holds 120M weights (25088 -> 4096 -> 4096): the same layer types, narrowed, keep the suite
    # fast; the features (in-place ReLUs, max pools) are torchvision's
    model = models.vgg11(weights=None, num_classes=10)
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    model.classifier = nn.Sequential(
        nn.Linear(512, 64), nn.ReLU(True), nn.Dropout(), nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(),
        nn.Linear(64, 10),
    )  # fmt: skip
    return model


ARCHS = {
    "resnet18": lambda: models.resnet18(weights=None, num_classes=10),
    "vgg11": _vgg11,
    "densenet121": lambda: models.densenet121(weights=None, num_classes=10),
    "mobilenet_v3_small": lambda: models.mobilenet_v3_small(weights=None, num_classes=10),
    "efficientnet_b0": lambda: models.efficientnet_b0(weights=None, num_classes=10),
    "googlenet": lambda: models.googlenet(weights=None, num_classes=10, aux_logits=False, init_weights=True),
    "vit": lambda: models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    ),
    # the zoo's ViT, narrowed: attention as one fused F.scaled_dot_product_attention call (timm's way), parameters
    # directly on the model (class token, position embeddings)
    "shapes_vit": lambda: ShapesViT(10, dim=32, depth=2, heads=2, size=32),
}
NO_RELU = {"efficientnet_b0", "vit", "shapes_vit"}  # SiLU / GELU only: the ReLU-rule methods must refuse them
# a module in the middle of each network, where the scenarios' user hook raises
MIDDLE = {
    "resnet18": "layer3",
    "vgg11": "features.10",
    "densenet121": "features.denseblock2",
    "mobilenet_v3_small": "features.6",
    "efficientnet_b0": "features.4",
    "googlenet": "inception4a",
    "vit": "encoder.layers.encoder_layer_1",
    "shapes_vit": "blocks.0",
}
# Score-CAM runs one masked forward pass per channel: an early layer with few channels keeps it cheap
SMALL_LAYER = {
    "resnet18": "layer1",
    "vgg11": "features.1",
    "densenet121": "features.conv0",
    "mobilenet_v3_small": "features.0",
    "efficientnet_b0": "features.0",
    "googlenet": "conv1",
    "vit": "encoder.layers.encoder_layer_1.ln_1",
    "shapes_vit": "blocks.1.norm1",
}
_QUARTERS = hv.grid_mask((32, 32), 16)
# cheap options for the methods that repeat passes; every other registered method is built as cls(model, eval_mode=)
OPTIONS = {
    "integrated-gradients": lambda m, arch, ev: hv.IntegratedGradients(m, steps=2, eval_mode=ev),
    "smoothgrad": lambda m, arch, ev: hv.SmoothGrad(
        hv.Saliency(m, eval_mode=ev), n=2, generator=torch.Generator().manual_seed(0)
    ),
    "vargrad": lambda m, arch, ev: hv.VarGrad(
        hv.Saliency(m, eval_mode=ev), n=2, generator=torch.Generator().manual_seed(0)
    ),
    "scorecam": lambda m, arch, ev: hv.ScoreCAM(m, layer=SMALL_LAYER[arch], batch_size=256, eval_mode=ev),
    "occlusion": lambda m, arch, ev: hv.Occlusion(m, window=(16, 16), eval_mode=ev),
    "rise": lambda m, arch, ev: hv.RISE(m, n_masks=8, cell=4, eval_mode=ev),
    "deeplift-shap": lambda m, arch, ev: hv.DeepLiftShap(m, torch.randn(2, 3, 32, 32), eval_mode=ev),
    "gradient-shap": lambda m, arch, ev: hv.GradientShap(
        m, torch.randn(2, 3, 32, 32), n_samples=2, generator=torch.Generator().manual_seed(0), eval_mode=ev
    ),
    # the coalition methods on a 2 x 2 grid of 16-pixel patches: 4 groups keep every one a few passes
    **{
        name: (lambda m, arch, ev, name=name, o=opts: hv.get_method(name)(m, feature_mask=_QUARTERS, eval_mode=ev, **o))
        for name, opts in {
            "feature-ablation": {},
            "feature-permutation": {},
            "shapley-values": {},
            "shapley-sampling": {"n_samples": 2},
            "kernel-shap": {"n_samples": 6},
            "lime": {"n_samples": 6},
            "partition-shap": {},
        }.items()
    },
}
# the lrp-<composite> names are `LRP` with another default composite: "lrp" stands for them (the rules themselves
# are tested in test_lrp.py), which keeps the suite's run time modest
SUITE_METHODS = sorted(m for m in hv.METHODS if not m.startswith("lrp-"))
# "lrp" with no composite named takes AttnLRP on the ViTs (attention found), EpsilonPlusFlat on the CNNs: it refuses
# none of the suite's architectures (a named CNN composite refuses a ViT: tests/test_lrp.py)
LRP_REFUSES: set[str] = set()
# the attention rollouts read self-attention: every architecture but the ViTs is refused up front ("no attention found")
ATTENTION_METHODS = {"attention-rollout", "gradient-rollout"}
HAS_ATTENTION = {"vit", "shapes_vit"}
TRANSFORMER_METHODS = ("lrp-attn-lrp", "lrp-cp-lrp")
TRANSFORMER_ARCHS = ("vit", "shapes_vit")
SCENARIOS = ("normal", "target-out-of-range", "error-mid-forward", "interrupt-mid-forward")


class Boom(Exception):
    """Raised by the user's own forward hook in the middle of the network."""


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = ARCHS[name]()
    model.train()
    children = list(model.children())
    children[0].requires_grad_(False)  # a frozen block
    model(torch.randn(2, 3, 32, 32)).sum().backward()  # gradients accumulated, BatchNorm statistics moved
    for i, p in enumerate(p for p in model.parameters() if p.requires_grad):
        if i % 3 == 2:
            p.grad = None  # some parameters without .grad
    children[1].eval()  # mixed modes must come back mixed
    return model


def _hook_tables(m: nn.Module) -> list[int]:
    return [
        len(m._forward_hooks),
        len(m._forward_pre_hooks),
        len(m._backward_hooks),
        len(m._backward_pre_hooks),
        len(m._forward_hooks_with_kwargs),
        len(m._forward_hooks_always_called),
        len(m._forward_pre_hooks_with_kwargs),
    ]


def _global_hooks() -> list[int]:
    return [
        len(module_globals._global_forward_hooks),
        len(module_globals._global_forward_pre_hooks),
        len(module_globals._global_backward_hooks),
        len(module_globals._global_backward_pre_hooks),
        len(module_globals._global_forward_hooks_always_called),
    ]


def plain_output(model: nn.Module, x: Tensor) -> Tensor:
    """``model(x)`` as the user would run it (same dropout draw), without leaving BatchNorm statistics changed."""
    buffers = [(b, b.clone()) for b in model.buffers()]
    torch.manual_seed(123)
    with torch.no_grad():
        out = model(x)
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    return out


class Snapshot:
    def __init__(self, model: nn.Module, x: Tensor) -> None:
        self.modules = list(model.named_modules())
        self.params = list(model.named_parameters())
        self.training = [m.training for _, m in self.modules]
        self.full_backward = [m._is_full_backward_hook for _, m in self.modules]
        self.inplace = [(n, m.inplace) for n, m in self.modules if hasattr(m, "inplace")]
        self.requires_grad = [p.requires_grad for _, p in self.params]
        self.grads = [(p.grad, None if p.grad is None else p.grad.clone()) for _, p in self.params]
        self.state = {k: v.clone() for k, v in model.state_dict().items()}
        self.output = plain_output(model, x)
        assert sum(g is not None for g, _ in self.grads) > 0 and sum(g is None for g, _ in self.grads) > 0
        assert any(self.training) and not all(self.training)
        assert any(self.requires_grad) and not all(self.requires_grad)


@pytest.fixture(scope="session")
def zoo() -> dict[str, tuple[nn.Module, Tensor, Snapshot]]:
    return {}


@pytest.fixture(scope="session")
def explainers() -> dict[tuple[str, str, bool], hv.Attribution]:
    """One explainer per method, model and eval_mode, reused by the four scenarios (as a user reuses one), so a CAM
    layer chosen automatically is probed once rather than in every case."""
    return {}


@pytest.fixture
def arch_model(request, zoo) -> tuple[str, nn.Module, Tensor, Snapshot]:
    name = request.param
    if name not in zoo:
        model = build(name)
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        zoo[name] = (model, x, Snapshot(model, x))
    return (name, *zoo[name])


def check_untouched(model: nn.Module, x: Tensor, snap: Snapshot, grad_enabled: bool) -> None:
    assert _get_current_function_mode_stack() == []
    assert _get_current_dispatch_mode_stack() == []
    assert current_call() is None and len(_INPLACE_HOLDS) == 0
    assert torch.is_grad_enabled() is grad_enabled and not torch.is_inference_mode_enabled()
    assert _global_hooks() == [0] * 5
    for n, m in snap.modules:
        assert _hook_tables(m) == [0] * 7, f"hooks left on {n!r}"
        assert "forward" not in m.__dict__, f"an instance forward left on {n!r}"  # patching's shared prefix sets them
    assert [m._is_full_backward_hook for _, m in snap.modules] == snap.full_backward
    for n, p in snap.params:
        assert not p._backward_hooks and not getattr(p, "_post_accumulate_grad_hooks", None), f"tensor hook on {n}"
    assert [m.training for _, m in snap.modules] == snap.training
    assert [p.requires_grad for _, p in snap.params] == snap.requires_grad
    assert [(n, m.inplace) for n, m in snap.modules if hasattr(m, "inplace")] == snap.inplace
    state = model.state_dict()
    assert state.keys() == snap.state.keys()
    for k, v in snap.state.items():
        assert torch.equal(state[k], v), f"{k} changed"
    for (n, p), (grad, value) in zip(snap.params, snap.grads, strict=True):
        assert p.grad is grad, f"{n}.grad replaced"
        if grad is not None:
            assert torch.equal(grad, value), f"{n}.grad changed"
    assert torch.equal(plain_output(model, x), snap.output)


def failing_hook(
    model: nn.Module, arch: str, scenario: str
) -> tuple[RemovableHandle | None, tuple[type[BaseException], str | None] | None]:
    """For the scenarios that end in the middle of the forward pass: a user's forward hook on a middle module that
    raises (an error, or Ctrl-C), and what the call must raise; else (None, None)."""
    if scenario not in ("error-mid-forward", "interrupt-mid-forward"):
        return None, None
    exc = Boom("the user's hook failed") if scenario == "error-mid-forward" else KeyboardInterrupt()

    def raise_it(module, args, out):
        raise exc

    hook = model.get_submodule(MIDDLE[arch]).register_forward_hook(raise_it)
    return hook, (type(exc), "the user's hook failed" if scenario == "error-mid-forward" else None)


def ending(
    model: nn.Module, arch: str, scenario: str
) -> tuple[object, tuple[type[BaseException], str | None] | None, RemovableHandle | None]:
    """(target, what the call must raise or None, the failing user hook or None) for `scenario`, for a method that
    refuses no model."""
    target: object = [1, 2]
    expected: tuple[type[BaseException], str | None] | None = None
    if scenario == "target-out-of-range":
        target, expected = 10, (ValueError, "out of range")
    hook, raised = failing_hook(model, arch, scenario)
    return target, raised or expected, hook


def make(method: str, model: nn.Module, arch: str, eval_mode: bool) -> hv.Attribution:
    if method in OPTIONS:
        return OPTIONS[method](model, arch, eval_mode)
    return hv.METHODS[method](model, eval_mode=eval_mode)


def refuses(method: str, arch: str) -> bool:
    cls = hv.METHODS[method]
    return arch in NO_RELU and issubclass(cls, ReLURuleAttribution | GuidedGradCAM)


@pytest.mark.parametrize("eval_mode", [True, False], ids=["eval", "keep-modes"])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch_model", sorted(ARCHS), indirect=True)
@pytest.mark.parametrize("method", SUITE_METHODS)
@pytest.mark.filterwarnings("ignore:IntegratedGradients. attributions:UserWarning")  # 2 steps: rightly warned
@pytest.mark.filterwarnings("ignore:DeepLift.*attributions:UserWarning")  # softmax, hardswish: rightly warned
def test_call_leaves_model_and_process_as_they_were(method, arch_model, scenario, eval_mode, explainers) -> None:
    arch, model, x, snap = arch_model
    grad_enabled = eval_mode  # keep-modes cases run under torch.no_grad()
    key = (method, arch, eval_mode)
    if method == "lrp" and arch in LRP_REFUSES:
        with pytest.raises(ValueError, match="has no rule for these layers with parameters"):
            make(method, model, arch, eval_mode)
        check_untouched(model, x, snap, torch.is_grad_enabled())
        return
    if method in ATTENTION_METHODS and arch not in HAS_ATTENTION:
        with pytest.raises(ValueError, match="no attention found"):
            make(method, model, arch, eval_mode)
        check_untouched(model, x, snap, torch.is_grad_enabled())
        return
    if key not in explainers:
        explainers[key] = make(method, model, arch, eval_mode)
    explainer = explainers[key]
    target: object = [1, 2]
    expected: tuple[type[BaseException], str | None] | None = None
    if refuses(method, arch):
        expected = (ValueError, "no ReLU ran")
    if scenario == "target-out-of-range":
        target = 10
        expected = (ValueError, "out of range|no ReLU ran" if expected else "out of range")
    user_hook, raised = failing_hook(model, arch, scenario)
    expected = raised or expected
    with torch.set_grad_enabled(grad_enabled):
        try:
            if expected is None:
                out = explainer.attribute(x, target=target)
                assert out.shape[0] == 2 and torch.isfinite(out).all()
            else:
                with pytest.raises(expected[0], match=expected[1]):
                    explainer.attribute(x, target=target)
        finally:
            if user_hook is not None:
                user_hook.remove()
        check_untouched(model, x, snap, grad_enabled)


@pytest.mark.parametrize("eval_mode", [True, False], ids=["eval", "keep-modes"])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch_model", TRANSFORMER_ARCHS, indirect=True)
@pytest.mark.parametrize("method", TRANSFORMER_METHODS)
def test_transformer_composites_leave_model_and_process_as_they_were(
    method, arch_model, scenario, eval_mode, explainers
) -> None:
    """AttnLRP / CP-LRP (their own rules: products, softmax, norms, the decomposed nn.MultiheadAttention) on the
    torchvision ViT, in the same four endings and two modes as every other method."""
    test_call_leaves_model_and_process_as_they_were(method, arch_model, scenario, eval_mode, explainers)


# TCAV (hookviz.concepts) is no attribution method (no hv.METHODS entry): its cases run the same models, endings and
# modes with an early layer (SMALL_LAYER) as the CAVs' layer, and check its caches too: one TCAV per model and mode,
# reused by the four endings as the explainers are; a call that ends in an error or Ctrl-C leaves no activation or
# CAV behind (the caches hold what they held before), a call that ends normally fills them.
_G = torch.Generator().manual_seed(2)
TCAV_CONCEPTS = {"a": torch.randn(3, 3, 32, 32, generator=_G), "b": torch.randn(3, 3, 32, 32, generator=_G) + 0.5}
TCAV_RANDOM = torch.randn(8, 3, 32, 32, generator=_G)


@pytest.mark.parametrize("eval_mode", [True, False], ids=["eval", "keep-modes"])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch_model", sorted(ARCHS), indirect=True)
def test_tcav_leaves_model_process_and_cache_as_they_were(arch_model, scenario, eval_mode, explainers) -> None:
    arch, model, x, snap = arch_model
    grad_enabled = eval_mode  # keep-modes cases run under torch.no_grad()
    key = ("tcav", arch, eval_mode)
    if key not in explainers:
        explainers[key] = hv.TCAV(model, SMALL_LAYER[arch], eval_mode=eval_mode)
    tcav = explainers[key]
    before = (dict(tcav._acts), dict(tcav._cavs))
    target, expected, user_hook = ending(model, arch, scenario)
    with torch.set_grad_enabled(grad_enabled):
        try:
            if expected is None:
                result = tcav.interpret(x, TCAV_CONCEPTS, TCAV_RANDOM, target=target, n_random=2, random_size=3)
                assert len(result.rows) == 2 * 2 and all(0 <= r.stats["sign_count"].mean <= 1 for r in result.rows)
                assert len(tcav._acts) == 3 and len(tcav._cavs) == 3 * 2  # two concepts and the null, 2 sets each
            else:
                # a concept not seen before: its activations, computed before the call fails, must not stay
                fresh = {**TCAV_CONCEPTS, "fresh": torch.randn(3, 3, 32, 32)}
                with pytest.raises(expected[0], match=expected[1]):
                    tcav.interpret(x, fresh, TCAV_RANDOM, target=target, n_random=2, random_size=3)
                assert tcav._acts == before[0] and tcav._cavs.keys() == before[1].keys()
                assert all(tcav._cavs[k] is v for k, v in before[1].items())
        finally:
            if user_hook is not None:
                user_hook.remove()
        check_untouched(model, x, snap, grad_enabled)


# CRP (hookviz.concepts) conditions LRP on channels: its cases run the models LRP takes, in the same endings and modes,
# two condition sets on an early layer (SMALL_LAYER's channels 0 and 1; a token layer's features 0 and 1) in one call.
@pytest.mark.parametrize("eval_mode", [True, False], ids=["eval", "keep-modes"])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch_model", sorted(set(ARCHS) - set(LRP_REFUSES)), indirect=True)
def test_crp_leaves_model_and_process_as_they_were(arch_model, scenario, eval_mode, explainers) -> None:
    arch, model, x, snap = arch_model
    grad_enabled = eval_mode  # keep-modes cases run under torch.no_grad()
    key = ("crp", arch, eval_mode)
    if key not in explainers:
        explainers[key] = hv.CRP(model, eval_mode=eval_mode)
    crp = explainers[key]
    conditions = [{SMALL_LAYER[arch]: [0]}, {SMALL_LAYER[arch]: [1]}]
    target, expected, user_hook = ending(model, arch, scenario)
    with torch.set_grad_enabled(grad_enabled):
        try:
            if expected is None:
                out = crp.attribute(x, target=target, conditions=conditions)
                assert out.shape[:2] == (2, 2) and torch.isfinite(out).all()
            else:
                with pytest.raises(expected[0], match=expected[1]):
                    crp.attribute(x, target=target, conditions=conditions)
        finally:
            if user_hook is not None:
                user_hook.remove()
        check_untouched(model, x, snap, grad_enabled)
