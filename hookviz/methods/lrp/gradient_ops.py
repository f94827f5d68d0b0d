r"""The stabilized transformer rules in gradient-times-input form: products, sums and linear maps with their
stabilizers as factors on the gradient.

In the form that carries $$ g = R / a $$ backward (`gradient_form`), each transformer rule with a stabilizer is the
operation's own gradient with the output's gradient multiplied by $$ z / \mathrm{stab}(z) $$ (`stabilizer`):

- LRP-epsilon on ``F.linear`` (and the projections of ``nn.MultiheadAttention``): $$ R_x = x \odot W^\top (R_z /
  \mathrm{stab}(z)) $$, so $$ g_x = W^\top (g_z \odot z / \mathrm{stab}(z)) $$;
- the uniform rule on a product z of two factors that depend on the input (AttnLRP, Prop. 3.4): each factor's share
  of $$ a \odot \partial_a \langle z, R / \mathrm{stab}(z) \rangle $$, the factor z / stab(z) then the shares
  (`gradient_form._share`); a product with a constant is LRP-epsilon on a linear map (the constant's share is 0);
- the sum rule on a sum that broadcasts or adds a constant (a position embedding, an attention mask): $$ R_a = a
  \odot R / \mathrm{stab}(a + b) $$, the constant's share absorbed (as a bias's; `lxt` does the same).

`GradientOps` also serves `attention.attend` (a fused attention call written out with its semantics: masks, causal,
GQA) where AttnLRP's stabilizers need the scores and the output, which a fused kernel does not expose: as one Function
that keeps q, k and v alone (`gradient_attention`), or, where q or k does not depend on the input, as its parts (q kᵀ,
the mask's sum, the softmax, p v), each by its rule. Each call gets an audit entry whose sums come from the same
backward pass (`stabilizer.Site`). With every stabilizer 0 nothing here places a Function: the plain gradients are the
rules (and the audit holds the totals only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..rules.reach import InputReach
from .audit import AuditEntry
from .gradient_attention import AttentionCall, StabilizedAttentionFn
from .products import _product
from .rules import Epsilon, LinearRule, Rule
from .stabilizer import Site, per_input, stabilized

EntryCall = Callable[[str, Rule], AuditEntry]
ShareCall = Callable[[Tensor, float], Tensor]
SharesCall = Callable[[object, object], "tuple[float, float] | None"]
FunctionalLayer = Callable[[str, LinearRule, Tensor, Tensor, "Tensor | None"], Tensor]


class GradientOps:
    """The stabilized rules of one forward pass of a transformer composite in gradient form (see the module
    docstring); the `attention.TransformerOps` protocol, for `attention.attend` and `attention.mha`.

    `entry` makes an audit entry, `shares` gives a product's factor shares (None: at most one factor depends on the
    input), `share` scales a factor's gradient, `rule_layer` applies a linear rule that is not LRP-epsilon (gamma) to
    ``F.linear``; `n` is the batch size (the audit's sums are per input)."""

    def __init__(
        self,
        composite_rules: tuple[Rule | None, Rule, Rule, Rule, Rule],
        reach: InputReach,
        entry: EntryCall,
        shares: SharesCall,
        share: ShareCall,
        rule_layer: FunctionalLayer,
        n: int,
    ) -> None:
        self.linear_rule, self.product_rule, self.sum_rule, self.norm_rule, self.softmax_rule = composite_rules
        self.reach = reach
        self.entry = entry
        self._shares = shares
        self._share = share
        self._rule_layer = rule_layer
        self.n = n
        self.product_eps = float(getattr(self.product_rule, "epsilon", 0.0))
        self.sum_eps = float(getattr(self.sum_rule, "stabilizer", 0.0))
        self.norm_eps = float(getattr(self.norm_rule, "epsilon", 0.0))
        lin = self.linear_rule
        self.linear_eps = float(lin.epsilon) if isinstance(lin, Epsilon) else 0.0
        # whether any rule needs more than the plain gradient (the stabilizers of lxt's rules are all 0)
        self.active = bool(self.product_eps or self.sum_eps or self.norm_eps or not isinstance(lin, Epsilon | None)
                           or self.linear_eps)  # fmt: skip

    # -- the protocol `attention.attend` calls ------------------------------------------------------------------
    def depends(self, t: object) -> bool:
        return self.reach.depends(t)

    def tag(self, t: Tensor) -> Tensor:
        return t  # AttnLRP holds no gate (CP-LRP's held attention does not decompose: `GradientFormRun._attention`)

    def _where(self, what: str) -> str:
        return what

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
        """``softmax(scale q kᵀ + bias) v`` as one Function that keeps q, k, v alone (`gradient_attention`): (output,
        probabilities if `need_p`, detached). None where q or k does not depend on the input or the mask does
        (`attention.attend` then decomposes the call, each part by its rule)."""
        if not (self.reach.depends(q) and self.reach.depends(k)) or self.reach.depends(bias):
            return None
        entries = (
            self.entry(f"{what} q@k", self.product_rule),
            None if bias is None else self.entry(f"{what} mask", self.sum_rule),
            self.entry(f"{what} softmax", self.softmax_rule),
            self.entry(f"{what} p@v", self.product_rule),
        )
        wq, wk = (0.5, 0.5)
        wp, wv = (0.5, 0.5) if self.reach.depends(v) else (1.0, 0.0)
        call = AttentionCall((q, k, v), bias, scale, dead, (wq, wk, wp, wv), self.product_eps, self.sum_eps, entries,
                             self.n)  # fmt: skip
        with torch.no_grad():  # as the backward pass computes them again: the same numbers
            _, _, p = call.probabilities()
            o = torch.matmul(p, call.v)
        return StabilizedAttentionFn.apply(q, k, v, (o,), call), (p if need_p else None)

    @property
    def linear(self) -> Callable[[Tensor, Tensor, Tensor | None, str], Tensor]:
        return self.functional_linear

    def functional_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, name: str) -> Tensor:
        """``F.linear(x, weight, bias)`` with the composite's rule for ``nn.Linear``: LRP-epsilon as a factor, another
        linear rule (gamma) as its `layer_fn` Function."""
        rule = self.linear_rule
        if not self.reach.depends(x):
            return F.linear(x, weight, bias)
        if isinstance(rule, LinearRule) and not isinstance(rule, Epsilon):
            return self._rule_layer(name, rule, x, weight, bias)
        z = F.linear(x, weight, bias)
        if rule is None:
            return z

        w, b = weight.detach(), None if bias is None else bias.detach()
        return self.stabilize(name, rule, self.linear_eps, z, b, _again(lambda t: F.linear(t, w, b), name, x))

    def product(
        self, what: str, a: Tensor, b: Tensor, kind: str, scale: float = 1.0, shares: tuple[float, float] | None = None
    ) -> Tensor:
        """``a @ b`` (`kind` "matmul"), ``a * b`` ("mul") or a two-operand einsum ("einsum:<equation>"), times
        `scale`: the uniform rule's shares (`shares`, else asked; one factor constant: all to the other) after the
        factor z / stab(z)."""
        if shares is None:
            shares = self._shares(a, b)
        if shares is None:
            shares = (float(self.reach.depends(a)), float(self.reach.depends(b)))
        z = _product(kind, self._share(a, shares[0]), self._share(b, shares[1]), scale)
        again = _again(lambda a0, b0: _product(kind, a0, b0, scale), what, a, b)
        return self.stabilize(what, self.product_rule, self.product_eps, z, None, again)

    def sum(self, what: str, a: Tensor, b: Tensor, depend: tuple[bool, bool], link: Tensor | None = None) -> Tensor:
        """``a + b`` by the sum rule: the factor z / stab(z); a side that does not depend on the input absorbs its
        share (its gradient is dropped; the audit's "left" subtracts it). `link`: unused (no in-place copies here)."""
        da, db = depend
        z = (a if da else a.detach()) + (b if db else b.detach())
        offset = None if da and db else (a if db else b).detach()
        again = _again(torch.add, what, a, b)
        return self.stabilize(what, self.sum_rule, self.sum_eps, z, offset, again, finite=True)

    def softmax(self, what: str, s: Tensor, dim: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """AttnLRP's softmax rule, the softmax's own gradient in this form, with its audit entry (the rule does not
        conserve: the audit shows what it changes)."""
        with torch.no_grad():
            p = fn(s)
        return _AuditedSoftmax.apply(s, (p,), dim, self.entry(what, self.softmax_rule), self.n)

    # -- the factor ---------------------------------------------------------------------------------------------
    def stabilize(
        self,
        what: str,
        rule: Rule,
        eps: float,
        z: Tensor,
        offset: Tensor | None,
        again: Callable[[], Tensor] | None,
        finite: bool = False,
    ) -> Tensor:
        """`z` whose gradient is multiplied by z / stab(z) (`eps` 0: by nothing, the call still audited); `offset`:
        the part of `z` that is not a function of the input, for the audit; `again`: z computed again (the model
        changed it in place); `finite`: infinities in `z` (a mask's) get no relevance (`stabilizer.Site`)."""
        return stabilized(z, Site(self.entry(what, rule), eps, z, again, self.n, offset, finite=finite))

    def broadcast_sum(self, func: Any, args: tuple, what: str) -> Any:
        """``a + b`` (``torch.add``, ``+``, ``+=``) where one side is a constant or the sides broadcast: the sum rule
        (`sum`); NotImplemented for other sums (two same-shaped branches: the layer rules' sum) and other calls."""
        if len(args) != 2 or not self.sum_eps:
            return NotImplemented
        a, b = (args[1], args[0]) if func is Tensor.__radd__ else args
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
            return NotImplemented
        da, db = self.reach.depends(a), self.reach.depends(b)
        if not (da or db) or (da and db and a.shape == b.shape):
            return NotImplemented
        if func is Tensor.add_:
            if torch.broadcast_shapes(a.shape, b.shape) != a.shape:
                return NotImplemented  # the in-place call raises its own error
            return a.copy_(self.sum(what, a, b, (da, db)))
        return self.sum(what, a, b, (da, db))


def _again(fn: Callable[..., Tensor], what: str, *inputs: Tensor) -> Callable[[], Tensor]:
    """``fn(*inputs)`` computed again from the inputs as they were (aliases): `RuntimeError` where the model changed
    one of them in place since (the output cannot be reproduced)."""
    kept = [(t.detach(), t._version) for t in inputs]

    def again() -> Tensor:  # noqa: D401
        if any(t._version != v for t, v in kept):
            raise RuntimeError(
                f"LRP: the inputs and the output of {what!r} were modified in place after its rule read them, so the "
                "rule cannot be evaluated; make the in-place operation that follows it out of place"
            )
        return fn(*(t for t, _ in kept))

    again.inputs = [t for t, _ in kept]  # type: ignore[attr-defined]
    return again


class _AuditedSoftmax(torch.autograd.Function):
    """Output: p = softmax(s) along `dim`, computed (boxed); backward: the softmax's gradient (AttnLRP's softmax rule
    in gradient form) and the audit's sums, entered ``sum p g`` and left ``sum s g_s`` (masked logits, -inf, none).
    s and p are kept as aliases: p changed in place later (a mask filled in) is computed again from s."""

    @staticmethod
    def forward(ctx: Any, s: Tensor, pbox: tuple[Tensor], dim: int, entry: AuditEntry, n: int) -> Tensor:
        p = pbox[0]
        ctx.kept = _again(lambda t: torch.softmax(t, dim, dtype=p.dtype), "softmax", s)
        ctx.p, ctx.version = p.detach(), p._version
        ctx.dim, ctx.entry, ctx.n = dim, entry, n
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None, None]:
        p = ctx.p if ctx.p._version == ctx.version else ctx.kept()
        s = ctx.kept.inputs[0]
        gs = torch._softmax_backward_data(g.to(p.dtype), p, ctx.dim, p.dtype).to(s.dtype)
        logits = torch.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0)
        ctx.entry.add(per_input(p, g, ctx.n), per_input(logits, gs, ctx.n))
        return gs, None, None, None, None
