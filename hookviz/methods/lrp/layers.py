"""The layer rules of LRP's composites in gradient-times-input form, as entries of its rule table: layers with
weights, BatchNorm folded at run time, sums of branches, pooling, activations and scaling by a constant.

Each layer call gets its rule from the composite (name map, then the first-layer map for the first convolution or
linear layer to run, then the type map), resolved at each call:

- LRP-epsilon: the layer's own gradient with the output's gradient multiplied by z / stab(z) (`stabilizer`); epsilon
  0: the plain gradient;
- z+, alpha-beta, gamma, z^B, flat, w²: one Function per call whose backward is the rule (`layer_fn`);
- BatchNorm (eval mode) whose input is exactly a convolution's or linear layer's output: folded into it for the call
  (``W' = W s``, ``b' = (b - mean) s + beta``, zennit's ``MergeBatchNorm``; the model's parameters are never written):
  epsilon's factor moves to the BatchNorm's output, whose own gradient is the s; the other rules get the folded
  layer. A subclass with a forward of its own (timm's BatchNormAct2d, its activation inside) is not folded: it
  passes relevance;
- `Norm` (average pooling, sums of two branches ``a + b``, ``torch.add``, ``+=``, ``add_``): the plain gradient with
  the factor of the sum rule's stabilizer;
- `Pass` (activations, an unfolded BatchNorm, scaling by a constant): the identity rule (`identity`), no rule at all
  where the operation is positively homogeneous (ReLU, leaky ReLU, ``x * c``: its gradient is y / x);
- `Gradient` (max pooling, dropout, reshaping): the plain gradient.

z+, alpha-beta and gamma skip their x- terms where the forward pass showed the input >= 0 (a ReLU's output, pooled,
reshaped, concatenated: `nonnegative`), without reading a value. A squeeze-excitation product holds its gate (a
sigmoid's output: `gate`), a difference of two branches takes the sum rule. Functional operations that no rule covers
(``F.conv2d`` called directly, ``torch.matmul``) on tensors that depend on the explained input are the table's
``uncovered`` calls (`LayerRules.report`), named in the engine's one warning; their gradient is their plain gradient
(in this form: relevance over activation).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..guided import OTHER_ACTIVATION_FUNCTIONS, RELU_FUNCTIONS
from ..rules import Call, RuleTable
from ..rules import Rule as EngineRule
from ..rules.reach import InputReach
from .audit import AuditEntry
from .composites import ACTIVATIONS, AVG_POOLS, BATCH_NORMS, GRADIENT_LAYERS, LINEAR_LAYERS, Composite
from .identity import IdentityRuleFn
from .layer_fn import LayerCall, LayerRuleFn
from .rules import Affine, Epsilon, Gradient, LinearRule, Norm, Pass, Rule
from .stabilizer import Site, Stabilized, stabilized

ACTIVATION_FUNCTIONS: dict[Callable[..., Any], str] = {
    **RELU_FUNCTIONS,
    **OTHER_ACTIVATION_FUNCTIONS,
    torch.sigmoid: "torch.sigmoid",
    Tensor.sigmoid: "Tensor.sigmoid",
    torch.tanh: "torch.tanh",
    Tensor.tanh: "Tensor.tanh",
    F.elu: "F.elu",
    F.softplus: "F.softplus",
    F.mish: "F.mish",
    F.hardsigmoid: "F.hardsigmoid",
}
INPLACE = {torch.relu_: torch.relu, Tensor.relu_: Tensor.relu, F.leaky_relu_: F.leaky_relu}
# positively homogeneous activations: y / x is their gradient, so the identity rule is their plain gradient
HOMOGENEOUS_MODULES: tuple[type[nn.Module], ...] = (nn.ReLU, nn.LeakyReLU)
HOMOGENEOUS_FUNCTIONS = {*RELU_FUNCTIONS, F.leaky_relu, F.leaky_relu_}
# outputs >= 0 whatever the input (`LayerRules.nonnegative`), and modules whose output is >= 0 where their input is
NONNEGATIVE_MODULES: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Hardsigmoid, nn.Softplus)
NONNEGATIVE_FUNCTIONS = {*RELU_FUNCTIONS, F.relu6, torch.sigmoid, Tensor.sigmoid, F.softplus}
SIGN_KEEPING_MODULES: tuple[type[nn.Module], ...] = (*AVG_POOLS, *GRADIENT_LAYERS)  # pools, dropout, reshaping
# gates: outputs of these activations scale another activation elementwise (a squeeze-excitation block's
# ``x * sigmoid(...)``); the product holds the gate constant and the scaled signal takes all the relevance (LRP-all,
# Arras et al., 2017, "Explaining Recurrent Neural Network Predictions in Sentiment Analysis"; the rule Arras et al.,
# 2019, found the most faithful for gated products), so that the gate's own branch takes none
GATE_MODULES: tuple[type[nn.Module], ...] = (nn.Sigmoid, nn.Hardsigmoid)
GATE_FUNCTIONS = {torch.sigmoid, Tensor.sigmoid, F.hardsigmoid}
_PRODUCTS = {Tensor.mul, torch.mul}
_DIFFERENCES = {Tensor.sub, torch.sub}
CONCATENATIONS = {torch.cat: "torch.cat", torch.concat: "torch.concat", torch.concatenate: "torch.concatenate"}
POOL_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.avg_pool1d: "F.avg_pool1d",
    F.avg_pool2d: "F.avg_pool2d",
    F.avg_pool3d: "F.avg_pool3d",
    F.adaptive_avg_pool1d: "F.adaptive_avg_pool1d",
    F.adaptive_avg_pool2d: "F.adaptive_avg_pool2d",
    F.adaptive_avg_pool3d: "F.adaptive_avg_pool3d",
    torch.mean: "torch.mean",
    Tensor.mean: "Tensor.mean",
}
ADD_FUNCTIONS: dict[Callable[..., Any], str] = {
    Tensor.add: "+",
    torch.add: "torch.add",
    Tensor.add_: "+=",
    Tensor.__radd__: "+",
}
# elementwise affine maps by a constant (input normalization inside a forward, scaling): relevance passes unchanged,
# as through a folded BatchNorm; a product of two tensors that both need a gradient (gating) has no rule
AFFINE_FUNCTIONS: dict[Callable[..., Any], str] = {
    Tensor.sub: "-",
    torch.sub: "torch.sub",
    Tensor.div: "/",
    torch.div: "torch.div",
    Tensor.mul: "*",
    torch.mul: "torch.mul",
}
# scaling: x * c and x / c are their own identity rule (the gradient c is y / x)
_SCALINGS = {Tensor.mul, torch.mul, Tensor.div, torch.div}
# operations whose plain gradient is a correct relevance rule: reshaping, routing, selection, copies
_NEUTRAL = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "permute", "transpose", "t", "contiguous",
    "__getitem__", "cat", "concat", "concatenate", "stack", "squeeze", "unsqueeze", "split", "chunk", "unbind",
    "expand", "expand_as", "clone", "to", "float", "double", "half", "type", "detach", "dropout", "max_pool1d",
    "max_pool2d", "max_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "movedim", "narrow", "select", "roll",
    "flip", "pad", "__get__", "size", "dim", "numel", "requires_grad_", "cpu", "cuda", "__setitem__", "copy_",
    "identity", "repeat", "tile", "squeeze_", "unsqueeze_", "view_as_real", "index_select", "gather",
    # routing; a maximum's winner takes all, as in max pooling
    "swapaxes", "swapdims", "moveaxis", "unfold", "amax", "max",
    "new_zeros", "new_ones", "new_full", "new_empty", "zeros_like", "ones_like", "empty_like", "full_like", "zero_",
    # linear maps without parameters: their gradient is LRP-0's rule in gradient-times-input form
    "sum", "interpolate", "upsample",
}  # fmt: skip

EntryCall = Callable[[str, Rule], AuditEntry]


def uncovered(func: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
    """The name under which a call no rule covers is reported: every operation on a tensor that needs a gradient,
    except those whose plain gradient is a correct relevance rule (reshaping, routing, selection, copies)."""
    name = _name(func)
    if name in _NEUTRAL or not any(isinstance(a, Tensor) and a.requires_grad for a in args):
        return None
    return name


def neutral(func: Callable[..., Any]) -> bool:
    """Whether `uncovered` lets every call of `func` pass whatever its arguments (its plain gradient is its rule):
    the rule table's ``passes`` (which caches the answer per callable)."""
    return _name(func) in _NEUTRAL


def _name(func: Callable[..., Any]) -> str:
    # not getattr(func, "__name__", repr(func)): its default is built on every call (every unnamed call of a pass)
    name = getattr(func, "__name__", None)
    return repr(func) if name is None else name


def check_pass_shape(name: str, x: Tensor, output: Tensor) -> None:
    """`ValueError` where the layer `name`, given the pass rule, maps `x` to an output of another shape."""
    if output.shape != x.shape:
        raise ValueError(
            f"LRP: the pass rule needs a layer whose output is shaped like its input, but {name!r} maps "
            f"{tuple(x.shape)} to {tuple(output.shape)}"
        )


def branches(func: Callable[..., Any], args: tuple, kwargs: dict, reach: InputReach) -> tuple[Tensor, Tensor] | None:
    """(a, b) of an addition ``a + b`` that is a sum of two branches of the same shape, both depending on the input
    (read from the graph: `InputReach`), without ``alpha``; None for other additions (a bias, a constant)."""
    a = args[0] if args else kwargs.get("input")
    b = args[1] if len(args) > 1 else kwargs.get("other")
    alpha = kwargs.get("alpha", 1)
    if func is Tensor.__radd__:
        a, b = b, a
    if not (
        isinstance(a, Tensor)
        and isinstance(b, Tensor)
        and a.shape == b.shape
        and reach.depends(a)
        and reach.depends(b)
        and alpha == 1
        and len(args) <= 2
    ):
        return None
    return a, b


def affine_input(args: tuple, kwargs: dict, out: Any, reach: InputReach) -> Tensor | None:
    """The input of an elementwise affine map by a constant (its output `out`): the one argument that depends on
    the explained input, shaped like the output; None where there is none or more than one (a product: gating)."""
    if isinstance(out, Tensor):
        grads = [a for a in args if reach.depends(a)]
        if len(grads) == 1 and grads[0].shape == out.shape and not kwargs.get("out"):
            return grads[0]
    return None


def _known(marks: dict[int, tuple[weakref.ref[Tensor], int]], t: Tensor) -> bool:
    """Whether `t` or the tensor it is a view of is marked in `marks` (id -> (weak reference, version)), unchanged in
    place since it was marked."""
    for u in (t, t._base):
        found = None if u is None else marks.get(id(u))
        if found is not None and found[0]() is u and u._version == found[1]:
            return True
    return False


def _bias_view(bias: Tensor | None, module: nn.Module, z: Tensor) -> Tensor | None:
    """The layer's bias shaped to broadcast against its output `z` (channels second for a convolution, last for a
    linear layer), for the audit's relevance that left; None without one."""
    if bias is None:
        return None
    if isinstance(module, nn.modules.conv._ConvNd):
        return bias.detach().view(1, -1, *(1,) * (z.dim() - 2))
    return bias.detach()


def _checked(t: Tensor, what: str) -> Callable[[], Tensor]:
    """`t` (an alias) as it was when read: `RuntimeError` where the model changed it in place since."""
    alias, version = t.detach(), t._version

    def read() -> Tensor:
        if alias._version != version:
            raise RuntimeError(
                f"LRP: the input of {what!r} was modified in place after it was read, so its output cannot be "
                "computed again for the rules; make the in-place operation that follows it out of place"
            )
        return alias

    return read


class _Native:
    """A layer computed by its own forward pass, whose rule is its gradient times a factor (LRP-epsilon): its output
    with that graph (`graph`: a BatchNorm after it folds the factor to its own output) and the site, if any."""

    __slots__ = ("graph", "site", "module")

    def __init__(self, graph: Tensor, site: Site | None, module: nn.Module) -> None:
        self.graph, self.site, self.module = graph, site, module


class LayerRules:
    """The composite's layer rules during one LRP forward pass (see the module docstring): the per-pass state they
    share (the first layer, BatchNorm to fold, what is known to be >= 0, where the input relevance goes) and the
    table entries (`add_entries`)."""

    def __init__(
        self, model: nn.Module, composite: Composite, canonize: bool, reach: InputReach, entry: EntryCall, n: int
    ) -> None:
        self.model = model
        self.composite = composite
        self.canonize = canonize
        self.reach = reach
        self.entry = entry
        self.n = n
        self.named = composite.resolve_names(model)
        self.first_done = False
        # a BatchNorm is folded into the layer before it (`fold`), found by its input: kept (`produced`) only in models
        # with a BatchNorm, not to hold every layer's output for nothing
        self.folds = canonize and any(isinstance(m, BATCH_NORMS) for m in model.modules())
        self.produced: dict[int, tuple[Tensor, LayerCall | _Native]] = {}  # output id -> (output, its layer)
        # output id -> (weak reference to the output, its version then): outputs known to be >= 0 (`nonnegative`)
        self.signs: dict[int, tuple[weakref.ref[Tensor], int]] = {}
        self.gates: dict[int, tuple[weakref.ref[Tensor], int]] = {}  # the same for gates (`gate`)
        self.leaf: Tensor | None = None  # the explained input, where the first layer's relevance goes whole
        self.sink: Tensor | None = None

    def clear(self) -> None:
        for _, layer in self.produced.values():
            if isinstance(layer, LayerCall):
                layer.graph_x = None  # a graph tensor held by a graph node would be a reference cycle
        self.produced.clear()
        self.signs.clear()
        self.gates.clear()

    # -- the table ------------------------------------------------------------------------------------------------
    def add_entries(self, table: RuleTable, hooked: Callable[[nn.Module], bool] | None = None) -> RuleTable:
        """The entries: layers by name, type and kind (one rule object resolving the LRP rule per call), activation
        modules run out of place; branch additions, functional activations, pooling, scaling by a constant and
        concatenations. `hooked`: more modules the layer rule sees (a transformer composite's normalisations)."""
        handled = (*LINEAR_LAYERS, *ACTIVATIONS, *AVG_POOLS, *BATCH_NORMS, *GRADIENT_LAYERS)

        def activation_module(name: str, module: nn.Module) -> bool:
            return module is not self.model and isinstance(module, ACTIVATIONS)

        def selected(name: str, module: nn.Module) -> bool:
            return module is not self.model and (
                isinstance(module, handled) or module in self.named or (hooked is not None and hooked(module))
            )

        def layer(call: Call) -> Any:
            assert isinstance(call.op, nn.Module)
            out = self.module_rule(call.name, call.op, call.args, call.output)
            x = call.args[0] if call.args else None
            if isinstance(call.op, NONNEGATIVE_MODULES) or (
                isinstance(call.op, SIGN_KEEPING_MODULES) and isinstance(x, Tensor) and self.nonnegative(x)
            ):
                self.mark_nonnegative(call.output if out is None else out)
            if isinstance(call.op, GATE_MODULES):
                self.mark_gate(call.output if out is None else out)
            return out

        def sum_rule(call: Call) -> Any:
            return self.add(call.op, call.args, call.kwargs)

        def pool(call: Call) -> Any:
            return self.pool(call.op, call.args, call.kwargs)

        # the rules of elementwise layers need their input intact: in-place activations run out of place
        return (
            table.modules(activation_module, EngineRule("layer", layer, needs_input=True, owns_call=True))
            .modules(selected, EngineRule("layer", layer, owns_call=True))
            .functions(ADD_FUNCTIONS, EngineRule("sum", sum_rule, owns_call=True))
            .functions(ACTIVATION_FUNCTIONS, EngineRule("pass", self.activation, owns_call=True))
            .functions(POOL_FUNCTIONS, EngineRule("norm", pool, owns_call=True))
            .functions(AFFINE_FUNCTIONS, EngineRule("affine", self.affine, owns_call=True))
            .functions(CONCATENATIONS, EngineRule("signs", self.concatenation, owns_call=True))
        )

    def report(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
        """`uncovered`, for calls on tensors that depend on the explained input (read from the graph: `InputReach`):
        a computation on parameters alone (a logit scale's ``exp``, a weight standardisation) routes no relevance and
        is not reported, trainable or not."""
        name = uncovered(func, args, kwargs)
        if name is None:
            return None
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        return name if any(self.reach.depends(t) for t in tensors) else None

    # -- what is >= 0 ---------------------------------------------------------------------------------------------
    def mark_nonnegative(self, t: Any) -> None:
        """Note that the tensor `t` holds no negative value (a ReLU's output, a pooling of one)."""
        if isinstance(t, Tensor):
            self.signs[id(t)] = (weakref.ref(t), t._version)

    def nonnegative(self, t: Tensor) -> bool:
        """Whether `t` (or the tensor it is a view of: a flattened pooling) is known to hold no negative value, as
        the forward pass computed it (unchanged in place since), so that a sign-splitting rule skips its x- terms
        without reading the values (`rules._split`)."""
        return _known(self.signs, t)

    def mark_gate(self, t: Any) -> None:
        """Note that the tensor `t` is a gate: a sigmoid's or hard sigmoid's output (`GATE_MODULES`)."""
        if isinstance(t, Tensor):
            self.gates[id(t)] = (weakref.ref(t), t._version)

    def gate(self, t: Tensor) -> bool:
        """Whether `t` (or the tensor it is a view of) is a gate as the forward pass computed it (`mark_gate`)."""
        return _known(self.gates, t)

    # -- layers ---------------------------------------------------------------------------------------------------
    def rule_for(self, module: nn.Module) -> Rule | None:
        rule = self.named.get(module)
        is_linear = isinstance(module, LINEAR_LAYERS)
        if rule is None:
            rule = self.composite.by_type(module, first=is_linear and not self.first_done)
        if is_linear:
            self.first_done = True
        return rule

    def applied(self, name: str, module: nn.Module, args: tuple, output: Any) -> tuple[Rule, Tensor] | Tensor | None:
        """What a layer call gets: None where no rule applies (none mapped, `Gradient`, no tensor input that needs a
        gradient or no tensor output), the folded layer's output for a BatchNorm folded into the layer before it
        (`fold`), else (its rule, its input); `TypeError` for a rule for layers with weights on one without."""
        rule = self.rule_for(module)
        x = args[0] if args else None
        if (
            rule is None
            or isinstance(rule, Gradient)
            or not isinstance(x, Tensor)
            or not isinstance(output, Tensor)
            or not x.requires_grad
        ):
            return None
        if isinstance(module, BATCH_NORMS) and self.canonize:
            folded = self.fold(name, module, x, output)
            if folded is not None:
                return folded
        if isinstance(rule, LinearRule) and not hasattr(module, "weight"):
            raise TypeError(f"LRP: rule {rule.name!r} needs a layer with weights, but {name!r} has none")
        return rule, x

    def module_rule(self, name: str, module: nn.Module, args: tuple, output: Any) -> Any:
        found = self.applied(name, module, args, output)
        if not isinstance(found, tuple):
            return found
        rule, x = found
        return self.layer_rule(name, module, rule, x, output)

    def layer_rule(self, name: str, module: nn.Module, rule: Rule, x: Tensor, output: Tensor) -> Tensor:
        """The output of the layer call `name` with `rule` applied (`x`: its input)."""
        if isinstance(rule, LinearRule):
            if isinstance(rule, Epsilon):
                return self.epsilon_layer(name, module, rule, x, output)
            return self.rule_layer(name, module, rule, x, output)
        if isinstance(rule, Norm):
            if rule.stabilizer == 0:
                return output  # the plain gradient: the sum rule without its stabilizer
            read = _checked(x, name)
            site = Site(self.entry(name, rule), rule.stabilizer, output, lambda: module.forward(read()), self.n)
            return stabilized(output, site)
        if isinstance(rule, Pass):
            check_pass_shape(name, x, output)
            if isinstance(module, HOMOGENEOUS_MODULES):
                return output
            return IdentityRuleFn.apply(x, (output.detach(),), None)
        raise TypeError(f"LRP: rule {rule!r} cannot be applied to {type(module).__name__} {name!r}")

    def epsilon_layer(self, name: str, module: nn.Module, rule: Epsilon, x: Tensor, y: Tensor) -> Tensor:
        """LRP-epsilon: the layer's own gradient, the output's gradient times y / stab(y) (epsilon 0: nothing)."""
        site = None
        out = y
        if rule.epsilon != 0:
            read = _checked(x, name)
            bias = _bias_view(getattr(module, "bias", None), module, y)
            site = Site(self.entry(name, rule), rule.epsilon, y, lambda: module.forward(read()), self.n, bias)
            out = stabilized(y, site)
        if self.folds:
            self.produced[id(out)] = (out, _Native(y, site, module))
        return out

    def rule_layer(self, name: str, module: nn.Module, rule: LinearRule, x: Tensor, y: Tensor) -> Tensor:
        """A rule with modified weights: one `LayerRuleFn` from the layer's input (see `layer_fn`)."""
        layer = Affine.of(module)
        layer.nonnegative = self.nonnegative(x)
        call = LayerCall(self.entry(name, rule), rule, layer, x, y, self.n)
        sink = self._sink(x, rule)
        call.sink = sink is not None
        out = LayerRuleFn.apply(x, sink, (y.detach(),), call)
        if self.folds:
            call.graph_x = x
            self.produced[id(out)] = (out, call)
        return out

    def functional_layer(self, name: str, rule: LinearRule, x: Tensor, y: Tensor, layer: Affine) -> Tensor:
        """A linear map called as a function (``F.linear`` in a transformer) with a rule with modified weights:
        `rule_layer` for an `Affine` given, not a module (nothing to fold)."""
        layer.nonnegative = self.nonnegative(x)
        call = LayerCall(self.entry(name, rule), rule, layer, x, y, self.n)
        sink = self._sink(x, rule)
        call.sink = sink is not None
        return LayerRuleFn.apply(x, sink, (y.detach(),), call)

    def _sink(self, x: Tensor, rule: LinearRule) -> Tensor | None:
        """Where a rule whose relevance is not a multiple of its input puts it when that input is the explained
        input itself: a zero tensor shaped like it (`layer_fn`), made at the first such call."""
        if rule.proportional or self.leaf is None or x is not self.leaf:
            return None
        if self.sink is None:
            self.sink = torch.zeros_like(x, requires_grad=True)
        return self.sink

    def folds_into(self, bn: nn.Module, x: Tensor) -> Any:
        """The layer call (`produced`) that `bn` folds into: the one whose output is exactly `x`, `bn`'s input, where
        `bn` normalizes with running statistics; else None."""
        found = self.produced.get(id(x))
        if found is None or found[0] is not x or bn.training or bn.running_var is None:
            return None
        if type(bn).forward is not nn.modules.batchnorm._BatchNorm.forward:
            # a BatchNorm with a forward of its own (timm's BatchNormAct2d applies its activation inside): its output
            # is not the folded layer's, so it passes relevance, as zennit's rules treat a BatchNorm they do not merge
            return None
        return found[1]

    def fold(self, name: str, bn: nn.Module, x: Tensor, output: Tensor) -> Tensor | None:
        """The output of `bn` as the output of the layer before it with `bn` folded in, if `x`, `bn`'s input, is
        exactly that layer's output (and `bn` normalizes with running statistics); else None."""
        prev: LayerCall | _Native | None = self.folds_into(bn, x)
        if prev is None:
            return None
        if isinstance(prev, LayerCall):
            call = LayerCall(prev.entry, prev.rule, prev.layer.folded(bn), prev.x, output, self.n)
            call.xversion, call.sink, call.graph_x = prev.xversion, prev.sink, prev.graph_x
            prev.entry.name += f" + {name}"
            assert prev.graph_x is not None
            out = LayerRuleFn.apply(prev.graph_x, self.sink if prev.sink else None, (output.detach(),), call)
            self.produced[id(out)] = (out, call)
            return out
        if prev.site is None:
            return output  # epsilon 0: the layer's and the BatchNorm's own gradients are the folded layer's rule
        # the BatchNorm's own gradient (its scale s) after the factor at its output, the folded layer's output
        var, mean = bn.running_var.detach(), bn.running_mean.detach()
        gamma = bn.weight.detach() if bn.weight is not None else torch.ones_like(var)
        beta = bn.bias.detach() if bn.bias is not None else torch.zeros_like(var)
        scale = gamma / (var + bn.eps) ** 0.5
        bias = getattr(prev.module, "bias", None)
        shift = ((bias.detach() if bias is not None else torch.zeros_like(mean)) - mean) * scale + beta
        shape = (1, -1, *(1,) * (output.dim() - 2))
        first = prev.site
        prev.site.entry.name += f" + {name}"  # type: ignore[union-attr]
        site = Site(first.entry, first.epsilon, output, lambda: bn.forward(first.output()), self.n, shift.view(shape),
                    scale=scale.view(shape))  # fmt: skip
        return Stabilized.apply(prev.graph, (output.detach(),), site)

    # -- functional operations ------------------------------------------------------------------------------------
    def add(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A sum of two branches of the same shape (both depend on the input, read from the graph: `InputReach`)
        with the composite's sum rule (`Norm`: its stabilizer as a factor); other additions as called (a bias, a
        constant: its plain gradient)."""
        pair = branches(func, args, kwargs, self.reach)
        if pair is None:
            return func(*args, **kwargs)
        return self._sum(*pair, ADD_FUNCTIONS[func], inplace=func is Tensor.add_)

    def _sum(self, a: Tensor, b: Tensor, what: str, inplace: bool = False) -> Tensor:
        """``a + b`` (written into `a` where `inplace`) with the composite's sum rule, audited as `what`."""
        rule = self.composite.sum_rule
        stabilizer = getattr(rule, "stabilizer", 0.0)
        z = torch.add(a, b)
        if stabilizer != 0:
            # in place, the sum is visible only through `a`, which the copy below writes: z itself is never changed
            again = None
            if not inplace:
                ra, rb = _checked(a, what), _checked(b, what)
                again = lambda: ra() + rb()  # noqa: E731
            z = stabilized(z, Site(self.entry(what, rule), stabilizer, z, again, self.n))
        return a.copy_(z) if inplace else z

    def activation(self, engine_call: Call) -> Any:
        """A functional activation: relevance passes through (the identity rule; ReLU-like ones: their gradient)."""
        func, args, kwargs = engine_call.op, engine_call.args, engine_call.kwargs
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Tensor) or not x.requires_grad or func in HOMOGENEOUS_FUNCTIONS:
            out = func(*args, **kwargs)
        else:
            base = INPLACE.get(func, func)
            inplace = base is not func or bool(kwargs.get("inplace", False))
            rest = {k: v for k, v in kwargs.items() if k != "inplace"}
            with torch.no_grad():
                y = base(*args, **rest)
            out = IdentityRuleFn.apply(x, (y,), None)
            if inplace:
                out = x.copy_(out)
        if func in NONNEGATIVE_FUNCTIONS:
            self.mark_nonnegative(out)
        if func in GATE_FUNCTIONS:
            self.mark_gate(out)
        return out

    def pool(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("input")
        out = func(*args, **kwargs)
        if not isinstance(x, Tensor) or not x.requires_grad:
            return out
        rule = self.composite.sum_rule
        stabilizer = getattr(rule, "stabilizer", 0.0)
        if stabilizer != 0:
            read, rest = _checked(x, POOL_FUNCTIONS[func]), args[1:]
            again = lambda: func(read(), *rest, **kwargs)  # noqa: E731
            out = stabilized(out, Site(self.entry(POOL_FUNCTIONS[func], rule), stabilizer, out, again, self.n))
        if self.nonnegative(x):
            self.mark_nonnegative(out)
        return out

    def concatenation(self, engine_call: Call) -> Any:
        """``torch.cat`` as called (its plain gradient routes relevance: `NotImplemented`, not reported), its output
        known to be >= 0 where every part is (an inception block's branches)."""
        out = engine_call.op(*engine_call.args, **engine_call.kwargs)
        parts = engine_call.args[0] if engine_call.args else engine_call.kwargs.get("tensors", ())
        if all(isinstance(t, Tensor) and self.nonnegative(t) for t in parts):
            self.mark_nonnegative(out)
        engine_call.output = out
        return NotImplemented

    def affine(self, engine_call: Call) -> Any:
        """An elementwise affine map by a constant (``x - m``, ``x / s``, ``x * c``; a parameter is a constant,
        trainable or not): relevance passes unchanged (scaling: its own gradient; a shift: the identity rule). A
        product of a signal and a gate (`GATE_MODULES`, both depending on the explained input: a squeeze-excitation
        block) holds the gate, a scaling of the signal, which takes all the relevance (LRP-all); other products of two
        inputs that depend on the explained input have no rule (`NotImplemented`, the engine reports it), the output
        as computed."""
        func, args, kwargs = engine_call.op, engine_call.args, engine_call.kwargs
        held = self._held_gate(func, args, kwargs)
        if held is not None:
            return held
        if func in _DIFFERENCES and not kwargs and len(args) == 2:
            pair = branches(torch.add, args, {}, self.reach)
            if pair is not None:
                # a difference of two branches is the sum a + (-b), the same values (IEEE subtraction adds the
                # negation exactly): the sum rule, as for an addition
                return self._sum(pair[0], torch.neg(pair[1]), AFFINE_FUNCTIONS[func])
        out = func(*args, **kwargs)
        x = affine_input(args, kwargs, out, self.reach)
        if x is not None:
            if func in _SCALINGS and (args[0] is x or func in (Tensor.mul, torch.mul)):
                return out
            return IdentityRuleFn.apply(x, (out.detach(),), None)
        engine_call.output = out
        return NotImplemented

    def _held_gate(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Tensor | None:
        """``signal * gate`` with the gate held (`affine`), the same values; None where the call is not a product of
        exactly one gate and a signal that both depend on the explained input."""
        if func not in _PRODUCTS or kwargs or len(args) != 2:
            return None
        a, b = args
        if not (isinstance(a, Tensor) and isinstance(b, Tensor) and self.reach.depends(a) and self.reach.depends(b)):
            return None
        ga, gb = self.gate(a), self.gate(b)
        if ga == gb:
            return None
        signal = b if ga else a
        out = func(a.detach(), b) if ga else func(a, b.detach())
        if self.nonnegative(signal):  # a gate is >= 0 (sigmoid, hard sigmoid)
            self.mark_nonnegative(out)
        return out
