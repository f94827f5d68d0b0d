"""Image files as a data set of model inputs, preprocessed by the one rule every entry point uses (`ImageFiles`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..images import choose_preprocess, load_images
from ..inputs import expected_channels

__all__ = ["ImageFiles", "is_image_list"]


def is_image_list(data: Any) -> bool:
    """Whether `data` is a list or tuple of image files (paths), PIL images or numpy arrays (not a data set)."""
    return (
        isinstance(data, (list, tuple))
        and bool(data)
        and all(isinstance(item, (str, os.PathLike, Image.Image, np.ndarray)) for item in data)
    )


class ImageFiles(Dataset):
    """Images (paths, PIL images or numpy arrays) as a map-style data set: item i is image i as `model` takes it,
    (C, H, W) float32, or ``(image, labels[i])`` when `labels` are given.

    Each image goes through `hookviz.load_images` with the model's own preprocessing (``preprocess="auto"``,
    `hookviz.images.auto_preprocess`, the rule of `visualize` and `hookviz.grid`), or the `preprocess` given, and
    the model's channel count. `explain_dataset` wraps a list of paths in it; a report reads ``files`` back.
    """

    def __init__(
        self,
        images: Sequence[Any],
        model: nn.Module,
        *,
        preprocess: Any = "auto",
        weights: Any = None,
        labels: Sequence[int] | Tensor | None = None,
    ) -> None:
        if not is_image_list(images):
            raise TypeError(
                "images: expected a non-empty list of image paths, PIL images or numpy arrays, got "
                f"{type(images).__name__}" + (" (empty)" if isinstance(images, (list, tuple)) else "")
            )
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        if labels is not None and len(labels) != len(images):
            raise ValueError(f"labels: expected one per image ({len(images)}), got {len(labels)}")
        self.images = list(images)
        self.labels = labels
        self.transform, self.preprocess = choose_preprocess(model, preprocess, weights)
        self.auto = isinstance(preprocess, str) and preprocess == "auto"
        self.channels = expected_channels(model) or 3
        paths = all(isinstance(item, (str, os.PathLike)) for item in self.images)
        self.files = [os.path.abspath(str(item)) for item in self.images] if paths else None

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Tensor | tuple[Tensor, Any]:
        x = load_images(self.images[i], preprocess=self.transform, channels=self.channels).tensor[0]
        return x if self.labels is None else (x, self.labels[i])

    def __repr__(self) -> str:
        return f"ImageFiles({len(self)} images, preprocess: {self.preprocess})"
