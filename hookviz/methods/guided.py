"""ReLU-rule methods: the backward pass through every ReLU call is rewritten.

Every ReLU call is seen, not only ``nn.ReLU`` modules:

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

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..hooks import HookManager
from .base import register
from .gradient import InputGradientAttribution
from .scope import acting, current_call

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
_INPLACE_FUNCTIONS = {torch.relu_, Tensor.relu_, F.leaky_relu_}


@dataclass
class ReLUCoverage:
    """What a ReLU-rule method did in its last forward pass.

    ``calls``: ReLU calls that ran; ``overridden``: calls whose backward was rewritten, ``by_kind`` split into
    ``"module"`` and ``"functional"``; ``repeated``: modules that ran more than once (name -> calls);
    ``left_alone``: activation calls not rewritten (module name or function name -> calls); ``others_overridden``:
    non-ReLU activation calls rewritten under ``activations="all"`` (name -> calls).
    """

    calls: int = 0
    overridden: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: {"module": 0, "functional": 0})
    repeated: dict[str, int] = field(default_factory=dict)
    left_alone: dict[str, int] = field(default_factory=dict)
    others_overridden: dict[str, int] = field(default_factory=dict)

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
                parts.append(f"{title}: {_first_few(calls)}")
        return "; ".join(parts)


def _first_few(calls: dict[str, int], shown: int = 3) -> str:
    items = [f"{name} x{count}" for name, count in calls.items()]
    more = f", and {len(items) - shown} more" if len(items) > shown + 1 else ""
    return ", ".join(items if not more else items[:shown]) + more


class _FunctionalActivations(TorchFunctionMode):
    """Routes functional activation calls made outside activation modules to `rule`; counts everything."""

    def __init__(self, owner: _ReLURuleRun) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = RELU_FUNCTIONS.get(func) or OTHER_ACTIVATION_FUNCTIONS.get(func)
        if name is None or self.owner.module_depth > 0 or not acting(self.owner.call):
            # not an activation, or the activation module's own hooks deal with this call, or the call comes from
            # another hookviz call's forward pass nested inside this one
            return func(*args, **kwargs)
        return self.owner.functional_call(func, name, args, kwargs)


class _ReLURuleRun:
    """State of one forward pass of a ReLU-rule method: applies the rule and builds the coverage report."""

    def __init__(self, method: ReLURuleAttribution, hooks: HookManager) -> None:
        self.method = method
        self.hooks = hooks
        self.call = current_call()  # the method's own call: its hooks act only while it is the innermost
        self.in_forward = False
        self.module_depth = 0
        self.module_calls: Counter[str] = Counter()
        self.left_alone: Counter[str] = Counter()
        self.relu_calls = 0
        self.by_kind: Counter[str] = Counter()
        self.others: Counter[str] = Counter()

    def covers(self, is_relu: bool) -> bool:
        return is_relu or self.method.activations == "all"

    def acting(self) -> bool:
        """Whether the hooks act now: inside this run's own forward pass, not a nested call's."""
        return self.in_forward and acting(self.call)

    def place_hooks(self) -> None:
        """Module hooks on activation modules (acting only inside `forward_pass`); covered modules that work in
        place run out of place while the hooks live when the rule needs the activation's input."""
        types = RELU_MODULES + OTHER_ACTIVATION_MODULES
        modules = [m for m in self.method.model.modules() if isinstance(m, types)]
        if not modules:
            return
        if self.method.needs_input:
            covered = [m for m in modules if self.covers(isinstance(m, RELU_MODULES))]
            self.hooks.out_of_place(covered)  # restored (owner-counted) when the manager removes its hooks

        def enter(module: nn.Module, args: tuple) -> None:
            if self.acting():
                self.module_depth += 1

        def leave(name: str, module: nn.Module, args: tuple, output: Any) -> Any:
            if not self.acting():
                return None
            self.module_depth -= 1
            self.module_calls[name] += 1
            is_relu = isinstance(module, RELU_MODULES)
            self.relu_calls += is_relu
            if not self.covers(is_relu) or not isinstance(output, Tensor) or not output.requires_grad:
                self.left_alone[name] += 1
                return None
            self._count(is_relu, "module", name)
            return self.method._rule(self.hooks, args[0], output)

        self.hooks.forward_pre(types, enter)
        self.hooks.forward(types, leave, with_name=True, always_call=True)

    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        """The functional mode, entered around the forward pass in ``try/finally``: it never outlives the pass,
        whatever ends it (a forward hook with ``always_call`` runs only for ``Exception``, not ``KeyboardInterrupt``).
        A pass that completes without any ReLU call raises `ValueError` (see `ReLURuleAttribution`)."""
        self.in_forward = True
        try:
            with _FunctionalActivations(self):
                yield
        finally:
            self.in_forward = False
            self.method.coverage = self.coverage()
        self.method._forward_done(self)

    def functional_call(self, func: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
        is_relu = func in RELU_FUNCTIONS
        self.relu_calls += is_relu
        x = args[0] if args else kwargs.get("input")
        if not self.covers(is_relu) or not isinstance(x, Tensor) or not x.requires_grad:
            self.left_alone[name] += 1
            return func(*args, **kwargs)
        self._count(is_relu, "functional", name)
        inplace = func in _INPLACE_FUNCTIONS or bool(kwargs.get("inplace", False))
        if inplace and self.method.needs_input:
            # compute out of place so the pre-activation survives, then write the result back in place
            out_of_place = {k: v for k, v in kwargs.items() if k != "inplace"}
            base = _OUT_OF_PLACE.get(func, func)
            result = self.method._rule(self.hooks, x, base(*args, **out_of_place))
            return x.copy_(result)
        return self.method._rule(self.hooks, x, func(*args, **kwargs))

    def _count(self, is_relu: bool, kind: str, name: str) -> None:
        if is_relu:
            self.by_kind[kind] += 1
        else:
            self.others[name] += 1

    def coverage(self) -> ReLUCoverage:
        overridden = self.by_kind["module"] + self.by_kind["functional"]
        return ReLUCoverage(
            calls=self.relu_calls,
            overridden=overridden,
            by_kind={"module": self.by_kind["module"], "functional": self.by_kind["functional"]},
            repeated={n: c for n, c in self.module_calls.items() if c > 1},
            left_alone=dict(self.left_alone),
            others_overridden=dict(self.others),
        )


_OUT_OF_PLACE: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.relu_: torch.relu,
    Tensor.relu_: Tensor.relu,
    F.leaky_relu_: F.leaky_relu,
}


def _clamp_positive(grad: Tensor) -> Tensor:
    return grad.clamp(min=0)


class ReLURuleAttribution(InputGradientAttribution):
    """Input gradient with the backward pass of every ReLU call rewritten by `_rule`.

    Args:
        activations: ``"relu"`` (default) rewrites ReLU calls only and reports other activations as left alone;
            ``"all"`` applies the rule to ReLU6, LeakyReLU, GELU, SiLU and Hardswish as well.

    After each call, ``self.coverage`` (a `ReLUCoverage`) says how many ReLU calls ran and were rewritten, by kind;
    `visualize` puts it on the `Explanation`. A model in which no ReLU ran raises `ValueError`: the result would
    silently be the plain gradient.
    """

    needs_input = False  # whether the rule needs the activation's input intact (so in-place calls are split)

    def __init__(self, model: nn.Module, *, activations: Literal["relu", "all"] = "relu", **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if activations not in ("relu", "all"):
            raise ValueError(f"activations must be 'relu' or 'all', got {activations!r}")
        self.activations = activations
        self.coverage: ReLUCoverage | None = None

    def _rule(self, hooks: HookManager, x: Tensor, out: Tensor) -> Tensor | None:
        """Rewrite the backward of one activation call ``out = act(x)``; return the output to use (None: keep)."""
        raise NotImplementedError

    def _forward_rules(self, hooks: HookManager) -> AbstractContextManager[None]:
        run = _ReLURuleRun(self, hooks)
        run.place_hooks()
        return run.forward_pass()

    def _forward_done(self, run: _ReLURuleRun) -> None:
        """Called when the model's forward completes: no ReLU at all is an error."""
        coverage = run.coverage()
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

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False}

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

    display_defaults = {"reduce": None, "mode": "seed", "overlay": False}
    needs_input = True

    def _rule(self, hooks: HookManager, x: Tensor, out: Tensor) -> Tensor | None:
        passthrough = x + (out - x).detach()
        hooks.tensor(passthrough, _clamp_positive)
        return passthrough
