"""`explain_dataset`: explain every item of a data set in one call, into sharded, checksummed, resumable files.

The items are cut into shards of `shard_size` consecutive items, and each shard into batches of `batch_size`; the
cut depends only on those two numbers, so a resumed run, a run on several ranks and an uninterrupted run compute
exactly the same batches. DataLoader workers (and pinned memory on CUDA) feed the model's device while a writer
thread encodes, checksums and saves the previous shard; the only host synchronisation per batch is the copy of its
maps into the shard's host buffer.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data import default_collate as _default_collate

from .._checks import int_option
from .._present import present
from .._progress import progress_bar
from ..inputs import model_device
from ..methods.base import Attribution
from ..targets import Targets
from . import store as _store
from .distributed import World, current_world, process_group
from .files import ImageFiles, is_image_list
from .source import describe_data
from .store import DTYPES, MANIFEST, ExplanationStore

DatasetTarget = "int | str | Callable[[Any], Tensor] | None"
# the fields a resumed run must share with the stored one, and how they are named in the error
_RESUME_FIELDS = {
    "model": "model",
    "method": "method",
    "options": "method options",
    "target": "target spec",
    "dtype": "dtype",
    "items": "number of items",
    "shard_size": "shard_size",
}


# ------------------------------------------------------------------------------------------- checks and specs


def _hookviz_version() -> str:
    try:
        return version("hookviz")
    except PackageNotFoundError:
        return "0+unknown"


def model_fingerprint(model: nn.Module) -> dict[str, str]:
    """The model's class name and a SHA-256 of its state_dict (names, dtypes, shapes and bytes, in key order)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return {"class": type(model).__qualname__, "state_dict_sha256": h.hexdigest()}


def _method_options(method: Attribution) -> dict[str, Any]:
    """The method's public, JSON-able settings; per-call results (coverage, deltas) are tensors or objects, skipped."""
    simple = (bool, int, float, str)
    opts: dict[str, Any] = {}
    for key, value in sorted(vars(method).items()):
        if key.startswith("_") or key == "model" or value is None:
            continue
        if isinstance(value, Attribution):
            opts[key] = type(value).__name__
        elif isinstance(value, simple):
            opts[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, simple) for v in value):
            opts[key] = list(value)
    if isinstance(getattr(type(method), "layer", None), property):
        # a layer chosen on the first call is recorded as "auto", so a fresh and a used method object agree
        opts["layer"] = "auto" if getattr(method, "_auto", False) else method.layer  # type: ignore[attr-defined]
    return opts


def _target_spec(target: object) -> dict[str, Any]:
    if target is None:
        return {"kind": "top"}
    if isinstance(target, bool):
        raise TypeError("target must be None, an int class index, 'label' or a callable, not a bool")
    if isinstance(target, int):
        if target < 0:
            raise ValueError(f"target class must be >= 0, got {target}")
        return {"kind": "class", "class": target}
    if isinstance(target, str):
        if target != "label":
            raise ValueError(f"target string must be 'label' (the data set's labels), got {target!r}")
        return {"kind": "label"}
    if callable(target):
        name = getattr(target, "__qualname__", None) or type(target).__qualname__
        return {"kind": "callable", "name": f"{getattr(target, '__module__', '')}.{name}"}
    raise TypeError(
        "target must be None (top class), an int class index, 'label' (the data set's labels) or a callable "
        f"f(output) -> (N,) scores; got {type(target).__name__}"
    )


def _check_out(out: str | os.PathLike[str]) -> Path:
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a directory path (str or os.PathLike), got {type(out).__name__}")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(path)!r} is a file; pass a directory (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hookviz-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"out={str(path)!r} is not a writable directory ({exc.strerror or exc})") from None
    return path


@dataclass
class _Source:
    dataset: Dataset
    collate: Callable[[list[Any]], Any]
    batch_size: int
    num_workers: int
    labelled: bool
    item_shape: tuple[int, ...]


def _source(data: Any, batch_size: int, num_workers: int, needs_labels: bool) -> _Source:
    collate: Callable[[list[Any]], Any] = _default_collate
    if isinstance(data, DataLoader):
        # the loader's dataset, batch size, workers and collate_fn are used; its sampler is not: items are stored in
        # data set order so that item i of the store is item i of the data set
        dataset, collate = data.dataset, data.collate_fn
        batch_size = data.batch_size or batch_size
        num_workers = data.num_workers
    else:
        dataset = data
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"data must be a map-style Dataset (with __len__ and __getitem__) or a DataLoader over one, got "
            f"{type(dataset).__name__}; shards are resumed by item index, which an IterableDataset does not have"
        )
    int_option("batch_size", batch_size, "an int >= 1")
    int_option("num_workers", num_workers, "an int >= 0", minimum=0)
    if len(dataset) == 0:
        raise ValueError("data holds no items (len(data) == 0)")
    first = dataset[0]
    if isinstance(first, Tensor):
        image, labelled = first, False
    elif isinstance(first, (tuple, list)) and first and isinstance(first[0], Tensor):
        image, labelled = first[0], len(first) >= 2
    else:
        raise TypeError(
            "data items must be image tensors or (image, label) pairs with a tensor image; item 0 is "
            f"{type(first).__name__}" + (f" of {type(first[0]).__name__}" if isinstance(first, (tuple, list)) else "")
        )
    if needs_labels and not labelled:
        raise ValueError(
            "target='label' needs a data set that yields (image, label) pairs, but item 0 is a bare tensor; pass "
            "target=None (top class), an int or a callable instead"
        )
    return _Source(dataset, collate, batch_size, num_workers, labelled, tuple(image.shape))


def _mismatch(stored: Mapping[str, Any], header: Mapping[str, Any], out: Path) -> None:
    for key, what in _RESUME_FIELDS.items():
        if stored.get(key) != header[key]:
            raise ValueError(
                f"out={str(out)!r} holds explanations made with a different {what}: stored {stored.get(key)!r}, "
                f"now {header[key]!r}; pass overwrite=True to start again, or another out directory"
            )


def _stored_records(out: Path) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
    """The stored run's header (any manifest found) and its shard records: manifest.json, then every rank's."""
    header: dict[str, Any] | None = None
    records: dict[int, dict[str, Any]] = {}
    paths = [out / MANIFEST, *sorted(out.glob("manifest-rank*.json"))]
    for path in paths:
        manifest = _store.read_json(path)
        if manifest is None or manifest.get("format") != _store.FORMAT:
            continue
        if header is None or (header.get("map_shape") is None and manifest.get("map_shape") is not None):
            header = manifest  # prefer a manifest that knows the map shape (a rank with no work has none)
        for rec in manifest.get("shards", []):
            records[int(rec["index"])] = rec
    return header, records


def _remove_run(out: Path) -> None:
    """Delete a stored run's own files (shards, manifests, temporaries); nothing else in `out` is touched."""
    for pattern in ("shard-*.safetensors", "manifest*.json", ".shard-*.tmp", ".manifest*.tmp"):
        for path in out.glob(pattern):
            path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------- the writer thread


@dataclass
class _Shard:
    index: int
    start: int
    stop: int
    maps: Tensor
    targets: Tensor
    scores: Tensor

    @classmethod
    def empty(cls, index: int, lo: int, hi: int, shape: list[int], k: int, dtype: torch.dtype) -> _Shard:
        """The host buffers of shard `index` (items ``[lo, hi)``, maps of `shape` in `dtype`, K targets)."""
        return cls(
            index,
            lo,
            hi,
            torch.empty((hi - lo, *shape), dtype=dtype),
            torch.empty((hi - lo, k), dtype=torch.long),
            torch.empty((hi - lo, k), dtype=torch.float32),
        )

    def put(self, a: int, b: int, attribution: Tensor, targets: Targets) -> None:
        """Items ``a..b-1``'s results copied in: the one host synchronisation per batch."""
        rows = slice(a - self.start, b - self.start)
        self.maps[rows].copy_(attribution.detach().to(self.maps.dtype))
        self.scores[rows].copy_(targets.scores.detach())
        if targets.indices is None:
            self.targets[rows].fill_(-1)  # a callable target has no class
        else:
            self.targets[rows].copy_(targets.indices)


class _Writer(threading.Thread):
    """Saves finished shards in the background, then rewrites the progress manifest; keeps the first error."""

    def __init__(self, out: Path, manifest_path: Path, manifest: dict[str, Any]) -> None:
        super().__init__(name="hookviz-shard-writer", daemon=True)
        self.out, self.manifest_path, self.manifest = out, manifest_path, manifest
        self.jobs: queue.Queue[_Shard | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.failed_shard: int | None = None

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.error is not None:
                continue  # drain: the main thread must never block on a dead writer
            try:
                self._save(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises it
                self.error, self.failed_shard = exc, job.index

    def _save(self, job: _Shard) -> None:
        data = _store.encode_shard(job.maps, job.targets, job.scores)
        name = _store.shard_name(job.index)
        _store.atomic_write(self.out / name, data)
        record = {
            "index": job.index,
            "file": name,
            "start": job.start,
            "stop": job.stop,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        shards = [r for r in self.manifest["shards"] if r["index"] != job.index] + [record]
        self.manifest["shards"] = sorted(shards, key=lambda r: r["index"])
        _store.atomic_write(self.manifest_path, _store.manifest_bytes(self.manifest))

    def submit(self, job: _Shard) -> None:
        self.raise_error()
        self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(None)
        self.join()

    def raise_error(self) -> None:
        exc = self.error
        if exc is None:
            return
        done = len(self.manifest["shards"])
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"no space left on device while writing shard {self.failed_shard} to {str(self.out)!r}; the {done} "
                "finished shard(s) are kept (no partial shard was left): free some space and rerun with resume=True",
            ) from exc
        raise RuntimeError(
            f"writing shard {self.failed_shard} to {str(self.out)!r} failed ({type(exc).__name__}: {exc}); the "
            f"{done} finished shard(s) are kept: rerun with resume=True"
        ) from exc


# ------------------------------------------------------------------------------------------- the run


@contextmanager
def _on_rank_device(model: nn.Module, world: World) -> Iterator[torch.device]:
    """Under torchrun with GPUs, a CPU model runs on its LOCAL_RANK device; it is moved back afterwards."""
    device = model_device(model)
    if not (world.distributed and device.type == "cpu" and torch.cuda.is_available()):
        yield device
        return
    target = torch.device("cuda", world.local_rank % torch.cuda.device_count())
    model.to(target)
    try:
        yield target
    finally:
        model.to(device)


def _check_dataset_kwargs(forward_kwargs: object, n: int) -> None:
    """forward_kwargs of `explain_dataset`: a dict whose tensors have one row per item, checked before any work."""
    if forward_kwargs is None:
        return
    if not isinstance(forward_kwargs, dict) or not all(isinstance(k, str) for k in forward_kwargs):
        raise TypeError(
            "forward_kwargs must be a dict of keyword arguments of forward (str keys), e.g. {'attention_mask': "
            f"masks}}; got {type(forward_kwargs).__name__}"
        )
    for key, value in forward_kwargs.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] != n:
            raise ValueError(
                f"forward_kwargs[{key!r}] has shape {tuple(value.shape)}; tensors among explain_dataset's "
                f"forward_kwargs must have one row per data set item (first dimension {n}), sliced per batch"
            )


def _batch_kwargs(forward_kwargs: dict[str, Any] | None, a: int, b: int, n: int) -> dict[str, Any] | None:
    """The forward_kwargs of items a..b-1: per-item tensors sliced, the rest as they are."""
    if forward_kwargs is None:
        return None
    return {
        k: v[a:b] if isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == n else v
        for k, v in forward_kwargs.items()
    }


def explain_dataset(
    method: Attribution,
    data: Dataset | DataLoader,
    out: str | os.PathLike[str],
    *,
    target: int | str | Callable[[Any], Tensor] | None = None,
    batch_size: int = 64,
    num_workers: int = 0,
    dtype: str = "float16",
    shard_size: int = 1024,
    resume: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    forward_kwargs: dict[str, Any] | None = None,
    report: bool | str | os.PathLike[str] = False,
) -> ExplanationStore:
    """Explain every item of `data` with `method` and store the maps as shards under `out`; returns the store.

    Args:
        method: an attribution method instance, e.g. ``hookviz.GuidedBackprop(model)``; maps are what its
            ``attribute`` returns (Grad-CAM family: at the layer's resolution), computed batched on the model's
            device.
        data: a map-style `Dataset` yielding image tensors (C, H, W) or ``(image, label, ...)`` tuples, or a
            `DataLoader` over one (its batch size, workers and collate_fn are used; items are stored in data set
            order whatever its sampler), or a list of image paths (PIL images, numpy arrays): read as
            `hookviz.dataset.ImageFiles` with the model's own preprocessing, the rule of `visualize`
            (`hookviz.images.auto_preprocess`).
        out: a directory (created if missing) for ``shard-*.safetensors`` and ``manifest.json``.
        target: None (each item's top class), an int (one class for all), ``"label"`` (the data set's labels) or a
            callable ``f(output) -> (N,)`` scores.
        dtype: storage dtype of the maps, ``"float16"`` (default), ``"bfloat16"`` or ``"float32"``; targets are
            stored as int64 (-1 for callable targets) and scores as float32.
        shard_size: items per shard (the unit of checkpointing and of distribution over ranks).
        resume: continue a run found in `out`: finished shards whose SHA-256 matches are kept, missing or corrupted
            ones are recomputed. A stored run made with another model (class or state_dict hash), method or method
            options, target spec, dtype, item count or shard size is refused with the mismatch named. With
            ``resume=False`` an existing run is refused too.
        overwrite: delete the run found in `out` (only its own files) and start again.
        progress: a tqdm bar with images/s (rank 0 only).
        forward_kwargs: keyword arguments of the model's ``forward`` (e.g. ``{"attention_mask": masks}``): tensors
            with one row per data set item (first dimension ``len(data)``) are sliced to each batch's items, in data
            set order; anything else is passed to every batch as it is (see `Attribution.attribute`).
        report: also write a static HTML report of the maps (`hookviz.report`): True for ``out/report``, or a folder.

    Crash safety: each shard is written to a temporary name, fsync'ed and renamed atomically, then the manifest is
    rewritten the same way, so a run killed at any point (SIGKILL included) and run again yields exactly the maps of
    an uninterrupted run. Under ``torchrun`` (``WORLD_SIZE``/``RANK``), each rank computes its own contiguous block
    of shards (on its ``LOCAL_RANK`` GPU when there are GPUs) and rank 0 writes the final manifest after a barrier;
    a process group is initialised (nccl or gloo) only if none exists, and destroyed again.

    Example::

        store = hookviz.explain_dataset(hookviz.GradCAM(model), dataset, "runs/gradcam", target="label")
        hits = hookviz.metrics.pointing_game(store[:], masks)
    """
    if not isinstance(method, Attribution):
        raise TypeError(
            f"method must be a hookviz attribution method instance such as hookviz.GuidedBackprop(model), got "
            f"{type(method).__name__}"
        )
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    int_option("shard_size", shard_size, "an int >= 1")
    if not isinstance(report, (bool, str, os.PathLike)):
        raise TypeError(f"report must be a bool or a folder path, got {type(report).__name__}")
    spec = _target_spec(target)
    if is_image_list(data):  # image files: preprocessed as visualize and grid do (the model's own rule)
        data = ImageFiles(data, method.model)
    src = _source(data, batch_size, num_workers, needs_labels=spec["kind"] == "label")
    _check_dataset_kwargs(forward_kwargs, len(src.dataset))
    job = _Job(method, src, spec, target, _check_out(out), len(src.dataset), shard_size, dtype, forward_kwargs)
    world = current_world()
    header = _header(job, world)
    stored, _ = _stored_records(job.out)
    if stored is not None and not overwrite:
        if not resume:
            raise ValueError(
                f"out={str(job.out)!r} already holds a hookviz run; pass resume=True to continue it or "
                "overwrite=True to start again"
            )
        _mismatch(stored, header, job.out)
    with process_group(world):
        _run_shards(job, header, stored, world, overwrite, progress)
    store = ExplanationStore(job.out)
    if report is not False and world.rank == 0:
        # the report sits above the data sets (presentation): reached through the seam it registers on import
        present("report", store, job.out / "report" if report is True else report, data=src.dataset, model=method.model)
    return store


@dataclass
class _Job:
    """One `explain_dataset` run: what is explained (method, items, targets) and how it is stored."""

    method: Attribution
    src: _Source
    spec: dict[str, Any]
    target: Any
    out: Path
    n: int  # items
    shard_size: int
    dtype: str
    forward_kwargs: dict[str, Any] | None = None  # keyword arguments of forward, per-item tensors sliced

    @property
    def num_shards(self) -> int:
        return -(-self.n // self.shard_size)

    def shard_rows(self, s: int) -> tuple[int, int]:
        """Items ``[lo, hi)`` of shard `s`."""
        return s * self.shard_size, min(self.n, (s + 1) * self.shard_size)


def _header(job: _Job, world: World) -> dict[str, Any]:
    """The manifest's description of the run, which a resumed run must match."""
    return {
        "format": _store.FORMAT,
        "format_version": _store.FORMAT_VERSION,
        "complete": False,
        "method": {"name": type(job.method).__name__, "key": getattr(job.method, "key", "")},
        "options": _method_options(job.method),
        "model": model_fingerprint(job.method.model),
        "target": job.spec,
        "dtype": job.dtype,
        "items": job.n,
        "shard_size": job.shard_size,
        "num_shards": job.num_shards,
        "batch_size": job.src.batch_size,
        "item_shape": list(job.src.item_shape),
        "versions": {"hookviz": _hookviz_version(), "torch": torch.__version__},
        "world_size": world.size,
        "data": describe_data(job.src.dataset),
    }


def _run_shards(
    job: _Job, header: dict[str, Any], stored: dict[str, Any] | None, world: World, overwrite: bool, progress: bool
) -> None:
    """This rank's shards computed (those not already done), then the final manifest written by rank 0."""
    out = job.out
    if overwrite and world.rank == 0:
        _remove_run(out)
    world.barrier()
    mine = world.shards(job.num_shards)
    _, records = _stored_records(out)
    done = [records[i] for i in mine if i in records and _shard_ok(out, records[i])]
    if stored is not None and stored.get("map_shape") is not None:
        header["map_shape"] = stored["map_shape"]
    for i in mine:  # temporaries of this rank's shards, left by a killed run
        (out / _store.tmp_name(_store.shard_name(i))).unlink(missing_ok=True)
    manifest_path = out / (MANIFEST if not world.distributed else _store.rank_manifest_name(world.rank))
    manifest_path.with_name(_store.tmp_name(manifest_path.name)).unlink(missing_ok=True)
    manifest = {**header, "shards": done}
    _store.atomic_write(manifest_path, _store.manifest_bytes(manifest))
    todo = [i for i in mine if i not in {r["index"] for r in done}]
    with _on_rank_device(job.method.model, world) as device:
        map_shape = _compute(job, todo, device, manifest_path, manifest, progress and world.rank == 0)
    world.barrier()
    if world.rank == 0:
        _finish(out, header, job.num_shards, map_shape)
    world.barrier()


def _shard_ok(out: Path, record: Mapping[str, Any]) -> bool:
    path = out / record["file"]
    return (
        path.is_file()
        and path.stat().st_size == record.get("bytes", -1)
        and _store.sha256_file(path) == record["sha256"]
    )


def _finish(out: Path, header: dict[str, Any], num_shards: int, map_shape: list[int] | None) -> None:
    stored, records = _stored_records(out)
    missing = [i for i in range(num_shards) if i not in records]
    if missing:
        raise RuntimeError(f"shards {missing[:10]} are missing after every rank finished; rerun with resume=True")
    final = {**header, "complete": True, "shards": [records[i] for i in range(num_shards)]}
    final["map_shape"] = map_shape or (stored or {}).get("map_shape") or header.get("map_shape")
    final["multi_target"] = bool((stored or {}).get("multi_target", header.get("multi_target", False)))
    _store.atomic_write(out / MANIFEST, _store.manifest_bytes(final))
    for path in out.glob("manifest-rank*.json"):
        path.unlink(missing_ok=True)


def _batches(todo: Sequence[int], n: int, shard_size: int, batch_size: int) -> list[tuple[int, int, int]]:
    """(shard, start, stop) of every batch: batches never cross a shard boundary, whatever was already done."""
    out = []
    for s in todo:
        lo, hi = s * shard_size, min(n, (s + 1) * shard_size)
        out.extend((s, a, min(a + batch_size, hi)) for a in range(lo, hi, batch_size))
    return out


def _compute(
    job: _Job,
    todo: list[int],
    device: torch.device,
    manifest_path: Path,
    manifest: dict[str, Any],
    progress: bool,
) -> list[int] | None:
    """Compute the shards in `todo` and hand each to the writer thread; returns the map shape (None if no work)."""
    map_shape: list[int] | None = manifest.get("map_shape")
    if not todo:
        return map_shape
    src = job.src
    plan = _batches(todo, job.n, job.shard_size, src.batch_size)
    loader = DataLoader(
        src.dataset,
        batch_sampler=[list(range(a, b)) for _, a, b in plan],
        num_workers=src.num_workers,
        collate_fn=src.collate,
        pin_memory=device.type == "cuda",
    )
    writer = _Writer(job.out, manifest_path, manifest)
    writer.start()
    bar = progress_bar(
        total=sum(b - a for _, a, b in plan), enabled=progress, unit="img", desc="explain_dataset", dynamic_ncols=True
    )
    buf: _Shard | None = None
    try:
        batches = iter(loader)
        for s, a, b in plan:
            x, labels = _next_batch(batches, src, a, b)
            tgt = _labels(labels, a, b) if job.spec["kind"] == "label" else job.target
            kwargs = _batch_kwargs(job.forward_kwargs, a, b, job.n)
            attribution, targets = job.method.attribute_with_targets(
                x.to(device, non_blocking=True), tgt, forward_kwargs=kwargs
            )
            shape = list(attribution.shape[1:])
            if map_shape is None:
                map_shape = shape
                manifest["map_shape"], manifest["multi_target"] = shape, targets.multi
            elif shape != map_shape:
                raise ValueError(f"maps of items {a}..{b - 1} have shape {shape}, the stored ones have {map_shape}")
            if buf is None or buf.index != s:
                buf = _Shard.empty(s, *job.shard_rows(s), shape, targets.scores.shape[1], DTYPES[job.dtype])
            buf.put(a, b, attribution, targets)
            if b == buf.stop:
                writer.submit(buf)
                buf = None
            bar.update(b - a)
    finally:
        bar.close()
        writer.close()  # the shards finished so far are saved, also when the loop was interrupted
    writer.raise_error()
    return map_shape


def _next_batch(batches: Iterator[Any], src: _Source, a: int, b: int) -> tuple[Tensor, Any]:
    """The next batch (items ``a..b-1``) as (images, labels or None), with a clear error for items of mixed shapes."""
    try:
        batch = next(batches)
    except RuntimeError as exc:
        if "stack expects each tensor to be equal size" in str(exc):
            raise ValueError(
                f"data items {a}..{b - 1} have different shapes and cannot be batched; resize them to one "
                f"size (e.g. transforms.Resize + CenterCrop); item 0 has shape {src.item_shape}"
            ) from None
        raise
    x, labels = (batch, None) if isinstance(batch, Tensor) else (batch[0], batch[1] if src.labelled else None)
    if tuple(x.shape[1:]) != src.item_shape:
        raise ValueError(
            f"data items {a}..{b - 1} have shape {tuple(x.shape[1:])}, item 0 has {src.item_shape}; every "
            "item must have the same shape (resize them to one size)"
        )
    return x, labels


def _labels(labels: Any, a: int, b: int) -> Tensor:
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dim() != 1:
        got = f"a tensor of {labels.dtype} {tuple(labels.shape)}" if isinstance(labels, Tensor) else type(labels)
        raise TypeError(f"target='label' needs integer class labels; items {a}..{b - 1} have labels of {got}")
    return labels
