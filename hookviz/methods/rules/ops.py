"""Operations by name: how a functional callable is spelled in reports, its spellings, and its in-place variants.

A functional operation reaches a `torch.overrides.TorchFunctionMode` as the callable that was called: ``F.relu``,
``torch.relu``, ``Tensor.relu`` and ``torch.relu_`` are four objects for one operation. `spellings` lists them for a
table, `function_name` names one for the coverage report, `out_of_place` finds the variant that leaves its input
intact (what the engine runs when a rule needs an in-place call's input).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Every spelling of a matrix product of two tensors (``a @ b`` reaches a function mode as ``Tensor.matmul``; a
#: subclass or an older torch may dispatch the dunders), with its report name; the tables of LRP and DeepLift use it.
MATMUL_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.matmul: "torch.matmul",
    Tensor.matmul: "@",
    Tensor.__matmul__: "@",
    Tensor.__rmatmul__: "@",
    torch.bmm: "torch.bmm",
    Tensor.bmm: "Tensor.bmm",
}

#: The max pools among the modules (LRP passes their gradient, DeepLift gives them its selection rule).
MAX_POOL_MODULES: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)

# the namespaces a functional call is looked up in, in the order a report prefers their names (``torch.relu_`` is
# also ``F.relu_``, ``torch.conv2d`` also ``F.conv2d``: the torch name wins)
_NAMESPACES: tuple[tuple[str, Any], ...] = (("torch", torch), ("F", F), ("Tensor", Tensor))
# in-place dunder methods and their out-of-place counterparts (``a += b`` reaches the mode as ``Tensor.add_``, but a
# subclass or an older torch may dispatch the dunder itself)
_DUNDERS = {"__iadd__": "__add__", "__isub__": "__sub__", "__imul__": "__mul__", "__itruediv__": "__truediv__"}


def function_name(func: Callable[..., Any]) -> str:
    """``"F.relu"``, ``"torch.relu_"``, ``"Tensor.add"``: the name under which `func` is reachable, else its own."""
    name = getattr(func, "__name__", None)
    if name is None:
        return repr(func)
    for prefix, namespace in _NAMESPACES:
        if getattr(namespace, name, None) is func:
            return f"{prefix}.{name}"
    return name


def out_of_place(func: Callable[..., Any]) -> Callable[..., Any] | None:
    """The out-of-place variant of an in-place callable (``torch.relu_`` -> ``torch.relu``, ``Tensor.add_`` ->
    ``Tensor.add``, ``Tensor.__iadd__`` -> ``Tensor.__add__``); None for a callable that is not in place."""
    name = getattr(func, "__name__", "")
    if name in _DUNDERS:
        base = _DUNDERS[name]
    elif name.endswith("_") and not name.endswith("__"):
        base = name[:-1]
    else:
        return None
    for _, namespace in _NAMESPACES:
        if getattr(namespace, name, None) is func and getattr(namespace, base, None) is not None:
            return getattr(namespace, base)
    return None


def spellings(name: str, *, inplace: bool = True) -> dict[Callable[..., Any], str]:
    """Every callable spelling of the operation `name` in ``F``, ``torch`` and ``Tensor``, with its report name:
    ``spellings("relu")`` gives ``torch.relu``, ``F.relu``, ``Tensor.relu`` and (with `inplace`) ``torch.relu_``
    (which is ``F.relu_``) and ``Tensor.relu_``. A callable reachable under two names is listed once."""
    found: dict[Callable[..., Any], str] = {}
    for variant in (name, name + "_") if inplace else (name,):
        for prefix, namespace in _NAMESPACES:
            func = getattr(namespace, variant, None)
            if callable(func) and func not in found:
                found[func] = f"{prefix}.{variant}"
    return found


def _sdpa_signature(
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


_SDPA = inspect.signature(_sdpa_signature)
_MHA = inspect.signature(F.multi_head_attention_forward)


def _bind(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    """`sig` bound to a call, defaults filled in. The common call (positional arguments, then keywords for the rest,
    every parameter without a default given) is bound by hand: ``Signature.bind`` took a third of an attention rule's
    time. Anything else, and every error, goes through ``Signature.bind``."""
    params = sig.parameters
    names = tuple(params)
    if len(args) <= len(names):
        a = dict(zip(names, args, strict=False))
        if all(k in params and k not in a for k in kwargs):
            a.update(kwargs)
            if len(a) < len(names):
                for n, p in params.items():
                    if n not in a:
                        if p.default is inspect.Parameter.empty:
                            break
                        a[n] = p.default
            if len(a) == len(names):
                return {n: a[n] for n in names}
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def bind_sdpa(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of an ``F.scaled_dot_product_attention`` call by name, defaults filled in (the methods that
    decompose the fused call read them: the attention rollouts, the transformer LRP rules)."""
    return _bind(_SDPA, args, kwargs)


def bind_mha(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of an ``F.multi_head_attention_forward`` call (what ``nn.MultiheadAttention`` runs) by name,
    defaults filled in."""
    return _bind(_MHA, args, kwargs)
