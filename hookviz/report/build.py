"""`report`: a static HTML report (no server, no CDN) over the maps of one or more stores of the same images."""

from __future__ import annotations

import os
import shutil
import threading
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._present import presenter
from ..display import EmptyMapWarning
from ..generation import GenerationExplanation
from ..metrics import Evaluation
from . import mapdata, pages, thumbnails
from .output import VERSION, mark, prepare_out
from .scores import item_scores, metric_names, summary
from .sources import Items, predict, recorded_model, resolve_items
from .stores import Column, read_stores

#: items per thumbnail task (one batched render per method, then one PNG per sprite sheet); a multiple of SPRITE
THUMB_BLOCK = 4 * thumbnails.SPRITE


class _Locked:
    """Row reads of a store from several threads: `ExplanationStore` keeps one shard open and is not thread-safe."""

    def __init__(self, maps: Any) -> None:
        self.maps, self.lock = maps, threading.Lock()

    def __getitem__(self, index: slice) -> Tensor:
        with self.lock:
            return self.maps[index].float()


def _memory_columns(maps: Mapping[str, Any]) -> list[Column]:
    columns = []
    n = None
    for name, m in maps.items():
        if not isinstance(name, str) or not isinstance(m, Tensor) or m.dim() != 4:
            raise TypeError(
                "stores given as a mapping must map method names (str) to (N, C, h, w) tensors of maps, got "
                f"{name!r}: {type(m).__name__}" + (f" of shape {tuple(m.shape)}" if isinstance(m, Tensor) else "")
            )
        if n is not None and m.shape[0] != n:
            raise ValueError(f"stores must hold maps of the same images: {name!r} has {m.shape[0]} maps, not {n}")
        n = m.shape[0]
        from ..methods import METHODS

        cls = METHODS.get(name)
        display = dict(cls.display_defaults) if cls is not None else {}
        minus = torch.full((n,), -1, dtype=torch.long)
        columns.append(Column(name, m.detach().cpu(), minus, torch.full((n,), float("nan")), display, {}))
    if not columns:
        raise ValueError("stores is an empty mapping; pass at least one method's maps")
    return columns


@presenter("report")  # explain_dataset(report=True) reaches it through hookviz._present
def report(
    stores: Any,
    out: str | os.PathLike[str],
    *,
    data: Any = None,
    model: nn.Module | None = None,
    evaluation: Evaluation | None = None,
    sanity_figure: str | os.PathLike[str] | None = None,
    title: str | None = None,
    overwrite: bool = False,
    workers: int | None = None,
) -> Path:
    """Write a static HTML report of a data set's explanations to `out`; returns the path of its ``index.html``.

    The report (plain HTML, CSS and a small script; no server, no CDN: it opens from the file system) has a grid
    with one row per image and one column per method, thumbnails loading lazily, per image its label, prediction and
    probability, target and per-method metrics; sorting and filtering (class, right / wrong, a metric's value, text
    over names and labels) with the state in the URL; a detail view with the full-size image, each method's map and
    the display controls of `Explanation` (mode, sign, colour map, overlay, sample or shared scale) redone in the
    browser from the stored maps; and ``summary.html`` with the methods x metrics table, per-class means and the
    sanity-check figure.

    Args:
        stores: a store directory written by `explain_dataset` (or an `ExplanationStore`), or a list of them over
            the same images (one column each), or a mapping ``{method name: (N, C, h, w) maps}`` computed in memory.
        out: the report folder; created if missing, replaced if it holds a previous report, refused if it holds
            anything else unless `overwrite` (then only the report's own files are replaced).
        data: the data set the maps explain (e.g. ``hookviz.zoo.ShapesDataset``, an ``ImageFolder``, a list of
            image paths); default: the one recorded in the store's manifest (shapes sets, image folders and image
            files are), else the maps are shown alone. Image files reach `model` by its own preprocessing
            (`hookviz.images.auto_preprocess`), the rule of `visualize` and `explain_dataset`.
            With object masks (shapes), the pointing game and the energy in the mask are computed per image.
        model: the classifier, for predictions and their softmax probabilities (one forward pass over `data`,
            model flags restored); default: the embedded shapes model when the store's model fingerprint is its,
            else a store that explained the top class gives the predictions (without probabilities).
        evaluation: a `hookviz.metrics.evaluate` result over the same items: its per-image values (deletion,
            insertion) join the grid and its table the summary.
        sanity_figure: an image file (PNG, SVG) of the sanity check, shown on the summary page.
        title: the report's title (default: the methods and the number of images).
        workers: threads writing thumbnails (default: the CPU count).

    Example::

        hookviz.report(["runs/gradcam", "runs/guided"], "report/")   # then open report/index.html
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an int >= 1 or None, got {workers!r}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    if sanity_figure is not None and not Path(sanity_figure).is_file():
        raise FileNotFoundError(f"sanity_figure={str(sanity_figure)!r} is not a file")
    if isinstance(stores, GenerationExplanation) or (
        isinstance(stores, Mapping) and any(isinstance(v, GenerationExplanation) for v in stores.values())
    ):
        raise TypeError(
            "stores holds generation explanations; report them with hookviz.report_generation(explanations, out)"
        )
    if isinstance(stores, Mapping):
        columns = _memory_columns(stores)
        manifest: dict[str, Any] = {}
    else:
        columns = read_stores(stores)
        manifest = columns[0].manifest
    n = len(columns[0].targets)
    item_shape = tuple(manifest.get("item_shape") or columns[0].maps[0:1].shape[1:])
    if model is None and data is None:
        model = recorded_model(manifest)
    items = resolve_items(data, manifest.get("data"), n, item_shape, model)
    path = prepare_out(out, overwrite)
    start = time.perf_counter()
    preds, probs = _predictions(columns, items, model)
    scores = item_scores(columns, items, evaluation)
    metrics = metric_names(scores, evaluation)
    summ = summary(columns, scores, metrics, items.labels, evaluation)
    for c in columns:
        if not isinstance(c.maps, Tensor):
            c.maps = _Locked(c.maps)
    _write_images(path, columns, items, workers or os.cpu_count() or 1)
    if sanity_figure is not None:
        shutil.copyfile(sanity_figure, path / f"sanity{Path(sanity_figure).suffix.lower()}")
    title = title or f"{', '.join(c.name for c in columns)} on {n} images"
    full = thumbnails.image_size(items, columns)
    pages.write_site(
        path,
        title=title,
        columns=columns,
        items=items,
        preds=preds,
        probs=probs,
        scores=scores,
        metrics=metrics,
        summary=summ,
        full=full,
        thumb=thumbnails.thumb_shape(*full),
        sanity=f"sanity{Path(sanity_figure).suffix.lower()}" if sanity_figure is not None else None,
    )
    info = {
        "format": "hookviz-report",
        "version": VERSION,
        "complete": True,
        "items": n,
        "methods": [c.name for c in columns],
    }
    mark(path, {**info, "seconds": round(time.perf_counter() - start, 3)})
    return path / "index.html"


def _predictions(columns: list[Column], items: Items, model: nn.Module | None) -> tuple[Tensor | None, Tensor | None]:
    if model is not None and items.inputs is not None:
        return predict(model, items.inputs, items.n)
    for c in columns:  # a store that explained each image's top class knows the predictions (not their probability)
        if c.manifest.get("target", {}).get("kind") == "top" and bool((c.targets >= 0).all()):
            return c.targets, None
    return None, None


def _write_images(path: Path, columns: list[Column], items: Items, workers: int) -> None:
    """Thumbnails and the detail view's map files, written by a pool of threads (torch and zlib release the GIL)."""
    full = thumbnails.image_size(items, columns)
    size = thumbnails.thumb_shape(*full)
    folders = [None if thumbnails.drawn_in_page(c, full, size) else f"m/{j}" for j, c in enumerate(columns)]
    for folder in ("img", "maps", *(f for f in folders if f is not None)):
        (path / folder).mkdir(parents=True)
    if size != full:
        (path / "full").mkdir()
    torch_threads = torch.get_num_threads()
    with warnings.catch_warnings():
        # constant maps are drawn as constant images; the report is no place for a warning per image
        warnings.simplefilter("ignore", EmptyMapWarning)
        torch.set_num_threads(1)  # the pool is the parallelism; torch's own threads would only contend with it
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hookviz-report") as pool:
                jobs = [
                    pool.submit(thumbnails.write_block, path, columns, items, folders, a, b, full, size)
                    for a, b in thumbnails.blocks(items.n, THUMB_BLOCK)
                ]
                jobs += [
                    pool.submit(mapdata.write_block, path, columns, a, b)
                    for a, b in thumbnails.blocks(items.n, mapdata.BLOCK)
                ]
                for job in jobs:
                    job.result()
        finally:
            torch.set_num_threads(torch_threads)
