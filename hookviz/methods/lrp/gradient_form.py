r"""AttnLRP / CP-LRP in gradient-times-input form: one ordinary backward pass, where the rules allow it.

With the stabilizers at zero (``epsilon=0, stabilizer=0``: the unstabilised rules, as `lxt` divides), every
transformer rule is exact in the form that carries $$ g = R / a $$ (relevance over activation) backward instead of R:
linear layers, sums and LayerNorm / RMSNorm with 1/std held constant are then their plain (linearised) gradient, a
product of two activations passes half the gradient to each factor, the softmax rule is the softmax's own gradient,
and only elementwise activations (and BatchNorm's pass rule) need $$ g_x = g_y \, y / x $$. The relevance at the input
is $$ x \odot g $$ (Achtibat et al., 2024, "AttnLRP", Sec. 3.4; the `lxt` package's efficient mode). Nothing keeps
an output to divide by it and fused kernels stay fused, so the pass costs about what the gradient costs.

`check_gradient_form` raises for a composite with a rule of another kind; `GradientFormRun` is the rule table for one
forward pass (products, softmax, fused attention, normalisations, activations), whose backward pass is then plain
autograd. The maps equal those of the relevance form (each rule an autograd Function carrying R), kept as a test
reference in tests/lrp_relevance_form/, with the same composite (tests/test_lrp_gradient_form.py).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ...hooks import HookManager
from ..rules import MATMUL_FUNCTIONS, Call, Coverage, RuleEngine, RuleTable
from ..rules import Rule as EngineRule
from ..rules.ops import bind_mha, bind_sdpa
from ..rules.reach import InputReach
from .attention import MHA, SDPA, attend, mha, mha_heads
from .attention_check import AttentionCheck
from .audit import AuditBook, AuditEntry
from .composites import ACTIVATIONS, AVG_POOLS, BATCH_NORMS, GRADIENT_LAYERS, LINEAR_LAYERS, Composite
from .gradient_ops import GradientOps, _again
from .held_attention import held_attention
from .identity import IdentityRuleFn, again_module
from .layers import ADD_FUNCTIONS, LayerRules, neutral
from .norm import GroupNormFn, NormMap, norm_map
from .output_rows import output_layer, rows_reached
from .rules import Affine, Epsilon, Gradient, LinearRule, Norm, Pass, Rule
from .stabilized_rows import stabilized_rows
from .transformer import Attention, NormIdentity, Softmax, Uniform, module_kind, whole_module_rule

# -- the operations the transformer composites' rules intercept ----------------------------------------------------
MUL_FUNCTIONS: dict[Callable[..., Any], str] = {Tensor.mul: "*", torch.mul: "torch.mul", Tensor.__rmul__: "*"}
EINSUM_FUNCTIONS: dict[Callable[..., Any], str] = {torch.einsum: "torch.einsum"}
BADDBMM_FUNCTIONS: dict[Callable[..., Any], str] = {torch.baddbmm: "torch.baddbmm", Tensor.baddbmm: "Tensor.baddbmm"}
SOFTMAX_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.softmax: "F.softmax",
    torch.softmax: "torch.softmax",
    Tensor.softmax: "Tensor.softmax",
}
# elementwise activations whose identity rule is not their own gradient (ReLU-like ones need no rule: y / x is
# their derivative wherever x != 0)
_ACTIVATION_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.gelu: "F.gelu",
    F.silu: "F.silu",
    F.mish: "F.mish",
    F.elu: "F.elu",
    F.softplus: "F.softplus",
    torch.tanh: "torch.tanh",
    Tensor.tanh: "Tensor.tanh",
    torch.sigmoid: "torch.sigmoid",
    Tensor.sigmoid: "Tensor.sigmoid",
    F.tanh: "F.tanh",
    F.sigmoid: "F.sigmoid",
}
# where relevance starts (an embedding's output), what routes nothing, and the maps whose plain gradient is their
# rule in gradient form (a negation, in-place scaling by a constant: positively homogeneous or linear)
_EXACT_AS_GRADIENT = {"embedding", "is_floating_point", "is_complex", "neg", "__neg__", "negative", "mul_", "div_",
                      "type_as"}  # fmt: skip


def _passes(func: Callable[..., Any]) -> bool:
    """The transformer table's ``passes``: what `unruled` lets pass whatever the arguments."""
    return neutral(func) or getattr(func, "__name__", None) in _EXACT_AS_GRADIENT


NORM_FUNCTIONS: dict[Callable[..., Any], str] = {F.layer_norm: "F.layer_norm", F.rms_norm: "F.rms_norm"}
# the std of a normalisation written out (HF's RMSNorm: ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``):
# inside a normalisation module its result is detached, so that the module's own gradient is the identity rule's
_STD_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.rsqrt: "torch.rsqrt",
    Tensor.rsqrt: "Tensor.rsqrt",
    torch.sqrt: "torch.sqrt",
    Tensor.sqrt: "Tensor.sqrt",
    torch.std: "torch.std",
    Tensor.std: "Tensor.std",
    torch.var: "torch.var",
    Tensor.var: "Tensor.var",
}


def _held(func: Callable[..., Any]) -> bool:
    """Which calls inside a normalisation module take a rule: its std (held constant) or a fused normalisation (its
    own rule); the module's other calls are their plain gradient, the identity rule on the whole module applied at
    its output (a centring mean, a bias added: no sum rule of their own)."""
    return func in _STD_FUNCTIONS or func in NORM_FUNCTIONS


# the rule kinds a transformer composite may hold: those with a gradient-times-input form here (the layer rules,
# `layers`; AttnLRP's and CP-LRP's, their stabilizers as factors: `gradient_ops`)
GRADIENT_FORM_RULES = (LinearRule, NormIdentity, Norm, Pass, Gradient, Attention, Uniform, Softmax)


def check_gradient_form(composite: Composite) -> None:
    """`ValueError` naming the first rule of `composite` that has no gradient-times-input form (a user's rule of
    another kind in a transformer composite), what it maps and the rule kinds expected; every rule of the other
    composites has one (`layers`)."""
    if composite.transformer is None:
        return
    expected = "one of the kinds " + ", ".join(kind.__name__ for kind in GRADIENT_FORM_RULES)
    maps = {"name_map": composite.name_map, "first_map": composite.first_map, "type_map": composite.type_map,
            "kind_map": composite.kind_map}  # fmt: skip
    for which, entries in maps.items():
        for key, rule in entries:
            if not isinstance(rule, GRADIENT_FORM_RULES):
                _reject(composite, f"its {which} gives {_mapped(which, key)}", rule, expected)
    if not isinstance(composite.sum_rule, Norm):
        _reject(composite, "its sum_rule gives additions of branches", composite.sum_rule, "the kind Norm")


def _reject(composite: Composite, where: str, rule: Rule, expected: str) -> None:
    raise ValueError(
        f"LRP composite {composite.name!r}: {where} the rule {rule.name!r} ({type(rule).__name__}), which has no "
        f"gradient-times-input form, the one form LRP runs in; a transformer composite needs a rule of {expected} "
        "there (or a subclass)"
    )


def _mapped(which: str, key: Any) -> str:
    """What a composite's map entry applies to, in words: module types, a selector, a module kind."""
    if which == "kind_map":
        return f"modules of kind {key!r}"
    types = key if isinstance(key, tuple) else (key,)
    if all(isinstance(t, type) for t in types):
        return " / ".join(t.__name__ for t in types)
    return repr(key)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward: the gradient times `w` (a factor's share of a product: the uniform rule)."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, w: float) -> Tensor:
        ctx.w = w
        return t.view_as(t)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:
        return g * ctx.w, None


class _HalfProduct(torch.autograd.Function):
    """Output ``a * b`` (same shapes); backward: half the gradient to each factor (the uniform rule) in one node,
    ``h = g / 2`` then ``h b`` and ``h a``: three products where two `_ScaleGrad` nodes and the product's own backward
    take four (the same values: halving is exact in binary floating point)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
        a, b = ctx.saved_tensors
        h = g * 0.5
        return h * b, h * a


def _share(t: Tensor, w: float) -> Tensor:
    if w == 1.0:
        return t
    return t.detach() if w == 0.0 else _ScaleGrad.apply(t, w)


class _NormFn(torch.autograd.Function):
    """Output: a normalisation's output; backward: the transpose of the map with 1/std held constant (`NormMap`).
    The std is taken in the forward pass and kept, (..., 1), not the input: the floor keeps the input (its own
    backward needs it), `lxt`'s rewritten norms keep nothing that size, and the std costs the same to take here as
    in the backward pass. Given `rstd` (1/std as ``torch.native_layer_norm`` computed it with the output), that is
    kept instead and nothing is taken again."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ybox: tuple[Tensor], nm: NormMap, rstd: Tensor | None = None) -> Tensor:
        ctx.save_for_backward(nm.sigma(x) if rstd is None else rstd)
        ctx.nm, ctx.rstd = nm, rstd is not None
        return ybox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None]:
        (scale,) = ctx.saved_tensors
        nm = ctx.nm
        gf = g.float() if g.dtype in (torch.float16, torch.bfloat16) else g
        h = nm.transpose_rstd(gf, scale) if ctx.rstd else nm.transpose(gf, scale)
        return h.to(g.dtype), None, None, None


class GradientFormRun:
    """One forward pass of a transformer composite in gradient-times-input form (see the module docstring): the
    engine's table rewrites products, softmax, fused attention, normalisations and activations; everything else is
    its plain gradient. `coverage` is set after the pass."""

    def __init__(
        self, model: nn.Module, composite: Composite, hooks: HookManager, canonize: bool = True, n: int = 1
    ) -> None:
        self.model = model
        self.composite = composite
        self.hooks = hooks
        self.reach = InputReach()
        self.entries: list[AuditEntry] = []
        self.book = AuditBook(self.entries)
        self.counts: Counter[str] = Counter()
        # the layer rules (`layers`): the whole table where the composite has no transformer rules; linear layers,
        # sums of branches, pooling and affine maps of the transformer composites
        self._layer_args = (canonize, n)
        self._layers: LayerRules | None = None  # made where used: lxt's rules (stabilizers 0) need none
        self._leaf: Tensor | None = None
        transformer = composite.transformer
        self.transformer = transformer is not None
        self.cp = transformer is not None and transformer.softmax.hold
        self.hold_gates = transformer is not None and transformer.product.hold_gates
        # id -> (weak reference, module type or function) of activation outputs: CP-LRP holds a gated MLP's gate
        self.gates: dict[int, tuple[weakref.ref[Tensor], object]] = {}
        self.gate_keys: set[object] = set()  # the activations whose outputs were gates in this pass
        self.coverage: Coverage | None = None
        # the normalisation modules running now (innermost last), each with how its rule was applied inside it:
        # None (not yet), a dtype (its std held constant by `_std`, taken in that dtype), "function" (F.layer_norm /
        # F.rms_norm's rule)
        self.norms: list[list[Any]] = []
        self.check = AttentionCheck()  # every attention module runs an attention the rules see
        # the transformer rules' stabilizers as factors on the gradient (`gradient_ops`; inactive where all are 0)
        self.ops: GradientOps | None = None
        if transformer is not None:
            rules = (composite.linear_rule(), transformer.product, composite.sum_rule, transformer.norm,
                     transformer.softmax)  # fmt: skip
            self.ops = GradientOps(rules, self.reach, self.entry, self._shares, _share, self._rule_layer, n)

    def entry(self, name: str, rule: Rule) -> AuditEntry:
        """A new audit entry for a call of `name` (``name#k`` for its k-th call) with `rule`, in execution order."""
        self.counts[name] += 1
        k = self.counts[name]
        e = AuditEntry(name if k == 1 else f"{name}#{k}", rule.name, book=self.book, row=len(self.entries))
        self.entries.append(e)
        return e

    @property
    def sink(self) -> Tensor | None:
        """Where the first layer's relevance on the explained input went whole (`layer_fn`), or None."""
        return None if self._layers is None else self._layers.sink

    def set_leaf(self, leaf: Tensor) -> None:
        """The explained input, before the forward pass."""
        self._leaf = leaf
        if self._layers is not None:
            self._layers.leaf = leaf

    @property
    def layers(self) -> LayerRules:
        if self._layers is None:
            canonize, n = self._layer_args
            self._layers = LayerRules(self.model, self.composite, canonize, self.reach, self.entry, n)
            self._layers.leaf = self._leaf
        return self._layers

    def _rule_layer(self, name: str, rule: LinearRule, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``F.linear`` with a linear rule other than LRP-epsilon (gamma on a transformer's linear layers)."""
        with torch.no_grad():
            y = F.linear(x, weight, bias)
        layer = Affine("linear", weight.detach(), None if bias is None else bias.detach())
        return self.layers.functional_layer(name, rule, x, y, layer)

    @property
    def _active(self) -> bool:
        return self.ops is not None and self.ops.active

    # -- the table ------------------------------------------------------------------------------------------------
    def table(self) -> RuleTable:
        if self.ops is None:
            return self.layers.add_entries(RuleTable(uncovered=self.layers.report, passes=neutral))
        active = self._active
        comp = self.composite
        ops = self.ops

        def rule_of(module: nn.Module) -> Rule | None:
            return comp.by_type(module, first=False)

        def is_norm(name: str, module: nn.Module) -> bool:
            return module is not self.model and (
                isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or module_kind(module) == "norm"
            )

        def enter_norm(module: nn.Module) -> None:
            self.norms.append([module, None])

        def open_norm(call: Call) -> Any:
            """A normalisation module whose calls were intercepted while it ran: where its std was taken by a call
            `_STD_FUNCTIONS` names (or it called ``F.layer_norm`` / ``F.rms_norm``, whose rule ran), its output's own
            gradient is the identity rule's, and nothing is added; else `norm`'s Function. A std held constant is
            accepted where the module's output is a LayerNorm / RMSNorm of its input (checked at its first call,
            as in `norm`)."""
            held = None
            if self.norms and self.norms[-1][0] is call.op:
                held = self.norms.pop()[1]
            if held is None:
                return norm(call)
            if held == "function":
                return call.output  # its F.layer_norm / F.rms_norm call took the rule, factor and all
            x = call.args[0] if call.args else None
            if not (isinstance(x, Tensor) and isinstance(call.output, Tensor)):
                return None
            if x.is_floating_point() and torch.finfo(held).eps > torch.finfo(x.dtype).eps:
                # computed in a lower precision than its input (HF's RMSNorm in float32 in a float64 model): the
                # module's own gradient would be too; the map's transpose is taken in the input's precision
                return norm(call)
            assert isinstance(call.op, nn.Module)
            norm_map(call.name, call.op, x.detach(), call.output)  # raises for a module no form reproduces
            bias = getattr(call.op, "bias", None)
            return self._norm_factor(call.name, call.output, call.op.forward, x, bias, call.op)

        def is_pass(name: str, module: nn.Module) -> bool:
            if module is self.model or isinstance(module, LINEAR_LAYERS + GRADIENT_LAYERS + AVG_POOLS):
                return False
            return isinstance(module, ACTIVATIONS + BATCH_NORMS) or module_kind(module) == "activation"

        def norm(call: Call) -> Any:
            x = call.args[0] if call.args else None
            if not (isinstance(x, Tensor) and isinstance(call.output, Tensor) and self.reach.depends(x)):
                return None
            assert isinstance(call.op, nn.Module)
            nm = norm_map(call.name, call.op, x.detach(), call.output)
            y = _NormFn.apply(x, (call.output,), nm)
            return self._norm_factor(call.name, y, call.op.forward, x, getattr(call.op, "bias", None), call.op)

        def passes(call: Call) -> Any:
            x = call.args[0] if call.args else None
            out = call.output
            if not (isinstance(x, Tensor) and isinstance(out, Tensor) and self.reach.depends(x)):
                return None
            if isinstance(call.op, nn.Module) and isinstance(rule_of(call.op), Gradient):
                return None
            if out.shape != x.shape:
                return None
            assert isinstance(call.op, nn.Module)
            key = type(call.op)
            again = again_module(call.op) if self._gate_like(key) else None
            return self._gate(IdentityRuleFn.apply(x, (out,), again), key)

        def owned(name: str, fn: Callable[[Call], Any]) -> EngineRule:
            return EngineRule(name, fn, owns_call=True)

        out_layer = output_layer(self.model)

        def is_output(name: str, module: nn.Module) -> bool:
            return module is out_layer

        def output_rows(call: Call) -> Any:
            h = call.args[0] if call.args else None
            if not (isinstance(h, Tensor) and isinstance(call.output, Tensor) and self.reach.depends(h)):
                return None
            assert out_layer is not None
            if not self._active:
                return rows_reached(h, out_layer, call.output)
            rule = self.layers.rule_for(out_layer)
            if isinstance(rule, LinearRule) and not isinstance(rule, Epsilon):
                return self.layers.module_rule(call.name, out_layer, call.args, call.output)
            if not (isinstance(rule, Epsilon) and rule.epsilon):
                return rows_reached(h, out_layer, call.output)
            return stabilized_rows(h, out_layer, call.output, rule.epsilon, self.entry(call.name, rule), self.layers.n)

        def linear(call: Call) -> Any:
            a = call.args
            x = a[0] if a else call.kwargs.get("input")
            if not self._active or not self.reach.depends(x):
                return NotImplemented
            bound = dict(zip(("input", "weight", "bias"), a, strict=False)) | call.kwargs
            return ops.functional_linear(x, bound["weight"], bound.get("bias"), call.name)

        def broadcast_sum(call: Call) -> Any:
            out = ops.broadcast_sum(call.op, call.args, call.name) if not call.kwargs else NotImplemented
            return self.layers.add(call.op, call.args, call.kwargs) if out is NotImplemented else out

        def conv1d(module: nn.Module) -> bool:
            return module_kind(module) == "conv1d"

        def unruled(func: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
            """What the engine reports: as the layer rules do, but not the operations inside a normalisation module
            (its rule covers the module) nor those whose plain gradient is their rule in this form."""
            if self.norms:
                return None
            name = self.layers.report(func, args, kwargs)
            return None if name in _EXACT_AS_GRADIENT else name

        # lxt's rules (every stabilizer 0): linear layers, sums and pooling are their plain gradients, and every
        # operation the table names is covered, so the engine's function mode passes other calls after one look-up
        table = (
            RuleTable(uncovered=unruled if active else None, passes=_passes)
            .modules(is_output, owned("linear (output rows)", output_rows))
            .modules(is_norm, EngineRule("identity-norm", open_norm, owns_call=True, enter=enter_norm, inside=_held))
            .modules(is_pass, EngineRule("identity", passes, needs_input=True, owns_call=True))
            .functions(MATMUL_FUNCTIONS, owned("product", self._product))
            .functions(MUL_FUNCTIONS, owned("product", self._product))
            .functions(EINSUM_FUNCTIONS, owned("product", self._einsum))
            .functions(BADDBMM_FUNCTIONS, owned("product", self._baddbmm))
            .functions(SOFTMAX_FUNCTIONS, owned("softmax", self._softmax))
            .functions({SDPA: "F.scaled_dot_product_attention"}, owned("attention", self._sdpa))
            .functions({MHA: "F.multi_head_attention_forward"}, owned("attention", self._mha))
            .functions(NORM_FUNCTIONS, owned("identity-norm", self._norm_function))
            .functions({F.normalize: "F.normalize"}, owned("identity-norm", self._normalize))
            .functions({F.group_norm: "F.group_norm"}, owned("identity-norm", self._group_norm))
            .functions(_STD_FUNCTIONS, owned("identity-norm", self._std))
            .functions(_ACTIVATION_FUNCTIONS, owned("identity", self._activation))
        )
        if not active:
            return table
        # what is left: linear layers, sums of branches, pooling, affine maps by a constant (`layers`)
        table.functions({F.linear: "F.linear"}, owned("linear", linear))
        table.functions(ADD_FUNCTIONS, owned("sum", broadcast_sum))
        return self.layers.add_entries(table, hooked=conv1d)

    # -- shares of products ---------------------------------------------------------------------------------------
    def _gate(self, t: Tensor, key: object) -> Tensor:
        if self.hold_gates:  # weakly: a gate goes with the product that reads it, its rule's saved tensor with it
            self.gates[id(t)] = (weakref.ref(t), key)
        return t

    def _gate_of(self, t: object) -> object | None:
        """The activation (module type or function) whose output `t` is, if `t` is a gate; else None."""
        entry = self.gates.get(id(t))
        return None if entry is None or entry[0]() is not t else entry[1]

    def _gate_like(self, key: object) -> bool:
        """Whether an activation (its module type or function) gave a gate earlier in this pass (CP-LRP): its
        output is then likely one again (the next layer's), and its ratio is left to a backward pass that then
        never comes. Only where the ratio is computed changes, not its value."""
        return self.hold_gates and key in self.gate_keys

    def _shares(self, a: object, b: object) -> tuple[float, float] | None:
        """The uniform rule's shares of a product's two factors (None: at most one depends on the input, a linear
        map: its plain gradient); CP-LRP holds a gate (the other factor gets all)."""
        if not (isinstance(a, Tensor) and a.requires_grad and isinstance(b, Tensor) and b.requires_grad):
            return None  # what `depends` says first, for both factors before the graph is read (rotary's cos, sin)
        if self.hold_gates:
            ga, gb = self._gate_of(a), self._gate_of(b)
            if (ga is None) != (gb is None):
                # a gate depends on the input (its rule ran only then): only the other factor is asked, so that the
                # graph memo does not keep the gate's node (and its saved input) alive to the end of the pass
                if not self.reach.depends(b if gb is None else a):
                    return None
                self.gate_keys.add(ga if gb is None else gb)
                return (0.0, 1.0) if gb is None else (1.0, 0.0)
        if not (self.reach.depends(a) and self.reach.depends(b)):
            return None
        return 0.5, 0.5

    def _product(self, call: Call) -> Any:
        args = call.args
        if len(args) != 2 or call.kwargs:
            return NotImplemented
        shares = self._shares(*args)
        a, b = args
        if self._active and self.ops is not None:
            mul = call.op in MUL_FUNCTIONS
            if shares is None:
                if not (self.reach.depends(a) or self.reach.depends(b)):
                    return call.op(*args)
                if mul:
                    # scaling by a constant (rotary's cos and sin) passes relevance unchanged, its own gradient;
                    # broadcast beyond the factor's shape, a linear map: LRP-epsilon (the product rule's factor)
                    out = call.op(*args)
                    x = a if self.reach.depends(a) else b
                    if out.shape == x.shape:
                        return out
            if call.op is Tensor.__rmatmul__:
                a, b = b, a
                shares = None if shares is None else (shares[1], shares[0])
            return self.ops.product(call.name, a, b, "mul" if mul else "matmul", shares=shares)
        if shares is None:
            return call.op(*args)  # a linear map (scaling by a constant, rotary's cos and sin): its own gradient
        if shares == (0.5, 0.5) and call.op in MUL_FUNCTIONS and a.shape == b.shape and a.dtype == b.dtype:
            return _HalfProduct.apply(a, b)
        return call.op(*(_share(t, w) for t, w in zip(args, shares, strict=True)))

    def _linear_product(self, a: object, b: object) -> bool:
        """Whether a matrix product of which at most one factor depends on the input takes LRP-epsilon (a linear map
        with a constant); False where neither depends."""
        return self.reach.depends(a) or self.reach.depends(b)

    def _einsum(self, call: Call) -> Any:
        args = call.args
        if not args or not isinstance(args[0], str) or call.kwargs:
            return NotImplemented
        operands = tuple(args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:])
        if len(operands) != 2:
            return NotImplemented
        shares = self._shares(*operands)
        if self._active and self.ops is not None:
            if shares is None and not self._linear_product(*operands):
                return NotImplemented
            return self.ops.product(call.name, *operands, "einsum:" + args[0], shares=shares)
        if shares is None:
            return torch.einsum(args[0], *operands)  # a linear map: its own gradient
        return torch.einsum(args[0], *(_share(t, w) for t, w in zip(operands, shares, strict=True)))

    def _baddbmm(self, call: Call) -> Any:
        names = ("input", "batch1", "batch2")
        bound = dict(zip(names, call.args, strict=False)) | {k: v for k, v in call.kwargs.items() if k in names}
        if len(bound) != 3 or len(call.args) > 3 or set(call.kwargs) - {*names, "beta", "alpha"}:
            return NotImplemented
        shares = self._shares(bound["batch1"], bound["batch2"])
        if self._active and self.ops is not None:
            # beta c + alpha (a @ b): the product rule on the product, the sum rule on the sum (c absorbs its share)
            ops = self.ops
            c, a, b = bound["input"], bound["batch1"], bound["batch2"]
            if shares is None and not self._linear_product(a, b):
                return NotImplemented
            beta, alpha = call.kwargs.get("beta", 1), call.kwargs.get("alpha", 1)
            z = ops.product(f"{call.name} @", a, b, "matmul", float(alpha), shares=shares)
            if beta == 0:
                return z
            c = c if beta == 1 else c * beta
            return ops.sum(f"{call.name} +", z, c, (True, self.reach.depends(c)))
        if shares is None:
            return call.op(*call.args, **call.kwargs)  # a linear map: its own gradient
        rest = {k: v for k, v in call.kwargs.items() if k in ("beta", "alpha")}
        a, b = (_share(bound[n], w) for n, w in zip(("batch1", "batch2"), shares, strict=True))
        return torch.baddbmm(bound["input"], a, b, **rest)

    # -- softmax and attention ------------------------------------------------------------------------------------
    def _softmax(self, call: Call) -> Any:
        """AttnLRP: the softmax rule is the softmax's gradient in this form (plain); CP-LRP holds the probabilities."""
        self.check.calls += 1
        if not self.cp:
            # the rule is the softmax's own gradient; audited where the other rules are (stabilized)
            if not self._active or self.ops is None:
                return call.op(*call.args, **call.kwargs)
            s = call.args[0] if call.args else call.kwargs.get("input")
            dim = call.kwargs.get("dim", call.args[1] if len(call.args) > 1 else None)
            if not isinstance(s, Tensor) or not self.reach.depends(s) or not isinstance(dim, int):
                return call.op(*call.args, **call.kwargs)
            op, args, kwargs = call.op, call.args, call.kwargs
            rest = {k: v for k, v in kwargs.items() if k not in ("input", "dim")}
            return self.ops.softmax(call.name, s, dim, lambda t: op(t, dim, *args[2:], **rest))
        args = list(call.args)
        kwargs = dict(call.kwargs)
        if args and isinstance(args[0], Tensor):
            args[0] = args[0].detach()
        elif isinstance(kwargs.get("input"), Tensor):
            kwargs["input"] = kwargs["input"].detach()
        return call.op(*args, **kwargs)

    def _qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v with their shares of ``softmax(q kᵀ) v`` (each product by the uniform rule; CP-LRP: q, k held)."""
        if self.cp:
            return q.detach(), k.detach(), v
        dq, dk, dv = (self.reach.depends(t) for t in (q, k, v))
        wp, wv = (0.5, 0.5) if (dq or dk) and dv else (1.0, 1.0)
        wq, wk = (0.5, 0.5) if dq and dk else (1.0, 1.0)
        return _share(q, wp * wq), _share(k, wp * wk), _share(v, wv)

    def _attend(self, a: dict[str, Any]) -> Tensor:
        """The fused call (`bind_sdpa`'s arguments, q, k, v with their shares from `_qkv`); CP-LRP's held q and k as
        `held_attention` where it applies (its backward pass forms only v's gradient)."""
        out = held_attention(a) if self.cp else None
        return SDPA(**a) if out is None else out

    def _sdpa(self, call: Call) -> Any:
        a = bind_sdpa(call.args, call.kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        # v first: CP-LRP holds q and k, whose nodes the graph memo would otherwise keep alive to the end of the pass
        if not any(self.reach.depends(t) for t in (v, q, k)):
            return NotImplemented
        self.check.calls += 1
        if self._active and self.ops is not None and not self.cp:
            # AttnLRP's stabilizers need the scores and the output: the call decomposed (`attention.attend`)
            out, _ = attend(self.ops, call.name, q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"], a["scale"],
                            a["enable_gqa"])  # fmt: skip
            return out
        a["query"], a["key"], a["value"] = self._qkv(q, k, v)
        return self._held_output(call.name, self._attend(a))

    def _held_output(self, what: str, o: Tensor) -> Tensor:
        """CP-LRP's attention output with the product rule's factor (the probabilities held: only v's product)."""
        if not self._active or self.ops is None:
            return o
        ops = self.ops
        return ops.stabilize(f"{what} p@v", ops.product_rule, ops.product_eps, o, None, None)

    def _in_projection(self, t: Tensor, w: Tensor, b: Tensor | None, which: str) -> Tensor:
        """An input projection of ``F.multi_head_attention_forward``: CP-LRP holds q and k, so their projections
        build no graph."""
        if self.cp and which not in ("v", "out"):
            with torch.no_grad():
                return F.linear(t, w, b)
        if self._active and self.ops is not None:
            return self.ops.functional_linear(t, w, b, f"multi_head_attention {which}_proj")
        return F.linear(t, w, b)

    def _mha(self, call: Call) -> Any:
        """``F.multi_head_attention_forward`` written out (projections, then sdpa with the shares), as PyTorch
        computes it: masks, key padding, add_bias_kv, add_zero_attn."""
        a = bind_mha(call.args, call.kwargs)
        if not any(self.reach.depends(a[t]) for t in ("value", "query", "key")):  # v first, as in `_sdpa`
            return NotImplemented
        self.check.calls += 1
        if self._active and self.ops is not None and not self.cp:
            return mha(self.ops, call.args, call.kwargs)  # decomposed, as `_sdpa`
        heads = mha_heads(a, self._in_projection)
        q, k, v, mask, causal, unbatched = heads.q, heads.k, heads.v, heads.mask, heads.causal, heads.unbatched
        (n_q, n, e), n_k, h = heads.shape, k.shape[-2], a["num_heads"]
        d = e // h
        dropout = a["dropout_p"] if a["training"] else 0.0
        qs, ks, vs = self._qkv(q, k, v)
        o = self._held_output(call.name, self._attend(bind_sdpa((qs, ks, vs, mask, dropout, causal), {})))
        o = o.permute(2, 0, 1, 3).reshape(n_q, n, e)
        out = self._in_projection(o, a["out_proj_weight"], a["out_proj_bias"], "out")
        weights = None
        if a["need_weights"]:
            with torch.no_grad():
                s = (q @ k.transpose(-2, -1)) * d**-0.5
                if mask is not None:
                    s = s + mask
                elif causal:
                    s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
                p = s.softmax(-1)
            weights = p.mean(1) if a["average_attn_weights"] else p
            weights = weights.squeeze(0) if unbatched else weights
        return (out.squeeze(1) if unbatched else out), weights

    # -- normalisations and activations as functions ------------------------------------------------------------
    def _std(self, call: Call) -> Any:
        """Inside a normalisation module: the std (or 1/std, or the variance) held constant. Elsewhere: run as
        called (its plain gradient)."""
        if not self.norms:
            return NotImplemented
        out = call.op(*call.args, **call.kwargs)
        if self.norms[-1][1] is None:
            self.norms[-1][1] = out.dtype if out.is_floating_point() else torch.float64
        return out.detach()

    def _normalize(self, call: Call) -> Any:
        """``F.normalize`` (x over its p-norm along `dim`: cosine attention, XCiT's cross-covariance attention) by the
        identity rule, the norm held constant: ``x / c`` with c = max(||x||_p, eps) as ``F.normalize`` computes it,
        the map linear in x, with the rule's stabilizer at its output (`_norm_factor`)."""
        names = ("input", "p", "dim", "eps", "out")
        a = dict(zip(names, call.args, strict=False)) | call.kwargs
        x = a.get("input")
        if a.get("out") is not None or not (isinstance(x, Tensor) and self.reach.depends(x)) or set(a) - set(names):
            return NotImplemented
        p, dim, eps = a.get("p", 2.0), a.get("dim", 1), a.get("eps", 1e-12)
        with torch.no_grad():  # F.normalize's own steps: the same values
            c = x.norm(p, dim, keepdim=True).clamp_min(eps).expand_as(x)
        y = x / c
        op = call.op
        return self._norm_factor(call.name, y, lambda t: op(t, p, dim, eps), x)

    def _group_norm(self, call: Call) -> Any:
        """``F.group_norm`` (``nn.GroupNorm``, timm's ``GroupNormAct``: BiT, PoolFormer) by the identity rule, each
        group's std held constant (`GroupNormFn`), with the rule's stabilizer at its output (`_norm_factor`)."""
        names = ("input", "num_groups", "weight", "bias", "eps")
        a = dict(zip(names, call.args, strict=False)) | call.kwargs
        x = a.get("input")
        if not (isinstance(x, Tensor) and self.reach.depends(x) and x.dim() >= 2) or set(a) - set(names):
            return NotImplemented
        w, b = a.get("weight"), a.get("bias")
        groups, eps = int(a["num_groups"]), float(a.get("eps", 1e-5))
        rstd = None
        with torch.no_grad():  # the rule's Function gives the output its backward
            if x.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(x.device.type):
                # F.group_norm's own kernel, the same output, with the 1/std it took: nothing is taken again
                n, c = x.shape[:2]
                out, _, rstd = torch.native_group_norm(x, w, b, n, c, x[0, 0].numel(), groups, eps)
            else:
                out = call.op(*call.args, **call.kwargs)
        y = GroupNormFn.apply(x, (out,), groups, w, eps, rstd)
        op, rest = call.op, {k: v for k, v in a.items() if k != "input"}
        offset = None if b is None else b.view(1, -1, *(1,) * (x.dim() - 2))
        return self._norm_factor(call.name, y, lambda t: op(t, **rest), x, offset)

    def _norm_function(self, call: Call) -> Any:
        """``F.layer_norm`` / ``F.rms_norm`` (``nn.LayerNorm`` / ``nn.RMSNorm`` call them) with 1/std held constant.
        A float32 / float64 layer norm runs as ``torch.native_layer_norm``, whose 1/std the rule keeps: nothing is
        taken again and no graph of the call's own is built."""
        x = call.args[0] if call.args else call.kwargs.get("input")
        if not self.reach.depends(x):
            return NotImplemented
        if self.norms:
            self.norms[-1][1] = "function"  # the module calling it adds nothing
        layer = call.op is F.layer_norm
        names = ("input", "normalized_shape", "weight", "bias", "eps") if layer else ("input", "normalized_shape",
                                                                                      "weight", "eps")  # fmt: skip
        a = dict(zip(names, call.args, strict=False)) | call.kwargs
        shape = a["normalized_shape"]
        dims = 1 if isinstance(shape, int) else len(shape)
        eps = a.get("eps")
        eps = (1e-5 if layer else float(torch.finfo(x.dtype).eps)) if eps is None else float(eps)
        nm = NormMap(layer, dims, a.get("weight"), a.get("bias"), eps)
        if layer and x.dtype in (torch.float32, torch.float64) and set(a) <= set(names):
            with torch.no_grad():
                w, b = a.get("weight"), a.get("bias")
                out, _, rstd = torch.native_layer_norm(x, [shape] if isinstance(shape, int) else list(shape), w, b, eps)
            y = _NormFn.apply(x, (out,), nm, rstd)
        else:
            y = _NormFn.apply(x, (call.op(*call.args, **call.kwargs),), nm)
        op, rest = call.op, {k: v for k, v in a.items() if k != "input"}
        module = self.norms[-1][0] if self.norms else None
        return self._norm_factor(call.name, y, lambda t: op(t, **rest), x, a.get("bias") if layer else None, module)

    def _norm_factor(
        self,
        what: str,
        y: Tensor,
        fn: Callable[[Tensor], Tensor],
        x: Tensor,
        bias: Tensor | None = None,
        module: nn.Module | None = None,
    ) -> Tensor:
        """A normalisation's output `y` = ``fn(x)`` with the identity rule's stabilizer as a factor (`NormIdentity`
        with epsilon 0: `y`); `bias`: the audit's offset (the part of `y` that is not a function of `x`)."""
        ops = self.ops
        if not self._active or ops is None:
            return y
        rule = ops.norm_rule if module is None else (self.composite.by_type(module, first=False) or ops.norm_rule)
        eps = float(getattr(rule, "epsilon", 0.0))
        offset = bias.detach() if isinstance(bias, Tensor) else None
        return ops.stabilize(what, rule, eps, y, offset, _again(fn, what, x))

    def _activation(self, call: Call) -> Any:
        x = call.args[0] if call.args else call.kwargs.get("input")
        if bool(call.kwargs.get("inplace", False)):
            return NotImplemented  # the plain gradient of an in-place call, reported uncovered
        if not self.reach.depends(x):
            return NotImplemented
        with torch.no_grad():  # the rule's Function gives the output its backward: no graph of the activation's own
            out = call.op(*call.args, **call.kwargs)
        op, args, kwargs = call.op, call.args, call.kwargs

        def again(t: Tensor) -> Tensor:
            return op(t, *args[1:], **kwargs) if args else op(**{**kwargs, "input": t})

        return self._gate(IdentityRuleFn.apply(x, (out,), again if self._gate_like(op) else None), op)

    # -- the pass -------------------------------------------------------------------------------------------------
    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        engine = RuleEngine(self.model, self.hooks, self.table(), method="LRP")
        try:
            with engine.forward_pass():
                if self.transformer:
                    self.check.place(self.model, self.hooks, engine, whole_module_rule, self.reach.depends)
                yield
        finally:
            self.check.clear()
            self.gates.clear()
            self.gate_keys.clear()
            self.norms.clear()
            self.reach.clear()
            if self._layers is not None:
                self._layers.clear()
            self.coverage = engine.coverage
