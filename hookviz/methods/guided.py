"""ReLU-rule methods: the backward pass through every ReLU call is rewritten; rule tables on `methods.rules`.

Every ReLU call is seen, not only ``nn.ReLU`` modules (the rule engine, `hookviz.methods.rules`):

- module ReLUs through forward hooks, which place a tensor hook on that call's output (full backward hooks break on
  ``nn.ReLU(inplace=True)``, pytorch#61519; a hook per call also covers one module called several times);
- functional calls inside ``forward`` (``F.relu``, ``F.relu_``, ``torch.relu``, ``torch.relu_``, ``Tensor.relu``,
  ``Tensor.relu_``: torchvision DenseNet's last ``F.relu``, Inception's ``BasicConv2d``) through a
  `torch.overrides.TorchFunctionMode` that is active only during the method's own forward pass: no process-wide
  monkey-patching, nothing changes for code running outside the call.

Other activations (ReLU6, LeakyReLU, GELU, SiLU, Hardswish) are left alone by default and reported as such;
``activations="all"`` applies the same rule to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks import HookManager
from .base import register
from .gradient import InputGradientAttribution
from .rules import Call, Coverage, Rule, RuleEngine, RuleTable, first_few

RELU_MODULES: tuple[type[nn.Module], ...] = (nn.ReLU,)
OTHER_ACTIVATION_MODULES: tuple[type[nn.Module], ...] = (nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Hardswish)
# functional calls, by the name the coverage report uses
RELU_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.relu: "F.relu",
    torch.relu: "torch.relu",
    torch.relu_: "torch.relu_",  # F.relu_ is the same function
    Tensor.relu: "Tensor.relu",
    Tensor.relu_: "Tensor.relu_",
}
OTHER_ACTIVATION_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.relu6: "F.relu6",
    F.leaky_relu: "F.leaky_relu",
    F.leaky_relu_: "F.leaky_relu_",
    F.gelu: "F.gelu",
    F.silu: "F.silu",
    F.hardswish: "F.hardswish",
}
# the rules' names in the engine's coverage report
RELU_RULE = "ReLU"
OTHER_RULE = "other activations"


@dataclass
class ReLUCoverage:
    """What a ReLU-rule method did in its last forward pass.

    ``calls``: ReLU calls that ran; ``overridden``: calls whose backward was rewritten, ``by_kind`` split into
    ``"module"`` and ``"functional"``; ``repeated``: modules that ran more than once (name -> calls);
    ``left_alone``: activation calls not rewritten (module name or function name -> calls); ``others_overridden``:
    non-ReLU activation calls rewritten under ``activations="all"`` (name -> calls). The rule engine's own report,
    `hookviz.methods.rules.Coverage`, is the method's ``rule_coverage``.
    """

    calls: int = 0
    overridden: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: {"module": 0, "functional": 0})
    repeated: dict[str, int] = field(default_factory=dict)
    left_alone: dict[str, int] = field(default_factory=dict)
    others_overridden: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, coverage: Coverage) -> ReLUCoverage:
        """The ReLU view of the engine's report of a ReLU-rule table."""
        kinds = coverage.by_kind.get(RELU_RULE, {"module": 0, "functional": 0})
        return cls(
            calls=coverage.calls(RELU_RULE),
            overridden=kinds["module"] + kinds["functional"],
            by_kind={"module": kinds["module"], "functional": kinds["functional"]},
            repeated={n: c for n, c in coverage.module_calls.items() if c > 1},
            left_alone=dict(coverage.left_alone),
            others_overridden=dict(coverage.covered.get(OTHER_RULE, {})),
        )

    def __str__(self) -> str:
        parts = [
            f"{self.overridden}/{self.calls} ReLU calls overridden "
            f"({self.by_kind['module']} module, {self.by_kind['functional']} functional)"
        ]
        for title, calls in (
            ("modules run more than once", self.repeated),
            ("other activations overridden", self.others_overridden),
            ("left alone", self.left_alone),
        ):
            if calls:
                parts.append(f"{title}: {first_few(calls)}")
        return "; ".join(parts)


# the tensor hook of the ReLU rules: the gradient clamped at zero. `Tensor.relu` itself (ATen's relu is clamp_min(0),
# the same values as clamp(min=0)), not a Python function around it: the backward pass calls it without a Python frame
_clamp_positive: Callable[[Tensor], Tensor] = Tensor.relu


class ReLURuleAttribution(InputGradientAttribution):
    """Input gradient with the backward pass of every ReLU call rewritten by `_rule`.

    Args:
        activations: ``"relu"`` (default) rewrites ReLU calls only and reports other activations as left alone;
            ``"all"`` applies the rule to ReLU6, LeakyReLU, GELU, SiLU and Hardswish as well.

    After each call, ``self.coverage`` (a `ReLUCoverage`) says how many ReLU calls ran and were rewritten, by kind;
    `visualize` puts it on the `Explanation`; ``self.rule_coverage`` is the rule engine's report (`rule_table`).
    A model in which no ReLU ran raises `ValueError`: the result would silently be the plain gradient.
    """

    needs_input = False  # whether the rule needs the activation's input intact (so in-place calls are split)

    def __init__(self, model: nn.Module, *, activations: Literal["relu", "all"] = "relu", **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if activations not in ("relu", "all"):
            raise ValueError(f"activations must be 'relu' or 'all', got {activations!r}")
        self.activations = activations
        self.coverage: ReLUCoverage | None = None
        self.rule_coverage: Coverage | None = None

    def _rule(self, hooks: HookManager, x: Tensor, out: Tensor) -> Tensor | None:
        """Rewrite the backward of one activation call ``out = act(x)``; return the output to use (None: keep)."""
        raise NotImplementedError

    def rule_table(self) -> RuleTable:
        """The method as a rule table: ReLU modules and functions get `_rule`; the other activations get it under
        ``activations="all"``, else they are watched and reported as left alone (no warning: the user's choice)."""

        def apply(call: Call) -> Tensor | None:
            return self._rule(call.hooks, call.input, call.output)

        relu = Rule(RELU_RULE, apply, needs_input=self.needs_input)
        other = Rule(OTHER_RULE, apply, needs_input=self.needs_input) if self.activations == "all" else None
        return (
            RuleTable(warn=False)
            .modules(RELU_MODULES, relu)
            .modules(OTHER_ACTIVATION_MODULES, other)
            .functions(RELU_FUNCTIONS, relu)
            .functions(OTHER_ACTIVATION_FUNCTIONS, other)
        )

    def _table(self) -> RuleTable:
        """`rule_table`, built once per setting of ``activations`` (and `needs_input`) and kept for later calls: it
        depends on nothing else (the rules call `_rule` at each call), and its module look-ups are cached by type.
        A subclass with a `rule_table` of its own gets a fresh one per call."""
        if type(self).rule_table is not ReLURuleAttribution.rule_table:
            return self.rule_table()
        key = (self.activations, self.needs_input)
        cached = self.__dict__.get("_cached_table")
        if cached is None or cached[0] != key:
            cached = self._cached_table = (key, self.rule_table())
        return cached[1]

    def _forward_rules(self, hooks: HookManager) -> AbstractContextManager[None]:
        return self._rule_pass(hooks)

    @contextmanager
    def _rule_pass(self, hooks: HookManager) -> Iterator[None]:
        """The rule engine around the forward pass; ``coverage`` set also when the pass raises. A pass that
        completes without any ReLU call raises `ValueError`: the result would silently be the plain gradient."""
        engine = RuleEngine(self.model, hooks, self._table(), method=type(self).__name__)
        try:
            with engine.forward_pass():
                yield
        finally:
            assert engine.coverage is not None
            self.rule_coverage = engine.coverage
            self.coverage = ReLUCoverage.of(engine.coverage)
        self._forward_done(self.coverage)

    def _forward_done(self, coverage: ReLUCoverage) -> None:
        """Called when the model's forward completes: no ReLU at all is an error."""
        if coverage.calls == 0 and not coverage.others_overridden:
            alone = coverage.left_alone
            seen = f" (activations left alone: {', '.join(alone)})" if alone else ""
            raise ValueError(
                f"{type(self).__name__} rewrites the gradient at ReLU calls, but no ReLU ran in the forward pass of "
                f"{type(self.model).__name__}{seen}: the result would silently be the plain gradient; use Saliency, "
                "or activations='all' to apply the rule to other activations"
            )


@register("guided-backprop")
class GuidedBackprop(ReLURuleAttribution):
    r"""Guided Backpropagation (Springenberg et al., 2015, "Striving for Simplicity: The All Convolutional Net",
    arXiv:1412.6806).

    At every ReLU call the gradient passed back is the incoming gradient clamped at zero times the forward mask:
    $$ R_{in} = [x > 0] \cdot \max(R_{out}, 0) $$. Result shaped like the input, (N, C, H, W).

    How: a tensor hook on each ReLU call's output clamps the incoming gradient; the ReLU's own backward then applies
    the mask. Covers module and functional ReLU calls (see the module docstring); ``self.coverage`` reports them.

    Example::

        GuidedBackprop(model).visualize("cat.png")   # shows itself in Jupyter
    """

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False, "alpha_by_map": True}

    def _rule(self, hooks: HookManager, x: Tensor, out: Tensor) -> Tensor | None:
        hooks.tensor(out, _clamp_positive)
        return out


@register("deconvnet")
class Deconvnet(ReLURuleAttribution):
    r"""Deconvnet (Zeiler & Fergus, 2014, "Visualizing and Understanding Convolutional Networks", arXiv:1311.2901).

    At every ReLU call the gradient passed back is the incoming gradient clamped at zero, without the forward mask:
    $$ R_{in} = \max(R_{out}, 0) $$. Result shaped like the input, (N, C, H, W).

    How: the call's output is rebuilt as ``x + (relu(x) - x).detach()``, which equals ``relu(x)`` exactly but has
    the identity as its derivative, and a tensor hook clamps the incoming gradient. ReLU modules with
    ``inplace=True`` run out of place during the call (restored afterwards) so their input survives.
    """

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False, "alpha_by_map": True}
    needs_input = True

    def _rule(self, hooks: HookManager, x: Tensor, out: Tensor) -> Tensor | None:
        passthrough = x + (out - x).detach()
        hooks.tensor(passthrough, _clamp_positive)
        return passthrough
