"""`LRP`: Layer-wise Relevance Propagation over the attribution life cycle (one forward, one backward pass)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...hooks import HookManager, Selector
from ...targets import BackwardStrategy, Targets, batched_grad, resolve_targets
from ..base import Attribution, register
from ..forward import ForwardArgs
from ..layer import LayerTap
from ..rules import Coverage
from .audit import RelevanceAudit
from .composites import (
    ACTIVATIONS,
    AVG_POOLS,
    BATCH_NORMS,
    COMPOSITES,
    GRADIENT_LAYERS,
    LINEAR_LAYERS,
    TRANSFORMER_COMPOSITES,
    Composite,
    composite,
)
from .gradient_form import GradientFormRun, check_gradient_form
from .transformer import module_kind

# Signed relevance: sum the channels, keep 0 at the middle of a diverging colour map.
_RELEVANCE_DISPLAY = {"reduce": "sum", "mode": "percentile", "cmap": "bwr", "overlay": False}


class LRP(Attribution):
    r"""Layer-wise Relevance Propagation (Bach et al., 2015, "On Pixel-Wise Explanations for Non-Linear Classifier
    Decisions by Layer-Wise Relevance Propagation", PLoS ONE 10(7); composites after Montavon et al., 2019,
    "Layer-Wise Relevance Propagation: An Overview", and Kohlbrenner et al., 2020, arXiv:1910.09840).

    The relevance starts as the target's score f_c(x) at the output (captum's convention) and is propagated back
    layer by layer with the composite's rules (zennit's formulas and defaults, see `hookviz.methods.lrp.rules`);
    where every rule conserves, the input relevance sums to f_c(x). Result: float32 input relevance shaped like the
    input (N, C, H, W); (N, K, C, H, W) with K targets per input (one forward pass, K backward passes).

    Args:
        composite: None (default: the one that fits the model, `fitting_composite`: ``"attn-lrp"`` where
            attention or a LayerNorm / RMSNorm is found, else ``"epsilon-plus-flat"``; the repr says which and why),
            a name (``"epsilon"``, ``"epsilon-plus"``, ``"epsilon-plus-flat"``,
            ``"epsilon-alpha2-beta1"``, ``"epsilon-alpha2-beta1-flat"``, ``"epsilon-gamma-box"``; for transformers
            ``"attn-lrp"``, AttnLRP (Achtibat et al., 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance
            Propagation for Transformers", ICML), and ``"cp-lrp"``, CP-LRP (Ali et al., 2022, "XAI for
            Transformers: Better Explanations through Conservative Propagation", ICML); see
            `hookviz.methods.lrp.transformer`) or a `Composite`.
        canonize: fold BatchNorm into the preceding layer and split branch additions with the Norm rule, found at
            run time (zennit's ``ResNetCanonizer`` / ``VGGCanonizer`` without writing one per architecture).
        epsilon: LRP-epsilon's stabilizer (fully connected layers); gamma: the gamma rule's factor; low / high: the
            input bounds of the ZBox first layer of ``"epsilon-gamma-box"`` (numbers or tensors broadcasting to
            the input, e.g. (1, 3, 1, 1)).
        linear_gamma: transformer composites only: the gamma rule with this gamma on linear layers instead of
            LRP-epsilon (the AttnLRP paper's choice for vision transformers); None (default): LRP-epsilon.
        layer: take the relevance at this module's output instead of the input (a module, its dotted name or a
            `HookManager` selector naming one module), e.g. the token embedding of a language model: the inputs
            may then be integer token ids, and the result is shaped like the layer's output, (N, T, D) (N, K, T, D);
            ``visualize`` gives a `TokenExplanation`. `layer_input`: its (first) input instead.

    After each call ``self.audit`` (a `RelevanceAudit`) lists, per layer call, the relevance that entered and left,
    and the conservation ratio input relevance / f_c(x). The layers and operations are a rule table on the one rule
    engine (`hookviz.methods.rules`); ``self.rule_coverage`` is its report, and its one warning names the
    operations in the forward pass that no rule covers. A layer with parameters that the composite does not map
    raises `ValueError` before any work, except a layer without children under a transformer composite, whose
    rules cover functional calls: it is seen call by call (DINOv2's layer scale, Swin's relative position bias).

    LRP runs in gradient-times-input form (`hookviz.methods.lrp.gradient_form`): one backward pass of modified
    gradients carrying relevance over activation, the input times its gradient, each stabilizer a factor
    z / stab(z) on the gradient (`gradient_ops`); a transformer composite with zero stabilizers (``composite(
    "attn-lrp", epsilon=0, stabilizer=0)``: the unstabilised rules that `lxt` applies) is then one plain backward
    pass and its audit holds the totals only (no per-layer entries). Every named composite runs in it; a transformer
    composite holding a rule of a kind that has no such form raises `ValueError` naming it before any work.

    Example::

        lrp = LRP(model, "epsilon-plus-flat")
        rel = lrp.attribute(x, target=281)      # (N, 3, H, W), sums to about model(x)[:, 281]
        print(lrp.audit)
    """

    display_defaults = _RELEVANCE_DISPLAY

    def __init__(
        self,
        model: nn.Module,
        composite: str | Composite | None = None,
        *,
        canonize: bool = True,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        low: float | Tensor | None = None,
        high: float | Tensor | None = None,
        linear_gamma: float | None = None,
        layer: Selector | None = None,
        layer_input: bool = False,
        eval_mode: bool = True,
        backward: BackwardStrategy = "auto",
    ) -> None:
        super().__init__(model, eval_mode=eval_mode, backward=backward)
        if not isinstance(canonize, bool):
            raise TypeError(f"canonize must be True or False, got {type(canonize).__name__} {canonize!r}")
        self._chosen: str | None = None
        if composite is None:
            composite, self._chosen = fitting_composite(model)
        if isinstance(composite, str):
            extra: dict[str, Any] = {} if linear_gamma is None else {"linear_gamma": linear_gamma}
            comp = _named_composite(composite, epsilon=epsilon, gamma=gamma, low=low, high=high, **extra)
        elif isinstance(composite, Composite):
            comp = composite
        else:
            raise TypeError(f"composite must be a composite name or a Composite, got {type(composite).__name__}")
        if linear_gamma is not None and not isinstance(composite, str):
            raise ValueError("linear_gamma applies to a named transformer composite; a Composite carries its own rules")
        check_gradient_form(comp)  # a rule without a gradient-times-input form fails here, before any work
        comp.resolve_names(model)  # selectors that match nothing fail here
        if comp.transformer is not None:
            _check_visible(model, comp)
        _check_mapped(model, comp)
        if layer is None and layer_input is not False:
            raise ValueError(f"layer_input={layer_input!r} needs layer= (the module whose input is attributed to)")
        self._tap = None if layer is None else LayerTap(model, layer, layer_input=layer_input)
        self.composite = comp
        self.canonize = canonize
        self.audit: RelevanceAudit | None = None
        self.rule_coverage: Coverage | None = None

    @property
    def layer(self) -> str | None:
        """Dotted name of the layer whose relevance is returned (None: the input)."""
        return None if self._tap is None else self._tap.name

    def _allows_integer_inputs(self) -> bool:
        return self._tap is not None

    def __repr__(self) -> str:
        tap = f", {self._tap!r}" if self._tap is not None else ""
        chosen = f" (chosen: {self._chosen})" if self._chosen else ""
        return f"LRP({type(self.model).__name__}, composite={self.composite.name!r}{chosen}{tap})"

    @property
    def method_label(self) -> str:
        """``"LRP (<composite>)"``: maps of two composites side by side in a figure are told apart."""
        return f"LRP ({self.composite.name})"

    def _explain(self, x: Tensor, target: Any, **kwargs: Any) -> tuple[Tensor, Targets]:
        self.composite.check_bounds(x.shape)
        self.audit = None
        self.rule_coverage = None
        return super()._explain(x, target, **kwargs)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        # one backward pass of modified gradients in gradient-times-input form (`gradient_form`)
        run = GradientFormRun(self.model, self.composite, hooks, self.canonize, x.shape[0])
        leaf, targets = self._forward(run, x, target, kwargs)
        # a gradient of 1 at the score is relevance f_c(x) over activation f_c(x); relevance = input x gradient, plus
        # what a first layer's rule handed to the input whole (`layer_fn`). K targets run K backward passes: the
        # rules' custom backward functions do not batch under vmap.
        sink = run.sink
        grads = batched_grad(targets.scores, [leaf] if sink is None else [leaf, sink], strategy="loop")
        relevance = leaf.detach().unsqueeze(1) * grads[0]
        if sink is not None:
            relevance = relevance + grads[1]
        return self._audited(run, targets, relevance), targets

    def _forward(self, run: GradientFormRun, x: Tensor, target: Any, kwargs: dict[str, Any]) -> tuple[Tensor, Targets]:
        """The forward pass under `run`'s rules: (the tensor whose relevance is returned: the input as a leaf, or the
        tapped layer's tensor; the targets); ``rule_coverage`` set also when the pass raises."""
        fwd = kwargs.get("forward_args") or ForwardArgs((), x.shape[0])
        try:
            with run.forward_pass():
                if self._tap is None:
                    leaf = x.detach().requires_grad_(True)
                    run.set_leaf(leaf)
                    output = fwd(self.model, (leaf,))
                else:
                    with self._tap.capture() as taken:
                        output = fwd(self.model, (x.detach(),))
                    leaf = self._tap.one(taken)
        finally:
            self.rule_coverage = run.coverage
        # the output is not needed in the backward pass: a language model's logits (N, T, V) held through it take
        # as much memory again as the gradient at them, which the backward pass then allocates fresh
        return leaf, resolve_targets(target, output, x.shape[0])

    def _audited(self, run: GradientFormRun, targets: Targets, relevance: Tensor) -> Tensor:
        """`relevance` (float32 where the model computes in half precision), with ``self.audit`` set from `run`'s
        entries, the targets' scores and the relevance's totals."""
        start = targets.scores.detach().sum(1)
        total = relevance.detach().flatten(2).sum(2).sum(1)
        # the layer calls the backward pass reached (a mean that only a held std reads is never reached)
        reached = [e for e in run.entries if e.entered is not None]
        self.audit = RelevanceAudit(start=start, total=total, entries=reached)
        return relevance.float() if relevance.dtype in (torch.float16, torch.bfloat16) else relevance


def _named_composite(name: str, **kwargs: Any) -> Composite:
    names = (*COMPOSITES, *TRANSFORMER_COMPOSITES)
    if name not in names:
        raise ValueError(f"unknown LRP composite {name!r}; valid composites: {', '.join(names)}")
    return composite(name, **kwargs)


def _check_visible(model: nn.Module, comp: Composite) -> None:
    """`ValueError` naming a TorchScript submodule: the engine cannot see the operations inside it, so its
    attention would silently get a plain gradient."""
    for name, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            raise ValueError(
                f"LRP composite {comp.name!r}: {name or '(model)'!r} ({type(module).__name__}) is a TorchScript "
                "module, whose operations the rules cannot see (its attention would get a plain gradient); explain "
                "the eager (not scripted) module"
            )


def _check_mapped(model: nn.Module, comp: Composite) -> None:
    """`ValueError` naming the layers with parameters that no rule of `comp` covers (their relevance would be the
    plain gradient, silently; `_unmapped`)."""
    missing = _unmapped(model, comp)
    if missing:
        shown = ", ".join(missing[:8]) + (f", and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(
            f"LRP composite {comp.name!r} has no rule for these layers with parameters: {shown}; add them to a "
            "Composite's type_map or name_map (e.g. composite(name, type_map=[(nn.LayerNorm, Pass())])); for "
            "transformers use composite='attn-lrp' or 'cp-lrp'"
        )


def _unmapped(model: nn.Module, comp: Composite) -> list[str]:
    """The layers with parameters of their own that no rule of `comp` covers, as "name (Type)". A transformer
    composite's rules cover functional calls too, so a layer without children of its own that it does not map
    (DINOv2's layer scale, Swin's relative position bias) is seen call by call instead: a product with its parameter
    is a scaling by a constant, a sum with it a sum with a constant, and any call that no rule covers is reported
    after the pass (`rule_coverage`)."""
    named = comp.resolve_names(model)
    known = (*ACTIVATIONS, *AVG_POOLS, *BATCH_NORMS, *GRADIENT_LAYERS)
    missing = []
    for name, module in model.named_modules():
        if module in named or isinstance(module, known):
            continue
        has_own_params = any(True for _ in module.parameters(recurse=False))
        if not has_own_params:
            continue
        if comp.transformer is not None and next(module.children(), None) is None:
            continue
        first = isinstance(module, LINEAR_LAYERS)
        if comp.by_type(module, first=first) is None and comp.by_type(module, first=False) is None:
            missing.append(f"{name or '(model)'} ({type(module).__name__})")
    return missing


def fitting_composite(model: nn.Module) -> tuple[str, str]:
    """(composite name, why) for `model` when none is named: AttnLRP where the model has attention (a module of
    ``nn.MultiheadAttention`` or one whose class name says attention or attn, as in timm and Hugging Face), a
    normalisation the CNN composites have no rule for (``nn.LayerNorm``, ``nn.RMSNorm``, a norm by class name:
    ConvNeXt, MLP-Mixer) or another layer with parameters they have no rule for and AttnLRP's functional rules
    cover (a layer scale: FastViT; ResMLP's affine maps); zennit's ``EpsilonPlusFlat`` otherwise (convolutional
    networks)."""
    modules = list(model.named_modules())
    for name, module in modules:
        kind = type(module).__name__
        if isinstance(module, nn.MultiheadAttention) or "attention" in kind.lower() or "attn" in kind.lower():
            return "attn-lrp", f"attention found: {name or 'the model'} ({kind})"
    for name, module in modules:
        kind = type(module).__name__
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or module_kind(module) == "norm":
            return "attn-lrp", f"a normalisation found: {name or 'the model'} ({kind})"
    missing = _unmapped(model, _named_composite("epsilon-plus-flat"))
    if missing and not _unmapped(model, _named_composite("attn-lrp")):
        return "attn-lrp", f"a layer the CNN composites have no rule for: {missing[0]}"
    return "epsilon-plus-flat", "no attention or LayerNorm: a convolutional network"


register("lrp")(LRP)


def _imagenet_bounds() -> tuple[Tensor, Tensor]:
    from ...images import IMAGENET

    mean = torch.tensor(IMAGENET.mean).view(1, -1, 1, 1)
    std = torch.tensor(IMAGENET.std).view(1, -1, 1, 1)
    return (0 - mean) / std, (1 - mean) / std


def _register_composite(name: str) -> type[LRP]:
    """``lrp-<composite>`` in the registry (CLI ``--method``): `LRP` with that composite by default; the ZBox
    bounds of ``epsilon-gamma-box`` default to ImageNet-normalized pixels [0, 1]."""

    def __init__(self: LRP, model: nn.Module, composite: str | Composite = name, **kwargs: Any) -> None:
        if composite == "epsilon-gamma-box" and kwargs.get("low") is None and kwargs.get("high") is None:
            kwargs["low"], kwargs["high"] = _imagenet_bounds()
        LRP.__init__(self, model, composite, **kwargs)

    cls = type("LRP", (LRP,), {"__init__": __init__, "__doc__": f"`LRP` with composite {name!r} by default."})
    cls.__qualname__ = f"LRP[{name}]"
    return register(f"lrp-{name}")(cls)  # type: ignore[return-value]


for _name in (*COMPOSITES, *TRANSFORMER_COMPOSITES):
    _register_composite(_name)
