"""A concept's examples in any form the library takes, as one batch the model can be given.

Forms (`load_examples`):

- a tensor (N, ...): model-ready, used as it is (cast and moved by `hookviz.inputs.check_model_inputs`);
- an image folder (str or os.PathLike): its image files, sorted by name, not recursing into subfolders;
- a list or tuple of image files, PIL images or numpy arrays;
- a map-style ``torch.utils.data.Dataset``: item i is one example (a tensor, or a tuple whose first element is);
- a list or tuple of tensors: one example each (stacked);
- any other iterable (a ``DataLoader``, a generator): batches (tensors, or tuples whose first element is one).

Images (folders, files, PIL images, arrays) go through `hookviz.dataset.ImageFiles`, the one preprocessing rule of
every entry point: the model's own preprocessing (``preprocess="auto"``) or the one given, and its channel count.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ..dataset.files import ImageFiles, is_image_list
from ..inputs import check_model_inputs

__all__ = ["IMAGE_SUFFIXES", "Examples", "image_files", "load_examples"]

Examples = Tensor | str | os.PathLike | Dataset | Iterable[Any]
"""One set of examples: a tensor (N, ...), an image folder, a list of image files, a Dataset or an iterable."""

IMAGE_SUFFIXES: frozenset[str] = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def image_files(folder: Path, where: str) -> list[Path]:
    """The image files directly in `folder`, sorted by name; an error naming `where` when there are none."""
    if not folder.exists():
        raise FileNotFoundError(f"{where}: no such folder or file {str(folder)!r}")
    if not folder.is_dir():
        return [folder]
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise ValueError(
            f"{where}: folder {str(folder)!r} holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))}); pass a "
            "folder of images, a list of image files, a tensor (N, ...) or a Dataset"
        )
    return found


def _first(item: Any, where: str) -> Tensor:
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], Tensor):
        item = item[0]  # (input, label) pairs, as data sets and loaders give them
    if not isinstance(item, Tensor):
        raise TypeError(
            f"{where}: expected tensors (or (tensor, label) pairs) from the data set or iterable, got "
            f"{type(item).__name__}"
        )
    return item


def load_examples(model: nn.Module, examples: Any, where: str, *, preprocess: Any = "auto", minimum: int = 2) -> Tensor:
    """All of `examples` as one batch (N, ...) on the model's device, checked by `check_model_inputs`.

    `where` names the examples in messages (``concepts['striped']``). Raises before any forward pass: for a form
    that is none of those above, and for fewer than `minimum` examples (two for a concept: a CAV separates two sets
    of examples, and one example is not a set).
    """
    if isinstance(examples, Tensor):
        batch = examples
    elif isinstance(examples, (str, os.PathLike)):
        batch = torch.stack(list(ImageFiles(image_files(Path(examples), where), model, preprocess=preprocess)))
    elif is_image_list(examples):
        batch = torch.stack(list(ImageFiles(list(examples), model, preprocess=preprocess)))
    elif isinstance(examples, (list, tuple)) and examples and all(isinstance(t, Tensor) for t in examples):
        batch = _stack(list(examples), where)
    elif isinstance(examples, Dataset) and not isinstance(examples, torch.utils.data.IterableDataset):
        n = len(examples)  # type: ignore[arg-type]
        batch = _stack([_first(examples[i], where) for i in range(n)], where) if n else torch.empty(0)
    elif isinstance(examples, (DataLoader, Iterable)) and not isinstance(examples, (bytes, dict)):
        parts = [_first(b, where) for b in examples]
        batch = torch.cat(parts) if parts else torch.empty(0)
    else:
        raise TypeError(
            f"{where}: expected a tensor (N, ...), an image folder, a list of image files, a Dataset or an iterable of "
            f"batches, got {type(examples).__name__}"
        )
    count = 0 if batch.dim() == 0 else batch.shape[0]
    if count < minimum and minimum >= 2:
        raise ValueError(
            f"{where} has {count} example(s); a concept activation vector separates two sets of examples, so each "
            f"set needs at least {minimum} (the TCAV paper uses tens to hundreds)"
        )
    if count < minimum:
        raise ValueError(f"{where} hold no examples; expected at least {minimum}")
    return check_model_inputs(model, batch, where)


def _stack(items: list[Tensor], where: str) -> Tensor:
    shapes = {tuple(t.shape) for t in items}
    if len(shapes) > 1:
        raise ValueError(
            f"{where}: the examples must share one shape to be batched, got {sorted(shapes)[:4]}; resize them first"
        )
    return torch.stack(items)
