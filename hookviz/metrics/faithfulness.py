"""Faithfulness metrics of RISE (Petsiuk et al. 2018): delete (or insert) pixels in the order the map ranks them and
watch the target probability fall (or rise). Every step of every sample is one row of a batched forward pass."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import int_at_least
from .._modes import eval_mode
from ..inputs import model_device
from ..targets import TargetPlan, aligned_scores
from ._checks import channel_sum, check_finite, check_images, check_model, class_scores, fit_maps

Baseline: TypeAlias = "Literal['zeros', 'blur'] | Tensor"
CurveTarget: TypeAlias = "int | Sequence[int] | Tensor | Callable[[Tensor], Tensor] | None"

BLUR_SIZE = 11  # RISE's evaluation code: klen = 11, nsig = 5
BLUR_SIGMA = 5.0


def rise_kernel(size: int = BLUR_SIZE, sigma: float = BLUR_SIGMA, *, device: torch.device | None = None) -> Tensor:
    """RISE's blur kernel, (size, size), summing to 1: a delta at the centre smoothed with
    ``scipy.ndimage.gaussian_filter(delta, sigma)`` (radius ``int(4 * sigma + 0.5)``, ``mode="reflect"``), so the
    Gaussian's tails beyond the kernel fold back onto it (flatter than a truncated Gaussian), computed in torch."""
    r = int(4.0 * sigma + 0.5)
    off = torch.arange(-r, r + 1, dtype=torch.float64, device=device)
    w = torch.exp(-0.5 * (off / sigma) ** 2)
    w = w / w.sum()
    # scipy's "reflect" (half-sample symmetric, period 2 * size): position p reads the delta when it maps to centre
    pos = (torch.arange(size, device=device)[:, None] + off.long()[None, :]) % (2 * size)
    pos = torch.where(pos >= size, 2 * size - 1 - pos, pos)
    k1 = (w[None, :] * (pos == size // 2)).sum(dim=1)
    return torch.outer(k1, k1)


def blur(images: Tensor, size: int = BLUR_SIZE, sigma: float = BLUR_SIGMA) -> Tensor:
    """RISE's insertion baseline: every channel convolved with `rise_kernel` (kernel 11, sigma 5), with torch's
    ``"reflect"`` padding (RISE pads with zeros, which darkens a 5-pixel frame). Needs H, W > size // 2."""
    n, c, h, w = images.shape
    p = size // 2
    if h <= p or w <= p:
        raise ValueError(f"baseline='blur' needs images larger than {p} pixels per side, got {h}x{w}; pass a tensor")
    k = rise_kernel(size, sigma, device=images.device).to(images.dtype)
    x = F.pad(images, (p, p, p, p), mode="reflect")
    return F.conv2d(x, k.expand(c, 1, size, size), groups=c)


def _check_target(target: object, n: int) -> Tensor | Callable[[Tensor], Tensor] | None:
    if target is None or (callable(target) and not isinstance(target, Tensor)):
        return target  # type: ignore[return-value]
    if isinstance(target, bool):
        raise TypeError("target must be an int class index, not a bool")
    if isinstance(target, int):
        t = torch.full((n,), target, dtype=torch.long)
    elif isinstance(target, Tensor | Sequence) and not isinstance(target, str):
        t = torch.as_tensor(target).detach().cpu()
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"target must hold integer class indices, got dtype {t.dtype}")
        if t.dim() == 0:
            t = t.expand(n)
        if t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"target must be an int or hold one class per image ({n},), got shape {tuple(t.shape)}")
        t = t.long()
    else:
        raise TypeError(
            f"target must be None, an int, N ints or a callable f(output) -> (N,) scores; got {type(target).__name__}"
        )
    if (t < 0).any():
        raise ValueError(f"target classes must be >= 0, got {int(t.min())}")
    return t


def _resolve_baseline(baseline: object, images: Tensor) -> Tensor:
    if isinstance(baseline, str):
        if baseline == "zeros":
            return torch.zeros_like(images)
        if baseline == "blur":
            return blur(images)
        raise ValueError(f"baseline must be 'zeros', 'blur' or a tensor, got {baseline!r}")
    if not isinstance(baseline, Tensor):
        raise TypeError(f"baseline must be 'zeros', 'blur' or a tensor, got {type(baseline).__name__}")
    check_finite(baseline, "baseline")
    try:
        return torch.broadcast_to(baseline.to(images.device, images.dtype), images.shape)
    except RuntimeError:
        raise ValueError(
            f"baseline of shape {tuple(baseline.shape)} does not broadcast to the images' shape {tuple(images.shape)}"
        ) from None


def _scores(
    out: object,
    b: int,
    cls: Tensor | None,
    fn: Callable[[Tensor], Tensor] | None,
    rows: Tensor | None = None,
    n: int = 0,
) -> Tensor:
    """(b,) curve values: the callable's scores, or the softmax probability of the classes `cls`. The callable sees
    outputs of one row per image (`aligned_scores`): `rows` (b,) says which of the `n` images each row perturbs."""
    if fn is not None:
        plan = TargetPlan(None, fn, False, None if rows is None else rows.cpu(), n if rows is not None else None)
        try:
            s = aligned_scores(plan, out, b, connected=False).scores
        except ValueError as exc:
            raise ValueError(f"the target callable must return one score per image, shape (N,): {exc}") from None
        if s.shape[1] != 1:
            raise ValueError(f"the target callable must return one score per image, shape (N,); got {s.shape[1]} each")
        return s[:, 0].float()
    return class_scores(out, b).float().softmax(dim=1).gather(1, cls[:, None]).squeeze(1)  # type: ignore[index]


def perturbation_curves(
    model: nn.Module,
    images: Tensor,
    attributions: Tensor,
    target: CurveTarget = None,
    *,
    steps: int,
    baseline: Baseline,
    insert: bool,
    batch_size: int = 64,
) -> Tensor:
    """(N, steps + 1) target probabilities along the deletion (``insert=False``) or insertion path; see `deletion`."""
    check_model(model)
    x = check_images(images)
    n, _, h, w = x.shape
    maps = channel_sum(attributions)
    if maps.shape[0] != n:
        raise ValueError(f"attributions hold {maps.shape[0]} maps for {n} images; expected one map per image")
    steps = int_at_least("steps", steps, 1, "perturbation steps")
    batch_size = int_at_least("batch_size", batch_size, 1, "images per forward pass")
    plan = _check_target(target, n)
    device = model_device(model)
    x = x.detach().to(device)
    maps = fit_maps(maps.to(device), (h, w), "attributions", "images")
    base = _resolve_baseline(baseline, x)
    fn = plan if callable(plan) and not isinstance(plan, Tensor) else None
    with eval_mode(model), torch.no_grad():
        # checked before the real work: the output's layout and the classes' range
        if fn is not None:  # the callable sees outputs of one row per image, as in every perturbed pass
            first = torch.arange(min(n, batch_size))
            _scores(model(x[: first.shape[0]]), first.shape[0], None, fn, first, n)
        else:
            probe = model(x[:1])
            classes = class_scores(probe, 1).shape[1]
            if isinstance(plan, Tensor) and (plan >= classes).any():
                raise ValueError(
                    f"target class {int(plan.max())} is out of range: the model has {classes} classes "
                    f"(valid targets are 0..{classes - 1})"
                )
        cls = None
        if fn is None:
            if isinstance(plan, Tensor):
                cls = plan.to(device)
            else:  # the model's top class on the unperturbed images
                cls = torch.cat([model(c).argmax(dim=1) for c in x.split(batch_size)])
        hw = h * w
        per_step = math.ceil(hw / steps)
        # stable descending sort: ties keep their index (row-major) order
        order = maps.flatten(1).argsort(dim=1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(hw, device=device).expand(n, hw))
        start, end = (base, x) if insert else (x, base)
        total = n * (steps + 1)
        curves = torch.empty(total, device=device)
        for lo in range(0, total, batch_size):  # chunks of (image, step) rows, never one sample at a time
            p = torch.arange(lo, min(lo + batch_size, total), device=device)
            i, k = p // (steps + 1), p % (steps + 1)
            moved = (rank[i] < (k * per_step)[:, None]).view(-1, 1, h, w)
            out = model(torch.where(moved, end[i], start[i]))
            curves[p] = _scores(out, p.shape[0], None if cls is None else cls[i], fn, i, n)
    return curves.view(n, steps + 1)


def auc(curves: Tensor) -> Tensor:
    """Area under (N, steps + 1) curves on [0, 1]: the trapezoid rule divided by `steps` (RISE's ``auc``)."""
    return torch.trapezoid(curves, dim=1) / (curves.shape[1] - 1)


def deletion(
    model: nn.Module,
    images: Tensor,
    attributions: Tensor,
    target: CurveTarget = None,
    *,
    steps: int = 100,
    baseline: Baseline = "zeros",
    batch_size: int = 64,
    return_curves: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The deletion metric of RISE (Petsiuk et al. 2018, "RISE: Randomized Input Sampling for Explanation of
    Black-box Models", BMVC, https://arxiv.org/abs/1806.07421); lower is better.

    Pixels are ranked by the channel-summed map (upsampled bilinearly to the images' size when smaller),
    descending, ties in index (row-major) order. Each of `steps` steps replaces the next ceil(H*W / steps) pixels
    (all channels) of the image by the baseline; the curve is the softmax probability of the target class at the
    steps + 1 images (image first, baseline last), and the result its area: the trapezoid rule divided by `steps`.

    Args:
        model: a classifier returning (N, classes) logits; run in eval mode (restored afterwards), without grad.
        images: (N, C, H, W) on any device (moved to the model's).
        attributions: (N, C', h, w) or (N, h, w) maps, h <= H, w <= W.
        target: None (the model's top class on the images), an int, N ints, or a callable ``f(output) -> (N,)``
            whose scores replace the softmax probability (for models whose output is not a class vector); it is
            called once per step, on an output whose row i is image i (`hookviz.targets.aligned_scores`).
        steps: number of perturbation steps (>= 1).
        baseline: ``"zeros"`` (default, as RISE), ``"blur"`` (`blur`) or a tensor broadcastable to the images.
        batch_size: images per forward pass: bounds the memory of the N * (steps + 1) forwards.
        return_curves: also return the (N, steps + 1) curves.

    Returns:
        (N,) AUC, or ``(auc, curves)``.
    """
    curves = perturbation_curves(
        model, images, attributions, target, steps=steps, baseline=baseline, insert=False, batch_size=batch_size
    )
    return (auc(curves), curves) if return_curves else auc(curves)


def insertion(
    model: nn.Module,
    images: Tensor,
    attributions: Tensor,
    target: CurveTarget = None,
    *,
    steps: int = 100,
    baseline: Baseline = "blur",
    batch_size: int = 64,
    return_curves: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The insertion metric of RISE (Petsiuk et al. 2018, https://arxiv.org/abs/1806.07421); higher is better.

    As `deletion`, in the other direction: the curve starts at the baseline (default ``"blur"``: RISE's Gaussian
    blur, kernel 11, sigma 5) and each step puts the next ceil(H*W / steps) highest-ranked pixels of the image back.
    Returns the (N,) AUC, or ``(auc, curves)`` with ``return_curves=True``.
    """
    curves = perturbation_curves(
        model, images, attributions, target, steps=steps, baseline=baseline, insert=True, batch_size=batch_size
    )
    return (auc(curves), curves) if return_curves else auc(curves)
