r"""`CRP`: Concept Relevance Propagation on hookviz's LRP engine.

Achtibat et al., 2023, "From attribution maps to human-understandable explanations through Concept Relevance
Propagation", Nature Machine Intelligence 5, 1006-1019. The relevance conditioned on a set θ of channels at a layer
is the LRP relevance of the paths that pass through those channels: the relevance at the layer's output is computed
as usual, the other channels' share is set to zero, and the rest is propagated to the input with the same rules. With
conditions at several layers the masks multiply, each applied where its layer is (paths through all of them).

How, on this engine: every composite runs one backward pass of modified gradients in gradient-times-input form
(`hookviz.methods.lrp.gradient_form`): the gradient at a tensor a is g = R / a and its relevance is a ⊙ g. The
rules are linear in the incoming gradient, so conditioning is a 0/1 mask on it. The pass is split at
the conditioned layers: one backward from the score to the topmost conditioned layer (shared by every condition
set that starts there), then per set the masked gradient is propagated from that layer only (`torch.autograd.grad`
with the layer's output as the root), so relevance that bypasses the layer (a parallel branch, a skip connection)
is not counted: zennit-crp's ``exclude_parallel=True``. K condition sets cost one forward pass, one shared backward
pass to the layer and K backward passes below it (a loop: the rules' autograd functions do not batch under vmap).

Relevance at a layer (`concept_relevance`): each channel's share R_c = Σ_{space} a ⊙ g (N, C); the shares sum to
the layer's relevance. A convolution followed by a BatchNorm that LRP folds into it (``canonize=True``) is measured
at the BatchNorm's output, the folded layer's output, where its relevance is (the masks are the same channel by
channel).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...hooks import HookManager, Selector
from ...methods.forward import ForwardArgs
from ...methods.layer import resolve_one_module
from ...methods.lrp.composites import BATCH_NORMS, Composite
from ...methods.lrp.gradient_form import GradientFormRun
from ...methods.lrp.lrp import LRP
from ...targets import Targets, check_target, resolve_targets
from .conditions import Condition, Heads, Site, check_channels, parse_conditions
from .graph import Children, children
from .relmax import ReferenceExamples, relmax

# in-place operations after a layer that leave its relevance where it was: elementwise activations whose rule passes
# relevance (a ReLU after a folded BatchNorm: ``nn.ReLU(inplace=True)``)
_INPLACE_PASS = ("Relu", "LeakyRelu", "Hardtanh", "Elu", "Threshold", "Silu", "Gelu", "Hardswish", "Mish")


@dataclass
class CRPOutput:
    """What one CRP pass returns: input relevance (N, K, ...) or None, per-channel relevance (N, K, C) at the
    measured layers, the relevance entering each set's topmost conditioned layer per channel (N, C), the targets,
    and each measured layer's largest activation per channel (N, C)."""

    relevance: Tensor | None
    recorded: dict[str, Tensor]
    entering: dict[str, Tensor]
    targets: Targets
    activation: dict[str, Tensor]


class CRP(LRP):
    r"""Concept Relevance Propagation (Achtibat et al., 2023, Nature Machine Intelligence 5): LRP conditioned on
    channels, neurons or heads. Takes `LRP`'s arguments (composite, canonize, epsilon, gamma, ...; every composite).

    ``attribute(x, target, conditions={layer: channels})``: the conditional heat map (N, ...) shaped like the input;
    a list of K condition sets gives (N, K, ...) from one forward pass; without conditions, plain LRP. Channels: axis
    1 of a convolution's output, the last axis of a token layer (N, T, D) (MLP neurons), `Heads` for attention heads
    (`hookviz.concepts.crp.conditions`). Several layers in one set: relevance through all of them. `target`: one
    class per input (None: the top class, an int, N ints, a callable).

    ``concept_relevance(x, target, layer)``: each channel's relevance at `layer`, (N, C), summing to the layer's
    relevance. ``children(x, target, (layer, channel), earlier_layer, top=k)``: which channels of an earlier layer
    carry a concept's relevance. `relmax` finds a data set's reference examples.

    Example::

        crp = hv.CRP(model, "epsilon-plus-flat")
        heat = crp.attribute(x, target=3, conditions=[{"features.3": [c]} for c in range(8)])  # (N, 8, 3, H, W)
        shares = crp.concept_relevance(x, target=3, layer="features.3")                        # (N, 96)
    """

    def __init__(self, model: nn.Module, composite: str | Composite | None = None, **kwargs: Any) -> None:
        if kwargs.get("layer") is not None:
            raise ValueError("CRP takes no layer=: its maps are at the input; relevance at a layer is "
                             "concept_relevance(x, target, layer)")  # fmt: skip
        super().__init__(model, composite, **kwargs)
        self.audit = None

    def __repr__(self) -> str:
        return "C" + super().__repr__()

    @property
    def method_label(self) -> str:
        return f"CRP ({self.composite.name})"

    # -- public API ---------------------------------------------------------------------------------------------
    def attribute(  # type: ignore[override]
        self,
        inputs: Tensor,
        target: Any = None,
        *,
        conditions: Mapping[Selector, object] | Sequence[Mapping[Selector, object]] | None = None,
        forward_kwargs: dict[str, Any] | None = None,
        additional_forward_args: Any = None,
    ) -> Tensor:
        """Conditional relevance at the input: (N, ...) for one condition set, (N, K, ...) for a list of K; plain
        LRP (N, ...) without conditions."""
        if conditions is None:
            return super().attribute(
                inputs, target, forward_kwargs=forward_kwargs, additional_forward_args=additional_forward_args
            )
        sets, sites, single = parse_conditions(self.model, conditions)
        out = self._crp(inputs, target, sets, sites, [], forward_kwargs, additional_forward_args, want_input=True)
        assert out.relevance is not None
        return out.relevance[:, 0] if single else out.relevance

    def concept_relevance(
        self,
        inputs: Tensor,
        target: Any = None,
        layer: Selector | None = None,
        *,
        heads: int | None = None,
        conditions: Mapping[Selector, object] | Sequence[Mapping[Selector, object]] | None = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Tensor:
        """Each channel's relevance at `layer`: R_c = Σ over the other axes of a ⊙ g, (N, C) (the paper's
        "relevance of concept c"); with `conditions` (at layers that run after `layer`), (N, C) for a dict and
        (N, K, C) for a list of K. `heads=H`: `layer` is an output projection whose input is split into H heads
        (or an attention module, see `Heads`)."""
        if layer is None:
            raise TypeError("concept_relevance needs layer= (the layer whose channels are measured)")
        site = self._site(layer, heads)
        if conditions is None:
            sets, sites, single = [{}], {}, True
        else:
            sets, sites, single = parse_conditions(self.model, conditions)
        sites = {**sites, site.name: sites.get(site.name, site)}
        out = self._crp(inputs, target, sets, sites, [site.name], forward_kwargs, None, want_input=False)
        r = out.recorded[site.name]
        return r[:, 0] if single else r

    def children(
        self,
        inputs: Tensor,
        target: Any,
        concept: tuple[Selector, int],
        earlier_layer: Selector,
        *,
        top: int = 5,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Children:
        """Which channels of `earlier_layer` carry the relevance of `concept` = (layer, channel): the relevance at
        `earlier_layer` conditioned on the concept (zennit-crp's attribution graph, one level), (N, C'); its `top`
        channels per input. See `hookviz.concepts.crp.graph.Children`."""
        return children(self, inputs, target, concept, earlier_layer, top=top, forward_kwargs=forward_kwargs)

    def relmax(self, data: Any, layer: Selector, out: str, **kwargs: Any) -> ReferenceExamples:
        """RelMax / ActMax reference examples of `layer`'s channels over `data`, state in the folder `out`
        (resumable, sharded); see `hookviz.concepts.crp.relmax.relmax` for the options."""
        return relmax(self, data, layer, out, **kwargs)

    # -- the pass -----------------------------------------------------------------------------------------------
    def _site(self, layer: Selector, heads: int | None) -> Site:
        if heads is not None:
            _, sites, _ = parse_conditions(self.model, {layer: Heads(0, heads)})
            return next(iter(sites.values()))
        name, module = resolve_one_module(self.model, layer)
        return Site(name, module)

    def _crp(
        self,
        inputs: Tensor,
        target: Any,
        sets: list[Condition],
        sites: dict[str, Site],
        record: list[str],
        forward_kwargs: dict[str, Any] | None,
        additional_forward_args: Any,
        *,
        want_input: bool,
    ) -> CRPOutput:
        x, kwargs, _ = self._call_args(inputs, additional_forward_args, forward_kwargs)
        n = x.shape[0]
        spec = check_target(target, n)
        self.composite.check_bounds(x.shape)
        self.audit = None
        self.rule_coverage = None
        fwd = kwargs.get("forward_args") or ForwardArgs((), n)
        with self._prepared() as hooks:
            run = GradientFormRun(self.model, self.composite, hooks, self.canonize, n)
            taps = _Taps(sites, fold=self.canonize)
            try:
                with run.forward_pass():
                    leaf = x.detach().requires_grad_(True)
                    run.set_leaf(leaf)
                    taps.place(self.model, hooks)  # after the engine's hooks: they see the outputs it hands on
                    output = fwd(self.model, (leaf,))
            finally:
                self.rule_coverage = run.coverage
            tensors = taps.tensors()
            check_channels(sets, sites, tensors, len(sets) == 1)
            targets = resolve_targets(spec, output, n)
            if targets.multi:
                raise ValueError("CRP takes one target per input (an int, N ints, None or a callable), not (N, K)")
            del output
            out = _propagate(targets.scores.sum(), leaf, run.sink, sets, sites, tensors, taps.order, record, want_input)
        rel = out[0]
        if rel is not None and rel.dtype in (torch.float16, torch.bfloat16):
            rel = rel.float()
        acts = {name: sites[name].per_channel_max(tensors[name]) for name in record}
        return CRPOutput(rel, out[1], out[2], targets, acts)


class _Taps:
    """The tensors of the conditioned and measured sites in one forward pass (forward hooks placed after the
    engine's), moved to a folded BatchNorm's output where one follows."""

    def __init__(self, sites: dict[str, Site], *, fold: bool) -> None:
        self.sites = sites
        self.fold = fold
        self.seen: dict[str, list[Tensor]] = {name: [] for name in sites}
        self.versions: dict[str, int] = {}
        self.order: dict[str, int] = {}
        self.count = 0

    def _take(self, name: str, t: Any) -> None:
        site = self.sites[name]
        # reading the tensor here is no operation of the model: kept out of the engine's function mode (coverage)
        with torch._C.DisableTorchFunction():
            if not isinstance(t, Tensor) or not t.is_floating_point():
                got = t.dtype if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"conditions: {site.what} is {got}, not a floating-point tensor; condition on a "
                                 "layer with a tensor output")  # fmt: skip
            self.versions[name] = t._version
        self.seen[name].append(t)
        self.count += 1
        self.order[name] = self.count

    def place(self, model: nn.Module, hooks: HookManager) -> None:
        for name, site in self.sites.items():
            if site.heads:
                hooks.forward_pre(site.module, lambda m, args, name=name: self._take(name, args[0] if args else None))
            else:
                hooks.forward(site.module, lambda m, args, out, name=name: self._take(name, out))
        if self.fold and any(isinstance(m, BATCH_NORMS) for m in model.modules()):
            hooks.forward(BATCH_NORMS, self._batch_norm)

    def _batch_norm(self, bn: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        # LRP folds an eval-mode BatchNorm into the layer whose output it takes (`layers.LayerRules.fold`): the folded
        # layer's relevance is at the BatchNorm's output (at the layer's own output the gradient carries s g)
        if bn.training or type(bn).forward is not nn.modules.batchnorm._BatchNorm.forward or not args:
            return
        for name, seen in self.seen.items():
            if seen and seen[-1] is args[0] and not self.sites[name].heads and isinstance(out, Tensor):
                seen[-1] = out
                with torch._C.DisableTorchFunction():
                    self.versions[name] = out._version

    def tensors(self) -> dict[str, Tensor]:
        found: dict[str, Tensor] = {}
        for name, seen in self.seen.items():
            site = self.sites[name]
            if len(seen) != 1:
                how = "did not run" if not seen else f"ran {len(seen)} times"
                raise ValueError(
                    f"conditions: layer {site.name!r} {how} in the forward pass; CRP conditions on a module that runs "
                    "exactly once (a module called several times, such as a shared ReLU, has no single output)"
                )
            t = seen[0]
            if not t.requires_grad:
                raise ValueError(f"conditions: {site.what} does not depend on the input (no relevance reaches it)")
            if t._version != self.versions[name]:
                kind = type(t.grad_fn).__name__ if t.grad_fn is not None else "?"
                if not kind.startswith(_INPLACE_PASS):
                    raise ValueError(
                        f"conditions: {site.what} is changed in place later in the forward pass ({kind}), so its "
                        "relevance is not there any more; condition on the module whose output it becomes"
                    )
            found[name] = t
        return found


def _propagate(
    seed: Tensor,
    leaf: Tensor,
    sink: Tensor | None,
    sets: list[Condition],
    sites: dict[str, Site],
    tensors: dict[str, Tensor],
    order: dict[str, int],
    record: list[str],
    want_input: bool,
) -> tuple[Tensor | None, dict[str, Tensor], dict[str, Tensor]]:
    """The K condition sets' backward passes over one forward graph (see the module docstring)."""

    def rel(name: str, g: Tensor | None) -> Tensor:
        t = tensors[name].detach()
        if g is None:
            return torch.zeros_like(t)
        return t * g

    first: dict[str, Tensor] = {}  # gradient from the score at each set's topmost conditioned layer, shared
    entering: dict[str, Tensor] = {}
    maps: list[Tensor] = []
    recorded: dict[str, list[Tensor]] = {name: [] for name in record}
    for cond in sets:
        chain = sorted(cond, key=lambda name: -order[name])
        for name in record:
            if chain and order[name] >= order[chain[-1]]:
                raise ValueError(
                    f"layer {name!r} runs after (or is) the conditioned layer {chain[-1]!r}; relevance is measured "
                    "at a layer that runs before every conditioned layer"
                )
        ends = ([leaf] + ([sink] if sink is not None else []) if want_input else []) + [tensors[r] for r in record]
        if not chain:
            grads = torch.autograd.grad(seed, ends, retain_graph=True, allow_unused=True)
        else:
            top = chain[0]
            if top not in first:
                (g0,) = torch.autograd.grad(seed, [tensors[top]], retain_graph=True, allow_unused=True)
                first[top] = torch.zeros_like(tensors[top]) if g0 is None else g0
                entering[top] = sites[top].per_channel(rel(top, first[top]))
            g = first[top]
            for i, name in enumerate(chain):
                g = g * sites[name].mask(tensors[name], cond[name])
                nxt = [tensors[chain[i + 1]]] if i + 1 < len(chain) else ends
                grads = torch.autograd.grad(tensors[name], nxt, g, retain_graph=True, allow_unused=True)
                if i + 1 < len(chain):
                    g = grads[0] if grads[0] is not None else torch.zeros_like(nxt[0])
        k = 0
        if want_input:
            g_leaf = grads[0] if grads[0] is not None else torch.zeros_like(leaf)
            r = leaf.detach() * g_leaf
            k = 1
            if sink is not None:
                if grads[1] is not None:
                    r = r + grads[1]
                k = 2
            maps.append(r)
        for j, name in enumerate(record):
            recorded[name].append(sites[name].per_channel(rel(name, grads[k + j])))
    relevance = torch.stack(maps, 1) if maps else None
    return relevance, {name: torch.stack(v, 1) for name, v in recorded.items()}, entering
