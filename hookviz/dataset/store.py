"""The on-disk layout of a stored explanation run, and `ExplanationStore`, its lazy read-back view.

A run directory holds ``shard-00000.safetensors``, ``shard-00001.safetensors``, ... and ``manifest.json``. Each shard
holds three tensors for a contiguous range of items: ``maps`` (n, ...) in the stored dtype, ``targets`` (n, K) int64
(-1 for callable targets) and ``scores`` (n, K) float32. The manifest records how the maps were made and every
shard's index range and SHA-256.

Why safetensors rather than ``.npy``: one file per shard (so one atomic rename commits a shard, and one checksum
covers it), native bfloat16 (numpy has none), and lazy memory-mapped reads (`safetensors.safe_open`). Speed is a
wash: for a shard of 1024 fp16 maps of (3, 64, 64), 25 MB, written with fsync plus SHA-256 and read back with
SHA-256 (median of 5, this project's 2 loaded cores, ``benchmarks/bench_shard_format.py``), safetensors took
131 ms to write / 56 ms to read against 112 / 49 ms for three ``.npy`` files in one run, and 402 / 181 ms against
415 / 195 ms in another under heavier load; either is small next to computing the maps.

Every file is written to a temporary name in the same directory, flushed and fsync'ed, then renamed over its final
name (`os.replace` is atomic on POSIX), so a killed run leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FORMAT = "hookviz-explanations"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def rank_manifest_name(rank: int) -> str:
    """The progress manifest of one rank in a distributed run (merged into ``manifest.json`` at the end)."""
    return f"manifest-rank{rank:03d}.json"


def tmp_name(name: str) -> str:
    return f".{name}.tmp"


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory: write, flush, fsync, rename.

    On any failure (a full disk included) the temporary file is removed and `path` is left as it was.
    """
    tmp = path.with_name(tmp_name(path.name))
    try:
        with open(tmp, "wb") as f:
            _write_bytes(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _write_bytes(f: Any, data: bytes) -> None:
    # one indirection so tests can simulate a full disk (ENOSPC) halfway through a file
    f.write(data)


def _fsync_dir(directory: Path) -> None:
    # the rename itself is durable only once the directory entry is flushed (POSIX; a no-op where unsupported)
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def encode_shard(maps: Tensor, targets: Tensor, scores: Tensor) -> bytes:
    from safetensors.torch import save

    return save({"maps": maps.contiguous(), "targets": targets.contiguous(), "scores": scores.contiguous()})


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def read_json(path: Path) -> dict[str, Any] | None:
    """A manifest, or None when the file is missing or unreadable (a run killed before its first manifest)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


class ExplanationStore:
    """A lazy, indexable view of the maps written by `explain_dataset` (memory-mapped, one shard open at a time).

    ``store[i]`` is item i's map (a float32 tensor shaped like one map), ``store[a:b]`` (or a list / 1-D tensor of
    indices) an (n, ...) float32 tensor, so items plug straight into the metrics (``pointing_game(store[:], masks)``).
    ``store.targets`` and ``store.scores`` are (N,) tensors ((N, K) when the targets were K per input: a callable
    returning (N, K) scores); targets are -1 where a callable target gave no class index. ``store.manifest`` is the
    manifest dict; `explanation` builds an `Explanation` of some items (for `hookviz.grid`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        root = Path(path)
        manifest = read_json(root / MANIFEST)
        if manifest is None or manifest.get("format") != FORMAT:
            raise FileNotFoundError(f"{str(root)!r} holds no hookviz explanations ({MANIFEST} missing or unreadable)")
        if not manifest.get("complete"):
            done = len(manifest.get("shards", []))
            raise ValueError(
                f"{str(root)!r} holds an unfinished run ({done} of {manifest.get('num_shards')} shards); rerun "
                "explain_dataset with resume=True to finish it"
            )
        self.root = root
        self.manifest = manifest
        self._shards = sorted(manifest["shards"], key=lambda s: s["start"])
        self._starts = [s["start"] for s in self._shards]
        self._len = int(manifest["items"])
        self._open: dict[int, Any] = {}
        self._targets: Tensor | None = None
        self._scores: Tensor | None = None

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"ExplanationStore({str(self.root)!r}: {self._len} maps of shape {tuple(m.get('map_shape', ()))} by "
            f"{m['method']['name']}, {m['dtype']}, {len(self._shards)} shards)"
        )

    def _file(self, i: int) -> Any:
        from safetensors import safe_open

        if i not in self._open:
            self._open.clear()  # keep one shard mapped at a time
            self._open[i] = safe_open(str(self.root / self._shards[i]["file"]), framework="pt")
        return self._open[i]

    def _read(self, key: str, start: int, stop: int) -> Tensor:
        """Rows [start, stop) of tensor `key`, read from the shards that hold them."""
        parts = []
        s = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            shard = self._shards[s]
            end = min(stop, shard["stop"])
            parts.append(self._file(s).get_slice(key)[start - shard["start"] : end - shard["start"]])
            start, s = end, s + 1
        if not parts:
            return self._empty(key)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _empty(self, key: str) -> Tensor:
        if key == "maps":
            return torch.empty(0, *self.manifest.get("map_shape", ()), dtype=DTYPES[self.manifest["dtype"]])
        return self._file(0).get_slice(key)[0:0]

    def __getitem__(self, index: int | slice | Sequence[int] | Tensor) -> Tensor:
        if isinstance(index, bool):
            raise TypeError("index must be an int, a slice or a sequence of ints, not a bool")
        if isinstance(index, int) or (isinstance(index, Tensor) and index.dim() == 0):
            i = int(index)
            if not -self._len <= i < self._len:
                raise IndexError(f"index {i} is out of range for a store of {self._len} items")
            i %= self._len
            return self._read("maps", i, i + 1)[0].float()
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step == 1:
                return self._read("maps", start, max(start, stop)).float()
            index = range(start, stop, step)
        if isinstance(index, (Sequence, range, Tensor)) and not isinstance(index, str):
            idx = torch.as_tensor(list(index) if isinstance(index, range) else index, dtype=torch.long).flatten()
            if idx.numel() and ((idx >= self._len) | (idx < -self._len)).any():
                raise IndexError(f"indices out of range for a store of {self._len} items")
            idx = idx % max(self._len, 1)
            return torch.stack([self[int(i)] for i in idx]) if idx.numel() else self._read("maps", 0, 0).float()
        raise TypeError(f"index must be an int, a slice or a sequence of ints, got {type(index).__name__}")

    def __iter__(self) -> Iterator[Tensor]:
        for shard in self._shards:
            maps = self._read("maps", shard["start"], shard["stop"])
            yield from maps.float().unbind(0)

    def _column(self, key: str) -> Tensor:
        t = self._read(key, 0, self._len)
        return t if self.manifest.get("multi_target") else t.squeeze(1)

    @property
    def targets(self) -> Tensor:
        """(N,) int64 class explained per item ((N, K) with K targets per item); -1 for callable targets."""
        if self._targets is None:
            self._targets = self._column("targets")
        return self._targets

    @property
    def scores(self) -> Tensor:
        """(N,) float32 score of the explained target per item ((N, K) with K targets per item)."""
        if self._scores is None:
            self._scores = self._column("scores")
        return self._scores

    def explanation(self, index: int | slice | Sequence[int], inputs: Tensor, images: Tensor | None = None) -> Any:
        """An `Explanation` of the items at `index` for display (`hookviz.grid`, ``.show()``).

        `inputs`: the (n, C, H, W) inputs of those items (the store keeps maps, not images); `images`: how a person
        sees them, (n, 3, H, W) in [0, 1] (default: `inputs` clamped to [0, 1]).
        """
        from ..explanation import Explanation
        from ..methods import METHODS

        idx = torch.arange(self._len)[index] if not isinstance(index, int) else torch.tensor([index])
        idx = idx.reshape(-1)
        maps = self[idx]
        targets = self._read_rows("targets", idx)
        scores = self._read_rows("scores", idx).float()
        if not isinstance(inputs, Tensor) or inputs.shape[0] != idx.numel():
            got = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(f"inputs must be a tensor with one row per item ({idx.numel()}), got {got}")
        cls = METHODS.get(self.manifest["method"].get("key", ""))
        return Explanation(
            attribution=maps,
            images=inputs.clamp(0, 1) if images is None else images,
            inputs=inputs,
            targets=None if bool((targets < 0).all()) else targets,
            scores=scores,
            method=self.manifest["method"]["name"],
            multi_target=bool(self.manifest.get("multi_target")),
            display=dict(cls.display_defaults) if cls is not None else {},
        )

    def _read_rows(self, key: str, idx: Tensor) -> Tensor:
        return torch.stack([self._read(key, int(i), int(i) + 1)[0] for i in idx])
