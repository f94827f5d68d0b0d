"""Where a stored run's images came from: a small JSON record kept in the manifest (``"data"``), so that a report
(`hookviz.report`) can show the images next to their maps without being handed the data set again.

Known sources: hookviz's shapes data set (``kind: "shapes"``, rebuilt from n, seed and size) and a torchvision
``ImageFolder`` (``kind: "folder"``, its root, classes and file paths), image files (`ImageFiles`, ``kind: "files"``:
their paths, and whether the model's own preprocessing made the inputs). Anything else is recorded by class name only
(``kind: "other"``): the report then needs the data set passed in.
"""

from __future__ import annotations

import os
from typing import Any

from .files import ImageFiles


def describe_data(dataset: Any) -> dict[str, Any]:
    """A JSON-able record of `dataset`'s origin (see the module docstring); never raises."""
    record: dict[str, Any] = {"class": type(dataset).__qualname__, "kind": "other"}
    seed, size = getattr(dataset, "seed", None), getattr(dataset, "size", None)
    if isinstance(dataset, ImageFiles):
        if dataset.files is not None:
            # the report rebuilds the inputs from the files only with the rule that made them ("auto")
            record.update(kind="files", files=dataset.files, preprocess="auto" if dataset.auto else "given")
    elif hasattr(dataset, "shapes") and isinstance(seed, int) and isinstance(size, int):
        record.update(kind="shapes", n=len(dataset), seed=seed, size=size)
    elif isinstance(getattr(dataset, "samples", None), list) and isinstance(getattr(dataset, "root", None), str):
        try:
            files = [os.path.abspath(str(path)) for path, _ in dataset.samples]
        except (TypeError, ValueError):
            return record
        record.update(kind="folder", root=os.path.abspath(dataset.root), classes=list(dataset.classes), files=files)
    return record
