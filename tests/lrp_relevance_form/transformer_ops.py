"""The relevance form's `TransformerOps`: the AttnLRP / CP-LRP rules during one LRP forward pass, as entries of
LRP's rule table: which functional calls they cover, what depends on the explained input, the gates CP-LRP holds,
and the check that every attention module ran an attention the rules saw."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hookviz.methods.lrp.attention import MHA, NOT_HANDLED, SDPA, attend, mha
from hookviz.methods.lrp.attention_check import AttentionCheck
from hookviz.methods.lrp.audit import AuditEntry
from hookviz.methods.lrp.gradient_form import (
    BADDBMM_FUNCTIONS,
    EINSUM_FUNCTIONS,
    MUL_FUNCTIONS,
    NORM_FUNCTIONS,
    SOFTMAX_FUNCTIONS,
)
from hookviz.methods.lrp.layers import ADD_FUNCTIONS
from hookviz.methods.lrp.norm import NormMap
from hookviz.methods.lrp.products import _product, attention_probabilities
from hookviz.methods.lrp.rules import Rule
from hookviz.methods.lrp.transformer import TransformerRules
from hookviz.methods.rules import MATMUL_FUNCTIONS, Call, RuleTable, spellings
from hookviz.methods.rules import Rule as EngineRule
from hookviz.methods.rules.ops import bind_sdpa
from hookviz.methods.rules.reach import InputReach

from .norm import _NormIdentityFn
from .products import _AttentionFn, _BroadcastSumFn, _ProductFn, _SoftmaxFn
from .rulecall import Kept, Recompute, RuleCall, _PassFn

# in-place scaling by a constant (timm's LayerScale with inplace=True: x.mul_(gamma)): relevance unchanged
SCALE_INPLACE: dict[Callable[..., Any], str] = {Tensor.mul_: "*=", Tensor.div_: "/="}
NEGATIONS: dict[Callable[..., Any], str] = {torch.neg: "torch.neg", Tensor.neg: "-", Tensor.__neg__: "-"}
# embeddings are where the propagation starts (their output is the relevance's input); dtype queries route nothing
_SOURCES = {"embedding", "is_floating_point", "is_complex"}
# the attention probabilities stay what they are through these (tags for CP-LRP follow them)
_KEEPS_TAG = {"to", "type_as", "dropout", "contiguous", "float", "half", "double", "type", "clone", "detach"}

LinearCall = Callable[[Tensor, Tensor, "Tensor | None", str], Tensor]
EntryCall = Callable[[str, Rule], AuditEntry]


class TransformerOps:
    """The transformer rules during one LRP forward pass: products, softmax, normalisations and fused attention
    calls as entries of LRP's rule table (`add_entries`), the gates CP-LRP holds (``tags``), and the check that
    every attention module ran an attention the engine saw (`check`, an `AttentionCheck`)."""

    def __init__(
        self,
        rules: TransformerRules,
        entry: EntryCall,
        linear: LinearCall,
        sum_rule: Rule,
        reach: InputReach,
        keep: Callable[[Tensor], Kept],
        recompute: Callable[[Tensor, Any, Tensor, str], Tensor],
    ) -> None:
        self.rules = rules
        self.keep = keep  # what a rule keeps of a tensor it read (`LRPRun.keep`)
        self.recompute = recompute  # registers an output computed again in the backward pass (`LRPRun.recompute`)
        self.reach = reach
        self.sum_rule = sum_rule
        self.entry = entry
        self.linear = linear
        # id -> weak reference: softmax and activation outputs (gates CP-LRP holds); weak, so that a gate no rule reads
        # is freed during the forward pass
        self.tags: dict[int, weakref.ref[Tensor]] = {}
        self.check = AttentionCheck()  # the attentions applied, and the attention modules running now

    def clear(self) -> None:
        self.tags.clear()
        self.check.clear()

    # -- what depends on the input ------------------------------------------------------------------------------
    def depends(self, t: object) -> bool:
        """Whether `t` depends on the explained input, not only on parameters and constants (`InputReach`): a
        product with a parameter is a linear map, not a product of two activations."""
        return self.reach.depends(t)

    def tag(self, t: Tensor) -> Tensor:
        self.tags[id(t)] = weakref.ref(t)
        return t

    def tagged(self, t: object) -> bool:
        ref = self.tags.get(id(t)) if isinstance(t, Tensor) else None
        return ref is not None and ref() is t

    def _where(self, what: str) -> str:
        return self.check.where(what)

    # -- the table's entries ------------------------------------------------------------------------------------
    def add_entries(
        self, table: RuleTable, add: Callable[[Any, tuple, dict], Any], affine: Callable[[Call], Any]
    ) -> None:
        """The transformer composites' entries, added to the LRP table before its other function entries (the first
        entry naming a callable wins): sums that broadcast (same-shaped sums: `add`), products of two activations
        (scaling by a constant: relevance unchanged; ``x * c`` as `affine`), softmax, fused attention, ``F.linear``,
        ``F.layer_norm`` / ``F.rms_norm``, in-place scaling, negation, embeddings and dtype queries (where relevance
        starts; they route nothing), and copies of CP-LRP's gates (which stay gates)."""

        def rule(name: str, handler: Callable[[Any, tuple, dict], Any], fallback: Callable[[Call], Any] | None = None):
            def apply(call: Call) -> Any:
                out = handler(call.op, call.args, call.kwargs)
                if out is not NOT_HANDLED:
                    return out
                return NotImplemented if fallback is None else fallback(call)

            return EngineRule(name, apply, owns_call=True)

        def affine_mul(call: Call) -> Any:
            return affine(call) if call.op in (Tensor.mul, torch.mul) else NotImplemented

        (
            table.functions(ADD_FUNCTIONS, rule("sum", self._sum, lambda c: add(c.op, c.args, c.kwargs)))
            .functions(MATMUL_FUNCTIONS, rule("product", self._matmul))
            .functions(MUL_FUNCTIONS, rule("product", self._mul, affine_mul))
            .functions(EINSUM_FUNCTIONS, rule("product", self._einsum))
            .functions(BADDBMM_FUNCTIONS, rule("product", self._baddbmm))
            .functions(SOFTMAX_FUNCTIONS, rule("softmax", self._softmax))
            .functions({SDPA: "F.scaled_dot_product_attention"}, rule("attention", lambda f, a, k: sdpa(self, a, k)))
            .functions({MHA: "F.multi_head_attention_forward"}, rule("attention", lambda f, a, k: mha(self, a, k)))
            .functions({F.linear: "F.linear"}, rule("linear", self._linear))
            .functions(NORM_FUNCTIONS, rule("identity-norm", self._norm))
            .functions(SCALE_INPLACE, rule("scale", self._scale_inplace))
            .functions(NEGATIONS, rule("negation", self._negation))
        )
        for name in sorted(_SOURCES):
            table.functions(spellings(name, inplace=False), rule("source", _as_called))
        for name in sorted(_KEEPS_TAG):
            table.functions(spellings(name, inplace=False), rule("gate-copy", self._keep_tag))

    def _linear(self, func: Any, args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("input")
        if not self.depends(x):
            return NOT_HANDLED
        w = args[1] if len(args) > 1 else kwargs["weight"]
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        return self.linear(x, w, b, self._where("F.linear"))

    def _negation(self, func: Any, args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("input")
        if not self.depends(x):
            return NOT_HANDLED
        out = _PassFn.apply(x, (func(*args, **kwargs).detach(),))
        return self.recompute(out, func, x, self._where(NEGATIONS[func])) if len(args) == 1 and not kwargs else out

    def _keep_tag(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if args and self.tagged(args[0]):
            return self.tag(func(*args, **kwargs))
        return NOT_HANDLED

    def _sum(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The sum rule (``R_a = a R / stab(a + b)``) also where one side is a constant (a position or token-type
        embedding, an attention mask: its share is absorbed, as a bias's is, and as ``lxt`` does) or broadcasts;
        sums of two same-shaped branches are the generic sum rule's (`propagate`). What is constant is read from the
        graph (`depends`), never from ``requires_grad``: a frozen embedding is the same constant as a trainable one."""
        if len(args) != 2 or kwargs or not hasattr(self.sum_rule, "stabilizer"):
            return NOT_HANDLED
        a, b = (args[1], args[0]) if func is Tensor.__radd__ else args
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
            return NOT_HANDLED
        da, db = self.depends(a), self.depends(b)
        if not (da or db) or (da and db and a.shape == b.shape):
            return NOT_HANDLED
        inplace = func is Tensor.add_
        if inplace and torch.broadcast_shapes(a.shape, b.shape) != a.shape:
            return NOT_HANDLED  # the in-place call raises its own error
        out = self.sum(self._where(ADD_FUNCTIONS[func]), a.detach().clone() if inplace else a, b, (da, db), a)
        return a.copy_(out) if inplace else out

    def sum(self, what: str, a: Tensor, b: Tensor, depend: tuple[bool, bool], link: Tensor | None = None) -> Tensor:
        """``a + b`` with the sum rule; `depend`: which sides depend on the input (the others absorb their share);
        `link`: the tensor the graph runs through for `a` (the original of an in-place call's copy)."""
        a0, b0 = a.detach(), b.detach()
        call = RuleCall(self.entry(what, self.sum_rule), self.sum_rule, (self.keep(a), self.keep(b)), a0 + b0, depend)
        return _BroadcastSumFn.apply(a if link is None else link, b, call)

    # -- products -----------------------------------------------------------------------------------------------
    def shares(self, da: bool, db: bool, ta: bool, tb: bool) -> tuple[float, float]:
        """The product rule's shares of two factors that depend on the input (`da`, `db`) or not, and are gates
        (`ta`, `tb`: attention probabilities, activation outputs) or not: half each; CP-LRP holds a gate (the other
        factor gets all); a constant factor gets none (the other then gets all: LRP-epsilon on a linear map)."""
        if da and db:
            if self.rules.product.hold_gates and ta != tb:
                return (0.0, 1.0) if ta else (1.0, 0.0)
            return 0.5, 0.5
        return float(da), float(db)

    def product(self, what: str, a: Tensor, b: Tensor, kind: str, scale: float = 1.0) -> Tensor:
        """``a @ b`` (`kind` "matmul") or ``a * b`` ("mul"), times `scale`, with the product rule (`shares`)."""
        rule = self.rules.product
        wa, wb = self.shares(self.depends(a), self.depends(b), self.tagged(a), self.tagged(b))
        a0, b0 = a.detach(), b.detach()
        with torch.no_grad():
            z = _product(kind, a0, b0, scale)
        call = RuleCall(self.entry(what, rule), rule, (self.keep(a), self.keep(b)), z, (kind, scale, wa, wb))
        return _ProductFn.apply(a, b, call)

    def _matmul(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if len(args) != 2 or kwargs:
            return NOT_HANDLED
        a, b = (args[1], args[0]) if func is Tensor.__rmatmul__ else args
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or not (self.depends(a) or self.depends(b)):
            return NOT_HANDLED
        return self.product(self._where(MATMUL_FUNCTIONS[func]), a, b, "matmul")

    def _einsum(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A two-operand einsum (``"bhqd,bhkd->bhqk"``: attention written with einsum) is bilinear: the product rule;
        one operand or more than two: not covered (reported)."""
        if not args or not isinstance(args[0], str) or kwargs:
            return NOT_HANDLED
        operands = tuple(args[1][0] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:])
        if len(operands) != 2 or not all(isinstance(t, Tensor) for t in operands):
            return NOT_HANDLED
        a, b = operands
        if not (self.depends(a) or self.depends(b)):
            return NOT_HANDLED
        return self.product(self._where("torch.einsum"), a, b, "einsum:" + args[0])

    def _baddbmm(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``beta * input + alpha * (batch1 @ batch2)`` (GPT-2-style attention scores with a mask or bias in one
        call): the product rule on the matrix product, the sum rule on the addition (a constant input absorbs its
        share, as a mask does)."""
        names = ("input", "batch1", "batch2")
        bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
        if set(kwargs) - {*names, "beta", "alpha"} or len(args) > 3 or len(bound) != 3:
            return NOT_HANDLED
        c, a, b = bound["input"], bound["batch1"], bound["batch2"]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        if not (self.depends(a) or self.depends(b)):
            return NOT_HANDLED
        where = self._where(BADDBMM_FUNCTIONS[func])
        z = self.product(f"{where} @", a, b, "matmul", float(alpha))
        if beta == 0:
            return z
        c = c if beta == 1 else c * beta
        return self.sum(f"{where} +", z, c, (True, self.depends(c)))

    def _mul(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if len(args) != 2 or kwargs:
            return NOT_HANDLED
        a, b = args
        da, db = self.depends(a), self.depends(b)
        if not (da or db):
            return NOT_HANDLED
        if da and db:
            return self.product(self._where(MUL_FUNCTIONS[func]), a, b, "mul")
        x = a if da else b
        out = func(*args, **kwargs)
        if out.shape == x.shape:  # scaling by a constant: relevance passes unchanged; computed again where read
            c = b if da else a
            again = (lambda t: func(t, c)) if da else (lambda t: func(c, t))
            return self.recompute(_PassFn.apply(x, (out.detach(),)), again, x, self._where(MUL_FUNCTIONS[func]))
        return (
            self.product(self._where(MUL_FUNCTIONS[func]), a, b, "mul")
            if isinstance(a, Tensor) and isinstance(b, Tensor)
            else NOT_HANDLED
        )

    def _scale_inplace(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if len(args) != 2 or kwargs or not self.depends(args[0]) or self.depends(args[1]):
            return NOT_HANDLED
        x, c = args
        with torch.no_grad():
            val = x * c if func is Tensor.mul_ else x / c
        if val.shape != x.shape or val.dtype != x.dtype:
            return NOT_HANDLED
        return x.copy_(_PassFn.apply(x, (val,)))

    def attention(
        self,
        what: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        scale: float,
        need_p: bool,
        dead: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None] | None:
        """``softmax(scale q kᵀ + bias) v`` as one `_AttentionFn` (the q kᵀ product, mask sum, softmax and p v product
        rules, with their audit entries, from q, k, v alone: scores and probabilities are recomputed in the backward
        pass, not kept): (output, probabilities if `need_p`, detached). The output is computed as the backward pass
        computes it again (``F.scaled_dot_product_attention`` would differ by rounding, and the epsilon rule divides by
        it: with epsilon 0, by a slightly different number near zero). `dead` (..., L, 1), bool: queries whose every
        key is masked (`attention.attend`), their probabilities set to zero after the softmax. None where q or k does
        not depend on the input or the mask does (the decomposed calls then decide each rule from the graph)."""
        if not (self.depends(q) and self.depends(k)) or self.depends(bias):
            return None
        rules = self.rules
        e_qk = self.entry(f"{what} q@k", rules.product)
        e_mask = None if bias is None else self.entry(f"{what} mask", self.sum_rule)
        e_soft = self.entry(f"{what} softmax", rules.softmax)
        e_pv = self.entry(f"{what} p@v", rules.product)
        self.check.calls += 1
        wq, wk = self.shares(True, True, self.tagged(q), self.tagged(k))
        wp, wv = self.shares(True, self.depends(v), True, self.tagged(v))  # p: a gate that depends on the input
        q0, k0, v0 = q.detach(), k.detach(), v.detach()
        b0 = None if bias is None else bias.detach()
        with torch.no_grad():  # as the backward pass computes them again: the same numbers, z / z = 1 exactly
            _, _, p = attention_probabilities(q0, k0.transpose(-2, -1), b0, scale)
            if dead is not None:
                p.masked_fill_(dead, 0.0)
            o = torch.matmul(p, v0)
        if not need_p:
            p = None
        stabilizer = getattr(self.sum_rule, "stabilizer", 0.0)
        extra = (b0, scale, (e_qk, e_mask, e_soft, e_pv), (wq, wk, wp, wv), rules.product.epsilon, stabilizer,
                 rules.softmax.hold, dead)  # fmt: skip
        call = RuleCall(e_pv, rules.product, (self.keep(q), self.keep(k), self.keep(v)), o, extra)
        return _AttentionFn.apply(q, k, v, call), p

    # -- softmax ------------------------------------------------------------------------------------------------
    def softmax(self, what: str, s: Tensor, dim: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
        rule = self.rules.softmax
        s0 = s.detach()
        with torch.no_grad():
            p = fn(s0)
        self.check.calls += 1
        call = RuleCall(self.entry(what, rule), rule, (s0,), p, dim)
        return self.tag(_SoftmaxFn.apply(s, call))

    def _softmax(self, func: Any, args: tuple, kwargs: dict) -> Any:
        s = args[0] if args else kwargs.get("input")
        if not self.depends(s):
            return NOT_HANDLED
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dim is None:
            return NOT_HANDLED
        rest = dict(kwargs)
        rest.pop("input", None)
        rest.pop("dim", None)
        extra = args[2:]
        return self.softmax(self._where(SOFTMAX_FUNCTIONS[func]), s, dim, lambda t: func(t, dim, *extra, **rest))

    # -- normalisation ------------------------------------------------------------------------------------------
    def norm(self, what: str, x: Tensor, y: Tensor, nm: NormMap, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """`y` = ``fn(x)``, a normalisation, with `NormIdentity`; `y` is computed again by `fn` where a backward
        pass needs it (`recompute`), not kept."""
        rule = self.rules.norm
        kx = self.keep(x)
        again = Recompute(fn, kx, what, cache=True)  # read by the layers after it (three projections), then by it
        call = RuleCall(self.entry(what, rule), rule, (kx,), again, nm)
        return self.recompute(_NormIdentityFn.apply(x, call, (y.detach(),)), again, x, what)

    def _norm(self, func: Any, args: tuple, kwargs: dict) -> Any:
        bound = _signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        x = a["input"]
        if not self.depends(x):
            return NOT_HANDLED
        dims = len(a["normalized_shape"])
        is_ln = func is F.layer_norm
        eps = a["eps"] if a["eps"] is not None else float(torch.finfo(x.dtype).eps)
        nm = NormMap(is_ln, dims, a["weight"], a.get("bias") if is_ln else None, eps)
        with torch.no_grad():
            y = func(*args, **kwargs)
        return self.norm(self._where(NORM_FUNCTIONS[func]), x, y, nm, lambda t: func(**{**a, "input": t}))


@functools.cache
def _signature(func: Callable[..., Any]) -> inspect.Signature:
    """`func`'s signature, read once (``F.layer_norm`` and ``F.rms_norm`` are bound on every call of a forward)."""
    return inspect.signature(func)


def sdpa(ops: TransformerOps, args: tuple, kwargs: dict) -> Any:
    """``F.scaled_dot_product_attention`` decomposed (`attention.attend`); `NOT_HANDLED` where q, k and v depend on
    no input."""
    a = bind_sdpa(args, kwargs)
    q, k, v = a["query"], a["key"], a["value"]
    if not any(ops.depends(t) for t in (q, k, v)):
        return NOT_HANDLED
    out, _ = attend(
        ops, ops._where("sdpa"), q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"], a["scale"], a["enable_gqa"]
    )
    return out


def _as_called(func: Any, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)
