"""`Explanation`: the result of ``method.visualize(img)``, raw attribution plus what a person needs to see it.

The tensors stay where the method left them (the model's device) and unnormalized; `normalized`, `heatmap` and
`overlay` compute batch-wide in torch, and only `figure`, `save`, `to_html`, `show` and the Jupyter hooks
(`_repr_mimebundle_`) turn them into pixels on the cpu.

Display options (``DISPLAY_KEYS``) come from the method's ``display_defaults`` and can be overridden per call
(``exp.figure(sign="positive", scale="shared")``) or for good (``exp.with_display(cmap="magma")``):
``reduce``, ``mode``, ``sign``, ``scale``, ``percentile`` (see `hookviz.display.normalize`), ``cmap``, ``alpha``,
``alpha_by_map`` (see `hookviz.display.overlay`), ``overlay`` (whether figures show the overlay column) and
``max_rows`` (rows drawn by figures and HTML). Their checks and fallbacks live in `hookviz.display_options`; the
pixels that figures and HTML views draw are laid out by `hookviz.panels`.
"""

from __future__ import annotations

import enum
import io
import math
import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from . import display as _display
from . import panels as _panels
from ._checks import bool_option, number_option
from ._formats import SAVE_FORMATS, save_format
from ._present import presenter
from .display_options import _UNSET, DISPLAY_KEYS, _check_option, _check_overrides, _UnsetType, resolve_options

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

__all__ = ["DISPLAY_KEYS", "SAVE_FORMATS", "Explanation", "resolve_labels"]


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def resolve_labels(labels: Any) -> tuple[str, ...] | None:
    """Class names indexed by class id, as a tuple; None stays None.

    ``labels`` is a sequence of names (``labels[class_id]``), or a torchvision weights enum member such as
    ``torchvision.models.ResNet18_Weights.IMAGENET1K_V1``, whose ``meta["categories"]`` is used (the names live in
    the enum: nothing is downloaded). Raises TypeError for anything else and ValueError for weights without
    categories (e.g. optical flow weights).
    """
    if labels is None:
        return None
    if isinstance(labels, type) and issubclass(labels, enum.Enum):
        example = next(iter(labels), None)
        hint = f", e.g. {labels.__name__}.{example.name}" if example is not None else ""
        raise TypeError(f"labels got the enum class {labels.__name__}; pass one of its members{hint}")
    source = "labels"
    if isinstance(labels, enum.Enum):
        member = f"{type(labels).__name__}.{labels.name}"
        meta = getattr(labels, "meta", None)
        if not isinstance(meta, Mapping):
            raise TypeError(
                f"labels got the enum member {member}, which has no .meta mapping; expected a torchvision weights "
                "enum member (e.g. ResNet18_Weights.IMAGENET1K_V1) or a sequence of class names"
            )
        if meta.get("categories") is None:
            raise ValueError(
                f"labels: the weights {member} have no 'categories' in their meta (keys: {sorted(meta)}); "
                "pass a sequence of class names instead"
            )
        labels, source = meta["categories"], f"{member}.meta['categories']"
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(
            "labels must be a sequence of class names, a torchvision weights enum member (e.g. "
            f"ResNet18_Weights.IMAGENET1K_V1) or None, got {type(labels).__name__}"
        )
    for i, name in enumerate(labels):
        if not isinstance(name, str):
            raise TypeError(f"{source} must hold class names (str); item {i} is {type(name).__name__}: {name!r}")
    return tuple(labels)


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
    - ``labels``: class names indexed by class id (a sequence, or a torchvision weights enum member whose
      ``meta["categories"]`` is used; see `resolve_labels`), stored as a tuple.
    - ``display``: the method's display defaults, keys among `DISPLAY_KEYS` (``overlay`` is a bool: whether
      figures show the overlay column). Every display method takes the same keys as keyword overrides.
    - ``coverage``: for ReLU-rule methods (Guided Backprop, Deconvnet), which ReLU calls were overridden.

    Example::

        exp = GuidedBackprop(model).visualize(img, labels=ResNet18_Weights.IMAGENET1K_V1)
        exp.heatmap()            # (N, 3, H, W) colour images in [0, 1], on the model's device
        exp.figure(mode="mass", sign="positive", scale="shared")   # override the method's display defaults
        exp.show()               # inline in Jupyter, else a matplotlib window
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
    preprocess: str | None = None  # what visualize fed the model: "auto"'s choice, or the preprocessing given

    def __post_init__(self) -> None:
        # everything checked up front, so a bad result fails here and not halfway through drawing a figure
        for name in ("attribution", "images", "inputs", "scores"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if self.targets is not None and not isinstance(self.targets, Tensor):
            raise TypeError(f"targets must be a torch.Tensor or None, got {type(self.targets).__name__}")
        bool_option("multi_target", self.multi_target)
        if not isinstance(self.method, str):
            raise TypeError(f"method must be a str, got {type(self.method).__name__}")
        labels = resolve_labels(self.labels)

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
        for key, value in self.display.items():
            _check_option(key, value, f"display[{key!r}]")
        self.labels = labels  # assigned last: nothing is changed unless every check passed

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

    def _options(self, where: str, **given: Any) -> dict[str, Any]:
        """Effective display options: the call's (not None / unset) over `display` over the fallbacks."""
        return resolve_options(self.display, where, given)

    def with_display(self, **options: Any) -> Explanation:
        """A copy whose display defaults are overridden by ``options`` (keys among `DISPLAY_KEYS`); tensors shared.

        ``exp.with_display(sign="positive", cmap="magma").show()``; the Jupyter hooks use the new defaults too.
        """
        _check_overrides(options, "with_display")
        return replace(self, display={**self.display, **options})

    def normalized(
        self,
        mode: str | None = None,
        reduce: str | None | _UnsetType = _UNSET,
        *,
        sign: str | None = None,
        scale: str | None = None,
        percentile: float | None = None,
        eps: float = 1e-8,
    ) -> Tensor:
        """Attribution reduced over channels, sign-selected, then normalized to [0, 1] (`hookviz.display.normalize`).

        Every option defaults to `display`, else: ``reduce`` None (channels kept), ``mode`` ``"minmax"``, ``sign``
        ``"all"``, ``scale`` ``"sample"`` (each (sample[, target]) map on its own; ``"shared"``: one scale for the
        whole batch, so maps compare), ``percentile`` the mode's default. Shape ``(N, [K], C', h, w)``, C' = 1
        after a reduction, at the attribution's resolution.
        """
        o = self._options("normalized", mode=mode, reduce=reduce, sign=sign, scale=scale, percentile=percentile)
        attr = _display.reduce_channels(self.attribution.detach(), o["reduce"])
        return _display.normalize(
            attr,
            o["mode"],
            sample_dims=2 if self.multi_target else 1,
            percentile=o["percentile"],
            eps=eps,
            sign=o["sign"],
            scale=o["scale"],
        )

    def _rgb_images(self) -> Tensor:
        images = self.images.detach()
        images = images if images.is_floating_point() else images.to(torch.get_default_dtype())
        return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images

    def _image_size(self) -> tuple[int, int]:
        return int(self.images.shape[-2]), int(self.images.shape[-1])

    def heatmap(
        self,
        cmap: str | None = None,
        *,
        mode: str | None = None,
        reduce: str | None | _UnsetType = _UNSET,
        sign: str | None = None,
        scale: str | None = None,
        percentile: float | None = None,
    ) -> Tensor:
        """Colour images of the normalized maps at the input image size: ``(N, [K], 3, H, W)`` in [0, 1].

        1-channel maps go through `hookviz.display.colormap` (``cmap`` defaults to ``display["cmap"]``, else
        ``"jet"``); 3-channel maps are shown as RGB, as the hooks tutorial shows Guided Backprop; other channel
        counts are reduced with ``"max-abs"``. Layer maps are upsampled bilinearly after normalization. The other
        options are those of `normalized`.
        """
        o = self._options("heatmap", cmap=cmap, mode=mode, reduce=reduce, sign=sign, scale=scale, percentile=percentile)
        reduce = o["reduce"]
        if reduce is None and self.attribution.shape[-3] not in (1, 3):
            reduce = "max-abs"  # neither grey nor RGB: no faithful way to show the channels as they are
        maps = self.normalized(o["mode"], reduce, sign=o["sign"], scale=o["scale"], percentile=o["percentile"])
        maps = _display.resize(maps, self._image_size())
        return _display.colormap(maps, o["cmap"]) if maps.shape[-3] == 1 else maps

    def overlay(
        self,
        alpha: float | None = None,
        cmap: str | None = None,
        *,
        alpha_by_map: bool | None = None,
        mode: str | None = None,
        reduce: str | None | _UnsetType = _UNSET,
        sign: str | None = None,
        scale: str | None = None,
        percentile: float | None = None,
    ) -> Tensor:
        """The normalized 1-channel map, coloured, over `images`: ``(N, [K], 3, H, W)`` in [0, 1].

        ``alpha`` (default 0.5) is the map's opacity; with ``alpha_by_map`` it is ``alpha`` times the map's
        magnitude per pixel (`hookviz.display.magnitude`: 0 where the attribution is 0), so the image shows through
        wherever the map is not (Guided Backprop and Deconvnet overlay this way by default). Multi-channel maps are
        first reduced with ``reduce``, else ``"max-abs"``. The other options are those of `normalized`.
        """
        o = self._options(
            "overlay",
            alpha=alpha,
            cmap=cmap,
            alpha_by_map=alpha_by_map,
            mode=mode,
            reduce=reduce,
            sign=sign,
            scale=scale,
            percentile=percentile,
        )
        reduce = o["reduce"]
        if reduce is None and self.attribution.shape[-3] != 1:
            reduce = "max-abs"
        heat = self.normalized(o["mode"], reduce, sign=o["sign"], scale=o["scale"], percentile=o["percentile"])
        weight = None
        if o["alpha_by_map"]:
            weight = _display.magnitude(
                _display.reduce_channels(self.attribution.detach(), reduce),
                o["mode"],
                sample_dims=2 if self.multi_target else 1,
                percentile=o["percentile"],
                sign=o["sign"],
                scale=o["scale"],
            )
        images = self._rgb_images()
        if self.multi_target:
            images = images.unsqueeze(1)  # broadcast over K
        return _display.overlay(images, heat, o["alpha"], o["cmap"], alpha_by_map=o["alpha_by_map"], weight=weight)

    # ---------------------------------------------------------------- pixels (cpu)

    def _panels(self, where: str, options: dict[str, Any], colorbar: bool = False) -> _panels.Panels:
        """The rows a figure or HTML view draws: ``(sample, target)`` pairs, column titles and uint8 HWC pixels;
        with `colorbar`, the colour bar of the column drawn through a colour map (the map's, else the overlay's)."""
        bool_option("colorbar", colorbar)
        o = self._options(where, **options)
        bar = None
        if colorbar:
            reduce = o["reduce"]
            if reduce is None and self.attribution.shape[-3] not in (1, 3):
                reduce = "max-abs"  # as heatmap
            scalar_map = reduce is not None or self.attribution.shape[-3] == 1
            if not (scalar_map or o["overlay"]):
                raise ValueError(
                    f"{where}(colorbar=True): the map has {self.attribution.shape[-3]} channels drawn as RGB and "
                    "no overlay is drawn, so no colour map is shown to explain; pass reduce='max-abs' (one channel "
                    "through the colour map) or overlay=True"
                )
            bar = _panels.colorbar_for(o["cmap"], o["mode"], o["sign"])
        if len(self) == 0:
            raise ValueError(f"cannot draw an empty Explanation (N=0) with {where}()")
        k = self.num_targets
        n_rows = min(o["max_rows"], len(self) * k)
        n_samples = math.ceil(n_rows / k)
        # only compute what is drawn; but shared statistics come from the whole batch, so the colours of a row do
        # not depend on how many rows are drawn
        src = self if o["scale"] == "shared" else self[:n_samples]
        view = {key: o[key] for key in ("cmap", "mode", "reduce", "sign", "scale", "percentile")}

        def with_k(t: Tensor) -> Tensor:
            t = t[:n_samples]
            return t if self.multi_target else t.unsqueeze(1)

        def to_hwc(t: Tensor) -> np.ndarray:
            # (N, K, 3, H, W) -> (N, K, H, W, 3) uint8 on the device, then one cpu transfer for the whole column
            return _display.to_uint8(t.clamp(0, 1)).movedim(-3, -1).cpu().numpy()

        images = self._rgb_images()[:n_samples].unsqueeze(1).expand(-1, k, -1, -1, -1)
        columns = [("image", to_hwc(images)), (_panels.pretty_method(self.method), to_hwc(with_k(src.heatmap(**view))))]
        if o["overlay"]:
            over = src.overlay(o["alpha"], alpha_by_map=o["alpha_by_map"], **view)
            columns.append(("overlay", to_hwc(with_k(over))))
        return _panels.Panels(
            rows=[divmod(r, k) for r in range(n_rows)],
            columns=columns,
            scores=self.scores[:n_samples].detach().float().cpu().tolist(),
            targets=None if self.targets is None else self.targets[:n_samples].detach().cpu().tolist(),
            total=len(self) * k,
            labels=self.labels,
            multi_target=self.multi_target,
            header=repr(self),
            colorbar=bar,
        )

    def figure(self, max_rows: int | None = None, *, colorbar: bool = False, **options: Any) -> Figure:
        """A matplotlib Figure, one row per (sample[, target]): image | map | overlay (no pyplot, no display needed).

        The image column shows `images`, the inputs as a person sees them (de-normalized when the preprocessing is
        known). Each row is titled with the target (its class name when `labels` has one) and its score, labelled:
        ``logit 10.2`` for a class target (the model's output for that class, which the map explains; not a
        probability), ``score`` for a callable target (`hookviz.panels.score_text`). ``options`` (keys among
        `DISPLAY_KEYS`: ``mode``, ``reduce``, ``sign``, ``scale``, ``percentile``, ``cmap``, ``alpha``,
        ``alpha_by_map``, ``overlay``) override the method's `display` defaults. The overlay column is left out when
        ``overlay`` is False. Rows beyond ``max_rows`` (default ``display["max_rows"]``, else 8) are not drawn; with
        ``scale="shared"`` the scale still comes from the whole batch. ``colorbar=True`` adds a colour bar labelled
        with what the colours mean (`hookviz.panels.colorbar_for`: "signed relevance" with 0 at the centre for
        signed maps, "normalised magnitude" otherwise, "standardised value" for ``mode="seed"``); a map drawn as
        RGB without an overlay has no colour map and is refused.
        """
        from matplotlib.figure import Figure

        panels = self._panels("figure", {"max_rows": max_rows, **options}, colorbar)
        fig = Figure(figsize=_panels.figsize(panels))
        _panels.draw(fig, panels)
        return fig

    def to_html(self, max_rows: int | None = None, **options: Any) -> str:
        """An HTML table, one row per (sample[, target]): image | map | overlay as inline PNGs (base64 data URIs).

        Each row names the sample, the target class (its label when `labels` has one, and the class id) and the
        score. Same options as `figure`; `_repr_html_` is ``to_html()`` with the display defaults.
        """
        return _panels.html_table(self._panels("to_html", {"max_rows": max_rows, **options}))

    def _repr_html_(self) -> str:
        """`to_html` with the display defaults (what `_repr_mimebundle_` gives Jupyter as ``text/html``)."""
        return self.to_html()

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, Any]:
        """Jupyter's rich view, drawn once: the HTML table (``text/html``), and a PNG of `figure` only for a
        front end that cannot show HTML (one that excludes ``text/html`` and accepts ``image/png``).

        One bundle instead of ``_repr_html_`` plus ``_repr_png_``: with both, Jupyter drew the explanation twice and
        stored both in the notebook.
        """

        def wanted(mime: str) -> bool:
            return (include is None or mime in include) and (exclude is None or mime not in exclude)

        bundle: dict[str, Any] = {"text/plain": repr(self)}
        if wanted("text/html"):
            bundle["text/html"] = self.to_html()
        elif wanted("image/png"):
            buf = io.BytesIO()
            self.figure().savefig(buf, format="png", dpi=100)
            bundle["image/png"] = buf.getvalue()
        return bundle

    def show(self, *, colorbar: bool = False, **options: Any) -> None:
        """Display the explanation: inline when running under IPython/Jupyter, else in a matplotlib window.

        Under IPython this is ``IPython.display.display(exp)`` (which uses `_repr_mimebundle_`); elsewhere the `figure`
        is drawn on a pyplot figure and ``pyplot.show()`` opens it with the configured backend. ``options`` are
        those of `figure` (including ``max_rows``) and override the display defaults; ``colorbar`` adds `figure`'s
        colour bar to the matplotlib window (the HTML view has none).
        """
        bool_option("colorbar", colorbar)
        shown = self.with_display(**options) if options else self
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            get_ipython = None
        if get_ipython is not None and get_ipython() is not None:
            display(shown)
            return
        import matplotlib.pyplot as plt

        panels = shown._panels("show", {}, colorbar)
        fig = plt.figure(figsize=_panels.figsize(panels))
        _panels.draw(fig, panels)
        plt.show()

    def save(self, path: str | PathLike[str], dpi: float = 150, **options: Any) -> Path:
        """Save `figure` to ``path``; the format comes from the suffix (`SAVE_FORMATS`); returns the Path.

        ``options`` are those of `figure` (``max_rows``, ``colorbar`` and the display options). Missing parent
        directories are created, as `hookviz.save_figure` does.
        """
        path = Path(path)
        fmt = save_format(path)
        number_option("dpi", dpi, "a positive number", lambda v: v > 0)
        fig = self.figure(**options)  # options are checked before anything is written
        path.parent.mkdir(parents=True, exist_ok=True)  # as save_figure does
        fig.savefig(path, format=fmt, dpi=dpi)
        return path

    def __repr__(self) -> str:
        k = f", K={self.num_targets}" if self.multi_target else ""
        if self.targets is None:
            targets = "None"
        elif self.targets.numel() <= 16:
            targets = str(self.targets.detach().cpu().tolist())
        else:
            targets = f"<{'x'.join(map(str, self.targets.shape))} tensor>"
        relu = "" if self.coverage is None else f", relu={self.coverage.overridden}/{self.coverage.calls}"
        prep = "" if self.preprocess is None else f", preprocess={self.preprocess!r}"
        return (
            f"Explanation(method={self.method!r}, N={len(self)}{k}, "
            f"attribution={_shape(self.attribution)}, targets={targets}{relu}{prep})"
        )


# `Attribution.visualize` (a layer below) builds an Explanation through this seam, never by importing it
presenter("images")(Explanation)
