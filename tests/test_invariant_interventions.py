"""The invariant suite extended to the interventions: `intervene`, `cache`, `patching`, `attribution_patching` and
`FeatureVisualization.render` x architectures (a reused ReLU, in-place ReLUs, tokens with tuple outputs) x the ways a
call ends (normal, bad input, an error or a KeyboardInterrupt raised by the user's hook in the middle of the network).
After each call, whatever happened, the model and the process are exactly as before (`check_untouched` of
test_invariant_suite: hooks, modes, flags, weights, ``.grad``, function modes, grad mode)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from test_invariant_suite import MIDDLE, Boom, Snapshot, build, check_untouched
from torch import Tensor, nn

import hookviz as hv
from hookviz.interventions import zero

ARCHS = ("resnet18", "vit")  # a reused ReLU and in-place ReLUs; tokens, tuple-free encoder blocks
# a layer early in each network, edited / patched / visualised by the calls below
EARLY = {"resnet18": "layer1.0.relu#1", "vit": "encoder.layers.encoder_layer_0"}
SCENARIOS = ("normal", "bad-input", "error-mid-forward", "interrupt-mid-forward")


def _intervene(model: nn.Module, x: Tensor, arch: str, bad: bool) -> None:
    edit = (lambda a: a[:1]) if bad else zero(channels=[0])
    buffers = [(b, b.clone()) for b in model.buffers()]  # the user's own train-mode forward moves BatchNorm stats
    try:
        with hv.intervene(model, {EARLY[arch]: edit}):
            model(x)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def _cache(model: nn.Module, x: Tensor, arch: str, bad: bool) -> None:
    hv.cache(model, x, layers=[EARLY[arch].partition("#")[0] + "#9" if bad else EARLY[arch]])


def _patching(model: nn.Module, x: Tensor, arch: str, bad: bool) -> None:
    corrupt = x.flip(0)[:1] if bad else x.flip(0)
    # many sites at one layer: the prefix is shared (module forwards replaced for the call, then restored)
    sites = {EARLY[arch]: "channel" if arch == "resnet18" else "token"}
    hv.patching(model, x, corrupt, lambda out: out[:, 1] - out[:, 2], sites)


def _attribution_patching(model: nn.Module, x: Tensor, arch: str, bad: bool) -> None:
    metric = (lambda out: out) if bad else (lambda out: out[:, 1])
    hv.attribution_patching(model, x, x.flip(0), metric, {EARLY[arch]: "layer"})


def _render(model: nn.Module, x: Tensor, arch: str, bad: bool) -> None:
    objective = {"resnet18": "conv1", "vit": "conv_proj"}[arch] + (":99" if bad else ":0")
    hv.FeatureVisualization(model, size=32, steps=2, model_size=32).render(objective, batch=2)


CALLS: dict[str, Callable[[nn.Module, Tensor, str, bool], None]] = {
    "intervene": _intervene,
    "cache": _cache,
    "patching": _patching,
    "attribution_patching": _attribution_patching,
    "render": _render,
}
EXPECTED_BAD = {
    "intervene": (ValueError, "must keep its shape"),
    "cache": (ValueError, "ran only"),
    "patching": (ValueError, "same shapes"),
    "attribution_patching": (ValueError, "one value per sample"),
    "render": (ValueError, "channel 99 is out of range"),
}


@pytest.fixture(scope="module")
def models() -> dict[str, tuple[nn.Module, Tensor, Snapshot]]:
    return {}


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_interventions_leave_model_and_process_as_they_were(call, arch, scenario, models) -> None:
    if arch not in models:
        model = build(arch)
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        models[arch] = (model, x, Snapshot(model, x))
    model, x, snap = models[arch]
    expected: tuple[type[BaseException], str | None] | None = None
    user_hook = None
    if scenario == "bad-input":
        expected = EXPECTED_BAD[call]
    elif scenario != "normal":
        exc = Boom("the user's hook failed") if scenario == "error-mid-forward" else KeyboardInterrupt()

        def raise_it(module, args, out):
            raise exc

        user_hook = model.get_submodule(MIDDLE[arch]).register_forward_hook(raise_it)
        expected = (type(exc), "the user's hook failed" if scenario == "error-mid-forward" else None)
        if call == "render":  # the render stops its forward at the named (early) layer: raise there
            user_hook.remove()
            first = {"resnet18": "conv1", "vit": "conv_proj"}[arch]
            user_hook = model.get_submodule(first).register_forward_hook(raise_it)
    try:
        if expected is None:
            CALLS[call](model, x, arch, False)
        else:
            with pytest.raises(expected[0], match=expected[1]):
                CALLS[call](model, x, arch, scenario == "bad-input")
    finally:
        if user_hook is not None:
            user_hook.remove()
    check_untouched(model, x, snap, torch.is_grad_enabled())
