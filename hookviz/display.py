"""Turn raw attribution tensors into pixels: channel reductions, normalization modes, colour maps, overlays.

Conventions: maps are laid out ``(..., C, H, W)`` with any number of leading axes; every function here works in torch
on the tensor's device and batch-wide. Only `to_pil` leaves torch (it is the one place that moves data to the cpu).

Peers make different display choices, often silently: captum sums the channels and clips the largest values that
carry 2% of the attribution *mass* (``outlier_perc=2``, not a percentile); pytorch-grad-cam min-max scales each map
(eps 1e-7); torch-cam squares the mask before colouring; zennit divides by ``max - min`` with no epsilon, so a
constant map becomes NaN. hookviz names every choice (`reduce_channels`, `apply_sign`, `normalize` with its ``mode``
and ``scale``, `colormap`, `overlay`) and guards every division: a constant map gives a constant image, never NaN,
and an `EmptyMapWarning` says which samples had nothing to show.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import sys
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import bool_option, is_int, number_option

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "DEFAULT_PERCENTILE",
    "NORMALIZATIONS",
    "REDUCTIONS",
    "SCALES",
    "SIGNS",
    "EmptyMapWarning",
    "apply_sign",
    "colormap",
    "magnitude",
    "normalize",
    "normalize_bounds",
    "overlay",
    "reduce_channels",
    "resize",
    "to_pil",
    "to_uint8",
]

NORMALIZATIONS = ("seed", "minmax", "absmax", "percentile", "mass")
REDUCTIONS = ("sum", "abs-sum", "max-abs", "l2")
SIGNS = ("all", "positive", "negative", "absolute")
SCALES = ("sample", "shared")
# the clip point of the two clipping modes when none is given: the 99th percentile of |a| by count, and the value
# where the sorted |a| reach 98% of the total mass, i.e. captum's default outlier_perc=2
DEFAULT_PERCENTILE = {"percentile": 99.0, "mass": 98.0}

# torch.quantile refuses inputs above 2**24 elements in many torch releases; above this we interpolate between
# two kthvalue order statistics instead, which gives the same "linear" quantile.
_QUANTILE_MAX_NUMEL = 2**24
_LUT_SIZE = 256


class EmptyMapWarning(UserWarning):
    """A map had nothing to show: constant over all its values (often all zero), so it is drawn as a constant image.

    Typical causes: a target whose gradient is zero everywhere (dead ReLUs, a saturated softmax), a Grad-CAM layer
    whose weighted activations are all negative before the final ReLU, or ``sign="positive"`` on a map with no
    positive value. Silence it with ``warnings.simplefilter("ignore", EmptyMapWarning)``.
    """


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


def apply_sign(attr: Tensor, sign: str = "all") -> Tensor:
    """Select which sign of the attribution to show, elementwise; same shape, floating point.

    - ``"all"``: the signed values, unchanged; `normalize` keeps 0 at 0.5, so pair it with a diverging colour map
      such as ``"bwr"``;
    - ``"positive"``: ``max(a, 0)``, the evidence for the target;
    - ``"negative"``: ``max(-a, 0)``, the evidence against it, shown as positive magnitudes (captum divides
      ``min(a, 0)`` by a negative threshold, which gives the same picture);
    - ``"absolute"``: ``|a|``, how much each value matters regardless of its sign.

    Every option but ``"all"`` gives non-negative data, which `normalize` maps onto the whole ``[0, 1]`` range.
    """
    _check_tensor(attr, "attr")
    if sign not in SIGNS:
        raise ValueError(f"sign must be one of {SIGNS}, got {sign!r}")
    a = _as_float(attr)
    if sign == "all":
        return a
    if sign == "positive":
        return a.clamp_min(0.0)
    if sign == "negative":
        return (-a).clamp_min(0.0)
    return a.abs()


def _mass_threshold(flat_abs: Tensor, percentile: float) -> Tensor:
    """captum's ``_cumulative_sum_threshold`` along the last axis, shape (..., 1).

    The values are sorted ascending and summed cumulatively; the threshold is the first sorted value at which the
    running sum reaches ``percentile``% of the total, so the values above it carry the other ``100 - percentile``%.
    The running sum is accumulated in float64 (not on mps, which has none): a float32 sum over a whole image drifts.
    """
    s = flat_abs.sort(dim=-1).values
    acc = s.to(torch.float64) if s.device.type != "mps" else s
    cum = acc.cumsum(dim=-1)
    target = cum[..., -1:] * 0.01 * percentile  # the same expression as captum, so the same rounding
    # cum is non-decreasing, so "first index with cum >= target" is "how many are below target"; the clamp only
    # guards total * 0.01 * 100 rounding above total
    idx = (cum < target).sum(dim=-1, keepdim=True).clamp_(max=s.shape[-1] - 1)
    return s.gather(-1, idx)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside hookviz, seen from the function that calls this one.

    So a warning points at the user's line whether they called `normalize` or ``Explanation.figure``.
    """
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def _warn_empty(a: Tensor, sample_dims: int, sign: str) -> None:
    per = a.flatten(sample_dims)  # (*samples, M); (M,) for sample_dims=0
    empty = per.amax(dim=-1) == per.amin(dim=-1)
    if not empty.any():
        return
    zero = bool((per.abs().amax(dim=-1)[empty] == 0).all())
    what = "all zero" if zero else "constant"
    if sign != "all":
        what += f" after sign={sign!r}"
    if sample_dims == 0:
        where = "the map is"
    else:
        ids = empty.nonzero().tolist()
        ids = [i[0] for i in ids] if sample_dims == 1 else [tuple(i) for i in ids]
        shown = ", ".join(map(str, ids[:10])) + (", ..." if len(ids) > 10 else "")
        where = f"sample(s) [{shown}] of {math.prod(a.shape[:sample_dims])} are"
    warnings.warn(
        f"empty attribution map: {where} {what}, so there is nothing to show; drawn as a constant image",
        EmptyMapWarning,
        stacklevel=_caller_stacklevel(),
    )


def normalize(
    attr: Tensor,
    mode: str = "minmax",
    *,
    sample_dims: int = 1,
    percentile: float | None = None,
    eps: float = 1e-8,
    sign: str = "all",
    scale: str = "sample",
) -> Tensor:
    """Map ``attr`` to ``[0, 1]`` for display; same shape, floating point, computed in torch on ``attr``'s device.

    The first ``sample_dims`` axes index samples (1 for ``(N, C, H, W)``, 2 for ``(N, K, C, H, W)``). ``scale``:

    - ``"sample"`` (default): statistics over each sample's own values (channels and pixels), so samples with
      different scales do not affect each other: every map uses the whole colour range;
    - ``"shared"``: one set of statistics over the whole tensor (batch and targets), so colours compare across
      samples: a map ten times weaker looks ten times weaker.

    ``sign`` (`apply_sign`: ``"all"``, ``"positive"``, ``"negative"``, ``"absolute"``) is applied first. With
    ``"all"`` the data is treated as signed and the symmetric modes keep 0 at 0.5; with the other signs the data is
    non-negative and they map ``[0, threshold]`` onto ``[0, 1]``.

    Modes (every division is guarded: a constant map gives a constant image, never NaN):

    - ``"seed"``: ``(a - mean) / (std + eps) * 0.1 + 0.5`` clipped to ``[0, 1]`` (population std, as the hooks
      tutorial's Guided Backprop visualizer does with numpy); constant -> 0.5. For RGB gradient images, sign "all".
    - ``"minmax"``: ``(a - min) / (max - min + eps)``; constant -> 0. Any sign; the usual choice for CAMs (and
      pytorch-grad-cam's); with signed data 0 lands wherever the range puts it.
    - ``"absmax"``: signed ``a / (2 max|a| + eps) + 0.5`` (0 -> 0.5, all-zero -> 0.5); non-negative
      ``a / (max|a| + eps)``. One outlier flattens the rest of the map.
    - ``"percentile"``: ``q`` = the ``percentile``-th percentile of ``|a|`` (by count, linear interpolation,
      default 99); ``a / (q + eps)`` clipped to ``[-1, 1]`` then ``* 0.5 + 0.5`` (signed), or to ``[0, 1]``
      (non-negative). Outliers above ``q`` saturate instead of flattening the map.
    - ``"mass"``: captum's ``outlier_perc``: ``t`` = the value at which the running sum of the ascending sorted
      ``|a|`` first reaches ``percentile``% of the total mass (default 98, i.e. the largest values carrying 2% of
      the attribution are clipped); ``a / t`` clipped like ``"percentile"``. ``t`` is one of the map's own values,
      so it is 0 only for an all-zero map, which gives 0 (0.5 signed). Best for sparse, heavy-tailed maps
      (gradients, Integrated Gradients) with any sign.

    Sign guide: ``"all"`` with absmax, percentile or mass and a diverging colour map (``"bwr"``);
    ``"positive"``, ``"negative"`` or ``"absolute"`` with minmax, percentile or mass and a sequential one.

    Raises ValueError for NaN or Inf values; warns `EmptyMapWarning` (naming the samples) for constant maps.
    """
    prepared = _prepare(attr, mode, sample_dims, percentile, eps, sign, scale)
    if isinstance(prepared, Tensor):
        return prepared  # empty tensor
    a, percentile, out_dtype = prepared
    _warn_empty(a, sample_dims, sign)
    signed = sign == "all"
    s1, s2 = _statistics(a, mode, sample_dims if scale == "sample" else 0, percentile)

    def clip(ratio: Tensor) -> Tensor:
        return ratio.clamp(-1.0, 1.0) * 0.5 + 0.5 if signed else ratio.clamp(0.0, 1.0)

    if mode == "seed":
        mean, std = s1, s2
        out = ((a - mean) / (std + eps) * 0.1 + 0.5).clamp(0.0, 1.0)
    elif mode == "minmax":
        lo, hi = s1, s2
        out = ((a - lo) / (hi - lo + eps)).clamp(0.0, 1.0)
    elif mode == "absmax":
        # already inside [0, 1] analytically; the clamp only guards float rounding
        out = (a / (2 * s1 + eps) + 0.5).clamp(0.0, 1.0) if signed else (a / (s1 + eps)).clamp(0.0, 1.0)
    elif mode == "percentile":
        out = clip(a / (s1 + eps))
    else:
        out = clip(a / s1)
    return out.to(out_dtype)


def normalize_bounds(
    attr: Tensor,
    mode: str = "minmax",
    *,
    sample_dims: int = 1,
    percentile: float | None = None,
    eps: float = 1e-8,
    sign: str = "all",
    scale: str = "sample",
) -> tuple[Tensor, Tensor]:
    """The raw values ``(lo, hi)`` that `normalize` (same arguments) maps to 0 and to 1: what a colour bar shows.

    Both are shaped to broadcast against ``attr`` (``(N, 1, 1, 1)`` per sample, all ones with ``scale="shared"``)
    and are in the units of ``apply_sign(attr, sign)``; between them the mapping is linear,
    ``normalize(attr) == clamp((a - lo) / (hi - lo), 0, 1)`` up to rounding (the ``eps`` is folded into ``hi``).
    Per mode: seed ``mean -+ 5 (std + eps)``; minmax ``min, max + eps``; absmax ``-+(max|a| + eps / 2)`` signed,
    ``0, max|a| + eps`` otherwise; percentile ``-+(q + eps)`` or ``0, q + eps``; mass ``-+t`` or ``0, t``.
    Constant maps warn nothing here (`normalize` does).
    """
    prepared = _prepare(attr, mode, sample_dims, percentile, eps, sign, scale)
    if isinstance(prepared, Tensor):
        raise ValueError("attr is empty (0 elements): it has no bounds")
    a, percentile, _ = prepared
    s1, s2 = _statistics(a, mode, sample_dims if scale == "sample" else 0, percentile)
    if mode == "seed":
        half = 5 * (s2 + eps)  # 0.1 * (a - mean) / (std + eps) reaches -+0.5 here
        return s1 - half, s1 + half
    if mode == "minmax":
        return s1, s2 + eps
    half = {"absmax": s1 + eps / 2 if sign == "all" else s1 + eps, "percentile": s1 + eps, "mass": s1}[mode]
    return (-half if sign == "all" else torch.zeros_like(half)), half


def _prepare(
    attr: Tensor, mode: str, sample_dims: int, percentile: float | None, eps: float, sign: str, scale: str
) -> tuple[Tensor, float | None, torch.dtype] | Tensor:
    """Validate `normalize`'s arguments (all before any work), then ``(apply_sign(a), percentile, out_dtype)``.

    ``a`` is at least float32; an empty ``attr`` comes back as the (empty) result instead.
    """
    _check_tensor(attr, "attr")
    if mode not in NORMALIZATIONS:
        raise ValueError(f"mode must be one of {NORMALIZATIONS}, got {mode!r}")
    if not is_int(sample_dims) or not 0 <= sample_dims < attr.ndim:
        raise ValueError(
            f"sample_dims must be an int in [0, attr.ndim) = [0, {attr.ndim}) so that at least one axis is left "
            f"for the statistics, got {sample_dims!r} for attr of shape {tuple(attr.shape)}"
        )
    number_option("eps", eps, "a positive number", lambda v: v > 0)
    if sign not in SIGNS:
        raise ValueError(f"sign must be one of {SIGNS}, got {sign!r}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if mode in DEFAULT_PERCENTILE:
        if percentile is None:
            percentile = DEFAULT_PERCENTILE[mode]
        number_option("percentile", percentile, "a number in (0, 100]", lambda v: 0 < v <= 100)

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
    return apply_sign(a, sign), percentile, out_dtype


def _statistics(a: Tensor, mode: str, stat_dims: int, percentile: float | None) -> tuple[Tensor, Tensor | None]:
    """Each mode's statistics over all but the first ``stat_dims`` axes, shaped to broadcast against ``a``.

    seed: (mean, population std); minmax: (min, max); absmax: (max|a|, None); percentile: (q, None);
    mass: (t, None) with t = 1 for an all-zero map (t is one of the map's own values, so it is 0 only there, and
    any divisor gives 0; no eps, to match captum exactly).
    """
    flat = a.flatten(stat_dims)  # (*samples, M), or (M,) for statistics over everything
    stat_shape = (*a.shape[:stat_dims], *([1] * (a.ndim - stat_dims)))

    def stat(t: Tensor) -> Tensor:
        return t.reshape(stat_shape)

    if mode == "seed":
        return stat(flat.mean(dim=-1)), stat(flat.std(dim=-1, correction=0))
    if mode == "minmax":
        return stat(flat.amin(dim=-1)), stat(flat.amax(dim=-1))
    if mode == "absmax":
        return stat(flat.abs().amax(dim=-1)), None
    if mode == "percentile":
        return stat(_linear_quantile(flat.abs(), float(percentile) / 100.0)), None
    t = stat(_mass_threshold(flat.abs(), float(percentile)))
    return torch.where(t > 0, t, torch.ones_like(t)), None


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
    if not isinstance(size, (tuple, list)) or len(size) != 2 or not all(is_int(s) and s > 0 for s in size):
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


def overlay(
    image: Tensor,
    heat: Tensor,
    alpha: float = 0.5,
    cmap: str = "jet",
    alpha_by_map: bool = False,
    *,
    weight: Tensor | None = None,
) -> Tensor:
    """Blend a coloured heat map over an image, in [0, 1].

    ``image``: ``(..., 3, H, W)`` in [0, 1]; ``heat``: ``(..., 1, h, w)`` in [0, 1], upsampled bilinearly to (H, W).
    Leading axes broadcast, e.g. images ``(N, 1, 3, H, W)`` with heat ``(N, K, 1, h, w)``.

    The per-pixel opacity is ``w = alpha`` (default), or ``w = alpha * weight`` with ``alpha_by_map=True``, so pixels
    with little attribution stay transparent and the image shows through: ``(1 - w) * image + w * colormap(heat)``.
    ``weight`` (shaped like ``heat``, in [0, 1]; default ``heat``) is where the map is: `magnitude` gives it for any
    map (0 exactly where the attribution is 0, also for signed maps drawn around 0.5 and maps normalized around
    their mean, where ``heat`` would be half opaque at 0).
    """
    _check_tensor(image, "image")
    _check_tensor(heat, "heat")
    number_option("alpha", alpha, "a number in [0, 1]", lambda v: 0 <= v <= 1)
    bool_option("alpha_by_map", alpha_by_map)
    _check_map_layout(image, "image", channels=3)
    _check_map_layout(heat, "heat", channels=1)
    if weight is not None:
        _check_tensor(weight, "weight")
        if weight.shape != heat.shape:
            raise ValueError(f"weight must have the shape of heat {tuple(heat.shape)}, got {tuple(weight.shape)}")
    if image.device != heat.device:
        raise ValueError(f"image and heat must be on the same device, got {image.device} and {heat.device}")
    img = _as_float(image)
    size = tuple(img.shape[-2:])
    heat = resize(heat, size).to(img.dtype)
    colored = colormap(heat, cmap).to(img.dtype)
    if alpha_by_map:
        opacity = heat if weight is None else resize(weight, size).to(img.dtype)
        w = alpha * opacity.nan_to_num(0.0).clamp(0.0, 1.0)
    else:
        w = alpha
    return ((1 - w) * img + w * colored).clamp(0.0, 1.0)


def magnitude(
    attr: Tensor,
    mode: str = "percentile",
    *,
    sample_dims: int = 1,
    percentile: float | None = None,
    sign: str = "all",
    scale: str = "sample",
) -> Tensor:
    """Where a map is, for an overlay's opacity (`overlay`'s ``weight``): ``|apply_sign(attr, sign)|`` on [0, 1],
    exactly 0 where the attribution is 0 whatever the display's normalization.

    With a mode whose scale starts at 0 (``"absmax"``, ``"percentile"``, ``"mass"``) it is that mode on the
    magnitudes (`normalize` with ``sign="absolute"``, same `percentile` and `scale`); modes that place 0 elsewhere
    (``"minmax"``: at the minimum, ``"seed"``: around the mean) use ``"percentile"`` (|a| over its 99th percentile,
    clipped at 1), so one outlier does not make the rest of the map transparent. Same shape as `attr`.
    """
    a = apply_sign(attr, sign)
    zero_based = mode in ("absmax", "percentile", "mass")
    return normalize(
        a,
        mode if zero_based else "percentile",
        sample_dims=sample_dims,
        percentile=percentile if zero_based else None,
        sign="absolute",
        scale=scale,
    )


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
