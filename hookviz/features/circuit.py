"""`latent_edges`: the edges between the latents of two spliced layers, for a feature circuit on one prompt (Marks et
al. 2024, "Sparse Feature Circuits", §2 and appendix A.1).

With SAEs spliced at an upstream layer u and a downstream layer d (error terms kept, so the model computes what it
computed before), the edge from upstream latent a to downstream latent b is the gradient-x-activation estimate of
the metric's change carried from a through b:

    edge[a, b] = Σ_{t_b} ∂m/∂f_b[t_b] · Σ_{t_a} ∂f_b[t_b]/∂f_a[t_a] · f_a[t_a]

summed over the positions (and over the inputs of a batch), ∂m/∂f_b held fixed (the downstream node's weight in the
metric, detached). One backward pass per downstream latent kept (the graph retained), from the scalar Σ_t g_b[t]
f_b[t]; the upstream error node gets an edge of its own (Σ over its features of e ⊙ ∂(…)/∂e), as in Marks et al.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..hooks import HookManager
from ..interventions._common import call_model, prepared
from .sae import SAE
from .splice import splice

__all__ = ["LatentEdges", "latent_edges"]


@dataclass
class LatentEdges:
    """Edges between `upstream`'s and `downstream`'s latents (module docstring): `edges` (d_sae_up, D) for the D
    downstream latents `kept` (their indices), `error_edges` (D,) from the upstream error node; `nodes` (D,) the
    downstream latents' own gradient x activation effects on the metric; `metric` (N,)."""

    upstream: str
    downstream: str
    edges: Tensor
    error_edges: Tensor
    kept: Tensor
    nodes: Tensor
    metric: Tensor

    def top(self, n: int = 10) -> list[tuple[int, int, float]]:
        """The `n` largest edges by absolute value: (upstream latent, downstream latent, edge)."""
        flat = self.edges.abs().flatten()
        idx = flat.topk(min(n, flat.numel())).indices
        cols = self.edges.shape[1]
        return [(int(i // cols), int(self.kept[i % cols]), float(self.edges.flatten()[i])) for i in idx]


def latent_edges(
    model: nn.Module,
    saes: Mapping[str, SAE],
    inputs: Any,
    metric: Callable[[Any], Tensor],
    upstream: str,
    downstream: str,
    *,
    downstream_latents: Sequence[int] | None = None,
) -> LatentEdges:
    """Edges from every latent (and the error node) of `upstream` to the downstream latents of `downstream`.

    Args:
        model: any module; eval mode and frozen parameters for the call, restored after.
        saes: ``{layer name: SAE}``, holding `upstream` and `downstream` (other layers are spliced too).
        inputs: one prompt (a batch sums its edges over the inputs), as `latent_attribution` takes them.
        metric: model output -> (N,) scores.
        upstream, downstream: the two spliced layers; `downstream` runs after `upstream`.
        downstream_latents: the downstream latents to keep (None: those active anywhere in `inputs`); one backward
            pass each.
    """
    for name, layer in (("upstream", upstream), ("downstream", downstream)):
        if layer not in saes:
            raise KeyError(f"{name} layer {layer!r} is not in saes: {sorted(saes)}")
    if upstream == downstream:
        raise ValueError("upstream and downstream must be two different spliced layers")
    if not callable(metric):
        raise TypeError(f"metric must be a callable model output -> (N,) scores, got {type(metric).__name__}")
    d_down = saes[downstream].d_sae
    if downstream_latents is not None:
        kept_list = [saes[downstream].check_latent(i) for i in downstream_latents]
    with prepared(model, True, freeze=True), splice(model, saes) as spliced:
        taps: dict[str, Tensor] = {}

        def tap(key: str) -> Callable[..., Tensor]:
            def hook(module: nn.Module, args: Any, out: Tensor) -> Tensor:
                # a zero leaf added to the site's output: its gradient is the output's (the graph below is kept)
                delta = torch.zeros_like(out, requires_grad=True)
                taps[key + "_delta"], taps[key] = delta, out + delta
                return taps[key]

            return hook

        with torch.enable_grad(), HookManager(model) as hooks:
            hooks.forward(spliced.latent_site(upstream), tap("up"))
            hooks.forward(spliced.error_site(upstream), tap("err"))
            hooks.forward(spliced.latent_site(downstream), tap("down"))
            out = call_model(model, inputs)
            if "up" not in taps or "down" not in taps:
                raise ValueError(f"{upstream!r} or {downstream!r} did not run in the model's forward")
            m = metric(out)
            if not isinstance(m, Tensor) or m.dim() > 1 or (m.dim() == 1 and m.shape[0] != taps["up"].shape[0]):
                raise ValueError("metric must return one score per input, a tensor (N,)")
            # the metric reaches the downstream latents only through the layers above them
            (g_down,) = torch.autograd.grad(m.sum(), taps["down_delta"], retain_graph=True)
            f_down = taps["down"]
            if f_down.dim() == 4:  # (N, d_sae, H, W): the latents on axis 1
                f_down, g_down = f_down.movedim(1, -1), g_down.movedim(1, -1)
            f_up, e_up = taps["up"].detach(), taps["err"].detach()
            if downstream_latents is None:
                active = (f_down.detach() != 0).reshape(-1, d_down).any(0)
                kept_list = torch.nonzero(active).flatten().tolist()
            nodes = (f_down.detach() * g_down).reshape(-1, d_down).sum(0)
            edges = torch.zeros(f_up.shape[1 if f_up.dim() == 4 else -1], len(kept_list), dtype=f_up.dtype)
            error_edges = torch.zeros(len(kept_list), dtype=f_up.dtype)
            up_axis = 1 if f_up.dim() == 4 else f_up.dim() - 1
            for col, b in enumerate(kept_list):
                s = (g_down[..., b] * f_down[..., b]).sum()
                if not s.requires_grad:  # nothing upstream reaches it
                    continue
                gu, ge = torch.autograd.grad(
                    s, [taps["up_delta"], taps["err_delta"]], retain_graph=True, allow_unused=True
                )
                if gu is not None:
                    edges[:, col] = (f_up * gu).movedim(up_axis, 0).reshape(edges.shape[0], -1).sum(1).cpu()
                if ge is not None:
                    error_edges[col] = (e_up * ge).sum().cpu()
    return LatentEdges(
        upstream,
        downstream,
        edges,
        error_edges,
        torch.tensor(kept_list, dtype=torch.long),
        nodes[kept_list].detach().cpu(),
        m.detach().reshape(-1).cpu(),
    )
