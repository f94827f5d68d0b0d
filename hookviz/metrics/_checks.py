"""Input checks and map preparation shared by the metrics: every check runs before any work is done."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_images(images: object, name: str = "images") -> Tensor:
    """A finite floating-point (N, C, H, W) batch with N >= 1."""
    if not isinstance(images, Tensor):
        raise TypeError(f"{name} must be a tensor (N, C, H, W), got {type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(f"{name} must be a 4-D batch (N, C, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {images.dtype}; convert with x.float() / 255")
    if images.shape[0] == 0:
        raise ValueError(f"{name} hold an empty batch (N = 0)")
    check_finite(images, name)
    return images


def check_finite(t: Tensor, name: str) -> None:
    bad = ~torch.isfinite(t)
    if bad.any():
        nan = int(torch.isnan(t).sum())
        raise ValueError(
            f"{name} hold {nan} NaN and {int(bad.sum()) - nan} infinite value(s); expected finite values "
            "(a NaN map cannot be ranked)"
        )


def channel_sum(attributions: object, name: str = "attributions") -> Tensor:
    """(N, h, w) maps from (N, C, h, w) attributions (summed over channels) or (N, h, w) maps; finite, float."""
    if not isinstance(attributions, Tensor):
        raise TypeError(f"{name} must be a tensor (N, C, h, w) or (N, h, w), got {type(attributions).__name__}")
    if attributions.dim() not in (3, 4):
        raise ValueError(
            f"{name} must be (N, C, h, w) or (N, h, w) maps, got shape {tuple(attributions.shape)} (for K targets "
            "per input, evaluate one target at a time)"
        )
    if attributions.shape[0] == 0:
        raise ValueError(f"{name} hold an empty batch (N = 0)")
    if attributions.dtype == torch.bool or attributions.is_complex():
        raise TypeError(f"{name} must be a real tensor, got {attributions.dtype}")
    a = attributions.detach()
    if not a.is_floating_point() or a.dtype in (torch.float16, torch.bfloat16):
        a = a.float()  # reductions and interpolation in float32 at least
    check_finite(a, name)
    return a.sum(dim=1) if a.dim() == 4 else a


def check_masks(masks: object, n: int, name: str = "masks") -> Tensor:
    """(N, H, W) bool masks from (N, H, W) or (N, 1, H, W) bool or 0/1 tensors."""
    if not isinstance(masks, Tensor):
        raise TypeError(f"{name} must be a tensor (N, H, W) of bools, got {type(masks).__name__}")
    m = masks.detach()
    if m.dim() == 4 and m.shape[1] == 1:
        m = m[:, 0]
    if m.dim() != 3:
        raise ValueError(f"{name} must be (N, H, W) or (N, 1, H, W), got shape {tuple(masks.shape)}")
    if m.shape[0] != n:
        raise ValueError(f"{name} hold {m.shape[0]} masks but the attributions hold {n} maps; expected one per map")
    if m.dtype != torch.bool:
        if m.is_complex() or not ((m == 0) | (m == 1)).all():
            raise ValueError(f"{name} must be bool (or 0/1) tensors, got {m.dtype} values other than 0 and 1")
        m = m != 0
    return m


def fit_maps(maps: Tensor, size: tuple[int, int], name: str, target: str) -> Tensor:
    """(N, h, w) maps resized to `size` (H, W): kept when equal, upsampled bilinearly (``align_corners=False``)
    when smaller; larger maps are an error (a metric never throws resolution away)."""
    h, w = maps.shape[-2:]
    H, W = size
    if (h, w) == (H, W):
        return maps
    if h > H or w > W:
        raise ValueError(
            f"{name} are {h}x{w} but the {target} are {H}x{W}; expected maps of the {target}' size or smaller "
            "(smaller maps are upsampled bilinearly)"
        )
    return F.interpolate(maps.unsqueeze(1), size=(H, W), mode="bilinear", align_corners=False).squeeze(1)


def check_model(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def class_scores(output: Any, n: int, name: str = "model") -> Tensor:
    """The (n, classes) logits of a classifier's output, or a clear error for any other output."""
    if not isinstance(output, Tensor) or output.dim() != 2 or output.shape[0] != n:
        got = f"a tensor of shape {tuple(output.shape)}" if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(
            f"{name} returned {got} for {n} input(s), expected class scores of shape (N, classes); pass a callable "
            "target f(output) -> (N,) scores for other outputs"
        )
    return output
