"""DeepLift as a rule table on the rule engine: which operation gets which rule, and which operations run without
one.

- the rescale rule (``rescale.py``) on every elementwise function of one input, as a module or a functional call;
- the selection rule (``selection.py``) on every max pool and on max / min reductions;
- the two-factor split (``products.py``) on products and quotients of two activations;
- softmax, log-softmax, ``F.normalize``, layer / group / RMS norm and fused attention
  (``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``'s call) written out in those (``decomposed.py``);
- every other call on a tensor that depends on the input is reported as not covered, unless its gradient is already
  exact: a linear map (convolutions, linear layers, sums and means, average pools, additions, a product with a
  weight or a constant, BatchNorm in eval mode, interpolation) or routing (reshapes, indexing, concatenation). The
  reported ones are named in the summation-to-delta warning (``method.py``), when the sum misses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ..rules import MATMUL_FUNCTIONS, RuleTable, function_name
from ..rules.reach import InputReach
from . import decomposed, products, rescale, selection

# operations whose plain gradient is an exact DeepLift multiplier: linear in their tensor inputs, or routing
_EXACT = {
    # routing, reshaping, copies
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "permute", "transpose", "t", "contiguous",
    "__getitem__", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "squeeze", "unsqueeze", "split",
    "split_with_sizes", "tensor_split", "chunk", "unbind", "expand", "expand_as", "broadcast_to", "clone", "to",
    "float", "double", "half", "bfloat16", "type", "type_as", "detach", "movedim", "moveaxis", "swapaxes",
    "swapdims", "narrow", "select", "roll", "flip", "fliplr", "flipud", "rot90", "pad", "__get__", "size", "dim",
    "numel", "requires_grad_", "cpu", "cuda", "__setitem__", "copy_", "identity", "repeat", "tile",
    "repeat_interleave", "squeeze_", "unsqueeze_", "index_select", "gather", "take_along_dim", "masked_fill",
    "masked_fill_", "tril", "triu", "diagonal", "diag_embed", "unfold", "fold", "as_strided", "zeros_like",
    "ones_like", "full_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "is_floating_point",
    "is_complex", "element_size", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
    "embedding", "nan_to_num", "retain_grad", "__len__", "__iter__", "__contains__", "__format__", "__repr__",
    # linear maps
    "add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_", "__sub__", "__rsub__", "__isub__", "subtract",
    "neg", "__neg__", "negative", "__pos__", "sum", "mean", "nansum", "cumsum", "diff", "trace", "sum_to_size",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear", "addmm",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "grid_sample", "einsum",
    # products and quotients the split leaves alone: with a weight or a number (linear)
    "mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply", "matmul", "__matmul__", "__rmatmul__", "bmm",
    "div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide", "addcmul", "addcmul_",
}  # fmt: skip


_DIVISIONS = {"div", "div_", "divide"}


def _tensors(args: tuple, kwargs: dict) -> list[Tensor]:
    found: list[Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, list | tuple):
            found.extend(t for t in a if isinstance(t, Tensor))
    return found


def uncovered(reach: InputReach) -> Callable[[Callable[..., Any], tuple, dict], str | None]:
    """The table's ``uncovered`` predicate: the name of a call that no rule covers, that an activation reaches
    (`reach`: read from the graph, so an operation on weights alone, a weight standardisation, is not named) and
    whose gradient may not be exact; None for the exact ones above."""

    def name_of(func: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
        tensors = [t for t in _tensors(args, kwargs) if t.requires_grad]
        if not tensors:
            return None
        name = getattr(func, "__name__", None) or repr(func)
        if name in _EXACT and name not in _DIVISIONS and name != "einsum":
            return None
        active = [t for t in tensors if reach.depends(t)]
        if not active:
            return None
        if name in _DIVISIONS:
            rounded = "rounding_mode" in kwargs or len(args) > 2
            return function_name(func) + " (rounded)" if rounded else None  # floor / trunc: piecewise constant
        if name == "batch_norm":  # eval: an affine map; training: the batch's statistics mix the rows
            training = kwargs.get("training", args[5] if len(args) > 5 else False)
            return "F.batch_norm (training: batch statistics)" if training else None
        if name == "einsum":
            return "torch.einsum" if len(active) > 1 else None  # of two activations: bilinear, no rule
        return function_name(func)

    return name_of


def rule_table() -> RuleTable:
    """DeepLift's rule table (module docstring), built for one forward pass. The engine's own warning is off: a call
    without a rule is named in the summation-to-delta warning instead, which is given only when the sum misses."""
    return (
        RuleTable(warn=False, uncovered=uncovered(InputReach()))
        .modules(rescale.MODULES, rescale.RESCALE)
        .modules(selection.MODULES, selection.MAX_POOL)
        .functions(rescale.FUNCTIONS, rescale.RESCALE)
        .functions(selection.POOL_FUNCTIONS, selection.MAX_POOL)
        .functions(selection.REDUCTION_FUNCTIONS, selection.REDUCTION)
        .functions(products.MUL_FUNCTIONS, products.PRODUCT)
        .functions(MATMUL_FUNCTIONS, products.MATRIX_PRODUCT)
        .functions(products.DIV_FUNCTIONS, products.QUOTIENT)
        .functions(products.ADDCMUL_FUNCTIONS, products.ADDCMUL)
        .functions(products.EINSUM_FUNCTIONS, products.EINSUM)
        .functions(decomposed.SOFTMAX_FUNCTIONS, decomposed.SOFTMAX)
        .functions(decomposed.NORM_FUNCTIONS, decomposed.NORM)
        .functions(decomposed.SDPA_FUNCTIONS, decomposed.ATTENTION)
        .functions(decomposed.MHA_FUNCTIONS, decomposed.MHA)
        .functions(decomposed.NORMALIZE_FUNCTIONS, decomposed.NORMALIZE)
    )
