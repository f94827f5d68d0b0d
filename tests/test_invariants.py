"""Every method leaves the model exactly as it entered: hooks, modes, requires_grad, values, .grad; also on error."""

from __future__ import annotations

import pytest
import torch
from cheap import NEEDS_ATTENTION, ON_CNNS, cheap_method
from torch import nn
from torchvision import models

import hookviz as hv
from hookviz import hook_counts

# every registered method, so a new method is covered without editing this file (the attention methods refuse the
# resnet: they are checked on transformers below)
BUILDERS = {name: (lambda m, name=name: cheap_method(name, m)) for name in ON_CNNS}
# options that change what runs: layer attribution, noise over other methods
BUILDERS.update(
    {
        "saliency[layer]": lambda m: hv.Saliency(m, layer="layer2"),
        "input-x-gradient[layer_input]": lambda m: hv.InputXGradient(m, layer="layer3", layer_input=True),
        "integrated-gradients[layer]": lambda m: hv.IntegratedGradients(m, steps=4, layer="layer2", batch_size=3),
        "smoothgrad[integrated-gradients]": lambda m: hv.SmoothGrad(hv.IntegratedGradients(m, steps=2), n=2),
        "vargrad[gradcam]": lambda m: hv.VarGrad(hv.GradCAM(m, layer="layer3"), n=2, batch_size=3),
        "vargrad[guided-backprop]": lambda m: hv.VarGrad(hv.GuidedBackprop(m), n=2),
    }
)


def snapshot(model: nn.Module) -> dict:
    return {
        "hooks": hook_counts(model),
        "training": [(n, m.training) for n, m in model.named_modules()],
        "requires_grad": [(n, p.requires_grad) for n, p in model.named_parameters()],
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grad_ids": [(n, id(p.grad)) for n, p in model.named_parameters()],
        "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "inplace": [(n, m.inplace) for n, m in model.named_modules() if hasattr(m, "inplace")],
    }


def assert_same(before: dict, model: nn.Module) -> None:
    after = snapshot(model)
    assert after["hooks"] == before["hooks"]
    assert after["training"] == before["training"]
    assert after["requires_grad"] == before["requires_grad"]
    assert after["grad_ids"] == before["grad_ids"]
    assert after["inplace"] == before["inplace"]
    assert before["state"].keys() == after["state"].keys()
    for k, v in before["state"].items():
        assert torch.equal(v, after["state"][k]), k  # bit for bit
    for k, v in before["grads"].items():
        assert torch.equal(v, after["grads"][k]), k


def mid_training_resnet() -> nn.Module:
    """A resnet18 in the middle of a training step: train mode, some frozen parameters, gradients accumulated."""
    torch.manual_seed(0)
    model = models.resnet18(weights=None, num_classes=10)
    model.train()
    model.layer1.requires_grad_(False)
    x = torch.randn(4, 3, 32, 32)
    model(x).sum().backward()
    model.layer2.eval()  # mixed modes must come back mixed
    return model


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.filterwarnings("ignore:IntegratedGradients. attributions:UserWarning")  # 50 steps: a legitimate warning
def test_model_restored_after_call(name: str) -> None:
    model = mid_training_resnet()
    before = snapshot(model)
    out = BUILDERS[name](model).attribute(torch.randn(2, 3, 32, 32), target=[1, 2])
    assert out.shape[0] == 2 and torch.isfinite(out).all()
    assert_same(before, model)


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize(
    "target",
    [10, lambda out: out.sum(), lambda out: (_ for _ in ()).throw(KeyError("boom"))],
    ids=["range", "shape", "raises"],
)
def test_model_restored_after_error(name: str, target) -> None:
    model = mid_training_resnet()
    before = snapshot(model)
    with pytest.raises((ValueError, RuntimeError)):
        BUILDERS[name](model).attribute(torch.randn(2, 3, 32, 32), target=target)
    assert_same(before, model)


EXPANDING = sorted(
    name
    for name in BUILDERS
    if name.split("[")[0] in {"integrated-gradients", "smoothgrad", "vargrad", "occlusion", "rise", "gradient-shap",
                              "scorecam", "deeplift", "deeplift-shap"}
)  # fmt: skip


@pytest.mark.parametrize("name", EXPANDING)
def test_model_restored_when_a_callable_target_interrupts_a_later_block(name: str) -> None:
    """A callable target runs once per block of N rows in methods that expand the batch (issue 27): a Ctrl-C in its
    second call, in the middle of the expanded batch, leaves the model as it was."""
    model = mid_training_resnet()
    before = snapshot(model)
    calls = []

    def interrupted(out: torch.Tensor) -> torch.Tensor:
        calls.append(out.shape[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return out[:, 1]

    with pytest.raises(KeyboardInterrupt):
        BUILDERS[name](model).attribute(torch.randn(2, 3, 32, 32), target=interrupted)
    assert set(calls) == {2}  # every call saw the two inputs' rows
    assert_same(before, model)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_model_restored_after_error_inside_forward(name: str) -> None:
    model = mid_training_resnet()
    before = snapshot(model)

    def boom(module, args, out):
        raise ZeroDivisionError("boom in the user's own hook")

    handle = model.layer3.register_forward_hook(boom)
    try:
        with pytest.raises(ZeroDivisionError, match="boom"):
            BUILDERS[name](model).attribute(torch.randn(2, 3, 32, 32), target=[1, 2])
    finally:
        handle.remove()
    assert_same(before, model)


def test_train_mode_option_restores_batchnorm_statistics() -> None:
    model = mid_training_resnet()
    before = snapshot(model)
    cam = hv.GradCAM(model, layer="layer3", eval_mode=False)
    cam.attribute(torch.randn(2, 3, 32, 32), target=[0, 1])
    assert_same(before, model)


class _TwoInputs(nn.Module):
    """The mid-training resnet on an image, plus a metadata input and a per-sample extra forward argument."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mid_training_resnet()
        self.meta = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor, meta: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return self.net(x) + self.meta(meta) * gain[:, None]


MULTI = sorted(name for name, cls in hv.METHODS.items() if cls.multi_input)


@pytest.mark.parametrize("name", MULTI)
@pytest.mark.parametrize("fail", [False, True], ids=["ok", "raises"])
@pytest.mark.filterwarnings("ignore:IntegratedGradients. attributions:UserWarning")
def test_model_restored_with_several_inputs_and_extra_args(name: str, fail: bool) -> None:
    model = _TwoInputs()
    before = snapshot(model)
    inputs = (torch.randn(2, 3, 32, 32), torch.randn(2, 3))
    kwargs = {"layer": "net.layer3"} if hv.METHODS[name].__module__.endswith("cam") else {}
    method = hv.METHODS[name](model, **kwargs)
    if fail:
        with pytest.raises(RuntimeError):  # the extra argument breaks the forward pass itself
            method.attribute(inputs, target=[1, 2], additional_forward_args=torch.ones(2, 5))
    else:
        out = method.attribute(inputs, target=[1, 2], additional_forward_args=torch.tensor([1.0, -1.0]))
        assert all(torch.isfinite(o).all() for o in (out if isinstance(out, tuple) else (out,)))
    assert_same(before, model)


# -- the attention methods, on transformers in the middle of a training step -------------------------------------------
def mid_training_vit() -> tuple[nn.Module, torch.Tensor, dict]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
        mlp_ratio=2.0, num_classes=10, reg_tokens=2,
    )  # fmt: skip
    model.train()
    model.patch_embed.requires_grad_(False)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    model.blocks[0].eval()
    model.blocks[1].attn.fused_attn = False  # one fused attention, one eager
    return model, torch.randn(2, 3, 32, 32), {}


def mid_training_bert() -> tuple[nn.Module, torch.Tensor, dict]:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=10, attn_implementation="sdpa",
    )  # fmt: skip
    model = BertForSequenceClassification(config).train()
    model.bert.embeddings.requires_grad_(False)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    model(ids, attention_mask=mask).logits.sum().backward()
    model.bert.encoder.layer[0].eval()
    return model, ids, {"attention_mask": mask}


TRANSFORMERS = {"timm-vit": mid_training_vit, "bert": mid_training_bert}
MIDDLE_BLOCK = {"timm-vit": "blocks.1", "bert": "bert.encoder.layer.1"}


@pytest.mark.parametrize("scenario", ["normal", "target-out-of-range", "target-raises", "error-inside", "interrupt"])
@pytest.mark.parametrize("arch", sorted(TRANSFORMERS))
@pytest.mark.parametrize("name", sorted(NEEDS_ATTENTION))
def test_attention_methods_restore_transformers(name: str, arch: str, scenario: str) -> None:
    model, x, kwargs = TRANSFORMERS[arch]()
    before = snapshot(model)
    method = cheap_method(name, model)
    target: object = [1, 2]
    handle = None
    expected: tuple[type[BaseException], str | None] | None = None
    if scenario == "target-out-of-range":
        target, expected = 10, (ValueError, "out of range")
    elif scenario == "target-raises":
        target, expected = (lambda out: (_ for _ in ()).throw(KeyError("boom"))), (RuntimeError, "target callable")
    elif scenario in ("error-inside", "interrupt"):
        exc = ZeroDivisionError("boom in the user's own hook") if scenario == "error-inside" else KeyboardInterrupt()

        def raise_it(module, args, out):
            raise exc

        handle = model.get_submodule(MIDDLE_BLOCK[arch]).register_forward_hook(raise_it)
        expected = (type(exc), "boom" if scenario == "error-inside" else None)
    try:
        if expected is None:
            out = method.attribute(x, target=target, forward_kwargs=kwargs)
            assert out.shape[0] == 2 and torch.isfinite(out).all()
        else:
            with pytest.raises(expected[0], match=expected[1]):
                method.attribute(x, target=target, forward_kwargs=kwargs)
    finally:
        if handle is not None:
            handle.remove()
    assert_same(before, model)
    assert torch.overrides._get_current_function_mode_stack() == []


@pytest.mark.parametrize("name", sorted(NEEDS_ATTENTION))
def test_attention_methods_refuse_a_model_without_attention_and_leave_it_alone(name: str) -> None:
    model = mid_training_resnet()
    before = snapshot(model)
    with pytest.raises(ValueError, match="no attention found in ResNet"):
        cheap_method(name, model)
    assert_same(before, model)


def test_eval_is_not_called_on_a_model_already_in_eval_mode() -> None:
    """The life cycle calls ``model.eval()`` only when some module trains (a model's own ``train`` may do more than
    set flags, and setting them to what they are costs a walk of the model); the flags come back either way."""

    class Counting(nn.Sequential):
        calls = 0

        def train(self, mode: bool = True) -> Counting:
            type(self).calls += 1
            return super().train(mode)

    model = Counting(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    Counting.calls = 0
    hv.Saliency(model).attribute(torch.randn(2, 4), target=0)
    assert Counting.calls == 0 and not any(m.training for m in model.modules())
    model.train()
    model[1].eval()  # mixed modes come back mixed
    Counting.calls = 0
    hv.Saliency(model).attribute(torch.randn(2, 4), target=0)
    assert Counting.calls == 1 and [m.training for m in model.modules()] == [True, True, False, True]
