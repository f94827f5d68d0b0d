"""Concept example sets drawn by the shapes generator, for TCAV on the zoo models without any files.

`shapes_concepts` gives sets whose content is known (issue 36's ground truth): a thin round outline, thin straight
edges (a square outline), the filled circle class, the background alone, and plain shapes images (a concept that
should not matter). `background_images` and `outline_images` draw the parts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import int_option, is_int
from .data import CLASSES, shapes

__all__ = ["CONCEPT_NAMES", "background_images", "outline_images", "shapes_concepts"]

CONCEPT_NAMES: tuple[str, ...] = ("round outline", "straight edges", "circle shape", "background", "random images")


def background_images(n: int, seed: int) -> Tensor:
    """(n, 3, 64, 64) shapes images with the object's pixels replaced by the image rolled by half its size: the
    background texture and distractors, no object."""
    d = shapes(n, seed=seed)
    size = d.images.shape[-1]
    rolled = d.images.roll((size // 2, size // 2), dims=(2, 3))
    return torch.where(d.masks[:, None], rolled, d.images)


def outline_images(n: int, seed: int, kind: str) -> Tensor:
    """(n, 3, 64, 64) thin (2 px) outlines on shapes backgrounds (`background_images`): ``kind="round"`` a circle
    of random centre and radius, ``"square"`` a randomly rotated square; in a colour contrasting with the image."""
    if kind not in ("round", "square"):
        raise ValueError(f"kind must be 'round' or 'square', got {kind!r}")
    g = torch.Generator().manual_seed(seed)
    img = background_images(n, seed)
    size = img.shape[-1]
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    radius = 9 + 7 * torch.rand(n, generator=g)
    centre = radius[:, None] + 2 + torch.rand(n, 2, generator=g) * (size - 4 - 2 * radius[:, None])
    dx = coords.view(1, 1, size) - centre[:, 0].view(-1, 1, 1)
    dy = coords.view(1, size, 1) - centre[:, 1].view(-1, 1, 1)
    r = radius.view(-1, 1, 1)
    if kind == "round":
        dist = (torch.sqrt(dx * dx + dy * dy) - r).abs() - 1.0
    else:
        th = (torch.rand(n, generator=g) * math.pi / 2).view(-1, 1, 1)
        u, v = dx * torch.cos(th) + dy * torch.sin(th), dy * torch.cos(th) - dx * torch.sin(th)
        dist = (torch.maximum(u.abs(), v.abs()) - r * 0.8).abs() - 1.0
    alpha = (0.5 - dist).clamp(0, 1).unsqueeze(1)
    mean = img.mean((2, 3), keepdim=True)
    colour = torch.where(mean > 0.5, mean - 0.45, mean + 0.45).clamp(0, 1)
    return img.lerp(colour.expand_as(img), alpha)


def shapes_concepts(n: int = 40, *, seed: int = 21) -> dict[str, Tensor]:
    """`n` examples of each of `CONCEPT_NAMES`, (n, 3, 64, 64) float32 in [0, 1], drawn with seeds seed .. seed + 4
    (deterministic; seed=21 gives the sets of docs/concepts.md's ground truth).

    - ``round outline``, ``straight edges``: `outline_images`;
    - ``circle shape``: images of the circle class (round, but filled, not an outline);
    - ``background``: `background_images`;
    - ``random images``: plain shapes images, like a random pool: no class should depend on them.
    """
    int_option("n", n, "an int >= 2 (examples per concept)", minimum=2)
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    other = shapes(20 * n, seed=seed)
    circles = other.images[other.labels == CLASSES.index("circle")][:n]
    return {
        "round outline": outline_images(n, seed + 1, "round"),
        "straight edges": outline_images(n, seed + 2, "square"),
        "circle shape": circles,
        "background": background_images(n, seed + 3),
        "random images": shapes(n, seed=seed + 4).images,
    }
