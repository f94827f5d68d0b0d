"""Turn raw attribution tensors into pixels: channel reductions, normalization modes, colour maps, overlays.

Conventions: maps are laid out ``(..., C, H, W)`` with any number of leading axes; every function here works in torch
on the tensor's device and batch-wide. Only `to_pil` leaves torch (it is the one place that moves data to the cpu).
Normalization is per sample, with an explicit ``eps``: a constant map gives a constant image and never NaN.
"""

from __future__ import annotations

import difflib
import functools
import math
from numbers import Real
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "NORMALIZATIONS",
    "REDUCTIONS",
    "colormap",
    "normalize",
    "overlay",
    "reduce_channels",
    "resize",
    "to_pil",
    "to_uint8",
]

NORMALIZATIONS = ("seed", "minmax", "absmax", "percentile")
REDUCTIONS = ("sum", "abs-sum", "max-abs", "l2")

# torch.quantile refuses inputs above 2**24 elements in many torch releases; above this we interpolate between
# two kthvalue order statistics instead, which gives the same "linear" quantile.
_QUANTILE_MAX_NUMEL = 2**24
_LUT_SIZE = 256


def _check_tensor(x: object, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _as_float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _check_map_layout(x: Tensor, name: str, channels: int | None = None) -> None:
    if x.ndim < 3:
        raise ValueError(
            f"{name} must have shape (..., C, H, W) with at least 3 dimensions, got shape {tuple(x.shape)}"
        )
    if channels is not None and x.shape[-3] != channels:
        raise ValueError(
            f"{name} must have {channels} channel(s) at dim -3, i.e. shape (..., {channels}, H, W), "
            f"got shape {tuple(x.shape)}"
        )


def reduce_channels(attr: Tensor, how: str | None) -> Tensor:
    """Reduce the channel axis of ``(..., C, H, W)`` to ``(..., 1, H, W)``.

    ``how``: ``"sum"`` (signed sum), ``"abs-sum"`` (sum of ``|a|``), ``"max-abs"`` (max over C of ``|a|``),
    ``"l2"`` (``sqrt(sum a^2)``), or None to return ``attr`` unchanged (channels kept).
    """
    _check_tensor(attr, "attr")
    if how is None:
        return attr
    if how not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS} or None, got {how!r}")
    _check_map_layout(attr, "attr")
    a = _as_float(attr)
    if how == "sum":
        return a.sum(dim=-3, keepdim=True)
    if how == "abs-sum":
        return a.abs().sum(dim=-3, keepdim=True)
    if how == "max-abs":
        return a.abs().amax(dim=-3, keepdim=True)
    # vector_norm rescales internally, so large values do not overflow the way a.pow(2).sum().sqrt() can
    return torch.linalg.vector_norm(a, ord=2, dim=-3, keepdim=True)


def _linear_quantile(flat: Tensor, q: float) -> Tensor:
    """Quantile along the last axis with torch.quantile's default "linear" interpolation, shape (..., 1)."""
    n = flat.shape[-1]
    if flat.numel() <= _QUANTILE_MAX_NUMEL:
        return torch.quantile(flat, q, dim=-1, keepdim=True)
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    v_lo = flat.kthvalue(lo + 1, dim=-1, keepdim=True).values  # kthvalue is 1-indexed
    if hi == lo or pos == lo:
        return v_lo
    v_hi = flat.kthvalue(hi + 1, dim=-1, keepdim=True).values
    return v_lo + (v_hi - v_lo) * (pos - lo)


def normalize(
    attr: Tensor,
    mode: str = "minmax",
    *,
    sample_dims: int = 1,
    percentile: float = 99.0,
    eps: float = 1e-8,
) -> Tensor:
    """Map each sample of ``attr`` to ``[0, 1]`` for display; same shape, floating point.

    The first ``sample_dims`` axes index samples (1 for ``(N, C, H, W)``, 2 for ``(N, K, C, H, W)``); statistics are
    taken over all remaining axes (channels and pixels), so samples with different scales do not affect each other.

    Modes (``eps`` keeps every division finite; a constant map gives a constant image):

    - ``"seed"``: ``(a - mean) / (std + eps) * 0.1 + 0.5`` clipped to ``[0, 1]`` (population std, as the hooks
      tutorial's Guided Backprop visualizer does with numpy); constant -> 0.5.
    - ``"minmax"``: ``(a - min) / (max - min + eps)``; constant -> 0.
    - ``"absmax"``: ``a / (2 * max|a| + eps) + 0.5``; keeps the sign readable: 0 -> 0.5, all-zero -> 0.5.
    - ``"percentile"``: ``a / (q + eps)`` with ``q`` the ``percentile``-th percentile of ``|a|``, clipped to
      ``[-1, 1]``, then ``* 0.5 + 0.5`` (0 -> 0.5); outliers above the percentile saturate instead of
      flattening the rest of the map.
    """
    _check_tensor(attr, "attr")
    if mode not in NORMALIZATIONS:
        raise ValueError(f"mode must be one of {NORMALIZATIONS}, got {mode!r}")
    if isinstance(sample_dims, bool) or not isinstance(sample_dims, int) or not 0 <= sample_dims < attr.ndim:
        raise ValueError(
            f"sample_dims must be an int in [0, attr.ndim) = [0, {attr.ndim}) so that at least one axis is left "
            f"for the statistics, got {sample_dims!r} for attr of shape {tuple(attr.shape)}"
        )
    if isinstance(eps, bool) or not isinstance(eps, Real) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    if mode == "percentile" and (
        isinstance(percentile, bool) or not isinstance(percentile, Real) or not 0 < percentile <= 100
    ):
        raise ValueError(f"percentile must be a number in (0, 100], got {percentile!r}")

    out_dtype = attr.dtype if attr.is_floating_point() else torch.get_default_dtype()
    if attr.numel() == 0:
        return attr.to(out_dtype)
    # half precision statistics lose too much (and quantile refuses it), so compute in at least float32
    a = attr.to(torch.promote_types(out_dtype, torch.float32))
    bad = ~torch.isfinite(a)
    if bad.any():
        raise ValueError(
            f"attr contains {int(bad.sum())} non-finite value(s) (NaN or Inf) out of {a.numel()}; "
            f"expected finite values to normalize"
        )

    flat = a.flatten(sample_dims)  # (*samples, M)
    stat_shape = (*a.shape[:sample_dims], *([1] * (a.ndim - sample_dims)))

    def stat(t: Tensor) -> Tensor:
        return t.reshape(stat_shape)

    if mode == "seed":
        mean = stat(flat.mean(dim=-1))
        std = stat(flat.std(dim=-1, correction=0))
        out = ((a - mean) / (std + eps) * 0.1 + 0.5).clamp(0.0, 1.0)
    elif mode == "minmax":
        lo = stat(flat.amin(dim=-1))
        hi = stat(flat.amax(dim=-1))
        out = ((a - lo) / (hi - lo + eps)).clamp(0.0, 1.0)
    elif mode == "absmax":
        m = stat(flat.abs().amax(dim=-1))
        # already inside (0, 1) analytically; the clamp only guards float rounding
        out = (a / (2 * m + eps) + 0.5).clamp(0.0, 1.0)
    else:
        q = stat(_linear_quantile(flat.abs(), float(percentile) / 100.0))
        out = (a / (q + eps)).clamp(-1.0, 1.0) * 0.5 + 0.5
    return out.to(out_dtype)


@functools.lru_cache(maxsize=64)
def _lut(cmap: str, device: torch.device) -> Tensor:
    """(256, 3) float32 RGB table of a matplotlib colour map, built once per (name, device)."""
    import matplotlib
    import numpy as np

    cm = matplotlib.colormaps[cmap].resampled(_LUT_SIZE)
    rgb = cm(np.arange(_LUT_SIZE))[:, :3]  # integer input indexes the table directly
    return torch.as_tensor(rgb, dtype=torch.float32, device=device)


def colormap(x: Tensor, cmap: str = "jet") -> Tensor:
    """Colour ``(..., 1, H, W)`` values in ``[0, 1]`` with a matplotlib colour map -> ``(..., 3, H, W)`` RGB in [0, 1].

    Values are binned like matplotlib does (``floor(x * 256)``, 1.0 in the last bin); values outside [0, 1] are
    clipped. The table is built once per (cmap, device) and indexed in torch on ``x``'s device.
    """
    _check_tensor(x, "x")
    if not isinstance(cmap, str):
        raise TypeError(f"cmap must be the name of a matplotlib colour map (str), got {type(cmap).__name__}")
    _check_map_layout(x, "x", channels=1)
    import matplotlib

    if cmap not in matplotlib.colormaps:
        close = difflib.get_close_matches(cmap, list(matplotlib.colormaps), n=5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"cmap {cmap!r} is not a matplotlib colour map{hint}")
    xf = _as_float(x)
    lut = _lut(cmap, xf.device).to(xf.dtype)
    idx = (xf.squeeze(-3).nan_to_num(0.0).clamp(0.0, 1.0) * _LUT_SIZE).long().clamp_(max=_LUT_SIZE - 1)
    return lut[idx].movedim(-1, -3).contiguous()


def _check_size(size: object) -> tuple[int, int]:
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)
    ):
        raise ValueError(f"size must be a pair of positive ints (H, W), got {size!r}")
    return int(size[0]), int(size[1])


def resize(x: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear resize (``align_corners=False``) of ``(..., C, h, w)`` to ``(..., C, H, W)``, any leading axes."""
    _check_tensor(x, "x")
    h, w = _check_size(size)
    _check_map_layout(x, "x")
    xf = _as_float(x)
    if tuple(xf.shape[-2:]) == (h, w):
        return xf
    lead = xf.shape[:-3]
    flat = xf.reshape(math.prod(lead), *xf.shape[-3:])
    out = F.interpolate(flat, size=(h, w), mode="bilinear", align_corners=False)
    return out.reshape(*lead, *out.shape[-3:])


def overlay(image: Tensor, heat: Tensor, *, alpha: float = 0.5, cmap: str = "jet") -> Tensor:
    """Blend a coloured heat map over an image: ``(1 - alpha) * image + alpha * colormap(heat)``, in [0, 1].

    ``image``: ``(..., 3, H, W)`` in [0, 1]; ``heat``: ``(..., 1, h, w)`` in [0, 1], upsampled bilinearly to (H, W).
    Leading axes broadcast, e.g. images ``(N, 1, 3, H, W)`` with heat ``(N, K, 1, h, w)``.
    """
    _check_tensor(image, "image")
    _check_tensor(heat, "heat")
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    _check_map_layout(image, "image", channels=3)
    _check_map_layout(heat, "heat", channels=1)
    if image.device != heat.device:
        raise ValueError(f"image and heat must be on the same device, got {image.device} and {heat.device}")
    img = _as_float(image)
    colored = colormap(resize(heat, tuple(img.shape[-2:])), cmap).to(img.dtype)
    return ((1 - alpha) * img + alpha * colored).clamp(0.0, 1.0)


def to_uint8(x: Tensor) -> Tensor:
    """``[0, 1]`` float -> uint8 in [0, 255] (``round(x * 255)``, clamped), same shape and device.

    A uint8 tensor is returned unchanged; NaN raises ValueError because it has no pixel value.
    """
    _check_tensor(x, "x")
    if x.dtype == torch.uint8:
        return x
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating point tensor with values in [0, 1] (or uint8), got dtype {x.dtype}")
    nans = torch.isnan(x)
    if nans.any():
        raise ValueError(f"x contains {int(nans.sum())} NaN value(s); expected values in [0, 1]")
    return (x * 255).round().clamp(0, 255).to(torch.uint8)


def to_pil(x: Tensor) -> Image.Image:
    """``(3, H, W)`` -> RGB, ``(1, H, W)`` or ``(H, W)`` -> L PIL image, from float in [0, 1] (or uint8).

    The conversion to uint8 happens on ``x``'s device; only the final uint8 pixels move to the cpu.
    """
    _check_tensor(x, "x")
    if not (x.ndim == 2 or (x.ndim == 3 and x.shape[0] in (1, 3))):
        raise ValueError(f"x must have shape (3, H, W), (1, H, W) or (H, W), got {tuple(x.shape)}")
    from PIL import Image

    pixels = to_uint8(x.detach())
    if pixels.ndim == 3:
        pixels = pixels.permute(1, 2, 0) if pixels.shape[0] == 3 else pixels[0]
    arr = pixels.contiguous().cpu().numpy()
    # Pillow infers RGB from (H, W, 3) uint8 and L from (H, W) uint8; its mode= argument is deprecated
    return Image.fromarray(arr)
