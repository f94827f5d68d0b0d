"""`ExplanationTracker`: a fixed probe set explained again and again while a model trains, to see how its
explanations evolve (how Grad-CAM sharpens as the model learns), stored on disk and drawn as a paper figure.

Imports no training library: the Lightning and Hugging Face callbacks that drive it live in
`hookviz.integrations.lightning` and `hookviz.integrations.transformers`.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..dataset import store as _store
from ..inputs import model_device
from ..methods import Attribution, get_method
from ..targets import TargetSpec

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_METRICS = ("pointing game", "energy in mask")


class ExplanationTracker:
    """Explain a fixed probe set with `method` every `every` optimizer steps, or at each epoch end.

    Args:
        method: a registered method name (``"gradcam"``, ``"guided-backprop"``, ...; `hookviz.METHODS`), an
            `Attribution` subclass, or a callable ``model -> Attribution``. A fresh explainer is built on the model
            at every snapshot (the model is trained in between); the model is left exactly as it was (hookviz's
            life-cycle invariant), so tracking never disturbs training.
        images: the probe set, an (N, C, H, W) float tensor (moved to the model's device at each snapshot).
        every: ``"epoch"`` (default: at each epoch end) or a positive int: every `every`-th optimizer step.
        target: the classes explained (any hookviz target spec: None is the model's top class *at that snapshot*;
            give the labels to follow one class through training).
        masks: optional (N, H, W) bool object masks, for `metric`.
        store: optional directory; each snapshot is written there as a run of the data-set store format
            (``<store>/step-00000042/``: safetensors shards and a manifest, readable with
            `hookviz.ExplanationStore`), with its step and epoch in the manifest.
        dtype: the stored dtype of the maps (``"float16"``, ``"bfloat16"``, ``"float32"``).

    The maps are also kept in memory (on the CPU, in `dtype`): ``tracker.snapshots`` is a list of
    ``(step, epoch, maps)`` with maps (N, ...) as the method returns them (CAMs: (N, 1, h, w) at the layer's
    resolution). `figure` draws one image's maps across snapshots; `metric` scores them against `masks`.
    """

    def __init__(
        self,
        method: str | type[Attribution] | Callable[[nn.Module], Attribution],
        images: Tensor,
        *,
        every: int | str = "epoch",
        target: TargetSpec = None,
        masks: Tensor | None = None,
        store: str | os.PathLike[str] | None = None,
        dtype: str = "float16",
    ) -> None:
        if isinstance(method, str):
            method = get_method(method)  # unknown names fail here, with the list of known ones
        if not callable(method):
            raise TypeError(f"method must be a method name, an Attribution subclass or a callable, got {method!r}")
        if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
            got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be an (N, C, H, W) float tensor (the probe set), got {got}")
        if every != "epoch" and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ValueError(f"every must be 'epoch' or a positive int (optimizer steps), got {every!r}")
        if masks is not None:
            if not isinstance(masks, Tensor) or masks.dim() != 3 or masks.shape[0] != images.shape[0]:
                got = tuple(masks.shape) if isinstance(masks, Tensor) else type(masks).__name__
                raise ValueError(f"masks must be an (N, H, W) bool tensor with N = {images.shape[0]}, got {got}")
            masks = masks.bool()
        if dtype not in _store.DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_store.DTYPES)}, got {dtype!r}")
        self.method = method
        self.images = images.detach()
        self.every = every
        self.target = target
        self.masks = masks
        self.store = Path(store) if store is not None else None
        self.dtype = dtype
        self.snapshots: list[tuple[int, int | None, Tensor]] = []
        self.failed: str | None = None

    def __repr__(self) -> str:
        name = getattr(self.method, "__name__", type(self.method).__name__)
        return f"ExplanationTracker({name}, {self.images.shape[0]} images, every={self.every!r}, {len(self)} snapshots)"

    @property
    def name(self) -> str:
        """The method's name, for tags and titles."""
        return getattr(self.method, "key", "") or getattr(self.method, "__name__", type(self.method).__name__)

    def __len__(self) -> int:
        return len(self.snapshots)

    # -- checks and snapshots -------------------------------------------------------------------------------------
    def check(self, model: nn.Module) -> None:
        """Fail now, at fit start, on a probe set the model refuses or a target out of range: one explanation of
        the first image, its result thrown away (the model is left as it was)."""
        try:
            explainer = self._explainer(model)
            explainer.attribute(self.images[:1].to(model_device(model)), _first(self.target))
        except Exception as err:
            raise ValueError(
                f"ExplanationTracker: the probe set {tuple(self.images.shape)} cannot be explained by this model "
                f"with target={_short(self.target)}: {type(err).__name__}: {err}"
            ) from err

    def due(self, step: int) -> bool:
        """Whether a step-scheduled tracker takes a snapshot at optimizer step `step` (0-based)."""
        return isinstance(self.every, int) and step % self.every == 0

    def snapshot(self, model: nn.Module, step: int, epoch: int | None = None) -> Tensor:
        """Explain the probe set with the model as it is now; keep (and store) the maps; return them (N, ...)."""
        explainer = self._explainer(model)
        with torch.no_grad():  # hookviz enables grad inside its own call; nothing else builds a graph
            maps, targets = explainer.attribute_with_targets(self.images.to(model_device(model)), self.target)
        maps = maps.detach().to("cpu", _store.DTYPES[self.dtype])
        self.snapshots.append((int(step), epoch, maps))
        if self.store is not None:
            self._write(step, epoch, maps, targets, explainer)
        return maps

    def _guarded(self, owner: str, model: nn.Module, step: int, epoch: int | None) -> bool:
        """`snapshot` for the training-loop callbacks: a failure warns and stops the tracking, never the training.
        Returns whether a snapshot was taken."""
        if self.failed is not None:
            return False
        try:
            self.snapshot(model, step, epoch)
        except Exception as err:
            self.failed = f"{type(err).__name__}: {err}"
            _warn_failed(owner, step, err)
            return False
        return True

    def _explainer(self, model: nn.Module) -> Attribution:
        explainer = self.method(model)
        if not isinstance(explainer, Attribution):
            raise TypeError(f"method must build a hookviz Attribution, built {type(explainer).__name__}")
        return explainer

    def _write(self, step: int, epoch: int | None, maps: Tensor, targets: Any, explainer: Attribution) -> None:
        out = self.store / f"step-{int(step):08d}"  # type: ignore[operator]
        out.mkdir(parents=True, exist_ok=True)
        indices = targets.indices if targets.indices is not None else torch.full_like(targets.scores, -1).long()
        data = _store.encode_shard(maps, indices.detach().cpu().reshape(len(maps), -1), targets.scores.detach().cpu())
        name = _store.shard_name(0)
        _store.atomic_write(out / name, data)
        manifest = {
            "format": _store.FORMAT,
            "format_version": _store.FORMAT_VERSION,
            "complete": True,
            "method": {"name": type(explainer).__name__, "key": getattr(explainer, "key", "")},
            "dtype": self.dtype,
            "items": len(maps),
            "shard_size": len(maps),
            "num_shards": 1,
            "map_shape": list(maps.shape[1:]),
            "multi_target": targets.multi,
            "item_shape": list(self.images.shape[1:]),
            "tracker": {"step": int(step), "epoch": epoch},
            "shards": [
                {
                    "index": 0,
                    "file": name,
                    "start": 0,
                    "stop": len(maps),
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            ],
        }
        _store.atomic_write(out / _store.MANIFEST, _store.manifest_bytes(manifest))

    # -- results --------------------------------------------------------------------------------------------------
    def metric(self, name: str = "pointing game", **kwargs: Any) -> list[tuple[int, float]]:
        """``(step, mean score over the probe set)`` for each snapshot: ``"pointing game"`` (Zhang et al. 2018;
        `hookviz.pointing_game`, keyword `tolerance`) or ``"energy in mask"`` (Wang et al. 2020), against `masks`."""
        from ..metrics import energy_in_mask, pointing_game

        if name not in _METRICS:
            raise ValueError(f"metric must be one of {list(_METRICS)}, got {name!r}")
        if self.masks is None:
            raise ValueError(f"metric {name!r} needs object masks: pass masks= (N, H, W) to the ExplanationTracker")
        fn = pointing_game if name == "pointing game" else energy_in_mask
        out = []
        for step, _, maps in self.snapshots:
            scores = fn(_per_image(maps).float(), self.masks, **kwargs)
            out.append((step, float(scores.nanmean())))
        return out

    def grid(self, snapshot: int = -1, columns: int = 8) -> Tensor:
        """(3, H', W') image grid in [0, 1] of one snapshot's maps over their images (what goes to TensorBoard)."""
        from ..display import normalize, overlay

        if not self.snapshots:
            raise ValueError("no snapshot yet: nothing to draw")
        maps = _per_image(self.snapshots[snapshot][2]).float().unsqueeze(1)
        heat = normalize(maps)
        tiles = overlay(self.images[:, :3].float().clamp(0, 1).cpu(), heat)
        n, _, h, w = tiles.shape
        cols = min(columns, n)
        rows = math.ceil(n / cols)
        canvas = torch.ones(3, rows * (h + 2), cols * (w + 2))
        for i in range(n):
            r, c = divmod(i, cols)
            canvas[:, r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = tiles[i]
        return canvas

    def figure(self, index: int = 0, *, metric: str | None = None, size: float = 1.6) -> Figure:
        """One probe image's maps across the snapshots (overlaid on it, left to right in training order), each
        normalized on its own; the titles give the step (and epoch). With `metric` and `masks`, the row's caption
        carries that image's score at each snapshot (1 = the map's peak on the object)."""
        import matplotlib.pyplot as plt

        from ..display import normalize, overlay

        if not self.snapshots:
            raise ValueError("no snapshot yet: train with the tracker's callback, or call snapshot(model, step)")
        n = self.images.shape[0]
        if not isinstance(index, int) or not -n <= index < n:
            raise IndexError(f"index must be an image of the probe set, 0..{n - 1}, got {index!r}")
        k = len(self.snapshots)
        fig, axes = plt.subplots(1, k + 1, figsize=(size * (k + 1), size * 1.25), squeeze=False)
        image = self.images[index, :3].float().clamp(0, 1).cpu()
        axes[0, 0].imshow(image.permute(1, 2, 0).numpy())
        axes[0, 0].set_title("image", fontsize=8)
        scores = None
        if metric is not None and self.masks is not None:
            from ..metrics import pointing_game

            scores = [
                pointing_game(_per_image(m[index : index + 1]).float(), self.masks[index : index + 1])
                for _, _, m in self.snapshots
            ]
        for j, (step, epoch, maps) in enumerate(self.snapshots, start=1):
            heat = normalize(_per_image(maps[index : index + 1]).float().unsqueeze(1))[0]
            axes[0, j].imshow(overlay(image, heat).permute(1, 2, 0).numpy())
            title = f"step {step}" if epoch is None else f"epoch {epoch}\nstep {step}"
            if scores is not None:
                title += "  hit" if float(scores[j - 1][0]) == 1 else "  miss"
            axes[0, j].set_title(title, fontsize=8)
        for ax in axes[0]:
            ax.set_xticks([])
            ax.set_yticks([])
        fig.tight_layout()
        return fig


def _per_image(maps: Tensor) -> Tensor:
    """(N, h, w): the maps summed over channels (CAMs have one), the first target where there are K."""
    if maps.dim() == 5:  # (N, K, C, h, w)
        maps = maps[:, 0]
    return maps.sum(1) if maps.dim() == 4 else maps


def _first(target: TargetSpec) -> TargetSpec:
    if isinstance(target, Tensor) and target.dim() >= 1:
        return target[:1]
    if isinstance(target, Sequence) and not isinstance(target, str):
        return list(target[:1])
    return target


def _short(target: Any) -> str:
    text = repr(target)
    return text if len(text) < 60 else text[:57] + "..."


def _warn_failed(owner: str, step: int, err: BaseException) -> None:
    warnings.warn(
        f"{owner} failed at step {step} ({type(err).__name__}: {err}); it stops tracking and training goes on",
        RuntimeWarning,
        stacklevel=3,
    )
