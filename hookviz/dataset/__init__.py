"""Explain a whole data set in one call: sharded, checksummed, resumable, torchrun-aware (`explain_dataset`), and
read the maps back lazily (`load_explanations` -> `ExplanationStore`).

``run``: the computation and the writer thread; ``store``: the on-disk format and the read-back view;
``distributed``: ranks, devices and the process group under ``torchrun``.
"""

from __future__ import annotations

import os

from .files import ImageFiles
from .run import explain_dataset, model_fingerprint
from .store import ExplanationStore


def load_explanations(out: str | os.PathLike[str]) -> ExplanationStore:
    """The maps stored in `out` by `explain_dataset`, as a lazy, indexable `ExplanationStore` (memory-mapped)."""
    return ExplanationStore(out)


__all__ = ["ExplanationStore", "ImageFiles", "explain_dataset", "load_explanations", "model_fingerprint"]
