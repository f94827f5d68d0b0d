"""The class names a model supplies, so that figures name its classes without being told (`class_names`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

__all__ = ["class_names"]

# transformers fills id2label with these placeholders when a config names no classes: they name nothing
_PLACEHOLDER = re.compile(r"LABEL_(\d+)")


def _id2label(config: Any) -> tuple[str, ...] | None:
    """A Hugging Face config's ``id2label`` as names indexed by class id; None for missing or placeholder names."""
    mapping = getattr(config, "id2label", None)
    if not isinstance(mapping, Mapping) or not mapping:
        return None
    try:
        by_id = {int(k): str(v) for k, v in mapping.items()}
    except (TypeError, ValueError):
        return None
    if sorted(by_id) != list(range(len(by_id))):
        return None  # ids with gaps: not a list of classes
    names = tuple(by_id[i] for i in range(len(by_id)))
    if all(_PLACEHOLDER.fullmatch(n) and int(n[6:]) == i for i, n in enumerate(names)):
        return None
    return names


def class_names(model: nn.Module, weights: Any = None) -> Sequence[str] | Any | None:
    """The class names `model` (or its `weights`) supplies, indexed by class id; None when it supplies none.

    In order: torchvision `weights` when given (returned as they are: ``Explanation`` reads their
    ``meta["categories"]``); ``model.hookviz_classes`` (the zoo's shapes models carry `hookviz.zoo.CLASSES`); a
    Hugging Face model's ``config.id2label``, unless it holds only transformers' placeholders ``LABEL_0``,
    ``LABEL_1``, ... (a config built without names). Names the user passes (``labels=``) always win over these.
    """
    if weights is not None:
        return weights
    own = getattr(model, "hookviz_classes", None)
    if own is not None:
        if isinstance(own, str) or not isinstance(own, Sequence) or not all(isinstance(n, str) for n in own):
            raise TypeError(f"model.hookviz_classes must be a sequence of class names (str), got {own!r}")
        return tuple(own)
    return _id2label(getattr(model, "config", None))
