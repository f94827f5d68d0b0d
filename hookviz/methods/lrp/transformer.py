r"""AttnLRP and CP-LRP rules for transformers, entries of LRP's rule table on the one rule engine.

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

The rules' parts, one concept a file: `norm` (normalisations as linear maps, the std held), `products` (the
products as the model computes them), `attention` (fused attention decomposed), `gradient_ops` and
`gradient_attention` (the rules in gradient-times-input form), `gradient_form` (the state of one pass and LRP's rule
table); this file: the rules as a composite names them, and which modules a transformer composite treats how.
"""

from __future__ import annotations

import functools
import re

from torch import nn

from .rules import Rule, _check_eps

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
    conv1d, norm, activation = _class_kind(type(module))
    # parameters(recurse=False) and children() read from the module's own dicts: the same answers (None entries and
    # duplicates aside, which do not change "any") without named_modules' generators; this runs on every module of
    # every call
    if conv1d and hasattr(module, "nf") and hasattr(module, "weight"):
        return "conv1d"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return None
    children = any(m is not None for m in module._modules.values())
    if norm and not children:
        return "norm"
    own = any(p is not None for p in module._parameters.values())
    if activation and not own:
        return "activation"
    if own and children:
        return "parameters"
    return None


def whole_module_rule(module: nn.Module) -> bool:
    """Whether a transformer composite's rule covers `module` whole (normalisations, transformers' Conv1D, activation
    modules): the operations inside it are then not seen one by one, and it is no attention module to check."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or module_kind(module) in ("conv1d", "norm", "activation")


@functools.lru_cache(maxsize=1024)
def _class_kind(cls: type) -> tuple[bool, bool, bool]:
    """What a module's class name and home say (GPT-2's Conv1D, a normalisation by name, an activation of
    ``transformers.activations``): read once per class."""
    name = cls.__name__
    norm = bool(_NORM_NAME.search(name)) and "Group" not in name
    return name == "Conv1D", norm, cls.__module__.startswith("transformers.activations")


class TransformerRules:
    """The function-level rules of a transformer composite: `product` (`Uniform`), `softmax` (`Softmax`), `norm`
    (`NormIdentity`, for ``F.layer_norm`` / ``F.rms_norm`` calls and normalisation modules found by name)."""

    def __init__(self, product: Uniform, softmax: Softmax, norm: NormIdentity) -> None:
        self.product, self.softmax, self.norm = product, softmax, norm
        self.attention = Attention()

    def __repr__(self) -> str:
        return f"TransformerRules(product={self.product!r}, softmax={self.softmax!r}, norm={self.norm!r})"
