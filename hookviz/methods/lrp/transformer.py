r"""AttnLRP and CP-LRP rules for transformers, as entries of the LRP engine's tables.

AttnLRP (Achtibat et al., 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers",
ICML, arXiv:2402.05602) with the rules the `lxt` package applies by default:

- `NormIdentity`: LayerNorm / RMSNorm with 1/std held constant, so the layer is the linear map
  $$ y = A x + b $$, $$ A = \mathrm{diag}(w / \sigma) (I - \tfrac{1}{D} 1 1^\top) $$ (no centring for RMSNorm);
  relevance is then propagated through that map by LRP-epsilon: $$ R_x = x \odot A^\top (R_y / \mathrm{stab}(y)) $$;
- elementwise activations (GELU, SiLU, tanh, ...): the identity rule, relevance passes unchanged (`rules.Pass`);
- `Softmax`: $$ R_{s,i} = s_i (R_i - p_i \sum_j R_j) $$ with $$ p = \mathrm{softmax}(s) $$ (the paper's softmax
  rule, input times the softmax's gradient applied to R / p; logits at -inf get none);
- `Uniform`: a product of two tensors that both depend on the input (q kᵀ, attention · v, a gated MLP's
  act(gate(x)) * up(x)): LRP-epsilon on the sum over the contracted index, then each product term split in half,
  $$ R_a = \tfrac12 a \odot \partial_a \langle z, g \rangle $$ with $$ g = R / \mathrm{stab}(z) $$ (same for b);
- linear layers: LRP-epsilon (optionally gamma, the paper's choice for ViTs).

CP-LRP (Ali et al., 2022, "XAI for Transformers: Better Explanations through Conservative Propagation", ICML):
the attention probabilities are held constant (the softmax passes no relevance to q and k; in attention · v the
value gets all of it), and so is a gated MLP's gate (`lxt`'s CP variant does the same).

Fused attention calls are decomposed during the call into the explicit form with the same semantics
(``F.scaled_dot_product_attention``: mask, causal, scale, GQA; ``F.multi_head_attention_forward``, which
``nn.MultiheadAttention`` calls when autograd is on): the user does not switch implementations.

Each rule here is one small autograd Function whose backward *is* the rule (the relevance comes in as the incoming
gradient, the relevance of the inputs goes out), like the engine's other rules (`propagate`).
"""

from __future__ import annotations

import inspect
import math
import re
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..rules import Call, RuleTable, spellings
from ..rules import Rule as EngineRule
from .audit import AuditEntry
from .rules import Rule, _check_eps, stabilize

# -- the rules ------------------------------------------------------------------------------------------------------


class NormIdentity(Rule):
    r"""LayerNorm / RMSNorm by the identity rule on the normalisation (AttnLRP, Sec. 3.3.2): 1/std held constant,
    LRP-epsilon on the resulting linear map $$ y = A x + b $$ (centring and affine included)."""

    name = "identity-norm"
    needs_output = True

    def __init__(self, epsilon: float = 1e-6) -> None:
        self.epsilon = _check_eps("epsilon", epsilon)


class Softmax(Rule):
    r"""The AttnLRP softmax rule $$ R_{s,i} = s_i (R_i - p_i \sum_j R_j) $$; ``hold=True`` (CP-LRP): the
    attention probabilities are constant, no relevance reaches the logits."""

    name = "softmax"

    def __init__(self, hold: bool = False) -> None:
        self.hold = bool(hold)

    @property
    def label(self) -> str:
        return "softmax-held" if self.hold else "softmax"


class Uniform(Rule):
    r"""The uniform rule for a product of two input-dependent tensors (AttnLRP, Prop. 3.4): each factor gets half
    of $$ a \odot \partial_a \langle z, R / \mathrm{stab}(z) \rangle $$. ``hold_gates=True`` (CP-LRP): a factor that
    is an attention probability or an activation's output (a gate) is held constant and the other gets all."""

    name = "uniform"

    def __init__(self, epsilon: float = 1e-6, hold_gates: bool = False) -> None:
        self.epsilon = _check_eps("epsilon", epsilon)
        self.hold_gates = bool(hold_gates)


class Attention(Rule):
    """A fused attention call (``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``): decomposed into
    q kᵀ (the product rule), the softmax rule and attention · v (the product rule) with the same semantics."""

    name = "attention"


# -- finding the layers ---------------------------------------------------------------------------------------------

_NORM_NAME = re.compile(r"(rms|layer|group)_?norm", re.IGNORECASE)


def module_kind(module: nn.Module) -> str | None:
    """What a transformer composite sees in `module` beyond its type, by name or behaviour:

    ``"conv1d"`` (transformers' GPT-2 ``Conv1D``: a linear layer with a transposed weight), ``"norm"`` (a
    normalisation module that is not ``nn.LayerNorm`` / ``nn.RMSNorm``, e.g. ``LlamaRMSNorm``, by class name; its
    form is checked against its output at run time), ``"activation"`` (a parameter-free module of
    ``transformers.activations``), ``"parameters"`` (a container with parameters of its own: class tokens, position
    embeddings, used as constants whose relevance is absorbed like a bias's), or None.
    """
    cls = type(module)
    own = any(True for _ in module.parameters(recurse=False))
    if cls.__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "weight"):
        return "conv1d"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return None
    if _NORM_NAME.search(cls.__name__) and not any(True for _ in module.children()) and "Group" not in cls.__name__:
        return "norm"
    if cls.__module__.startswith("transformers.activations") and not own:
        return "activation"
    if own and any(True for _ in module.children()):
        return "parameters"
    return None


def _eps_of(module: nn.Module, x: Tensor) -> float:
    for attr in ("variance_epsilon", "eps", "epsilon"):
        v = getattr(module, attr, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return float(torch.finfo(x.dtype).eps)


class NormMap:
    r"""One normalisation as a linear map of its input with the std held constant:
    $$ y = w \odot (x - \mu [\mathrm{centre}]) / \sigma + b $$ over the last ``dims`` dimensions."""

    __slots__ = ("centre", "dims", "weight", "bias", "eps")

    def __init__(self, centre: bool, dims: int, weight: Tensor | None, bias: Tensor | None, eps: float) -> None:
        self.centre, self.dims, self.eps = centre, dims, eps
        self.weight = None if weight is None else weight.detach()
        self.bias = None if bias is None else bias.detach()

    def _axes(self) -> tuple[int, ...]:
        return tuple(range(-self.dims, 0))

    def sigma(self, x: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.centre:
            var = xf.var(self._axes(), unbiased=False, keepdim=True)
        else:
            var = xf.pow(2).mean(self._axes(), keepdim=True)
        return (var + self.eps).sqrt()

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        c = xf - xf.mean(self._axes(), keepdim=True) if self.centre else xf
        y = c / self.sigma(x)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def transpose(self, g: Tensor, sigma: Tensor) -> Tensor:
        """``A^T g``: the gradient of the map (std constant) applied to `g`."""
        h = g / sigma
        if self.weight is not None:
            h = h * self.weight
        if self.centre:
            h = h - h.mean(self._axes(), keepdim=True)
        return h


# the form (index into norm_map's candidates) identified for a normalisation module: checked once, at its first call
_FORMS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def norm_map(name: str, module: nn.Module, x: Tensor, output: Tensor) -> NormMap:
    """The `NormMap` of a normalisation module; for modules found by name (and subclasses of nn.LayerNorm, which
    may normalise other axes, like timm's ``LayerNorm2d``), the form whose output equals the module's is taken.
    A module none of the forms reproduces raises `ValueError` naming it."""
    if type(module) in (nn.LayerNorm, nn.RMSNorm):
        dims = len(module.normalized_shape)
        eps = module.eps if module.eps is not None else float(torch.finfo(x.dtype).eps)
        return NormMap(isinstance(module, nn.LayerNorm), dims, module.weight, getattr(module, "bias", None), eps)
    eps = _eps_of(module, x)
    w = getattr(module, "weight", None)
    b = getattr(module, "bias", None)
    w = w if isinstance(w, Tensor) and w.shape == x.shape[-1:] else None
    b = b if isinstance(b, Tensor) and b.shape == x.shape[-1:] else None
    candidates = [NormMap(True, 1, w, b, eps), NormMap(False, 1, w, b, eps)]
    if w is not None:
        candidates.append(NormMap(False, 1, 1 + w.detach(), b, eps))  # Gemma's RMSNorm scales by (1 + w)
    known = _FORMS.get(module)
    if known is not None and known < len(candidates):  # its form was identified at an earlier call
        return candidates[known]
    ref = output.detach().float()
    tol = 1e-3 * float(ref.abs().max()) + 1e-5
    for i, cand in enumerate(candidates):
        y = cand.forward(x.detach()).float()
        if y.shape == ref.shape and bool(((y - ref).abs() <= tol).all()):
            _FORMS[module] = i
            return cand
    raise ValueError(
        f"LRP: {name!r} ({type(module).__name__}) looks like a normalisation layer, but its output is neither a "
        "LayerNorm nor an RMSNorm of its last dimension (with its weight and bias), so the identity rule cannot be "
        "applied; give it a rule in the composite's name_map"
    )


# -- the autograd Functions (backward = rule) -----------------------------------------------------------------------


class RuleCall:
    """One application of a transformer rule in the forward pass, kept for its backward pass and the audit."""

    __slots__ = ("entry", "rule", "tensors", "z", "extra", "version")

    def __init__(self, entry: AuditEntry, rule: Rule, tensors: tuple[Tensor, ...], z: Tensor, extra: Any) -> None:
        self.entry = entry
        self.rule = rule
        self.tensors = tensors
        self.z = z
        self.extra = extra
        self.version = tuple(t._version for t in (*tensors, z))

    def hand_on(self) -> Tensor:
        """The output, handed on as the Function's output without a copy; the call keeps an alias (sharing its
        version counter), not the output itself, which would hold the graph node that holds this call (a cycle)."""
        z = self.z
        self.z = z.detach()
        return z

    def output(self, recompute: Callable[[], Tensor]) -> Tensor:
        """The output as the forward pass computed it; `recompute` (from the inputs) where the model changed it in
        place afterwards (``scores += mask``, ``masked_fill_``): the outputs are handed on without a copy."""
        return self.z if self.z._version == self.version[-1] else recompute()

    def inputs(self) -> tuple[Tensor, ...]:
        """The stored inputs; `RuntimeError` if they were modified in place since."""
        if tuple(t._version for t in self.tensors) != self.version[:-1]:
            raise RuntimeError(
                f"LRP: an input of {self.entry.name!r} was modified in place after it was read, so its rule cannot "
                "be evaluated; make the in-place operation that follows it out of place"
            )
        return self.tensors


def _per_input(t: Tensor, n: int) -> Tensor:
    t = t.detach()
    if t.dim() > 0 and t.shape[0] == n:
        return t.reshape(n, -1).sum(1)
    return t.sum().expand(n) / n  # a factor without the batch axis first: its total, spread evenly


def _audit(call: RuleCall, r: Tensor, *r_in: Tensor) -> None:
    n = r.shape[0] if r.dim() > 0 else 1
    call.entry.add(_per_input(r, n), sum(_per_input(t, n) for t in r_in))


class _NormIdentityFn(torch.autograd.Function):
    """Output: the normalisation's output; backward: `NormIdentity`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None]:
        call = ctx.call
        nm: NormMap = call.extra
        (x,) = call.inputs()
        y = call.output(lambda: nm.forward(x))
        s = r / stabilize(y, call.rule.epsilon)
        r_in = (x * nm.transpose(s, nm.sigma(x))).to(x.dtype)
        _audit(call, r, r_in)
        return r_in, None


class _SoftmaxFn(torch.autograd.Function):
    """Output: softmax(s); backward: `Softmax` (zero for held probabilities)."""

    @staticmethod
    def forward(ctx: Any, s: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()  # computed for this call alone: no copy (changed in place later: recomputed)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None]:
        call = ctx.call
        (s,) = call.inputs()
        if call.rule.hold:
            r_in = torch.zeros_like(s)
        else:
            dim = call.extra
            p = call.output(lambda: torch.softmax(s.to(call.z.dtype), dim))
            logits = torch.where(torch.isfinite(s), s, torch.zeros((), dtype=s.dtype, device=s.device))
            r = r.to(p.dtype)
            r_in = (logits * (r - p * r.sum(dim, keepdim=True))).to(s.dtype)
        _audit(call, r, r_in)
        return r_in, None


def _product(kind: str, a: Tensor, b: Tensor, scale: float) -> Tensor:
    z = torch.matmul(a, b) if kind == "matmul" else torch.mul(a, b)
    return z if scale == 1.0 else z * scale


def _product_vjp(kind: str, a: Tensor, b: Tensor, scale: float, g: Tensor, wa: float, wb: float) -> list[Tensor]:
    """The gradients of ``<_product(a, b), g>`` w.r.t. the factors with a nonzero share: written out for matrix
    products of 2-D or more operands and elementwise products (broadcast axes summed), autograd otherwise."""
    if scale != 1.0:
        g = g * scale
    if kind == "mul" or (a.dim() >= 2 and b.dim() >= 2):
        out = []
        if wa != 0:
            ga = g * b if kind == "mul" else g @ b.transpose(-2, -1)
            out.append(ga.sum_to_size(a.shape) if ga.shape != a.shape else ga)
        if wb != 0:
            gb = g * a if kind == "mul" else a.transpose(-2, -1) @ g
            out.append(gb.sum_to_size(b.shape) if gb.shape != b.shape else gb)
        return out
    with torch.enable_grad():
        ad = a.detach().requires_grad_(wa != 0)
        bd = b.detach().requires_grad_(wb != 0)
        wrt = [t for t in (ad, bd) if t.requires_grad]
        return list(torch.autograd.grad(_product(kind, ad, bd, 1.0), wrt, g)) if wrt else []


class _ProductFn(torch.autograd.Function):
    """Output: ``a @ b`` or ``a * b`` (times a constant scale: q kᵀ / sqrt(d)); backward: each factor gets its share
    (``call.extra = (kind, scale, wa, wb)``) of ``factor * d<z, R / stab(z)>/d factor``."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()  # computed for this call alone: no copy (changed in place later: recomputed)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        call = ctx.call
        a, b = call.inputs()
        kind, scale, wa, wb = call.extra
        g = r / stabilize(call.output(lambda: _product(kind, a, b, scale)), call.rule.epsilon)
        grads = _product_vjp(kind, a, b, scale, g, wa, wb)
        ra = a * grads.pop(0) * wa if wa != 0 else None
        rb = b * grads.pop(0) * wb if wb != 0 else None
        _audit(call, r, *(t for t in (ra, rb) if t is not None))
        return ra, rb, None


# -- the operations a transformer composite intercepts ---------------------------------------------------------------

MATMUL_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.matmul: "torch.matmul",
    Tensor.matmul: "@",
    Tensor.__matmul__: "@",
    Tensor.__rmatmul__: "@",
    torch.bmm: "torch.bmm",
    Tensor.bmm: "Tensor.bmm",
}
MUL_FUNCTIONS: dict[Callable[..., Any], str] = {Tensor.mul: "*", torch.mul: "torch.mul", Tensor.__rmul__: "*"}
SOFTMAX_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.softmax: "F.softmax",
    torch.softmax: "torch.softmax",
    Tensor.softmax: "Tensor.softmax",
}
NORM_FUNCTIONS: dict[Callable[..., Any], str] = {F.layer_norm: "F.layer_norm", F.rms_norm: "F.rms_norm"}
# in-place scaling by a constant (timm's LayerScale with inplace=True: x.mul_(gamma)): relevance unchanged
SCALE_INPLACE: dict[Callable[..., Any], str] = {Tensor.mul_: "*=", Tensor.div_: "/="}
NEGATIONS: dict[Callable[..., Any], str] = {torch.neg: "torch.neg", Tensor.neg: "-", Tensor.__neg__: "-"}
SDPA = F.scaled_dot_product_attention
MHA = F.multi_head_attention_forward
_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)
# embeddings are where the propagation starts (their output is the relevance's input); dtype queries route nothing
_SOURCES = {"embedding", "is_floating_point", "is_complex"}
# the attention probabilities stay what they are through these (tags for CP-LRP follow them)
_KEEPS_TAG = {"to", "type_as", "dropout", "contiguous", "float", "half", "double", "type", "clone", "detach"}


class _PassFn(torch.autograd.Function):
    """Output: an elementwise op's output (boxed, ``(z,)``: handed on without a copy); backward: relevance
    unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, zbox: tuple[Tensor]) -> Tensor:
        return zbox[0]

    @staticmethod
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None]:
        return r, None


class TransformerRules:
    """The function-level rules of a transformer composite: `product` (`Uniform`), `softmax` (`Softmax`), `norm`
    (`NormIdentity`, for ``F.layer_norm`` / ``F.rms_norm`` calls and normalisation modules found by name)."""

    def __init__(self, product: Uniform, softmax: Softmax, norm: NormIdentity) -> None:
        self.product, self.softmax, self.norm = product, softmax, norm
        self.attention = Attention()

    def __repr__(self) -> str:
        return f"TransformerRules(product={self.product!r}, softmax={self.softmax!r}, norm={self.norm!r})"


NOT_HANDLED = object()
LinearCall = Callable[[Tensor, Tensor, "Tensor | None", str], Tensor]
EntryCall = Callable[[str, Rule], AuditEntry]


def is_attention_module(module: nn.Module) -> bool:
    """Modules whose forward must contain an attention the engine sees (by type, or 'Attention' in the class name)."""
    return isinstance(module, nn.MultiheadAttention) or "Attention" in type(module).__name__


class _BroadcastSumFn(torch.autograd.Function):
    """Output: ``a + b`` where one side broadcasts (a position embedding added to a batch of tokens); backward: the
    sum rule (`rules.Norm`), ``R_a = a R / stab(a + b)`` summed over the broadcast axes (same for b)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, call: RuleCall) -> Tensor:
        ctx.call = call
        return call.hand_on()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, Tensor, None]:
        call = ctx.call
        a, b = call.inputs()
        s = r / stabilize(call.output(lambda: a + b), call.rule.stabilizer)
        ra, rb = (a * s).sum_to_size(a.shape), (b * s).sum_to_size(b.shape)
        _audit(call, r, ra, rb)
        return ra, rb, None


ADD_FUNCTIONS: dict[Callable[..., Any], str] = {Tensor.add: "+", torch.add: "torch.add", Tensor.__radd__: "+"}


class TransformerOps:
    """The transformer rules during one LRP forward pass: products, softmax, normalisations and fused attention
    calls seen by the engine's function mode (`handle`), the gates CP-LRP holds (``tags``), and the check that
    every attention module ran an attention the engine saw (`enter_attention` / `leave_attention`)."""

    def __init__(self, rules: TransformerRules, entry: EntryCall, linear: LinearCall, sum_rule: Rule) -> None:
        self.rules = rules
        self.sum_rule = sum_rule
        self.entry = entry
        self.linear = linear
        self.tags: dict[int, Tensor] = {}  # id -> tensor: softmax and activation outputs (gates CP-LRP holds)
        self._reaches: dict[Any, bool] = {}  # autograd node -> whether it reaches an input (not a parameter)
        self.attention_calls = 0
        self._open: list[tuple[str, int]] = []  # attention modules being run: (name, attention calls at entry)

    def clear(self) -> None:
        self.tags.clear()
        self._reaches.clear()
        self._open.clear()

    # -- what depends on the input ------------------------------------------------------------------------------
    def depends(self, t: object) -> bool:
        """Whether `t` depends on the explained input (a leaf that is not an `nn.Parameter`), not only on
        parameters and constants: a product with a parameter is a linear map, not a product of two activations."""
        if not isinstance(t, Tensor) or not t.requires_grad:
            return False
        if t.grad_fn is None:
            return not isinstance(t, nn.Parameter)
        return self._node_reaches(t.grad_fn)

    def _node_reaches(self, root: Any) -> bool:
        memo = self._reaches
        if root in memo:
            return memo[root]
        stack, seen, found = [root], [], False
        visited = {root}
        while stack and not found:
            node = stack.pop()
            seen.append(node)
            for nxt, _ in getattr(node, "next_functions", ()):
                if nxt is None or nxt in visited:
                    continue
                known = memo.get(nxt)
                if known is True:
                    found = True
                    break
                if known is False:
                    continue
                var = getattr(nxt, "variable", None)
                if var is not None:  # AccumulateGrad: a leaf
                    if not isinstance(var, nn.Parameter):
                        found = True
                        break
                    continue
                visited.add(nxt)
                stack.append(nxt)
        if found:
            memo[root] = True
        else:  # a full search: nothing below any visited node reaches an input
            for node in seen:
                memo[node] = False
        return found

    def tag(self, t: Tensor) -> Tensor:
        self.tags[id(t)] = t
        return t

    def tagged(self, t: object) -> bool:
        return isinstance(t, Tensor) and self.tags.get(id(t)) is t

    # -- attention modules --------------------------------------------------------------------------------------
    def enter_attention(self, name: str) -> None:
        self._open.append((name, self.attention_calls))

    def leave_attention(self, name: str, module: nn.Module, ran_on_input: bool) -> None:
        if not self._open:
            return
        opened, before = self._open.pop()
        if ran_on_input and self.attention_calls == before:
            raise RuntimeError(
                f"LRP: the attention module {name!r} ({type(module).__name__}) ran without any operation the engine "
                "sees (softmax, F.scaled_dot_product_attention, F.multi_head_attention_forward): a custom kernel or "
                "a TorchScript function computes its attention, which would get a plain gradient instead of the "
                "attention rules; use the module's eager (PyTorch) attention"
            )

    def _where(self, what: str) -> str:
        return f"{self._open[-1][0]}: {what}" if self._open else what

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
            table.functions(ADD_FUNCTIONS, rule("sum", self._broadcast_add, lambda c: add(c.op, c.args, c.kwargs)))
            .functions(MATMUL_FUNCTIONS, rule("product", self._matmul))
            .functions(MUL_FUNCTIONS, rule("product", self._mul, affine_mul))
            .functions(SOFTMAX_FUNCTIONS, rule("softmax", self._softmax))
            .functions({SDPA: "F.scaled_dot_product_attention"}, rule("attention", lambda f, a, k: self._sdpa(a, k)))
            .functions({MHA: "F.multi_head_attention_forward"}, rule("attention", lambda f, a, k: self._mha(a, k)))
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
        return _PassFn.apply(x, (func(*args, **kwargs).detach(),))

    def _keep_tag(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if args and self.tagged(args[0]):
            return self.tag(func(*args, **kwargs))
        return NOT_HANDLED

    def _broadcast_add(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Sums of two tensors of different shapes (broadcasting) get the sum rule too; same-shaped sums are the
        engine's (`propagate`)."""
        if len(args) != 2 or kwargs or not hasattr(self.sum_rule, "stabilizer"):
            return NOT_HANDLED
        a, b = (args[1], args[0]) if func is Tensor.__radd__ else args
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.shape == b.shape:
            return NOT_HANDLED
        if not (a.requires_grad and b.requires_grad):
            return NOT_HANDLED
        a0, b0 = a.detach(), b.detach()
        z = a0 + b0
        call = RuleCall(self.entry(self._where(ADD_FUNCTIONS[func]), self.sum_rule), self.sum_rule, (a0, b0), z, None)
        return _BroadcastSumFn.apply(a, b, call)

    # -- products -----------------------------------------------------------------------------------------------
    def product(self, what: str, a: Tensor, b: Tensor, kind: str, scale: float = 1.0) -> Tensor:
        """``a @ b`` (`kind` "matmul") or ``a * b`` ("mul"), times `scale`, with the product rule; a factor
        that does not depend on the input is a constant (the other then gets all the relevance: LRP-epsilon on a
        linear map)."""
        da, db = self.depends(a), self.depends(b)
        rule = self.rules.product
        if da and db:
            wa = wb = 0.5
            if rule.hold_gates and self.tagged(a) != self.tagged(b):
                wa, wb = (0.0, 1.0) if self.tagged(a) else (1.0, 0.0)
        else:
            wa, wb = float(da), float(db)
        a0, b0 = a.detach(), b.detach()
        with torch.no_grad():
            z = _product(kind, a0, b0, scale)
        call = RuleCall(self.entry(what, rule), rule, (a0, b0), z, (kind, scale, wa, wb))
        return _ProductFn.apply(a, b, call)

    def _matmul(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if len(args) != 2 or kwargs:
            return NOT_HANDLED
        a, b = (args[1], args[0]) if func is Tensor.__rmatmul__ else args
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or not (self.depends(a) or self.depends(b)):
            return NOT_HANDLED
        return self.product(self._where(MATMUL_FUNCTIONS[func]), a, b, "matmul")

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
        if out.shape == x.shape:  # scaling by a constant: relevance passes unchanged
            return _PassFn.apply(x, (out.detach(),))
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

    # -- softmax ------------------------------------------------------------------------------------------------
    def softmax(self, what: str, s: Tensor, dim: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
        rule = self.rules.softmax
        s0 = s.detach()
        with torch.no_grad():
            p = fn(s0)
        self.attention_calls += 1
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
    def norm(self, what: str, x: Tensor, y: Tensor, nm: NormMap) -> Tensor:
        rule = self.rules.norm
        call = RuleCall(self.entry(what, rule), rule, (x.detach(),), y.detach(), nm)
        return _NormIdentityFn.apply(x, call)

    def _norm(self, func: Any, args: tuple, kwargs: dict) -> Any:
        bound = inspect.signature(func).bind(*args, **kwargs)
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
        return self.norm(self._where(NORM_FUNCTIONS[func]), x, y, nm)

    # -- attention ----------------------------------------------------------------------------------------------
    def attend(
        self,
        what: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        dropout_p: float,
        causal: bool,
        scale: float | None,
        gqa: bool,
    ) -> tuple[Tensor, Tensor]:
        """Scaled dot-product attention with F.scaled_dot_product_attention's semantics (boolean masks: True
        takes part; float masks are added; `causal`: the upper triangle masked; `gqa`: key/value heads repeated),
        decomposed into the product, softmax and product rules. Returns (output, attention probabilities)."""
        n_q, n_k = q.size(-2), k.size(-2)
        scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
        if gqa and q.dim() >= 3 and k.size(-3) != q.size(-3):
            rep = q.size(-3) // k.size(-3)
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        bias = None
        if causal:
            keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
            bias = torch.zeros(n_q, n_k, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))
        if mask is not None:
            m = mask
            if m.dtype == torch.bool:
                m = torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            bias = m if bias is None else bias + m
        s = self.product(f"{what} q@k", q, k.transpose(-2, -1), "matmul", scale)
        if bias is not None:
            s = s + bias  # a constant: relevance passes to the logits unchanged
        p = self.softmax(f"{what} softmax", s, -1, lambda t: torch.softmax(t, -1))
        if dropout_p > 0:
            p = self.tag(F.dropout(p, dropout_p))
        return self.product(f"{what} p@v", p, v, "matmul"), p

    def _sdpa(self, args: tuple, kwargs: dict) -> Any:
        bound = inspect.signature(_sdpa_reference).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        q, k, v = a["query"], a["key"], a["value"]
        if not any(self.depends(t) for t in (q, k, v)):
            return NOT_HANDLED
        out, _ = self.attend(
            self._where("sdpa"), q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"], a["scale"], a["enable_gqa"]
        )
        return out

    def _mha(self, args: tuple, kwargs: dict) -> Any:
        bound = _MHA_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        query, key, value = a["query"], a["key"], a["value"]
        if not any(self.depends(t) for t in (query, key, value)):
            return NOT_HANDLED
        if a["bias_k"] is not None or a["bias_v"] is not None or a["add_zero_attn"]:
            raise TypeError(
                f"LRP: {self._where('nn.MultiheadAttention')} with add_bias_kv or add_zero_attn is not supported by "
                "the attention rules"
            )
        if a["static_k"] is not None or a["static_v"] is not None:
            raise TypeError("LRP: F.multi_head_attention_forward with static_k / static_v is not supported")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        n_q, n, e = query.shape
        n_k = key.shape[0]
        h = a["num_heads"]
        d = e // h
        if a["use_separate_proj_weight"]:
            ws = (a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"])
        else:
            ws = tuple(a["in_proj_weight"].chunk(3))
        bs = (None, None, None) if a["in_proj_bias"] is None else tuple(a["in_proj_bias"].chunk(3))
        where = self._where("multi_head_attention")
        inputs = zip((query, key, value), ws, bs, "qkv", strict=True)
        q, k, v = (self.linear(t, w, b, f"{where} in_proj {c}") for t, w, b, c in inputs)
        q = q.reshape(n_q, n, h, d).permute(1, 2, 0, 3)  # (N, h, L, d)
        k = k.reshape(n_k, n, h, d).permute(1, 2, 0, 3)
        v = v.reshape(n_k, n, h, d).permute(1, 2, 0, 3)
        mask = _mha_mask(a["attn_mask"], a["key_padding_mask"], n, h, n_q, n_k, q.dtype, q.device)
        causal = bool(a["is_causal"]) and a["attn_mask"] is None
        dropout = a["dropout_p"] if a["training"] else 0.0
        o, p = self.attend(where, q, k, v, mask, dropout, causal, None, False)
        o = o.permute(2, 0, 1, 3).reshape(n_q, n, e)
        out = self.linear(o, a["out_proj_weight"], a["out_proj_bias"], f"{where} out_proj")
        weights = None
        if a["need_weights"]:
            weights = p.detach().mean(1) if a["average_attn_weights"] else p.detach()
            weights = weights.squeeze(0) if unbatched else weights
        return (out.squeeze(1) if unbatched else out), weights


def _as_called(func: Any, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)


def _sdpa_reference(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> None:
    """The signature of ``F.scaled_dot_product_attention`` (a builtin, which ``inspect`` cannot read)."""


def _mha_mask(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    n: int,
    h: int,
    n_q: int,
    n_k: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor | None:
    """nn.MultiheadAttention's masks (boolean: True is *masked out*; float: added) as one additive (N, h, L, S)."""

    def additive(m: Tensor) -> Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    out = None
    if attn_mask is not None:
        m = additive(attn_mask)
        out = m.reshape(n, h, n_q, n_k) if m.dim() == 3 else m
    if key_padding_mask is not None:
        kp = additive(key_padding_mask).reshape(n, 1, 1, n_k)
        out = kp if out is None else out + kp
    return out
