"""`splice`: run a model with SAEs in place of layers' outputs, latents readable, editable and attributable.

Inside ``with hv.splice(model, {layer: sae}) as spliced:`` every forward of `model` replaces `layer`'s output x by
the SAE's reconstruction x̂ = decode(f), f = encode(x), plus, with ``error_term=True``, the error e = x - x̂ (Marks
et al. 2024, "Sparse Feature Circuits": the error as a node of its own). Two identity modules are hung on the layer
for the block, ``"{layer}.sae_latents"`` (f, in the layer's layout: (N, d_sae), (N, T, d_sae), or (N, d_sae, H, W)
for a 4-D (N, C, H, W) layer) and ``"{layer}.sae_error"`` (e, in the layer's layout): module names that `intervene`,
`patching`, `cache`, the recorders and every attribution method's ``layer=`` accept, like any other module's. The
hooks go through one `HookManager`; on exit (also on an exception) the hooks and the two modules are removed, so the
model is exactly as it was (its modules, parameters, hooks, flags).

With the error term the output is computed as ``x + (decode(f') - decode(f)) + (e' - e)`` where f', e' are the
latents and error after the site modules (edited or not): this equals x̂' + e' in exact arithmetic, and x bit for bit
when nothing is edited, so the spliced model's outputs equal the original's exactly. Gradients: d/df' = W_dec, d/de' =
the identity, and the gradient reaching the layer's output from above passes to the layers below unchanged (the
two paths through the SAE cancel), as in the original model. Without the error term the output is x̂' = decode(f').

``spliced.latents[layer]``, ``errors``, ``reconstructions`` and ``inputs`` hold the last forward's f', e', x̂', x
(detached). A module run several times in one forward is spliced at each call; the dicts keep the last call's values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..hooks import HookManager, select_modules
from ._acts import first_tensor, model_device, rebuild
from .sae import SAE

__all__ = ["LATENTS", "ERROR", "Spliced", "splice"]

LATENTS = "sae_latents"
ERROR = "sae_error"


class SAESite(nn.Module):
    """An identity on the latents (or the error) of a spliced layer: a module to hook, name and edit. It returns a
    view of its input (a node of its own in the autograd graph, so that its output's gradient is the gradient with
    respect to the latents after any edit). An edit must return a new tensor (as `intervene`'s do), not modify in
    place."""

    def __init__(self, layer: str, what: str) -> None:
        super().__init__()
        self.layer, self.what = layer, what
        self.last: Tensor | None = None

    def forward(self, t: Tensor) -> Tensor:
        out = t.view_as(t)
        self.last = out
        return out

    def extra_repr(self) -> str:
        return f"{self.what} of the SAE spliced at {self.layer!r}"


@dataclass
class Spliced:
    """What a `splice` block holds: the SAEs, the site module names and the last forward's values per layer."""

    saes: dict[str, SAE]
    error_term: bool
    latent_sites: dict[str, str]
    error_sites: dict[str, str]
    latents: dict[str, Tensor] = field(default_factory=dict)
    errors: dict[str, Tensor] = field(default_factory=dict)
    reconstructions: dict[str, Tensor] = field(default_factory=dict)
    inputs: dict[str, Tensor] = field(default_factory=dict)

    def latent_site(self, layer: str) -> str:
        """The module name of `layer`'s latents (for `intervene`, `cache`, ``layer=`` of the attribution methods)."""
        if layer not in self.latent_sites:
            raise KeyError(f"{layer!r} is not spliced here; spliced layers: {sorted(self.latent_sites)}")
        return self.latent_sites[layer]

    def error_site(self, layer: str) -> str:
        """The module name of `layer`'s error node."""
        if layer not in self.error_sites:
            raise KeyError(f"{layer!r} is not spliced here; spliced layers: {sorted(self.error_sites)}")
        return self.error_sites[layer]


def _owner(model: nn.Module, layer: str) -> tuple[nn.Module, str]:
    """The module the sites hang on and the prefix of their names: the layer itself, unless it is an `nn.Sequential`
    (whose forward would run a new child), then its closest ancestor that is not one."""
    named = dict(model.named_modules())
    path, prefix = layer, ""
    while isinstance(named[path], nn.Sequential):
        if path == "":
            raise ValueError(
                f"cannot hang the latent sites of {layer!r}: it and every module above it are nn.Sequential, whose "
                "forward runs every child; wrap the model in a module of your own"
            )
        parent, _, last = path.rpartition(".")
        prefix = f"{last}_{prefix}" if prefix else f"{last}_"
        path = parent
    return named[path], prefix


def _known_width(module: nn.Module) -> int | None:
    """The output width of common layers, to refuse a mismatched SAE before any forward."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.out_channels
    if isinstance(module, nn.Embedding):
        return module.embedding_dim
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        return module.normalized_shape[0]
    return None


@contextmanager
def splice(
    model: nn.Module,
    saes: Mapping[str, SAE],
    *,
    error_term: bool = True,
    freeze: bool = True,
    name_sites: bool = True,
) -> Iterator[Spliced]:
    """Replace each named layer's output by its SAE's reconstruction (+ the error term) inside the ``with`` block.

    Args:
        model: any module; it comes back exactly as it was, also when the block raises.
        saes: ``{layer name: SAE}``; the SAE's d_in must equal the layer's output width (the last axis, or axis 1
            of a 4-D (N, C, H, W) output). The layer's output is its first tensor for a tuple output.
        error_term: add e = x - x̂ (the default: outputs equal the original model's); False: x̂ alone.
        freeze: the SAEs' parameters do not require grad inside the block (restored after), so that attribution
            computes no weight gradients for them.
        name_sites: hang the latent and error modules on the model (False: they run unnamed, the module tree is
            not touched, and a layer inside nested `nn.Sequential` modules only can be spliced too).

    Yields a `Spliced` (module docstring). Errors before anything changes: a layer that does not exist (with the
    closest names), a non-SAE, an SAE on another device than the model, a known width (Linear, Conv, Embedding,
    LayerNorm) that differs from d_in; an unknown width is checked at the first forward, before the output changes.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(saes, Mapping) or not saes:
        raise TypeError(f"saes must be a non-empty dict {{layer name: SAE}}, got {saes!r}")
    if not isinstance(error_term, bool):
        raise TypeError(f"error_term must be True or False, got {error_term!r}")
    device = model_device(model)
    owners: dict[str, tuple[nn.Module, str]] = {}
    for layer, sae in saes.items():
        if not isinstance(layer, str) or any(c in layer for c in "*?[#"):
            raise ValueError(f"saes keys must be exact module names, got {layer!r}")
        ((_, module),) = select_modules(model, layer)
        if not isinstance(sae, SAE):
            raise TypeError(f"saes[{layer!r}] must be a hookviz.features.SAE, got {type(sae).__name__}")
        if sae.W_dec.device != device:
            raise ValueError(
                f"saes[{layer!r}] is on {sae.W_dec.device}, the model on {device}: move it with sae.to({str(device)!r})"
            )
        width = _known_width(module)
        if width is not None and width != sae.d_in:
            raise ValueError(
                f"saes[{layer!r}] reads activations of width d_in = {sae.d_in}, but {layer!r} "
                f"({type(module).__name__}) outputs width {width}"
            )
        if not name_sites:
            continue
        owner, prefix = _owner(model, layer)
        for what in (LATENTS, ERROR):
            if hasattr(owner, prefix + what):
                raise ValueError(f"{layer!r} is already spliced (it has a child {prefix + what!r}): one SAE per layer")
        owners[layer] = (owner, prefix)

    names = {n: m for n, m in model.named_modules()}
    owner_names = {id(m): n for n, m in names.items()}
    sites: dict[str, tuple[SAESite, SAESite]] = {}
    state = Spliced(dict(saes), error_term, {}, {})
    for layer in saes:
        sites[layer] = (SAESite(layer, "latents"), SAESite(layer, "error"))
    for layer, (owner, prefix) in owners.items():
        base = owner_names[id(owner)]
        state.latent_sites[layer] = f"{base}.{prefix}{LATENTS}".lstrip(".")
        state.error_sites[layer] = f"{base}.{prefix}{ERROR}".lstrip(".")

    def on_forward(name: str, module: nn.Module, args: Any, output: Any) -> Any:
        sae = saes[name]
        x = first_tensor(output)
        if x is None:
            raise TypeError(f"{name!r} returned {type(output).__name__}: splice needs a tensor (or a tuple of them)")
        channels_first = x.dim() == 4
        xs = x.movedim(1, -1) if channels_first else x
        if xs.shape[-1] != sae.d_in:
            raise ValueError(
                f"saes[{name!r}] reads activations of width d_in = {sae.d_in}, but {name!r} outputs shape "
                f"{tuple(x.shape)} (width {xs.shape[-1]})"
            )
        xs = xs.to(sae.W_dec.dtype)
        latent_site, error_site = sites[name]
        f = sae.encode(xs)
        x_hat_clean = sae.decode(f)
        f_site = latent_site(f.movedim(-1, 1) if channels_first else f)
        edited = f_site is not latent_site.last
        if channels_first:
            f_site = f_site.movedim(1, -1)
        # an unedited forward without autograd can reuse the reconstruction; with autograd the two decodes must be
        # separate nodes, or the latents' gradient would cancel to zero
        x_hat = sae.decode(f_site) if edited or torch.is_grad_enabled() else x_hat_clean
        if error_term:
            e = xs - x_hat_clean
            e_site = error_site(e.movedim(-1, 1) if channels_first else e)
            if channels_first:
                e_site = e_site.movedim(1, -1)
            out = xs + (x_hat - x_hat_clean) + (e_site - e)
            state.errors[name] = _back(e_site.detach(), channels_first)
        else:
            out = x_hat
        state.latents[name] = _back(f_site.detach(), channels_first)
        state.reconstructions[name] = _back(x_hat.detach(), channels_first)
        state.inputs[name] = x.detach()
        out = _back(out.to(x.dtype), channels_first)
        return rebuild(output, out)

    flags = [(p, p.requires_grad) for sae in saes.values() for p in sae.parameters()]
    added: list[tuple[nn.Module, str]] = []
    try:
        with HookManager(model) as hooks:
            for layer, (owner, prefix) in owners.items():
                for what, site in zip((LATENTS, ERROR), sites[layer], strict=True):
                    owner.add_module(prefix + what, site)
                    added.append((owner, prefix + what))
            if freeze:
                for p, _ in flags:
                    p.requires_grad_(False)
            hooks.forward(lambda n, m: n in saes, on_forward, with_name=True)
            yield state
    finally:
        for owner, child in reversed(added):
            del owner._modules[child]
        for p, requires_grad in flags:
            p.requires_grad_(requires_grad)
        for latent_site, error_site in sites.values():
            latent_site.last = error_site.last = None


def _back(t: Tensor, channels_first: bool) -> Tensor:
    return t.movedim(-1, 1) if channels_first else t
