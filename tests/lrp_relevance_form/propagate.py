"""The relevance form of LRP, kept as the test reference of the gradient form that hookviz runs
(`hookviz.methods.lrp.gradient_form`): one LRP forward pass, the composite as a rule table on the engine
(`hookviz.methods.rules`), canonization found at run time.

How (one forward, one backward): the engine hands each layer call (and each functional call the table names) to a
rule that replaces the output by the output of a small `torch.autograd.Function` that keeps the input (and, for
rules that read it, the output) and whose backward *is* the LRP rule: the relevance at the output comes in as the
incoming gradient, the relevance at the input goes out. Nothing re-runs a layer to compute its own output again;
rules with modified weights (z+, gamma, alpha-beta) compute their modified terms from the stored input in the
backward pass. The table is built per call (`LRPRun.table`), so its rules share the pass's state:

- per-layer rules: the composite's name map, then the first-layer map (the first convolution or linear layer to
  run), then the type map, resolved at each call (the layer rule sees every call: ``owns_call``);
- BatchNorm folded into the preceding layer for the call only: when a BatchNorm (eval mode) receives exactly the
  output of a convolution or linear layer, the rule is applied to the folded layer ``W' = W s``,
  ``b' = (b - mean) s + beta`` (zennit's ``MergeBatchNorm``); the model's parameters are never written. A subclass
  with a forward of its own (timm's BatchNormAct2d, its activation inside) is not folded: it passes relevance;
- additions of two branches (``a + b``, ``torch.add``, ``a += b``, ``a.add_(b)``) in a ``forward``: split with the
  composite's sum rule (`Norm`), as zennit's ``Sum`` module after canonizing;
- functional activations (``F.relu``, ``torch.sigmoid``, ...) pass relevance through like activation modules,
  functional average pooling gets `Norm`, scaling by a constant passes relevance unchanged;
- transformer composites add the entries of `transformer` (products, softmax, normalisations, fused attention).

Functional operations that no rule covers (``F.conv2d`` called directly, ``torch.matmul``, ...) are the table's
``uncovered`` calls: the engine's one warning names them after the forward pass (``LRP.rule_coverage`` lists them);
their relevance is their plain gradient.
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

from hookviz.hooks import HookManager
from hookviz.methods.lrp.audit import AuditBook, AuditEntry
from hookviz.methods.lrp.composites import BATCH_NORMS, Composite
from hookviz.methods.lrp.gradient_form import GradientFormRun
from hookviz.methods.lrp.layers import (
    ADD_FUNCTIONS,
    AFFINE_FUNCTIONS,
    NONNEGATIVE_FUNCTIONS,
    POOL_FUNCTIONS,
    LayerRules,
    _name,
    affine_input,
    branches,
    check_pass_shape,
    uncovered,
)
from hookviz.methods.lrp.layers import INPLACE as _INPLACE
from hookviz.methods.lrp.norm import norm_map
from hookviz.methods.lrp.output_rows import output_layer
from hookviz.methods.lrp.rules import Affine, LinearRule, Norm, Pass, Rule, stabilized_ratio
from hookviz.methods.lrp.transformer import NormIdentity, whole_module_rule
from hookviz.methods.rules import Call, Coverage, RuleEngine, RuleTable
from hookviz.methods.rules.reach import InputReach

from .rulecall import Kept, Recompute, _PassFn, value
from .transformer_ops import TransformerOps


class _Call:
    """One rule application in the forward pass, kept for its backward (and the audit)."""

    __slots__ = ("entry", "rule", "layer", "x", "z", "fn", "version", "others", "graph_x", "zversion")

    def __init__(self, entry: AuditEntry, rule: Rule, x: Kept, z: Tensor | None) -> None:
        self.entry = entry
        self.rule = rule
        self.layer: Affine | None = None
        self.x = x
        self.z = z
        self.fn: Callable[[Tensor], Tensor] | None = None
        self.version = x._version if isinstance(x, Tensor) else 0  # a Recompute checks its own source
        self.others: tuple[Kept, ...] = ()
        self.graph_x: Tensor | None = None  # the input as the graph has it (for folding a BatchNorm in later)
        self.zversion = 0

    def hand_on(self, z: Tensor) -> Tensor:
        """`z`, the op's output, handed on as the Function's output without a copy; the rule keeps an alias (if it
        reads the output) and its version, so an in-place change downstream is noticed (`output`)."""
        if self.z is not None:
            self.z = z.detach()
            self.zversion = z._version
        return z

    def output(self) -> Tensor:
        """The op's output as the forward pass computed it: recomputed from the input if the model changed it in
        place after this op (``out += identity``, an in-place ReLU)."""
        assert self.z is not None
        if self.z._version == self.zversion:
            return self.z
        x = self.input()
        if self.layer is not None:
            return self.layer.forward(x, self.layer.weight, self.layer.bias)
        if self.fn is not None:
            return self.fn(x)
        return x + value(self.others[0])  # a sum of two branches

    def input(self) -> Tensor:
        if isinstance(self.x, Recompute):
            return self.x()
        if self.x._version != self.version:
            raise RuntimeError(
                f"LRP: the input of {self.entry.name!r} was modified in place after the layer read it, so its rule "
                "cannot be evaluated; make the in-place operation that follows it out of place"
            )
        return self.x


def _audit(call: _Call, r: Tensor, r_in: Tensor) -> None:
    call.entry.add(r.detach().flatten(1).sum(1), r_in.detach().flatten(1).sum(1))


class _RuleFn(torch.autograd.Function):
    """Output: the op's output `z` computed in the forward (`x` only links the graph; `z` comes boxed, ``(z,)``, so
    that it is not an input, which autograd would only hand on as a view); subclasses: the rule."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, zbox: tuple[Tensor], call: _Call) -> Tensor:
        ctx.call = call
        return call.hand_on(zbox[0])


class _LinearFn(_RuleFn):
    """Output: the layer's output; backward: the layer's LRP rule."""

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None, None]:
        call = ctx.call
        rule = call.rule
        assert isinstance(rule, LinearRule) and call.layer is not None
        r_in = rule.relevance(call.layer, call.input(), call.output() if rule.needs_output else None, r)
        _audit(call, r, r_in)
        return r_in, None, None


class _NormFn(_RuleFn):
    """Output: a parameter-free linear op's output (pooling); backward: `Norm`, the op's transpose from its input."""

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None, None]:
        call = ctx.call
        x, z = call.input(), call.output()
        assert call.fn is not None and isinstance(call.rule, Norm)
        s = stabilized_ratio(r, z, call.rule.stabilizer)
        with torch.enable_grad():
            xr = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(call.fn(xr), xr, s)
        r_in = x * g
        _audit(call, r, r_in)
        return r_in, None, None


class _SumFn(torch.autograd.Function):
    """Output: ``a + b``; backward: `Norm` over the two branches, ``R_a = a R / stab(a + b)`` (zennit's ``Sum``)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, call: _Call) -> Tensor:
        ctx.call = call
        assert call.z is not None
        return call.hand_on(call.z)  # computed for this call alone: handed on without a copy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, Tensor, None]:
        call = ctx.call
        a, b = call.input(), value(call.others[0])
        assert isinstance(call.rule, Norm)
        s = stabilized_ratio(r, call.output(), call.rule.stabilizer)
        ra, rb = a * s, b * s
        _audit(call, r, ra + rb)
        return ra, rb, None


class LRPRun:
    """One LRP forward pass: the composite as a `RuleTable` on the rule engine (`table`), the per-pass state its
    rules share (first layer, folded BatchNorm, the transformer rules' gates) and the calls for the audit.

    Which rule a layer call gets, what is known to be >= 0, which layer a BatchNorm folds into, the audit's entries
    and the table's layer entries are the gradient form's (`hookviz.methods.lrp.layers.LayerRules`,
    `GradientFormRun.entry`: their methods read the same attributes); the rules are this form's."""

    rule_for = LayerRules.rule_for
    applied = LayerRules.applied
    module_rule = LayerRules.module_rule
    folds_into = LayerRules.folds_into
    entry = GradientFormRun.entry
    mark_nonnegative = LayerRules.mark_nonnegative
    nonnegative = LayerRules.nonnegative
    mark_gate = LayerRules.mark_gate  # marked as the layer rules do; this form's products do not hold them
    concatenation = LayerRules.concatenation

    def __init__(self, model: nn.Module, composite: Composite, hooks: HookManager, canonize: bool) -> None:
        self.model = model
        self.composite = composite
        self.out_layer = output_layer(model)  # its rule's product skips g's zero rows and columns
        self.hooks = hooks
        self.canonize = canonize
        # a BatchNorm is folded into the layer before it (`fold`), which needs that layer's input as the graph has it:
        # kept (`produced`) only in models with a BatchNorm, not to hold every linear layer's input for nothing
        self.folds = canonize and any(isinstance(m, BATCH_NORMS) for m in model.modules())
        self.named = composite.resolve_names(model)
        self.first_done = False
        self.entries: list[AuditEntry] = []
        self.book = AuditBook(self.entries)
        self.counts: Counter[str] = Counter()
        self.produced: dict[int, tuple[Tensor, _Call]] = {}  # output id -> (output, its linear call)
        # output id -> (weak reference to the output, its version then): outputs known to be >= 0 (`nonnegative`)
        self.signs: dict[int, tuple[weakref.ref[Tensor], int]] = {}
        self.gates: dict[int, tuple[weakref.ref[Tensor], int]] = {}
        # output id -> (weak reference to the output, its Recompute, its version then): activation and normalisation
        # outputs, which the transformer composites' rules compute again in the backward pass instead of keeping them
        # (`keep`); weak, so that an output no rule reads is freed during the forward pass as it would be without LRP
        self.recipes: dict[int, tuple[weakref.ref[Tensor], Recompute, int]] = {}
        self.coverage: Coverage | None = None
        self.engine: RuleEngine | None = None
        rules = composite.transformer
        self.reach = InputReach()
        self.ops = (
            None
            if rules is None
            else TransformerOps(
                rules, self.entry, self.functional_linear, composite.sum_rule, self.reach, self.keep, self.recompute
            )
        )

    def set_leaf(self, leaf: Tensor) -> None:
        """Nothing: the relevance form takes relevance at the input as its gradient (`LRP._forward` hands either
        form's run the input leaf; the gradient form's rules need it)."""

    # -- the table ------------------------------------------------------------------------------------------------
    def table(self) -> RuleTable:
        """The composite as engine entries: layers by name, type and kind (one rule object resolving the LRP rule
        per call: name map, first layer, type map); branch additions, functional activations, pooling and scaling
        by a constant; for transformer composites the products, softmax, normalisations and fused attention calls.
        Every other call on a tensor that needs a gradient (except reshaping and routing) is reported uncovered."""
        table = RuleTable(uncovered=uncovered)
        if self.ops is not None:  # before the layer rules' function entries: the first entry naming a callable wins
            self.ops.add_entries(table, self.add, self.affine)
        return LayerRules.add_entries(self, table, self.hooked_kind)  # type: ignore[arg-type]

    def hooked_kind(self, module: nn.Module) -> bool:
        """Transformer composites also hook normalisations, transformers' Conv1D and activation modules (the
        operations inside them are then not seen one by one)."""
        return self.ops is not None and whole_module_rule(module)

    def keep(self, t: Tensor) -> Kept:
        """What a rule keeps of the tensor `t` it read for its backward pass: for an activation's or a
        normalisation's output (transformer composites, `recompute`) the way to compute it again from its input, so
        that the output itself is freed after the forward pass (its input is kept by the rule before it anyway);
        else `t`, detached (no copy). An output changed in place since is kept as it is now."""
        found = self.recipes.get(id(t))
        if found is not None and found[0]() is t and t._version == found[2]:
            return found[1]
        return t.detach()

    def recompute(self, out: Tensor, again: Recompute | Callable[[Tensor], Tensor], x: Tensor, what: str) -> Tensor:
        """Register `out` = ``fn(x)`` (an elementwise activation or a normalisation, as the forward pass called it;
        `again`: fn or its `Recompute`) for `keep`; transformer composites only (the other composites keep what
        they read, as zennit does)."""
        if self.ops is not None:
            if not isinstance(again, Recompute):
                again = Recompute(again, self.keep(x), what, cache=False)
            self.recipes[id(out)] = (weakref.ref(out), again, out._version)
        return out

    def layer_rule(self, name: str, module: nn.Module, rule: Rule, x: Tensor, output: Tensor) -> Tensor:
        """The output of the layer call `name` with `rule` applied (`x`: its input), the rule an autograd Function."""
        if isinstance(rule, LinearRule):
            call = _Call(self.entry(name, rule), rule, self.keep(x), output.detach() if rule.needs_output else None)
            call.layer = Affine.of(module)
            call.layer.rows = module is self.out_layer
            call.layer.nonnegative = self.nonnegative(x)
            out = _LinearFn.apply(x, (output.detach(),), call)
            if self.folds:
                call.graph_x = x
                self.produced[id(out)] = (out, call)
            return out
        if isinstance(rule, Norm):
            call = _Call(self.entry(name, rule), rule, self.keep(x), output.detach())
            call.fn = module.forward  # no hooks in the backward pass
            return _NormFn.apply(x, (output.detach(),), call)
        if isinstance(rule, Pass):
            check_pass_shape(name, x, output)
            out = _PassFn.apply(x, (output.detach(),))
            if self.ops is None:
                return out
            # computed again by its own forward (no hooks) where read; not an in-place module, nor a random one
            if not getattr(module, "inplace", False) and not (isinstance(module, nn.RReLU) and module.training):
                self.recompute(out, module.forward, x, name)
            return self.ops.tag(out)  # an activation's output: a gate for CP-LRP
        if isinstance(rule, NormIdentity) and self.ops is not None:
            nm = norm_map(name, module, x.detach(), output)
            return self.ops.norm(name, x, output, nm, module.forward)
        raise TypeError(f"LRP: rule {rule!r} cannot be applied to {type(module).__name__} {name!r}")

    def fold(self, name: str, bn: nn.Module, x: Tensor, output: Tensor) -> Tensor | None:
        """The output of `bn` as the output of the preceding linear layer with `bn` folded in, if `x` is exactly
        that layer's output (and `bn` normalizes with running statistics); else None."""
        prev = self.folds_into(bn, x)
        if prev is None:
            return None
        call = _Call(prev.entry, prev.rule, prev.x, output.detach() if prev.rule.needs_output else None)
        call.version = prev.version
        assert prev.layer is not None
        call.layer = prev.layer.folded(bn)
        prev.entry.name += f" + {name}"
        assert prev.graph_x is not None
        call.graph_x = prev.graph_x
        out = _LinearFn.apply(prev.graph_x, (output.detach(),), call)
        self.produced[id(out)] = (out, call)
        return out

    # -- functional operations ------------------------------------------------------------------------------------
    def functional_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, name: str) -> Tensor:
        """``F.linear(x, weight, bias)`` with the composite's rule for ``nn.Linear`` (transformer composites:
        ``F.linear`` calls and the projections of ``nn.MultiheadAttention``)."""
        rule = self.composite.linear_rule()
        with torch.no_grad():
            z = F.linear(x, weight, bias)
        if not isinstance(rule, LinearRule):
            raise TypeError(f"LRP: composite {self.composite.name!r} has no linear-layer rule for {name!r}")
        call = _Call(self.entry(name, rule), rule, self.keep(x), z if rule.needs_output else None)
        call.layer = Affine("linear", weight.detach(), None if bias is None else bias.detach())
        call.layer.nonnegative = self.nonnegative(x)
        return _LinearFn.apply(x, (z,), call)

    def add(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A sum of two branches of the same shape (both depend on the input, read from the graph: `InputReach`)
        with the composite's sum rule (`Norm`); other additions as called (a bias, a constant: relevance passes to
        the input unchanged, as zennit's plain gradient does; transformer composites give constants the sum rule
        before this, as ``lxt`` does)."""
        pair = branches(func, args, kwargs, self.reach)
        if pair is None:
            return func(*args, **kwargs)
        a, b = pair
        name, rule = ADD_FUNCTIONS[func], self.composite.sum_rule
        inplace = func is Tensor.add_
        call = _Call(self.entry(name, rule), rule, a.detach().clone() if inplace else self.keep(a), None)
        call.others = (self.keep(b),)
        call.z = (a.detach() + b.detach()).detach()
        out = _SumFn.apply(a, b, call)
        if inplace:
            return a.copy_(out)
        return out

    def activation(self, engine_call: Call) -> Any:
        """A functional activation: relevance passes through (an output, a gate for CP-LRP)."""
        func, args, kwargs = engine_call.op, engine_call.args, engine_call.kwargs
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Tensor) or not x.requires_grad:
            out = func(*args, **kwargs)
        elif not (func in _INPLACE or bool(kwargs.get("inplace", False))):
            out = _PassFn.apply(x, (func(*args, **kwargs).detach(),))
            if args and args[0] is x:
                rest = args[1:]
                self.recompute(out, lambda t: func(t, *rest, **kwargs), x, _name(func))
        else:
            base = _INPLACE.get(func, func)
            rest = {k: v for k, v in kwargs.items() if k != "inplace"}
            out = x.copy_(_PassFn.apply(x, (base(*args, **rest).detach(),)))
        if func in NONNEGATIVE_FUNCTIONS:
            self.mark_nonnegative(out)
        return out if self.ops is None else self.ops.tag(out)

    def pool(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Tensor) or not x.requires_grad:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        rule = self.composite.sum_rule
        call = _Call(self.entry(POOL_FUNCTIONS[func], rule), rule, x.detach(), out.detach())
        rest = args[1:]
        call.fn = lambda t: func(t, *rest, **kwargs)
        out = _NormFn.apply(x, (out.detach(),), call)
        if self.nonnegative(x):
            self.mark_nonnegative(out)
        return out

    def affine(self, engine_call: Call) -> Any:
        """An elementwise affine map by a constant (``x - m``, ``x / s``, ``x * c``; a parameter is a constant,
        trainable or not): relevance passes unchanged; with two inputs that depend on the explained input (a
        product: gating) no rule covers it (`NotImplemented`, the engine reports it), the output as computed."""
        func, args, kwargs = engine_call.op, engine_call.args, engine_call.kwargs
        out = func(*args, **kwargs)
        x = affine_input(args, kwargs, out, self.reach)
        if x is not None:
            again = lambda t: func(*[t if a is x else a for a in args], **kwargs)  # noqa: E731
            what = AFFINE_FUNCTIONS.get(func, _name(func))
            return self.recompute(_PassFn.apply(x, (out.detach(),)), again, x, what)
        engine_call.output = out
        return NotImplemented

    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        """The rule engine around the forward pass only (its hooks and function mode undone in ``finally``, its
        one warning about uncovered operations afterwards); `coverage` set also when the pass raises."""
        engine = RuleEngine(self.model, self.hooks, self.table(), method="LRP")
        try:
            with engine.forward_pass():
                if self.ops is not None:
                    self.ops.check.place(self.model, self.hooks, engine, self.hooked_kind, self.reach.depends)
                yield
        finally:
            for _, call in self.produced.values():
                call.graph_x = None  # a graph tensor held by a graph node would be a reference cycle
            self.produced.clear()
            self.recipes.clear()
            self.signs.clear()
            if self.ops is not None:
                self.ops.clear()
            self.reach.clear()
            self.coverage = engine.coverage
