"""Target specs -> the (N, K) scores to explain, and one batched backward pass over them.

A target spec is one of:

- ``None``: the model's top class for each input;
- an ``int``: the same class for every input;
- a sequence or 1-D tensor of N ints: one class per input;
- an (N, K) integer tensor (or nested sequence): K classes per input; results gain a K axis after N, computed from
  one forward pass with the K backward seeds batched;
- numpy integer scalars and arrays wherever ints and tensors are (``np.int64(3)``, ``np.array([3, 7])``,
  ``np.array([[1, 2], [3, 4]])``); numpy float arrays are refused, like float tensors;
- a callable ``f(output) -> Tensor`` of shape (N,) or (N, K): a score per input (and per target), for models whose
  output is not a class vector (segmentation maps, dicts, detection heads). It is always called on outputs whose
  row i belongs to the user's input i: methods that expand the batch call it once per block of N rows
  (`aligned_scores`). An (N, K) result spanning the logits' whole class or vocabulary axis is refused;
- a `RowTarget`: a callable whose scores depend on which input a row of the output belongs to (a language model's
  next-token logit at each input's own positions); methods that expand the batch (path points, noisy copies,
  perturbed copies) hand it the input index of every row they evaluate, in one call per chunk.

Class targets (None, ints, index tensors) read the class scores from the model output (`class_logits`): a tensor
(N, classes); an object with a ``logits`` attribute or a mapping with a ``"logits"`` key (Hugging Face's
``ModelOutput``, dicts); or a tuple / list whose first element is an (N, classes) tensor (``return_dict=False``).
A callable target gets the output as the model returned it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import torch
from torch import Tensor

from ._checks import int_option
from ._device import to_device

TargetFn: TypeAlias = Callable[[Any], Tensor]
TargetSpec: TypeAlias = (
    "int | np.integer | Sequence[int] | Sequence[Sequence[int]] | Tensor | np.ndarray | TargetFn | None"
)
BackwardStrategy: TypeAlias = Literal["auto", "vmap", "loop"]


class RowTarget:
    """A callable target whose scores depend on the input each output row belongs to.

    ``fn(output, rows) -> (n,) or (n, K)``: `rows` (n,) holds, for each of the n rows of `output`, the index of its
    input among the N inputs of the call. A plain callable target cannot tell that a method expanding the batch
    (Integrated Gradients' path points, SmoothGrad's noisy copies, Occlusion's occluded copies) evaluates input i
    at row j: this one is told, through `take`. Called directly, the rows are the inputs in order, ``arange(n)``.

    Example: the logit of each input's own token at each input's own position, ``(N, T, V)`` logits::

        RowTarget(lambda out, rows: out.logits[rows, pos[rows], tok[rows]])
    """

    def __init__(self, fn: Callable[[Any, Tensor], Tensor], rows: Tensor | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"RowTarget needs a callable fn(output, rows), got {type(fn).__name__}")
        self.fn = fn
        self.rows = rows

    def take(self, rows: Tensor) -> RowTarget:
        """The target of an expanded batch whose rows belong to the inputs `rows` (indices into this target's rows)."""
        rows = rows.detach().cpu().long()
        return RowTarget(self.fn, rows if self.rows is None else self.rows[rows])

    def __call__(self, output: Any) -> Tensor:
        if self.rows is not None:
            return self.fn(output, self.rows)
        n = class_rows(output)
        return self.fn(output, torch.arange(n))

    @property
    def __name__(self) -> str:  # named in the callable-target error messages
        return f"RowTarget({getattr(self.fn, '__name__', type(self.fn).__name__)})"


def class_rows(output: Any) -> int:
    """The number of rows N of a model output: a tensor's first dimension, else that of its logits (attribute, key
    or first element of a tuple)."""
    if isinstance(output, Tensor):
        return output.shape[0]
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        return output["logits"].shape[0]
    if isinstance(getattr(output, "logits", None), Tensor):
        return output.logits.shape[0]
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0].shape[0]
    raise ValueError(f"cannot tell the number of rows of a model output of type {type(output).__name__}")


@dataclass
class Targets:
    """A resolved target spec: scores are still attached to the autograd graph."""

    scores: Tensor  # (N, K)
    indices: Tensor | None  # (N, K) long class indices; None for callable targets
    multi: bool  # whether results keep the K axis


@dataclass(frozen=True)
class TargetPlan:
    """A target spec checked before any work: class indices or a callable, and whether K is kept.

    A callable's plan also knows the rows it scores: `inputs` is the number N of the user's inputs and `rows` (None:
    the N inputs themselves, in order) the input each row of an expanded batch belongs to (`aligned_scores`).
    Class indices are on the host where the user gave them (checked there, for free), or where the model's output
    gave them (its top classes, ``from_output``: in range by construction, never read on the host).
    """

    indices: Tensor | None  # (N, K) long, None for `top` and callable specs
    fn: TargetFn | None
    multi: bool
    rows: Tensor | None = None  # (R,) long on the cpu, in 0..inputs-1; callable plans of an expanded batch only
    inputs: int | None = None  # N, for callable plans
    from_output: bool = False  # indices the model's output gave: no range check (which would read them)

    def take(self, rows: Tensor) -> TargetPlan:
        """The plan of a batch whose row j belongs to row ``rows[j]`` of this plan's batch (an expanded batch: path
        points, noisy or masked copies; or a chunk of it). Class indices are gathered; a callable's plan composes
        the rows, so the callable still sees outputs aligned with the user's inputs. `rows` on the host: a callable's
        rows are kept there, and the output's indices (on the device) get them without a wait (`to_device`)."""
        if self.indices is not None:
            idx = self.indices[to_device(rows, self.indices.device) if self.from_output else rows.cpu()]
            return TargetPlan(idx, None, self.multi, from_output=self.from_output)
        if self.fn is None:
            return self  # "top class" is resolved per row
        if isinstance(self.fn, RowTarget):
            return TargetPlan(None, self.fn.take(rows), self.multi)  # told its rows: one call per chunk
        rows = rows.cpu().long()
        if self.rows is not None:
            rows = self.rows[rows]
        return TargetPlan(None, self.fn, self.multi, rows, self.inputs)


def check_target(target: object, n: int) -> TargetPlan:
    """Normalize a target spec before any work is done.

    Raises `TypeError`/`ValueError` for specs that are wrong whatever the model outputs (wrong type, wrong length,
    negative classes). Whether classes are in range is checked once the output is known (`resolve_targets`).
    """
    if isinstance(target, TargetPlan):
        return target
    if target is None:
        return TargetPlan(None, None, False)
    if callable(target) and not isinstance(target, Tensor):
        return TargetPlan(None, target, False, None, n)  # type: ignore[arg-type]
    if isinstance(target, np.generic | np.ndarray):
        # numpy ints are class indices like Python ints; np.float64 subclasses float, so it must be caught here
        if np.asarray(target).dtype.kind not in "iu":
            kind = "scalar" if isinstance(target, np.generic) else f"array of shape {np.shape(target)}"
            raise TypeError(
                f"target must hold integer class indices; got a numpy {np.asarray(target).dtype} {kind}; convert "
                "it with .astype(np.int64) if it holds whole numbers"
            )
        target = int(target) if isinstance(target, np.generic) else torch.from_numpy(np.asarray(target, np.int64))
    if isinstance(target, bool):
        raise TypeError("target must be an int class index, not a bool")
    if isinstance(target, int):
        return _checked(torch.full((n, 1), target, dtype=torch.long), multi=False)
    if isinstance(target, Tensor):
        t = target.detach().cpu()
    elif isinstance(target, Sequence) and not isinstance(target, str):
        try:
            t = torch.as_tensor(target)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(
                f"target sequence must hold ints (one per input) or equal-length rows of ints; got {target!r}"
            ) from exc
    else:
        raise TypeError(
            "target must be None, an int, a sequence or tensor of ints, an (N, K) tensor of ints, or a callable "
            f"f(output) -> (N,) scores; got {type(target).__name__}"
        )
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"target tensor must hold integer class indices, got dtype {t.dtype}")
    if t.dim() == 0:
        return _checked(t.long().expand(n, 1), multi=False)
    if t.dim() == 1:
        if t.shape[0] != n:
            raise ValueError(f"target has {t.shape[0]} entries but the batch has {n} inputs; give one per input")
        return _checked(t.long().unsqueeze(1), multi=False)
    if t.dim() == 2:
        if t.shape[0] != n or t.shape[1] == 0:
            raise ValueError(
                f"an (N, K) target must have N = {n} rows (one per input) and K >= 1 columns; got {tuple(t.shape)}"
            )
        return _checked(t.long(), multi=True)
    raise ValueError(f"target must be 0-, 1- or 2-D (N, K); got shape {tuple(t.shape)}")


def _checked(idx: Tensor, multi: bool) -> TargetPlan:
    if (idx < 0).any():
        raise ValueError(f"target classes must be >= 0; got {idx.min().item()} (negative indices are not wrapped)")
    return TargetPlan(idx, None, multi)


_OUTPUT_RULE = (
    "a tensor (N, classes), an output with a `logits` attribute or key (Hugging Face ModelOutput, dict) holding one, "
    "or a tuple whose first element is one"
)


def _find_logits(output: Any) -> tuple[Any, str, str]:
    """What class targets read in `output`: (the object found, where it was found in words, the Python expression
    that reaches it from ``out``)."""
    if not isinstance(output, Tensor):
        if isinstance(output, Mapping) and "logits" in output:
            attr = isinstance(getattr(output, "logits", None), Tensor)  # ModelOutput: the attribute users write
            return output["logits"], "the output's 'logits' key", "out.logits" if attr else "out['logits']"
        if isinstance(getattr(output, "logits", None), Tensor):
            return output.logits, "the output's logits attribute", "out.logits"
        if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
            return output[0], "the output tuple's first element", "out[0]"
    return output, "the model output", "out"


def suggest_callable(output: Any, cls: int | None = None) -> tuple[str, str] | None:
    """A callable target that is right for the shape of `output`, and what it scores in words: one score per input,
    (N,), read where class targets read (`class_logits`) or, where the output has no logits, from a tensor field
    (an (N, D) one first: a pooled output).

    (N,) -> the output itself; (N, C) -> class ``cls``; (N, T, V) (a language model) -> token ``cls`` at the last
    position, or with ``cls`` None the top token's logit there; (N, C, H, W, ...) (a segmentation map) -> class
    ``cls`` summed over the map. ``cls`` is used where it is in range, else 0. None where no tensor with a batch
    axis is found."""
    found, _, expr = _find_logits(output)
    field = None
    if not isinstance(found, Tensor) and isinstance(output, Mapping):
        tensors = [(k, v) for k, v in output.items() if isinstance(v, Tensor) and v.dim() >= 1]
        tensors.sort(key=lambda kv: kv[1].dim() != 2)  # an (N, D) field first: a pooled output
        if tensors:
            field, found = tensors[0]
            expr = f"out.{field}" if hasattr(type(output), "__dataclass_fields__") else f"out[{field!r}]"
    if not isinstance(found, Tensor) or found.dim() == 0:
        return None
    dim = found.dim()
    axis = -1 if dim <= 3 else 1
    c = cls if cls is not None and 0 <= cls < found.shape[axis] else 0
    if dim == 1:
        return f"lambda out: {expr}", "the output's one score per input"
    if dim == 2:
        return f"lambda out: {expr}[:, {c}]", (f"unit {c} of {field}" if field else f"class {c}'s score")
    if dim == 3:
        if cls is None and field is None:
            return f"lambda out: {expr}[:, -1].max(dim=-1).values", "the top token's logit at the last position"
        return f"lambda out: {expr}[:, -1, {c}]", f"the last position's {'unit' if field else 'logit of token'} {c}"
    return f"lambda out: {expr}[:, {c}].flatten(1).sum(1)", f"class {c}'s score summed over the map"


def _shape_words(t: Tensor) -> str:
    names = {2: "(N, classes)", 3: "(N, T, V): a score per position and vocabulary entry", 4: "(N, C, H, W): a map"}
    return f"{tuple(t.shape)} {names.get(t.dim(), '')}".strip()


def _fields(output: Any) -> str:
    if not isinstance(output, Mapping):
        return ""
    shapes = [f"{k} {tuple(v.shape)}" for k, v in output.items() if isinstance(v, Tensor)]
    return f" (fields: {', '.join(shapes)}; no class scores)" if shapes else ""


def class_logits(output: Any, *, cls: int | None = None) -> Tensor:
    """The (N, classes) class scores in a model output: the tensor itself, its ``logits`` attribute or ``"logits"``
    key (Hugging Face ``ModelOutput``, dicts), or the first element of a tuple / list. Raises `ValueError` naming
    the rule where none applies, or where the ``logits`` found is not 2-D, with a callable target to use instead
    that is right for the output's shape (`suggest_callable`; `cls`: the class asked for, used in it)."""
    found, where, _ = _find_logits(output)
    if isinstance(found, Tensor) and found.dim() == 2:
        return found
    got = f"a tensor of shape {_shape_words(found)}" if isinstance(found, Tensor) else type(found).__name__
    got += "" if isinstance(found, Tensor) else _fields(output)
    fix = suggest_callable(output, cls)
    if fix is None:
        hint = "pass a callable target that maps the output to one score per input, (N,)"
    else:
        hint = f"pass a callable target that scores each input instead, e.g. {fix[1]}: target={fix[0]}"
    raise ValueError(
        f"class targets need a model output of shape (N, classes) ({_OUTPUT_RULE}), but {where} is {got}; {hint}"
    )


def _one_class(plan: TargetPlan) -> int | None:
    """The class every row asks for, if there is one (for the suggestion of an error message)."""
    if plan.indices is None or plan.indices.numel() == 0:
        return None
    first = int(plan.indices.flatten()[0])  # an error message's suggestion: reading is fine there
    return first if bool((plan.indices == first).all()) else None


def resolve_targets(target: object, output: Any, n: int) -> Targets:
    """Turn a target spec (or a checked `TargetPlan`) and the model output into the (N, K) scores to differentiate.

    Class targets read the output through `class_logits`; a callable gets the output as it is, cut into blocks of
    one row per user input where the batch was expanded (`aligned_scores`)."""
    plan = check_target(target, n)
    if plan.fn is not None:
        return aligned_scores(plan, output, n)
    found = _find_logits(output)[0]
    # the class of the error message's suggestion only where there is an error: it reads the indices
    output = class_logits(output, cls=None if isinstance(found, Tensor) and found.dim() == 2 else _one_class(plan))
    if output.shape[0] != n:
        raise ValueError(f"model output has {output.shape[0]} rows for {n} inputs; the batch axis must be kept")
    classes = output.shape[1]
    if plan.indices is None:
        idx = output.detach().argmax(dim=1, keepdim=True)
    else:
        idx = plan.indices
        if not plan.from_output and (idx >= classes).any():  # the user's indices, on the host
            bad = idx[idx >= classes].unique().tolist()
            raise ValueError(
                f"target class {bad[0] if len(bad) == 1 else bad} is out of range: the model has {classes} classes "
                f"(valid targets are 0..{classes - 1})"
            )
        idx = to_device(idx, output.device)
    return Targets(scores=output.gather(1, idx), indices=idx, multi=plan.multi)


# -- callable targets: the user's rows --------------------------------------------------------------------------------
def aligned_scores(plan: TargetPlan, output: Any, n: int, *, connected: bool = True) -> Targets:
    """The (R, K) scores of a callable target on the output of R rows, calling it only on outputs whose rows are the
    user's N inputs in order (row i of what it sees belongs to input i).

    Without an expansion (``plan.rows`` None, or the N inputs in order) the callable gets the output as it is. In
    an expanded batch (path points, noisy copies, occluded or masked inputs, baselines) the output is cut into
    blocks: block k holds the k-th row of every input, so the callable runs once per block (m = R / N calls for a
    batch of m rows per input), each on N rows. Tensors with one row per row of the batch are cut (a view of
    contiguous blocks: ``split``, whose backward is one concatenation; else one ``index_select``); mappings, tuples
    and lists are cut field by field; anything else (a cache object) is passed whole. A block that a chunk covers
    only in part is filled up with copies of another row; their scores are dropped. The K target seeds stay
    batched: the blocks' (N, K) results are stacked into one (R, K) tensor before the one backward pass.
    `connected`: the scores must be connected to the output (False for forward-only methods under ``no_grad``).
    """
    fn = plan.fn
    assert fn is not None
    rows, inputs = plan.rows, plan.inputs
    if rows is None or inputs is None or (inputs == n and torch.equal(rows, torch.arange(n))):
        scores = _call(fn, output, n, None, connected)
        _check_multi(scores, output)
        return Targets(
            scores=scores if scores.dim() == 2 else scores.unsqueeze(1), indices=None, multi=scores.dim() == 2
        )
    if rows.shape[0] != n:
        raise RuntimeError(f"internal: a callable's plan covers {rows.shape[0]} rows but the output has {n}")
    slot, index, m = _blocks(rows, inputs)
    blocks = _cut(output, index, n, inputs, m)
    parts = []
    for k, block in enumerate(blocks):
        s = _call(fn, block, inputs, (k, m), connected)
        if parts and s.shape != parts[0].shape:
            raise ValueError(
                f"the target callable returned shape {tuple(s.shape)} on block {k} of the expanded batch but "
                f"{tuple(parts[0].shape)} on block 0; it must return the same (N,) or (N, K) each time"
            )
        parts.append(s)
    _check_multi(parts[0], blocks[0])
    stacked = torch.stack(parts).flatten(0, 1)  # (m * N[, K]), block-major like `slot`
    scores = stacked.index_select(0, to_device(slot, stacked.device))
    multi = scores.dim() == 2
    return Targets(scores=scores if multi else scores.unsqueeze(1), indices=None, multi=multi)


def _blocks(rows: Tensor, inputs: int) -> tuple[Tensor, Tensor | None, int]:
    """For rows of an expanded batch (the input of each row): each row's slot ``k * inputs + input`` in m blocks of
    `inputs` rows (block k: the k-th row of every input), the rows that fill the slots (None: the batch is already
    laid out so, in order and complete), and m."""
    r = rows.shape[0]
    counts = torch.bincount(rows, minlength=inputs)
    order = torch.argsort(rows, stable=True)
    first = torch.cumsum(counts, 0) - counts
    occurrence = torch.empty_like(rows)
    occurrence[order] = torch.arange(r) - first[rows[order]]
    m = int(counts.max())
    slot = occurrence * inputs + rows
    if m * inputs == r and torch.equal(slot, torch.arange(r)):
        return slot, None, m
    index = torch.zeros(m * inputs, dtype=torch.long)  # slots no row fills: a copy of row 0, its score dropped
    index[slot] = torch.arange(r)
    return slot, index, m


def _cut(output: Any, index: Tensor | None, r: int, inputs: int, m: int) -> list[Any]:
    """`output` of r rows as m outputs of `inputs` rows each: block k holds rows ``index[k*inputs:(k+1)*inputs]``
    (``index`` None: rows in order)."""
    if isinstance(output, Tensor):
        if output.dim() == 0 or output.shape[0] != r:
            return [output] * m
        t = output if index is None else output.index_select(0, to_device(index, output.device))
        return list(t.split(inputs))
    if isinstance(output, Mapping):
        fields = {key: _cut(value, index, r, inputs, m) for key, value in output.items()}
        return [_rebuild_mapping(output, {key: cut[k] for key, cut in fields.items()}) for k in range(m)]
    if isinstance(output, tuple | list):
        items = [_cut(value, index, r, inputs, m) for value in output]
        return [_rebuild_sequence(output, [cut[k] for cut in items]) for k in range(m)]
    return [output] * m


def _rebuild_mapping(like: Mapping[Any, Any], fields: dict[Any, Any]) -> Any:
    if hasattr(type(like), "__dataclass_fields__"):  # Hugging Face's ModelOutput: keyword fields
        return type(like)(**fields)
    try:
        return type(like)(fields)
    except TypeError:
        return dict(fields)


def _rebuild_sequence(like: tuple[Any, ...] | list[Any], items: list[Any]) -> Any:
    if hasattr(like, "_fields"):  # a namedtuple
        return type(like)(*items)
    return type(like)(items) if type(like) in (tuple, list) else tuple(items)


def _call(fn: TargetFn, output: Any, n: int, block: tuple[int, int] | None, connected: bool) -> Tensor:
    """`fn(output)` checked: (n,) or (n, K) scores connected to the output."""
    try:
        scores = fn(output)
    except Exception as exc:
        got = f"a tensor of shape {tuple(output.shape)}" if isinstance(output, Tensor) else type(output).__name__
        raise RuntimeError(
            f"the target callable {getattr(fn, '__name__', fn)!r} failed on the model output ({got}) with "
            f"{type(exc).__name__}: {exc}; it must map the output to (N,) or (N, K) scores"
        ) from exc
    if not isinstance(scores, Tensor) or scores.dim() not in (1, 2) or scores.shape[0] != n:
        got = f"shape {tuple(scores.shape)}" if isinstance(scores, Tensor) else type(scores).__name__
        where = (
            ""
            if block is None
            else f" (the method runs the model on {block[1]} rows per input; the callable is called once for each, "
            "on an output of N rows, one per input)"
        )
        fix = suggest_callable(output)
        raise ValueError(
            f"a callable target must return a tensor of shape (N,) or (N, K) with N = {n} (one score per input"
            f"{where}); got {got}. Reduce per input" + (f", e.g. {fix[1]}: target={fix[0]}" if fix else "")
        )
    if connected and not scores.requires_grad:
        raise ValueError("the target callable returned scores that are not connected to the model output")
    # a view (``out.logits[:, -1, c]``) would keep the whole output alive until the scores go, through the backward
    # pass: a language model's logits (N, T, V), as large as the gradient the backward pass allocates at them
    return scores.clone() if scores._is_view() else scores


def _check_multi(scores: Tensor, output: Any) -> None:
    """Refuse an (N, V) result that is a whole row of class scores: (N, K) results are K targets (K backward passes),
    and K equal to the length of the class axis of 2-D logits (N, C) or the vocabulary axis of 3-D ones (N, T, V)
    is a callable that forgot to pick its class or token (``out.logits[:, 3]`` on (N, T, V) logits: position 3's
    whole vocabulary)."""
    if scores.dim() != 2:
        return
    logits, _, expr = _find_logits(output)
    if not isinstance(logits, Tensor) or logits.dim() not in (2, 3) or logits.shape[-1] < 2:
        return
    v = logits.shape[-1]
    if scores.shape[1] != v:
        return
    what = "class" if logits.dim() == 2 else "vocabulary entry"
    fix = suggest_callable(output)
    assert fix is not None  # the output holds logits
    if logits.dim() == 2:  # class targets read (N, C) logits: an index tensor asks for every class explicitly
        several = f"for every class, pass an index tensor target, torch.arange({v}).repeat({scores.shape[0]}, 1)"
    else:  # class targets cannot read (N, T, V) logits: name the tokens
        several = f"for several tokens, name them: target=lambda out: {expr}[:, -1, [0, 1]]"
    raise ValueError(
        f"the target callable returned shape {tuple(scores.shape)}: one score per {what} of the logits "
        f"{tuple(logits.shape)}, which would be read as {v} separate targets. A callable returns (N,) or (N, K) scores "
        f"of the targets you choose, e.g. {fix[1]}: target={fix[0]}; {several}"
    )


VMAP_CHUNK = 16  # seeds per vectorized backward pass: its memory grows with the chunk, not with K


# The largest backward pass (elements of the tensors differentiated, all N rows) for which ``backward="auto"`` runs
# vmap: below it one pass over N rows leaves the device idle between kernels (launches, Python, a core's cache), so
# batching K seeds into one pass wins; above it the device is busy and the batching rules' copies cost more than the
# launches they save. One rule for every device: the measured crossovers lie near it on an H100 and on 2 CPU cores
# (`auto_strategy`).
VMAP_WORK = 300_000


def auto_strategy(device: torch.device, work: int | None = None) -> Literal["vmap", "loop"]:
    """What ``backward="auto"`` runs for K > 1 targets: vmap where one backward pass is too small to keep the device
    busy, the loop (K passes over the retained graph) otherwise, by `work`: the elements of the tensors
    differentiated, all rows (an (N, 3, 224, 224) batch: N x 150,528; Grad-CAM's layer4 output of a resnet18 at
    64x64: N x 2,048). vmap where `work` <= `VMAP_WORK` (300,000), on every device; `device` decides only where the
    work is not given (None: the loop on the CPU, vmap elsewhere).

    A vectorized pass runs the same arithmetic as K passes plus the batching rules' copies; it saves K - 1 sets of
    kernel launches and Python, which matters while one pass is too small to fill the device. The size of what is
    differentiated stands for the size of each operation of the pass: an input gradient's operations are a few times
    its input (a stem convolution's output), Grad-CAM's are no larger than its layer's output.

    Measured, median ms of ``attribute`` with K = 10 targets per input, vmap / loop, the rule's pick in bold:

    ================================  ===============  ===============  ===============  ===============
    H100, resnet50 224 (bench_gpu)    N = 1 (150k)     N = 8 (1.2M)     N = 64           N = 128
    ================================  ===============  ===============  ===============  ===============
    Saliency                          **31.7** / 44.4  65.2 / **61.0**  333 / **293**    636 / **555**
    Guided Backprop                   **40.9** / 60.5  72.5 / **69.5**  349 / **311**    670 / **590**
    ================================  ===============  ===============  ===============  ===============

    On 2 CPU cores (resnet18 at 64x64: an input of 12,288 elements per image; Grad-CAM at layer4, 2,048;
    ``python benchmarks/bench_targets.py --ns 1 8 64 128 --size 64 --k 10 --models resnet18``,
    ``benchmarks/results/targets-cpu.md``; these runs vary by 10-20%, the borderline rows were run again with one
    thread and 9 repeats): vmap wins the input gradients at N = 1 (0.81-0.85x the loop), ties at N = 8 (98,304
    elements: 0.93-0.98x with one thread, 0.94-1.10x with two), loses from N = 64 (786,432: 1.21-1.38x); for Grad-CAM
    it wins or ties up to N = 128 (131,072 elements: 0.97-1.01x; 262,144: 0.90x with one thread). The crossovers,
    0.15-1.2 million elements on the H100 and 0.1-0.8 million on the CPU, both hold 300,000.
    """
    if work is None:
        return "loop" if device.type == "cpu" else "vmap"
    return "vmap" if work <= VMAP_WORK else "loop"


def batched_grad(
    scores: Tensor, inputs: Sequence[Tensor], *, strategy: BackwardStrategy = "auto", chunk: int = VMAP_CHUNK
) -> list[Tensor]:
    """Gradients of each column of `scores` (N, K) w.r.t. each of `inputs`, as (N, K, *input.shape[1:]) tensors.

    Inputs of the N samples must be independent (no batch statistics: the model is in eval mode), so the gradient of
    the column sum gives every sample's gradient at once. With K > 1 the K seeds are batched: ``"vmap"`` runs
    vectorized backward passes (`torch.autograd.grad(..., is_grads_batched=True)`) over at most `chunk` seeds at a
    time, which bounds the memory; ``"loop"`` runs K backward passes over the retained graph. ``"auto"`` picks the
    faster one for the work and the device (`auto_strategy`: vmap for small passes) and falls back to the loop for
    operations vmap cannot batch or when vmap runs out of memory, with a RuntimeWarning (once per reason) that says
    why.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (N, K), got shape {tuple(scores.shape)}")
    int_option("chunk", chunk, "an int >= 1 (seeds per vectorized backward pass)")
    n, k = scores.shape
    try:
        if k == 1:
            grads = torch.autograd.grad(scores.sum(), inputs)
            return [g.unsqueeze(1) for g in grads]
        work = sum(t.numel() for t in inputs)
        how = auto_strategy(scores.device, work) if strategy == "auto" else strategy
        if how == "vmap":
            try:
                return _vmap_grad(scores, inputs, chunk, fallback=strategy == "auto")
            except (RuntimeError, NotImplementedError) as exc:
                if strategy == "vmap":
                    raise
                _warn_fallback(exc)
        per_k = [torch.autograd.grad(scores[:, j].sum(), inputs, retain_graph=j < k - 1) for j in range(k)]
        return [torch.stack([g[i] for g in per_k], dim=1) for i in range(len(inputs))]
    except RuntimeError as exc:
        if "does not require grad" in str(exc) or "not have been used in the graph" in str(exc):
            raise RuntimeError(
                "the target score is not connected to the tensor being explained (is the layer used in the "
                "forward pass? does the callable target use the model output?)"
            ) from exc
        raise


_FALLBACKS_WARNED: set[str] = set()


def _warn_fallback(exc: BaseException) -> None:
    """Say once per reason that ``backward="auto"`` fell back from vmap to the loop, and why: the results are the
    same, the time and memory are not, and an out-of-memory error is never passed over in silence."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    reason = f"{type(exc).__name__}: {detail}"
    if reason in _FALLBACKS_WARNED:
        return
    _FALLBACKS_WARNED.add(reason)
    if isinstance(exc, torch.OutOfMemoryError):
        why = "the vectorized backward pass ran out of memory"
        fix = "lower the vmap chunk (batched_grad(chunk=...)) or the batch, or pass backward='loop'"
    else:
        why = "vmap cannot batch an operation of this model"
        fix = "pass backward='loop' to skip the attempt"
    warnings.warn(
        f"backward='auto': {why} ({reason}); fell back to one backward pass per target (same results, slower); {fix}",
        RuntimeWarning,
        stacklevel=4,
    )


def _vmap_grad(scores: Tensor, inputs: Sequence[Tensor], chunk: int, fallback: bool) -> list[Tensor]:
    """Vectorized backward passes over chunks of the K one-hot seeds; (N, K, ...) per input."""
    n, k = scores.shape
    eye = torch.eye(k, dtype=scores.dtype, device=scores.device)
    parts: list[tuple[Tensor, ...]] = []
    for c in range(0, k, chunk):
        seeds = eye[c : c + chunk].unsqueeze(1).expand(-1, n, k)
        # the graph is kept for the next chunk, and under "auto" also after the last, so a failed attempt can fall
        # back to the loop
        last = c + chunk >= k
        parts.append(
            torch.autograd.grad(
                scores, inputs, grad_outputs=seeds, is_grads_batched=True, retain_graph=fallback or not last
            )
        )
    return [torch.cat([p[i] for p in parts]).movedim(0, 1) for i in range(len(inputs))]
