"""Localisation metrics: does the map point at the object? (pointing game, energy in the mask)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import number_at_least
from ._checks import channel_sum, check_masks, fit_maps


def _prepare(attributions: Tensor, masks: Tensor) -> tuple[Tensor, Tensor]:
    maps = channel_sum(attributions)
    m = check_masks(masks, maps.shape[0]).to(maps.device)
    return fit_maps(maps, tuple(m.shape[-2:]), "attributions", "masks"), m


def _dilate(masks: Tensor, tolerance: float) -> Tensor:
    """Pixels within Euclidean distance `tolerance` of a mask pixel: one convolution with a disk, batched."""
    r = math.floor(tolerance)
    if r == 0:
        return masks
    off = torch.arange(-r, r + 1, device=masks.device, dtype=torch.float32)
    disk = (off[:, None] ** 2 + off[None, :] ** 2 <= tolerance**2).float()
    # 0/1 values: the convolution counts mask pixels in the disk exactly
    hits = F.conv2d(masks.float().unsqueeze(1), disk[None, None], padding=r)
    return hits.squeeze(1) > 0


def pointing_game(attributions: Tensor, masks: Tensor, tolerance: float = 0) -> Tensor:
    """The pointing game (Zhang et al. 2018, "Top-Down Neural Attention by Excitation Backprop", IJCV 126,
    https://arxiv.org/abs/1608.00507): a hit when the map's maximum lies on the object.

    Args:
        attributions: (N, C, h, w) maps, summed over channels, or (N, h, w) maps. Maps smaller than the masks
            (CAMs at a layer's resolution) are upsampled bilinearly (``align_corners=False``) to the masks' size.
        masks: (N, H, W) (or (N, 1, H, W)) bool masks of the object.
        tolerance: a hit when any pixel at the map's maximum lies within this Euclidean distance, in pixels, of a
            mask pixel. ``0`` (default): the maximum must lie on the mask, Quantus's ``PointingGame`` convention;
            TorchRay uses 15 pixels.

    Returns:
        (N,) float tensor of 1.0 (hit) and 0.0 (miss); NaN where a mask is empty. Every pixel at the maximum counts
        (ties: a hit when any of them is within the tolerance).
    """
    tol = number_at_least("tolerance", tolerance, 0, "a distance in pixels")
    maps, m = _prepare(attributions, masks)
    peak = maps == maps.amax(dim=(1, 2), keepdim=True)
    hit = (peak & _dilate(m, tol)).flatten(1).any(dim=1).float()
    return torch.where(m.flatten(1).any(dim=1), hit, torch.full_like(hit, math.nan))


def energy_in_mask(attributions: Tensor, masks: Tensor) -> Tensor:
    """The energy-based pointing game (Wang et al. 2020, "Score-CAM: Score-Weighted Visual Explanations for
    Convolutional Neural Networks", CVPR workshops, https://arxiv.org/abs/1910.01279): the share of the map's
    positive attribution that falls inside the mask, sum(relu(L) * mask) / sum(relu(L)).

    Args:
        attributions: (N, C, h, w) maps, summed over channels before the positive part is taken, or (N, h, w);
            smaller maps are upsampled bilinearly (``align_corners=False``) to the masks' size.
        masks: (N, H, W) (or (N, 1, H, W)) bool masks (Score-CAM uses the bounding box as the mask).

    Returns:
        (N,) float tensor in [0, 1]; NaN where a mask is empty or a map has no positive attribution.
    """
    maps, m = _prepare(attributions, masks)
    pos = maps.clamp(min=0)
    inside = (pos * m).sum(dim=(1, 2))
    total = pos.sum(dim=(1, 2))
    share = inside / total  # 0 / 0 -> NaN for a map without positive values
    return torch.where(m.flatten(1).any(dim=1), share, torch.full_like(share, math.nan))
