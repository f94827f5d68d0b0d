"""`latent_attribution`: a metric attributed to every SAE latent and to each SAE's error node (Marks et al. 2024,
"Sparse Feature Circuits", §2 and appendix A).

The SAEs are spliced in with their error terms (`splice`), so the model computes what it computed before, and the
metric m (a function of the model's output giving one score per input, (N,): a logit, a logit difference, a token's
probability) is differentiated with respect to the latents f and the errors e at every spliced layer:

- ``"gradient"`` (gradient x activation): f ⊙ ∂m/∂f, and Σ_d e ⊙ ∂m/∂e for the error; one forward and one backward
  pass for all layers, latents and inputs.
- ``"patching"`` (attribution patching, Marks et al. eq. 3; Nanda 2023; Syed et al. 2023): (f* - f) ⊙ ∂m/∂f with f*
  the latents on the `corrupted` inputs: the first-order estimate of m(f_i := f*_i) - m(clean). One forward on the
  corrupted inputs (no gradient) and one forward and backward on the clean ones.
- ``"integrated_gradients"`` (Marks et al. eq. 4): (f - f*) ⊙ mean over α of ∂m/∂f at f* + α (f - f*) (the
  corrupted latents, or zeros without `corrupted`), midpoint rule with `steps` points; one layer at a time (its
  latents and error interpolated together, the other layers clean), the `steps` points batched into one forward and
  one backward pass per layer. Its sign is that of gradient x activation (clean minus baseline).

Where m is linear in the spliced layer's output (a linear head directly on it), the gradient is constant, so the
latents' effects plus the error's add up to the change of m exactly: m(clean) - m(baseline) for gradient x
activation and integrated gradients, m(corrupted) - m(clean) for attribution patching, whose per-latent effects then
equal exact activation patching (tests/test_sae_attribution.py).

Gradients reach each layer's latents through everything above it, other spliced layers included: a spliced layer
passes gradients to the layers below as the original layer does (`splice`'s docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import positive_int
from ..hooks import HookManager
from ..interventions._common import call_model, expand_inputs, prepared
from .sae import SAE
from .splice import Spliced, splice

__all__ = ["LatentAttribution", "latent_attribution"]

METHODS = ("gradient", "patching", "integrated_gradients")


@dataclass
class LatentAttribution:
    """Effects per spliced layer: ``latents[layer]`` in the latents' layout ((N, d_sae), (N, T, d_sae), (N, d_sae,
    H, W)), ``errors[layer]`` the error node's effect summed over the features ((N,), (N, T), (N, H, W)); `metric`
    (N,) on the clean inputs and `baseline` (N,) on the corrupted ones (None without them)."""

    method: str
    latents: dict[str, Tensor]
    errors: dict[str, Tensor]
    metric: Tensor
    baseline: Tensor | None = None
    steps: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def total(self, layer: str) -> Tensor:
        """Σ latents + error per input (N,): the change of the metric the layer's nodes account for."""
        lat = self.latents[layer]
        return lat.reshape(lat.shape[0], -1).sum(1) + self.errors[layer].reshape(lat.shape[0], -1).sum(1)


def _feature_axis(t: Tensor) -> int:
    return 1 if t.dim() == 4 else -1


def _scores(metric: Callable[[Any], Tensor], output: Any, n: int) -> Tensor:
    m = metric(output)
    if not isinstance(m, Tensor) or m.shape not in ((n,), (n, 1)):
        got = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
        raise ValueError(f"metric must return one score per input, a tensor (N,) = ({n},); got {got}")
    return m.reshape(n)


def latent_attribution(
    model: nn.Module,
    inputs: Any,
    saes: Mapping[str, SAE],
    metric: Callable[[Any], Tensor],
    *,
    method: str = "gradient",
    corrupted: Any = None,
    steps: int = 16,
) -> LatentAttribution:
    """Attribute `metric` to every latent and error node of the SAEs spliced at `saes`' layers (module docstring).

    Args:
        model: any module; eval mode and frozen parameters for the call, restored after.
        inputs: the clean batch (a tensor, a tuple of positional arguments or a dict of keyword arguments).
        saes: ``{layer name: SAE}``.
        metric: model output -> (N,) scores, e.g. ``lambda out: out[:, -1, good] - out[:, -1, bad]``.
        method: ``"gradient"``, ``"patching"`` (needs `corrupted`) or ``"integrated_gradients"``.
        corrupted: the corrupted batch (same shapes), the patching source and the IG baseline.
        steps: integration points of ``"integrated_gradients"``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    if method == "patching" and corrupted is None:
        raise ValueError("method='patching' needs corrupted=<the corrupted inputs> to patch from")
    if not callable(metric):
        raise TypeError(f"metric must be a callable model output -> (N,) scores, got {type(metric).__name__}")
    positive_int("steps", steps, "integration points")
    with prepared(model, True, freeze=True), splice(model, saes) as spliced:
        base_f: dict[str, Tensor] = {}
        base_e: dict[str, Tensor] = {}
        baseline = None
        if corrupted is not None:
            with torch.no_grad():
                out = call_model(model, corrupted)
            base_f = {k: v.clone() for k, v in spliced.latents.items()}
            base_e = {k: v.clone() for k, v in spliced.errors.items()}
            first = next(iter(base_f.values()))
            baseline = _scores(metric, out, first.shape[0]).detach()
        if method == "integrated_gradients":
            return _integrated(model, inputs, spliced, metric, base_f, base_e, baseline, steps)
        with torch.enable_grad(), HookManager(model) as hooks:
            taps: dict[str, list[Tensor]] = {}
            _tap(hooks, spliced, taps)
            out = call_model(model, inputs)
            values = {k: v[0] for k, v in taps.items()}
            n = next(iter(values.values())).shape[0]
            m = _scores(metric, out, n)
            deltas = [taps[k][1] for k in taps]
            grads = dict(zip(taps, torch.autograd.grad(m.sum(), deltas, allow_unused=True), strict=True))
        latents, errors = {}, {}
        for layer in saes:
            for kind, base, store in (("latents", base_f, latents), ("error", base_e, errors)):
                key = (layer, kind)
                value, grad = values[key], grads[key]
                grad = torch.zeros_like(value) if grad is None else grad
                delta = value if method == "gradient" else base[layer] - value
                effect = delta * grad
                store[layer] = effect if kind == "latents" else effect.sum(_feature_axis(effect))
        return LatentAttribution(method, latents, errors, m.detach(), baseline)


def _tap(hooks: HookManager, spliced: Spliced, taps: dict[Any, list[Tensor]]) -> None:
    """Hooks on the site modules: each output t becomes t + δ (δ a zero leaf requiring grad, so ∂m/∂δ = ∂m/∂t and
    the graph through t stays, for the layers below); records (t, δ)."""

    def make(key: tuple[str, str]) -> Callable[..., Tensor]:
        def hook(module: nn.Module, args: Any, out: Tensor) -> Tensor:
            delta = torch.zeros_like(out, requires_grad=True)
            taps[key] = [out.detach(), delta]
            return out + delta

        return hook

    for layer in spliced.saes:
        hooks.forward(spliced.latent_site(layer), make((layer, "latents")))
        hooks.forward(spliced.error_site(layer), make((layer, "error")))


def _integrated(
    model: nn.Module,
    inputs: Any,
    spliced: Spliced,
    metric: Callable[[Any], Tensor],
    base_f: dict[str, Tensor],
    base_e: dict[str, Tensor],
    baseline: Tensor | None,
    steps: int,
) -> LatentAttribution:
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps  # midpoint rule
    big = expand_inputs(inputs, steps)
    latents, errors = {}, {}
    clean_metric = None
    for layer in spliced.saes:
        got: dict[str, list[Tensor]] = {}
        with torch.enable_grad(), HookManager(model) as hooks:
            hooks.forward(spliced.latent_site(layer), _ig_hook(got, "latents", base_f.get(layer), alphas, steps))
            hooks.forward(spliced.error_site(layer), _ig_hook(got, "error", base_e.get(layer), alphas, steps))
            out = call_model(model, big)
            n = got["latents"][0].shape[0]
            m = _scores(metric, out, n * steps)
            g_f, g_e = torch.autograd.grad(m.sum(), [got["latents"][2], got["error"][2]])
        for kind, grad, store in (("latents", g_f, latents), ("error", g_e, errors)):
            clean, start, _ = got[kind]
            mean_grad = grad.reshape(steps, *clean.shape).mean(0)
            effect = (clean - start) * mean_grad
            store[layer] = effect if kind == "latents" else effect.sum(_feature_axis(effect))
    with torch.no_grad():
        clean_metric = _scores(metric, call_model(model, inputs), next(iter(latents.values())).shape[0])
    return LatentAttribution("integrated_gradients", latents, errors, clean_metric, baseline, steps)


def _ig_hook(
    got: dict[str, list[Tensor]], kind: str, base: Tensor | None, alphas: Tensor, steps: int
) -> Callable[..., Tensor]:
    """A site hook for `steps` site-major copies of the clean batch: copy j becomes base + α_j (clean - base), a
    leaf whose gradient is read; records (clean, base, points)."""

    def hook(module: nn.Module, args: Any, out: Tensor) -> Tensor:
        n = out.shape[0] // steps
        clean = out.detach()[:n]
        start = torch.zeros_like(clean) if base is None else base
        a = alphas.to(out.device, out.dtype).view(steps, *([1] * clean.dim()))
        points = (start + a * (clean - start)).reshape(out.shape).requires_grad_()
        got[kind] = [clean, start, points]
        return points

    return hook
