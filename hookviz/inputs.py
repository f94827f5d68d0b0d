"""A model and the batch it is given: where the model lives (device, dtype), what its first convolution takes, and
the checks a batch passes before any work (`check_model_inputs`).

Image decoding and presets are in `hookviz.images` (one layer up: it uses the checks here).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ._device import to_device, to_host

__all__ = [
    "check_channels",
    "check_finite",
    "check_model_inputs",
    "expected_channels",
    "model_device",
    "model_dtype",
]

_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# The batch layout each convolution takes (torch also accepts unbatched inputs, which would lose the batch axis).
_CONV_LAYOUTS = {nn.Conv1d: "(N, C, L)", nn.Conv2d: "(N, C, H, W)", nn.Conv3d: "(N, C, D, H, W)"}


def _check_module(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter, else its first buffer, else cpu."""
    _check_module(model)
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return torch.device("cpu")


def _first_conv(model: nn.Module) -> tuple[str, nn.Module] | None:
    for name, module in model.named_modules():
        if isinstance(module, _CONV_TYPES):
            return name, module
    return None


def expected_channels(model: nn.Module) -> int | None:
    """in_channels of the first nn.Conv1d/2d/3d in ``model.modules()`` order; None if none (or a lazy one not yet
    initialised)."""
    _check_module(model)
    found = _first_conv(model)
    # LazyConv*d report in_channels == 0 until their first forward.
    return None if found is None else found[1].in_channels or None


def check_channels(model: nn.Module, x: Tensor, where: str = "x") -> None:
    """Raise ValueError if ``x.shape[1]`` (x: (N, C, ...)) differs from :func:`expected_channels` when that is known.

    `where` names `x` in the messages.
    """
    _check_module(model)
    if not isinstance(x, Tensor):
        raise TypeError(f"{where}: expected a tensor (N, C, ...), got {type(x).__name__}")
    if x.ndim < 2:
        raise ValueError(f"{where}: expected a tensor (N, C, ...) with a channel axis, got shape {tuple(x.shape)}")
    found = _first_conv(model)
    expected = None if found is None else found[1].in_channels or None
    got = x.shape[1]
    if found is None or expected is None or got == expected:
        return
    name, conv = found
    # the fix names what the caller has, a tensor (float tensors reach every method unchanged), not a loader it may
    # never have called; each suggested expression gives the channel count expected
    if got == 1:
        hint = f"repeat its one channel: x.expand(-1, {expected}, *x.shape[2:])"
    elif expected == 1:
        hint = "average its channels to one: x.mean(dim=1, keepdim=True) (or weight them, e.g. as luma)"
    elif got == expected + 1 == 4:
        hint = "drop its 4th (alpha) channel: x[:, :3]"
    else:
        hint = f"give it the {expected} channels the model was trained on"
    raise ValueError(
        f"{where} has {got} channels (shape {tuple(x.shape)}) but the model's first convolution "
        f"{name or '<model>'!r} ({conv}) expects {expected}; {hint}"
    )


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """dtype of the model's first floating-point parameter, else its first floating-point buffer; None if none."""
    _check_module(model)
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


# dtype -> the dtype its finiteness sum accumulates in
_SUMMED = {
    torch.float32: torch.float32,
    torch.float64: torch.float64,
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
}


# the finiteness sums queued by `check_finite` inside `finite_checks_deferred`, per thread: (tensor, name, its sum)
_DEFERRED = threading.local()


def check_finite(t: Tensor, name: str) -> None:
    """Raise ValueError if `t` holds NaN or +-Inf, naming `name` and how many: they give meaningless maps silently.

    Costs one reduction and one device sync per call (not per sample): the sum, which is finite only if every value
    is (NaN and Inf propagate through it); the exact count only where it is not (a bad value, or a sum that
    overflowed). Inside `finite_checks_deferred` the sum is queued instead, and read with the others (and whatever
    else the caller needs from the device before its work) by `read_deferred`: one wait for all of them.
    """
    if not (t.is_floating_point() or t.is_complex()):
        return
    if t.dtype in _SUMMED:
        # one pass, accumulated in float32 at least (a float16 batch's sum would overflow at 65504), instead of the
        # six elementwise operations of isfinite and the count
        total = t.detach().sum(dtype=_SUMMED[t.dtype])
        queue: list[tuple[Tensor, str, Tensor]] | None = getattr(_DEFERRED, "queue", None)
        if queue is not None:
            queue.append((t, name, total))
            return
        if math.isfinite(float(to_host([total])[0])):  # through `to_host`: its wait also runs earlier calls' checks
            return
    _raise_if_not_finite(t, name)


@contextmanager
def finite_checks_deferred() -> Iterator[None]:
    """`check_finite` calls in the block (this thread) queue their sums instead of reading each; `read_deferred`
    reads them, before the caller's work, in one wait with the values it adds. A method that needs values from the
    device before its work (KernelShap's varying groups) so waits once per call, not twice. The queue goes at the
    end of the block whatever happens; an inner block keeps the outer one's queue."""
    if getattr(_DEFERRED, "queue", None) is not None:
        yield
        return
    _DEFERRED.queue = []
    try:
        yield
    finally:
        _DEFERRED.queue = None


def read_deferred(extra: list[Tensor]) -> list[Tensor]:
    """The queued finiteness sums and `extra` read in one wait (`to_host`); `ValueError` for the first queued tensor
    that is not finite (as `check_finite` raises it); `extra` returned on the host. Later checks read at once."""
    queue: list[tuple[Tensor, str, Tensor]] = getattr(_DEFERRED, "queue", None) or []
    _DEFERRED.queue = None
    values = to_host([total for _, _, total in queue] + extra)
    for (t, name, _), total in zip(queue, values, strict=False):
        if not math.isfinite(float(total)):
            _raise_if_not_finite(t, name)
    return values[len(queue) :]


def _raise_if_not_finite(t: Tensor, name: str) -> None:
    """`check_finite`'s error, with the exact count, where `t` holds a non-finite value (its sum may also just have
    overflowed: then nothing is raised)."""
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise ValueError(
            f"{name}: found {bad} non-finite value(s) (NaN or Inf) among {t.numel()}; expected finite values (maps "
            f"computed through them are meaningless); replace them first, e.g. with torch.nan_to_num"
        )


def check_model_inputs(model: nn.Module, x: Any, where: str = "inputs", *, conv_check: bool = True) -> Tensor:
    """Check a batch `x` (N, ...) against `model` before any work and return it ready for the model.

    Refused, with a message naming `where`, what came and what is expected: non-tensors (`TypeError`), tensors
    without a batch axis or with N = 0, a rank other than the first convolution's (``nn.Conv1d``: 3-D (N, C, L),
    ``nn.Conv2d``: 4-D (N, C, H, W), ``nn.Conv3d``: 5-D (N, C, D, H, W)), a channel count other than its
    ``in_channels``, non-float dtypes, sparse and meta tensors (`TypeError`/`ValueError`), NaN or Inf values. The
    first convolution is the first in ``model.modules()`` order: a model whose forward reshapes its input before
    that convolution (e.g. folds (N, T, C, H, W) into (N * T, C, H, W)) must get the reshaped batch; a flat (N, F)
    batch is passed on unchecked against it (models that reshape features into an image), and so is every tensor
    with ``conv_check=False`` (the tensors of a tuple of inputs: which one feeds the convolution is unknown).

    Convention: the result is cast to the model's floating-point parameter dtype (`model_dtype`; unchanged for a model
    without parameters or buffers) and moved to its device; `visualize` goes through the same cast after
    `load_images`: a float64 batch on a float32 model is explained in float32, the precision the model computes in,
    and a float64 model gets float64 inputs. A tensor created under
    ``torch.inference_mode()`` is copied into a normal tensor (inference tensors cannot take part in autograd).
    The caller's tensor is never modified.
    """
    if not isinstance(x, Tensor):
        raise TypeError(
            f"{where}: attribute() takes a batch tensor (N, ...), got {type(x).__name__}; use visualize() for paths, "
            "PIL images and numpy arrays, or hookviz.load_images(...).tensor"
        )
    if x.dim() < 2:
        raise ValueError(f"{where} need a batch axis first, (N, ...); got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{where} must be a floating-point tensor, got {x.dtype}; convert with x.float() / 255")
    if x.layout != torch.strided:
        raise TypeError(f"{where} must be a dense tensor, got layout {x.layout}; convert with x.to_dense()")
    if x.is_meta:
        raise ValueError(f"{where} are on the meta device (shapes without data); pass a tensor that holds values")
    if x.shape[0] == 0:
        raise ValueError(f"{where} hold an empty batch (N = 0), shape {tuple(x.shape)}; expected N >= 1")
    found = _first_conv(model) if conv_check and x.dim() != 2 else None
    if found is not None:
        name, conv = found
        layout = next(v for k, v in _CONV_LAYOUTS.items() if isinstance(conv, k))
        rank = layout.count(",") + 1
        if x.dim() != rank:
            hint = (
                "add the batch axis with x.unsqueeze(0) (or pass the image to visualize())"
                if x.dim() == rank - 1
                else f"give one {rank}-D batch"
            )
            raise ValueError(
                f"{where} have shape {tuple(x.shape)} ({x.dim()}-D) but the model's first convolution "
                f"{name or '<model>'!r} ({type(conv).__name__}) takes {rank}-D batches {layout}; {hint}"
            )
        check_channels(model, x, where)
    check_finite(x, where)  # on the host, for a batch that comes from there: no wait
    dtype = model_dtype(model) or x.dtype
    out = to_device(x.to(dtype), model_device(model))  # cast where it is; to a GPU without a wait (pinned memory)
    if out.is_inference() and not torch.is_inference_mode_enabled():
        out = out.clone()  # a clone made outside inference_mode is a normal tensor
    return out
