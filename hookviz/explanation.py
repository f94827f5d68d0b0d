"""`Explanation`: the result of ``method.visualize(img)``, raw attribution plus what a person needs to see it.

The tensors stay where the method left them (the model's device) and unnormalized; `normalized`, `heatmap` and
`overlay` compute batch-wide in torch, and only `figure`, `save` and `_repr_png_` turn them into pixels on the cpu.
"""

from __future__ import annotations

import io
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from numbers import Real
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from . import display as _display

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

__all__ = ["Explanation"]

DISPLAY_KEYS = ("reduce", "mode", "cmap", "overlay")
SAVE_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg", ".jpg": "jpg", ".jpeg": "jpg"}


class _UnsetType:
    """Sentinel type: "argument not given", distinct from an explicit None."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _UnsetType()


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


# eq=False: a generated __eq__ would compare tensors elementwise and fail on bool(); identity is the useful equality
@dataclass(eq=False)
class Explanation:
    """The result of `method.visualize(img)`: raw attribution plus what a person needs to see it.

    Shapes (N samples, K targets per sample):

    - ``attribution``: raw, unnormalized; ``(N, C, H, W)`` for input-space maps, ``(N, 1, h, w)`` for layer maps
      (Grad-CAM); with several targets per input (``multi_target=True``) a K axis after N: ``(N, K, C, H, W)``.
    - ``images``: ``(N, 3, H, W)`` float in [0, 1], the inputs as a person sees them (1 channel is accepted and shown
      as grey).
    - ``inputs``: ``(N, C, H, W)``, what the model got.
    - ``targets``: ``(N, K)`` integer class indices, or None when the target was a callable.
    - ``scores``: ``(N, K)`` float target scores (K is 1 unless ``multi_target``).
    - ``display``: the method's display defaults, keys among ``reduce``, ``mode``, ``cmap``, ``overlay`` (bool:
      whether `figure` shows the overlay column).
    - ``coverage``: for ReLU-rule methods (Guided Backprop, Deconvnet), which ReLU calls were overridden.

    Example::

        exp = GuidedBackprop(model).visualize(img)
        exp.heatmap()            # (N, 3, H, W) colour images in [0, 1], on the model's device
        exp[0].save("gb.pdf")
    """

    attribution: Tensor
    images: Tensor
    inputs: Tensor
    targets: Tensor | None
    scores: Tensor
    method: str
    multi_target: bool = False
    labels: Sequence[str] | None = None
    display: dict = field(default_factory=dict)
    coverage: Any = None  # ReLU-rule methods: the ReLUCoverage of the forward pass (what was overridden)

    def __post_init__(self) -> None:
        # everything checked up front, so a bad result fails here and not halfway through drawing a figure
        for name in ("attribution", "images", "inputs", "scores"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if self.targets is not None and not isinstance(self.targets, Tensor):
            raise TypeError(f"targets must be a torch.Tensor or None, got {type(self.targets).__name__}")
        if not isinstance(self.multi_target, bool):
            raise TypeError(f"multi_target must be a bool, got {type(self.multi_target).__name__}")
        if not isinstance(self.method, str):
            raise TypeError(f"method must be a str, got {type(self.method).__name__}")
        if self.labels is not None and (isinstance(self.labels, str) or not isinstance(self.labels, Sequence)):
            raise TypeError(f"labels must be a sequence of class names or None, got {type(self.labels).__name__}")

        attr, expected = self.attribution, 5 if self.multi_target else 4
        if attr.ndim != expected:
            layout = "(N, K, C, H, W)" if self.multi_target else "(N, C, H, W)"
            raise ValueError(
                f"attribution must have shape {layout} when multi_target={self.multi_target}, got {_shape(attr)}"
            )
        n = attr.shape[0]
        if self.images.ndim != 4 or self.images.shape[1] not in (1, 3) or self.images.shape[0] != n:
            raise ValueError(f"images must have shape (N={n}, 3, H, W), got {_shape(self.images)}")
        if self.inputs.ndim < 1 or self.inputs.shape[0] != n:
            raise ValueError(f"inputs must have shape (N={n}, C, H, W), got {_shape(self.inputs)}")
        k = attr.shape[1] if self.multi_target else 1
        if self.scores.ndim != 2 or _shape(self.scores) != (n, k):
            raise ValueError(f"scores must have shape (N, K) = ({n}, {k}), got {_shape(self.scores)}")
        if self.targets is not None:
            if _shape(self.targets) != (n, k):
                raise ValueError(f"targets must have shape (N, K) = ({n}, {k}) or be None, got {_shape(self.targets)}")
            if self.targets.is_floating_point() or self.targets.is_complex():
                raise TypeError(f"targets must hold integer class indices, got dtype {self.targets.dtype}")

        if not isinstance(self.display, Mapping):
            raise TypeError(f"display must be a dict, got {type(self.display).__name__}")
        self.display = dict(self.display)  # our own copy: indexing and replace() must not share it with the caller
        unknown = sorted(set(self.display) - set(DISPLAY_KEYS))
        if unknown:
            raise ValueError(f"display has unknown key(s) {unknown}; expected keys among {DISPLAY_KEYS}")
        reduce = self.display.get("reduce")
        if reduce is not None and reduce not in _display.REDUCTIONS:
            raise ValueError(f"display['reduce'] must be one of {_display.REDUCTIONS} or None, got {reduce!r}")
        mode = self.display.get("mode")
        if mode is not None and mode not in _display.NORMALIZATIONS:
            raise ValueError(f"display['mode'] must be one of {_display.NORMALIZATIONS}, got {mode!r}")

    # ---------------------------------------------------------------- tensor access

    @property
    def num_targets(self) -> int:
        """K: targets per sample (1 unless `multi_target`)."""
        return self.scores.shape[1]

    def __len__(self) -> int:
        return self.attribution.shape[0]

    def __getitem__(self, i: int | slice) -> Explanation:
        """The Explanation of a subset of the batch; an int keeps a batch axis of 1, so every Explanation is batched."""
        n = len(self)
        if isinstance(i, slice):
            rows = range(n)[i]
        else:
            if isinstance(i, bool):
                raise TypeError("index must be an int or a slice, got bool")
            try:
                idx = operator.index(i)
            except TypeError:
                raise TypeError(f"index must be an int or a slice, got {type(i).__name__}") from None
            if not -n <= idx < n:
                raise IndexError(f"index {idx} is out of range for an Explanation of N={n} samples")
            idx %= n
            rows = range(idx, idx + 1)

        def take(t: Tensor) -> Tensor:
            if rows.step > 0:
                return t[rows.start : rows.stop : rows.step]
            # tensors do not accept negative slice steps
            return t[torch.as_tensor(list(rows), dtype=torch.long, device=t.device)]

        return replace(
            self,
            attribution=take(self.attribution),
            images=take(self.images),
            inputs=take(self.inputs),
            targets=None if self.targets is None else take(self.targets),
            scores=take(self.scores),
        )

    def numpy(self) -> np.ndarray:
        """The raw attribution as a numpy array on the cpu (same shape as `attribution`)."""
        attr = self.attribution.detach()
        if attr.dtype == torch.bfloat16:  # numpy has no bfloat16
            attr = attr.float()
        return attr.cpu().numpy()

    # ---------------------------------------------------------------- display (torch, on device)

    def normalized(self, mode: str | None = None, reduce: str | None | _UnsetType = _UNSET, **kw: Any) -> Tensor:
        """Attribution reduced over channels, then normalized per sample (and per target) to [0, 1].

        ``reduce`` defaults to ``display["reduce"]`` (else None: channels kept), ``mode`` to ``display["mode"]``
        (else ``"minmax"``); ``kw`` (``percentile``, ``eps``) go to `hookviz.display.normalize`.
        Shape: ``(N, [K], C', h, w)`` with C' = 1 after a reduction, at the attribution's resolution.
        """
        if isinstance(reduce, _UnsetType):
            reduce = self.display.get("reduce")
        if mode is None:
            mode = self.display.get("mode") or "minmax"
        attr = _display.reduce_channels(self.attribution.detach(), reduce)
        return _display.normalize(attr, mode, sample_dims=2 if self.multi_target else 1, **kw)

    def _rgb_images(self) -> Tensor:
        images = self.images.detach()
        images = images if images.is_floating_point() else images.to(torch.get_default_dtype())
        return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images

    def _image_size(self) -> tuple[int, int]:
        return int(self.images.shape[-2]), int(self.images.shape[-1])

    def heatmap(self, cmap: str | None = None) -> Tensor:
        """Colour images of the normalized maps at the input image size: ``(N, [K], 3, H, W)`` in [0, 1].

        1-channel maps go through `hookviz.display.colormap` (``cmap`` defaults to ``display["cmap"]``, else
        ``"jet"``); 3-channel maps are shown as RGB, as the hooks tutorial shows Guided Backprop. Layer maps are
        upsampled bilinearly after normalization.
        """
        cmap = cmap or self.display.get("cmap") or "jet"
        reduce = self.display.get("reduce")
        if reduce is None and self.attribution.shape[-3] not in (1, 3):
            reduce = "max-abs"  # neither grey nor RGB: no faithful way to show the channels as they are
        maps = _display.resize(self.normalized(reduce=reduce), self._image_size())
        return _display.colormap(maps, cmap) if maps.shape[-3] == 1 else maps

    def overlay(self, alpha: float = 0.5, cmap: str | None = None) -> Tensor:
        """The normalized 1-channel map, coloured, over `images`: ``(N, [K], 3, H, W)`` in [0, 1].

        Multi-channel maps are first reduced with ``display["reduce"]``, else ``"max-abs"``.
        """
        cmap = cmap or self.display.get("cmap") or "jet"
        reduce = self.display.get("reduce")
        if reduce is None and self.attribution.shape[-3] != 1:
            reduce = "max-abs"
        heat = self.normalized(reduce=reduce)
        images = self._rgb_images()
        if self.multi_target:
            images = images.unsqueeze(1)  # broadcast over K
        return _display.overlay(images, heat, alpha=alpha, cmap=cmap)

    # ---------------------------------------------------------------- pixels (cpu)

    def _target_title(self, class_id: int | None) -> str:
        if class_id is None:
            return "custom target"
        if self.labels is not None and 0 <= class_id < len(self.labels):
            return str(self.labels[class_id])
        return f"class {class_id}"

    def figure(self, max_rows: int = 8) -> Figure:
        """A matplotlib Figure, one row per (sample[, target]): image | map | overlay (no pyplot, no display needed).

        The overlay column is left out when ``display["overlay"]`` is False. Rows beyond ``max_rows`` are not drawn.
        """
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be a positive int, got {max_rows!r}")
        if len(self) == 0:
            raise ValueError("cannot draw a figure of an empty Explanation (N=0)")
        from matplotlib.figure import Figure

        k = self.num_targets
        n_rows = min(max_rows, len(self) * k)
        sub = self[: math.ceil(n_rows / k)]  # only compute what is drawn
        show_overlay = bool(self.display.get("overlay", True))

        def to_hwc(t: Tensor) -> np.ndarray:
            # (N, K, 3, H, W) -> (N, K, H, W, 3): one cpu transfer for the whole panel column
            return t.clamp(0, 1).movedim(-3, -1).float().cpu().numpy()

        def with_k(t: Tensor) -> Tensor:
            return t if sub.multi_target else t.unsqueeze(1)

        columns = [("image", to_hwc(sub._rgb_images().unsqueeze(1).expand(-1, k, -1, -1, -1)))]
        columns.append((self.method, to_hwc(with_k(sub.heatmap()))))
        if show_overlay:
            columns.append(("overlay", to_hwc(with_k(sub.overlay()))))
        scores = sub.scores.detach().float().cpu().tolist()
        targets = None if sub.targets is None else sub.targets.detach().cpu().tolist()

        fig = Figure(figsize=(2.6 * len(columns), 2.6 * n_rows))
        axes = fig.subplots(n_rows, len(columns), squeeze=False)
        for r in range(n_rows):
            i, j = divmod(r, k)
            target = self._target_title(None if targets is None else targets[i][j])
            titles = [f"{target}  score {scores[i][j]:.3g}"] + [name for name, _ in columns[1:]]
            for c, (_, pixels) in enumerate(columns):
                ax = axes[r, c]
                ax.imshow(pixels[i, j], interpolation="nearest")
                ax.set_title(titles[c], fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
        fig.tight_layout()
        return fig

    def save(self, path: str | PathLike[str], dpi: float = 150) -> Path:
        """Save `figure` to ``path``; the format comes from the suffix (.png, .pdf, .svg, .jpg). Returns the Path."""
        path = Path(path)
        fmt = SAVE_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(
                f"path must end with one of {tuple(SAVE_FORMATS)} to choose the format, got suffix "
                f"{path.suffix!r} in {str(path)!r}"
            )
        if isinstance(dpi, bool) or not isinstance(dpi, Real) or not dpi > 0:
            raise ValueError(f"dpi must be a positive number, got {dpi!r}")
        self.figure().savefig(path, format=fmt, dpi=dpi)
        return path

    def _repr_png_(self) -> bytes:
        """PNG bytes of `figure`, so Jupyter shows an Explanation inline."""
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=100)
        return buf.getvalue()

    def __repr__(self) -> str:
        k = f", K={self.num_targets}" if self.multi_target else ""
        if self.targets is None:
            targets = "None"
        elif self.targets.numel() <= 16:
            targets = str(self.targets.detach().cpu().tolist())
        else:
            targets = f"<{'x'.join(map(str, self.targets.shape))} tensor>"
        relu = "" if self.coverage is None else f", relu={self.coverage.overridden}/{self.coverage.calls}"
        return (
            f"Explanation(method={self.method!r}, N={len(self)}{k}, "
            f"attribution={_shape(self.attribution)}, targets={targets}{relu})"
        )
