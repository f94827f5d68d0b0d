"""The items a report shows: their images (for people), model inputs, labels, class names, file paths and masks,
from a data set passed in or rebuilt from the ``"data"`` record a store's manifest keeps (`describe_data`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

Rows = Callable[[int, int], Tensor]


@dataclass
class Items:
    """What is known about the N items; any field may be None where the data does not say."""

    n: int
    images: Rows | None  # rows [a, b) as (b - a, 3, H, W) float in [0, 1]: what a person sees
    inputs: Rows | None  # rows [a, b) as the model takes them
    labels: Tensor | None  # (N,) int64
    classes: list[str] | None
    names: list[str]  # a short name per item (file name, or "#i")
    files: list[str] | None  # absolute paths of the source files
    masks: Tensor | None  # (N, H, W) bool object masks, for the localisation metrics
    source: str  # one line on where the items came from


def _rgb(x: Tensor) -> Tensor:
    x = x.float()
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x[:, :3].clamp(0, 1)


def _from_tensors(images: Tensor, labels: Tensor | None, masks: Tensor | None, classes: Any, source: str) -> Items:
    n = images.shape[0]
    return Items(
        n,
        lambda a, b: _rgb(images[a:b]),
        lambda a, b: images[a:b],
        labels.long() if isinstance(labels, Tensor) else None,
        [str(c) for c in classes] if classes is not None else None,
        [f"#{i}" for i in range(n)],
        None,
        masks.bool() if isinstance(masks, Tensor) else None,
        source,
    )


def _load_file(path: str, shape: tuple[int, int]) -> Tensor:
    """A file's pixels resized (shorter side) and centre-cropped to `shape`, as the usual Resize + CenterCrop do."""
    from PIL import Image
    from torchvision.transforms.functional import center_crop, pil_to_tensor, resize

    with Image.open(path) as im:
        t = pil_to_tensor(im.convert("RGB")).float() / 255
    return center_crop(resize(t, list(shape) if shape[0] != shape[1] else shape[0], antialias=True), list(shape))


def _folder(files: list[str], labels: list[int] | None, classes: Any, shape: tuple[int, int], inputs: Any) -> Items:
    def images(a: int, b: int) -> Tensor:
        return torch.stack([_load_file(f, shape) for f in files[a:b]]).clamp(0, 1)

    return Items(
        len(files),
        images,
        inputs,
        torch.tensor(labels) if labels is not None else None,
        [str(c) for c in classes] if classes is not None else None,
        [Path(f).name for f in files],
        files,
        None,
        f"{len(files)} image files",
    )


def _dataset_rows(dataset: Any) -> Rows:
    from torch.utils.data import default_collate

    def rows(a: int, b: int) -> Tensor:
        batch = default_collate([dataset[i] for i in range(a, b)])
        return batch if isinstance(batch, Tensor) else batch[0]

    return rows


def _file_inputs(files: list[str], model: nn.Module | None) -> Rows | None:
    """Rows [a, b) of the files as `model` takes them, by its own preprocessing (the rule of every entry point,
    `hookviz.images.auto_preprocess`); None without a model."""
    if model is None:
        return None
    from ..dataset import ImageFiles

    dataset = ImageFiles(files, model)
    return lambda a, b: torch.stack([dataset[i] for i in range(a, b)])


def resolve_items(
    data: Any, record: dict[str, Any] | None, n: int, item_shape: tuple[int, ...], model: nn.Module | None = None
) -> Items:
    """The items of `data` (a data set, or a list of image paths), else of the store's data `record`; without
    either, items without images. Image files (a list of paths, or a ``"files"`` record made with the model's own
    preprocessing) are fed to `model` by its own preprocessing, as `visualize` and `explain_dataset` do."""
    if isinstance(data, (list, tuple)) and data and all(isinstance(f, (str, os.PathLike)) for f in data):
        if len(data) != n:
            raise ValueError(f"data has {len(data)} image files but the stores hold maps of {n}")
        files = [os.path.abspath(str(f)) for f in data]
        return _folder(files, None, None, tuple(item_shape[-2:]), _file_inputs(files, model))
    if data is None and record is not None and record.get("kind") == "files":
        files = [str(f) for f in record["files"]]
        if os.path.isfile(files[0]):
            inputs = _file_inputs(files, model) if record.get("preprocess") == "auto" else None
            return _folder(files, None, None, tuple(item_shape[-2:]), inputs)
    if data is None and record is not None:
        if record.get("kind") == "shapes":
            from ..zoo import ShapesDataset  # only when a record names it

            data = ShapesDataset(int(record["n"]), seed=int(record["seed"]), size=int(record["size"]))
        elif record.get("kind") == "folder":
            files = [str(f) for f in record["files"]]
            missing = [f for f in files[:1] if not os.path.isfile(f)]
            if not missing:
                labels = [_class_of(f, record) for f in files]
                return _folder(files, labels, record.get("classes"), tuple(item_shape[-2:]), None)
    if data is None:
        return Items(n, None, None, None, None, [f"#{i}" for i in range(n)], None, None, "maps only (no data set)")
    if not hasattr(data, "__len__"):
        raise TypeError(f"data must be a data set with __len__ (e.g. hookviz.zoo.ShapesDataset), got {type(data)}")
    if len(data) != n:
        raise ValueError(f"data has {len(data)} items but the stores hold maps of {n}; pass the data set they explain")
    shapes = getattr(data, "shapes", data)
    if all(isinstance(getattr(shapes, a, None), Tensor) for a in ("images", "labels", "masks")):
        source = f"{n} shapes images" + (f" (seed {data.seed})" if isinstance(getattr(data, "seed", None), int) else "")
        return _from_tensors(shapes.images, shapes.labels, shapes.masks, getattr(shapes, "classes", None), source)
    samples = getattr(data, "samples", None)
    if isinstance(samples, list) and samples and isinstance(samples[0], tuple):
        files = [os.path.abspath(str(p)) for p, _ in samples]
        labels = [int(y) for _, y in samples]
        return _folder(files, labels, getattr(data, "classes", None), tuple(item_shape[-2:]), _dataset_rows(data))
    rows = _dataset_rows(data)
    first = data[0]
    labels = None
    if isinstance(first, (tuple, list)) and len(first) > 1:
        labels = torch.tensor([int(data[i][1]) for i in range(n)])
    return Items(
        n,
        lambda a, b: _rgb(rows(a, b)),
        rows,
        labels,
        [str(c) for c in data.classes] if isinstance(getattr(data, "classes", None), (list, tuple)) else None,
        [f"#{i}" for i in range(n)],
        None,
        None,
        f"{n} items of {type(data).__name__}",
    )


def _class_of(path: str, record: dict[str, Any]) -> int:
    classes = record.get("classes") or []
    name = Path(path).parent.name
    return classes.index(name) if name in classes else -1


def predict(model: nn.Module, inputs: Rows, n: int, batch_size: int = 256) -> tuple[Tensor, Tensor]:
    """(N,) predicted classes and their softmax probabilities; the model's flags are restored afterwards."""
    from ..inputs import model_device
    from ..metrics._checks import class_scores
    from ..metrics.faithfulness import eval_mode

    device = model_device(model)
    preds, probs = [], []
    with eval_mode(model), torch.no_grad():
        for a in range(0, n, batch_size):
            x = inputs(a, min(n, a + batch_size)).to(device)
            p = class_scores(model(x), x.shape[0]).float().softmax(dim=1)
            top = p.max(dim=1)
            preds.append(top.indices.cpu())
            probs.append(top.values.cpu())
    return torch.cat(preds), torch.cat(probs)


def recorded_model(manifest: dict[str, Any]) -> nn.Module | None:
    """The embedded shapes model when the manifest's model fingerprint is its (so a report from the command line
    shows predictions); None for any other model, which the caller has to pass."""
    fingerprint = manifest.get("model") or {}
    if fingerprint.get("class") != "ShapesCNN":
        return None
    from ..dataset import model_fingerprint
    from ..zoo import shapes_model

    model = shapes_model()
    return model if model_fingerprint(model) == fingerprint else None
