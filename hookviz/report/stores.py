"""Reading the stores a report shows: one column per store, checked complete and over the same images first."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from ..dataset.store import FORMAT, MANIFEST, ExplanationStore, read_json, shard_name

StoreLike = "str | os.PathLike[str] | ExplanationStore"


@dataclass
class Column:
    """One method's maps for every item: ``maps[a:b]`` gives (n, C, h, w) float32; ``targets``/``scores`` (N,)."""

    name: str
    maps: Any  # an ExplanationStore or an (N, C, h, w) tensor: anything sliceable into float tensors
    targets: Tensor
    scores: Tensor
    display: dict[str, Any]
    manifest: dict[str, Any]


def _missing_shards(root: Path, manifest: dict[str, Any]) -> list[str]:
    records = {int(r["index"]): r for r in manifest.get("shards", [])}
    for path in sorted(root.glob("manifest-rank*.json")):  # a distributed run killed before its merge
        for r in (read_json(path) or {}).get("shards", []):
            records.setdefault(int(r["index"]), r)
    total = int(manifest.get("num_shards") or 0)
    return [shard_name(i) for i in range(total) if i not in records or not (root / records[i]["file"]).is_file()]


def open_store(store: str | os.PathLike[str] | ExplanationStore, argument: str = "stores") -> ExplanationStore:
    """An `ExplanationStore`, or a ValueError / FileNotFoundError that names what is missing (shards by file name)."""
    if isinstance(store, ExplanationStore):
        return store
    if not isinstance(store, (str, os.PathLike)):
        raise TypeError(
            f"{argument} must be store directories (str or os.PathLike) or ExplanationStore objects, got "
            f"{type(store).__name__}"
        )
    root = Path(store)
    if not root.is_dir():
        raise FileNotFoundError(f"{argument}: no store at {str(root)!r} (not a directory); run explain_dataset first")
    manifest = read_json(root / MANIFEST)
    if manifest is None or manifest.get("format") != FORMAT:
        raise FileNotFoundError(
            f"{argument}: {str(root)!r} holds no hookviz explanations ({MANIFEST} missing or unreadable)"
        )
    missing = _missing_shards(root, manifest)
    if missing or not manifest.get("complete"):
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(
            f"{argument}: {str(root)!r} holds an incomplete run: {len(missing)} of {manifest.get('num_shards')} "
            f"shards missing ({shown or 'the final manifest was never written'}); rerun explain_dataset with "
            "resume=True to finish it"
        )
    return ExplanationStore(root)


def read_stores(stores: Any) -> list[Column]:
    """One `Column` per store, in order; all must hold maps of the same images (count, item shape, data record)."""
    items = [stores] if isinstance(stores, (str, os.PathLike, ExplanationStore)) else stores
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise TypeError(
            f"stores must be a store directory, an ExplanationStore or a non-empty list of them, got {stores!r}"
        )
    opened = [open_store(s) for s in items]
    for s in opened:
        if s.manifest.get("multi_target"):
            raise ValueError(
                f"stores: {str(s.root)!r} holds K targets per image (multi_target); the report shows one map per image "
                "and method: explain with one target per image (target=None, an int or 'label')"
            )
    first = opened[0]
    for other in opened[1:]:
        for key, what in (("items", "number of items"), ("item_shape", "image shape"), ("data", "data set")):
            a, b = first.manifest.get(key), other.manifest.get(key)
            if a is not None and b is not None and a != b:
                raise ValueError(
                    f"stores must explain the same images: {str(first.root)!r} and {str(other.root)!r} differ in "
                    f"{what} ({_short(a)} vs {_short(b)})"
                )
    names = [s.manifest["method"].get("key") or s.manifest["method"]["name"] for s in opened]
    names = [f"{n} ({names[:i].count(n) + 1})" if names.count(n) > 1 else n for i, n in enumerate(names)]
    columns = []
    for name, s in zip(names, opened, strict=True):
        columns.append(Column(name, s, s.targets, s.scores, _display_defaults(s.manifest), s.manifest))
    return columns


def _display_defaults(manifest: dict[str, Any]) -> dict[str, Any]:
    from ..methods import METHODS

    cls = METHODS.get(manifest["method"].get("key", ""))
    return dict(cls.display_defaults) if cls is not None else {}


def _short(value: Any) -> str:
    text = repr({k: v for k, v in value.items() if k != "files"} if isinstance(value, dict) else value)
    return text if len(text) < 120 else text[:117] + "..."
