"""Composites: which LRP rule each layer gets, by module type, by name, and for the first layer.

The named composites reproduce zennit's layer maps (``zennit.composites``, 0.5.1): activations pass relevance
through, sums of branches and average pooling use `Norm`, BatchNorm passes (it is folded into the layer before it),
and convolutions and fully connected layers get the rules below. ``"epsilon"`` (every layer LRP-epsilon) has no
zennit counterpart of that name.

=============================  ====================  ==============  =====================================
name                           first layer           convolutions    fully connected
=============================  ====================  ==============  =====================================
``epsilon``                    -                     Epsilon         Epsilon
``epsilon-plus``               -                     ZPlus           Epsilon
``epsilon-plus-flat``          Flat (conv or linear) ZPlus           Epsilon
``epsilon-alpha2-beta1``       -                     AlphaBeta(2, 1) Epsilon
``epsilon-alpha2-beta1-flat``  Flat (conv or linear) AlphaBeta(2, 1) Epsilon
``epsilon-gamma-box``          ZBox (convolution)    Gamma           Epsilon
=============================  ====================  ==============  =====================================

Transformer composites (`TRANSFORMER_COMPOSITES`, see `hookviz.methods.lrp.transformer`): ``attn-lrp`` (AttnLRP,
Achtibat et al., 2024) and ``cp-lrp`` (CP-LRP, Ali et al., 2022): LRP-epsilon on linear layers (``nn.Linear``,
transformers' ``Conv1D``, ``F.linear`` calls, convolutions; gamma with ``linear_gamma=``), the identity rule on
LayerNorm / RMSNorm and on elementwise activations, the softmax rule, the uniform rule on products of two activations
(held attention probabilities and gates for CP-LRP), fused attention calls decomposed; embeddings and a container's
own parameters (class tokens, position embeddings) take their share of relevance like biases.

"First layer" is the first convolution (or linear layer) *to run* in the forward pass; zennit takes the first in
``named_modules()`` order, which differs when a model registers its modules in another order than it calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ...hooks import Selector, select_modules
from ..rules import MAX_POOL_MODULES
from .rules import AlphaBeta, Epsilon, Flat, Gamma, Gradient, Norm, Pass, Rule, ZBox, ZPlus, check_bound
from .transformer import Attention, NormIdentity, Softmax, TransformerRules, Uniform, module_kind

CONVOLUTIONS: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)
LINEAR_LAYERS: tuple[type[nn.Module], ...] = (*CONVOLUTIONS, nn.Linear)
# zennit.types.Activation, less MultiheadAttention (not elementwise)
ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.ELU,
    nn.Hardshrink,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.Hardswish,
    nn.LeakyReLU,
    nn.LogSigmoid,
    nn.PReLU,
    nn.ReLU,
    nn.ReLU6,
    nn.RReLU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.Sigmoid,
    nn.SiLU,
    nn.Softplus,
    nn.Softshrink,
    nn.Softsign,
    nn.Tanh,
    nn.Tanhshrink,
    nn.Threshold,
    nn.Mish,
)
AVG_POOLS: tuple[type[nn.Module], ...] = (
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
)
BATCH_NORMS: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
# layers whose plain gradient is the relevance rule (routing, reshaping, identity in eval mode)
GRADIENT_LAYERS: tuple[type[nn.Module], ...] = (
    *MAX_POOL_MODULES,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.Flatten,
    nn.Unflatten,
    nn.Identity,
)

TypeMap = Sequence[tuple[type[nn.Module] | tuple[type[nn.Module], ...], Rule]]
NameMap = Sequence[tuple[Selector, Rule]]
KindMap = Sequence[tuple[str, Rule]]


@dataclass
class Composite:
    """Rules for the layers of a model: `name_map` first (selectors as `HookManager` takes them: exact names,
    globs, types, instances, predicates), then `first_map` for the first linear layer to run, then `type_map`.

    A type in the maps covers its subclasses. ``sum_rule`` applies to additions of branches found at run time
    (``a + b``, ``torch.add``, ``+=`` in a forward). Build one with `composite` from a named one plus overrides.

    Example::

        comp = Composite(type_map=[(nn.Conv2d, Gamma(0.5)), (nn.Linear, Epsilon(0.1))],
                         name_map=[("features.0", Flat())])
        LRP(model, composite=comp)
    """

    type_map: TypeMap = ()
    name_map: NameMap = ()
    first_map: TypeMap = ()
    sum_rule: Rule = field(default_factory=Norm)
    name: str = "custom"
    # modules found by name or behaviour (`transformer.module_kind`: "conv1d", "norm", "activation", "parameters")
    kind_map: KindMap = ()
    # function-level rules of transformer composites (products, softmax, F.layer_norm, fused attention)
    transformer: TransformerRules | None = None

    def __post_init__(self) -> None:
        for what, entries in (("type_map", self.type_map), ("first_map", self.first_map)):
            for entry in entries:
                if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Rule)):
                    raise TypeError(f"Composite: {what} entries must be (module type(s), Rule) pairs, got {entry!r}")
                types = entry[0] if isinstance(entry[0], tuple) else (entry[0],)
                if not types or not all(isinstance(t, type) and issubclass(t, nn.Module) for t in types):
                    raise TypeError(f"Composite: {what} keys must be nn.Module subclasses, got {entry[0]!r}")
        for entry in self.name_map:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Rule)):
                raise TypeError(f"Composite: name_map entries must be (selector, Rule) pairs, got {entry!r}")

    def resolve_names(self, model: nn.Module) -> dict[nn.Module, Rule]:
        """The rule of every module the name map selects (the first entry that selects a module wins)."""
        chosen: dict[nn.Module, Rule] = {}
        for selector, rule in self.name_map:
            for _, module in select_modules(model, selector):
                chosen.setdefault(module, rule)
        return chosen

    def by_type(self, module: nn.Module, first: bool) -> Rule | None:
        if first:
            for types, rule in self.first_map:
                if isinstance(module, types):
                    return rule
        for types, rule in self.type_map:
            if isinstance(module, types):
                return rule
        if self.kind_map:
            kind = module_kind(module)
            for k, rule in self.kind_map:
                if k == kind:
                    return rule
        return None

    def check_bounds(self, shape: tuple[int, ...]) -> None:
        """`ValueError` where a z^B rule's bounds (`ZBox` low / high) do not broadcast to an input of `shape`, before
        any work (LRP's and CRP's calls)."""
        for _, rule in (*self.first_map, *self.type_map, *self.name_map):
            if isinstance(rule, ZBox):
                check_bound(rule.low, shape, "low")
                check_bound(rule.high, shape, "high")

    def linear_rule(self) -> Rule | None:
        """The rule of ``nn.Linear`` layers (``F.linear`` calls of transformer composites get it too)."""
        for types, rule in self.type_map:
            if issubclass(nn.Linear, types):
                return rule
        return None


def _base(stabilizer: float) -> list[tuple[Any, Rule]]:
    return [(ACTIVATIONS, Pass()), (AVG_POOLS, Norm(stabilizer)), (BATCH_NORMS, Pass())]


def _named(
    name: str, epsilon: float, gamma: float, low: float | Tensor | None, high: float | Tensor | None, stabilizer: float
) -> Composite:
    eps = Epsilon(epsilon)
    if name == "epsilon":
        convs: Rule = Epsilon(epsilon)
        first: list[tuple[Any, Rule]] = []
    elif name in ("epsilon-plus", "epsilon-plus-flat"):
        convs = ZPlus(stabilizer)
        first = [(LINEAR_LAYERS, Flat(stabilizer))] if name.endswith("-flat") else []
    elif name in ("epsilon-alpha2-beta1", "epsilon-alpha2-beta1-flat"):
        convs = AlphaBeta(2.0, 1.0, stabilizer)
        first = [(LINEAR_LAYERS, Flat(stabilizer))] if name.endswith("-flat") else []
    else:  # epsilon-gamma-box
        if low is None or high is None:
            raise ValueError(
                "composite 'epsilon-gamma-box' needs the input bounds low= and high= for its ZBox first layer "
                "(e.g. low=(0 - mean) / std, high=(1 - mean) / std for normalized images)"
            )
        convs = Gamma(gamma, stabilizer)
        first = [(CONVOLUTIONS, ZBox(low, high, stabilizer))]
    type_map = [*_base(stabilizer), (CONVOLUTIONS, convs), (nn.Linear, eps)]
    return Composite(type_map=type_map, first_map=first, sum_rule=Norm(stabilizer), name=name)


def _transformer(name: str, epsilon: float, stabilizer: float, linear_gamma: float | None) -> Composite:
    cp = name == "cp-lrp"
    lin: Rule = Epsilon(epsilon) if linear_gamma is None else Gamma(linear_gamma, stabilizer)
    norm = NormIdentity(epsilon)
    rules = TransformerRules(Uniform(epsilon, hold_gates=cp), Softmax(hold=cp), norm)
    type_map: list[tuple[Any, Rule]] = [
        *_base(stabilizer),
        ((nn.LayerNorm, nn.RMSNorm), norm),
        (nn.MultiheadAttention, Attention()),
        (LINEAR_LAYERS, lin),
        (nn.Embedding, Gradient()),
    ]
    kind_map = [("conv1d", lin), ("norm", norm), ("activation", Pass()), ("parameters", Gradient())]
    return Composite(type_map=type_map, sum_rule=Norm(stabilizer), name=name, kind_map=kind_map, transformer=rules)


TRANSFORMER_COMPOSITES: tuple[str, ...] = ("attn-lrp", "cp-lrp")

COMPOSITES: tuple[str, ...] = (
    "epsilon",
    "epsilon-plus",
    "epsilon-plus-flat",
    "epsilon-alpha2-beta1",
    "epsilon-alpha2-beta1-flat",
    "epsilon-gamma-box",
)


def composite(
    name: str,
    *,
    epsilon: float = 1e-6,
    gamma: float = 0.25,
    low: float | Tensor | None = None,
    high: float | Tensor | None = None,
    stabilizer: float = 1e-6,
    type_map: TypeMap = (),
    name_map: NameMap = (),
    linear_gamma: float | None = None,
) -> Composite:
    """The named composite `name` (see the module docstring), with `type_map` / `name_map` entries put before its
    own (so they win). Unknown names raise `ValueError` listing the valid ones. `linear_gamma` (transformer
    composites only): the gamma rule with this gamma on linear layers instead of LRP-epsilon (the AttnLRP paper's
    choice for vision transformers)."""
    names = (*COMPOSITES, *TRANSFORMER_COMPOSITES)
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"unknown LRP composite {name!r}; valid composites: {', '.join(names)}")
    if linear_gamma is not None:
        if name not in TRANSFORMER_COMPOSITES:
            raise ValueError(
                f"linear_gamma is an option of the transformer composites ({', '.join(TRANSFORMER_COMPOSITES)}), "
                f"not of {name!r}; use composite='epsilon-gamma-box' or a Composite with Gamma rules"
            )
        if isinstance(linear_gamma, bool) or not isinstance(linear_gamma, (int, float)) or not linear_gamma >= 0:
            raise ValueError(f"linear_gamma must be None or a finite number >= 0, got {linear_gamma!r}")
    if name in TRANSFORMER_COMPOSITES:
        base = _transformer(name, epsilon, stabilizer, linear_gamma)
    else:
        base = _named(name, epsilon, gamma, low, high, stabilizer)
    return Composite(
        type_map=[*type_map, *base.type_map],
        name_map=list(name_map),
        first_map=base.first_map,
        sum_rule=base.sum_rule,
        name=name,
        kind_map=base.kind_map,
        transformer=base.transformer,
    )


RuleFactory = Callable[..., Rule]
