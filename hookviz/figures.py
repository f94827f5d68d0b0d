"""Paper figures: a grid of explanations (rows = images, columns = methods or targets) and vector output.

::

    from hookviz.figures import grid, save_figure

    fig = grid([GuidedBackprop(model).visualize(imgs), GradCAM(model).visualize(imgs)], colorbar=True)
    save_figure(fig, "figure.pdf")                       # TrueType fonts embedded (pdf.fonttype 42)

    # or let grid explain the images itself: method names from the registry, Attribution instances or classes
    grid(["cat.jpg", "dog.jpg"], ["saliency", "gradcam"], model=model, out="figure.svg")

Everything matplotlib-specific is set per figure under `matplotlib.rc_context` (`PAPER_RC`, overridable with
``rc=``): nothing here touches the global ``rcParams`` and nothing uses pyplot, so it runs headless.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from . import display as _display
from . import panels as _panels
from ._checks import is_number, number_option
from ._formats import save_format
from .explanation import Explanation

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure
    from torch import nn

    from .methods.base import Attribution

__all__ = ["PAPER_RC", "SCALES", "grid", "save_figure"]

SCALES = ("column", "sample", "shared")

PAPER_RC: dict[str, Any] = {
    # one font family and a small set of sizes; DejaVu Sans ships with matplotlib, so figures look the same everywhere
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 7,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "figure.titlesize": 9,
    "axes.linewidth": 0.4,
    "xtick.major.width": 0.4,
    "ytick.major.width": 0.4,
    "xtick.major.size": 2.0,
    "ytick.major.size": 2.0,
    "xtick.major.pad": 1.5,
    "ytick.major.pad": 1.5,
    "axes.titlepad": 3.0,
    "axes.labelpad": 2.0,
    "figure.constrained_layout.h_pad": 0.02,
    "figure.constrained_layout.w_pad": 0.02,
    "figure.constrained_layout.hspace": 0.01,
    "figure.constrained_layout.wspace": 0.01,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.dpi": "figure",
    # vector output: TrueType (not Type 3) fonts in PDF/PS, text as paths in SVG, stable ids across runs
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "path",
    "svg.hashsalt": "hookviz",
}

# no creation dates or software versions in the files: a figure made the same way gives the same bytes
_METADATA = {"pdf": {"CreationDate": None}, "svg": {"Date": None}, "png": {"Software": None}}


_CELL_IN = 1.1  # default cell edge in inches: 6 columns fit a two-column paper's full width (about 7 in)
_LABEL_WIDTH = 18  # row labels are wrapped at this many characters
_CBAR_ROW = 0.08  # thickness of the colour bars, in cells


@dataclass
class _Column:
    """One map column of the grid: N maps plus how to show them."""

    maps: Tensor  # (N, C, h, w) raw attribution
    exp: Explanation
    k: int  # which target of exp
    mode: str
    reduce: str | None
    cmap: str
    sign: str
    percentile: float | None
    alpha: float
    alpha_by_map: bool
    overlay: bool
    label: str = ""


# ---------------------------------------------------------------------------------------------------- checks


def _check_size(size: Any) -> tuple[float, float] | None:
    if size is None:
        return None
    if not isinstance(size, (tuple, list)) or len(size) != 2 or not all(is_number(s) and s > 0 for s in size):
        raise ValueError(f"size must be None or a pair of positive numbers (width, height) in inches, got {size!r}")
    return float(size[0]), float(size[1])


def _check_labels(values: Any, n: int, what: str, allowed: tuple[int, ...] | None = None) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{what} must be a sequence of strings, got {type(values).__name__}")
    ok = allowed or (n,)
    if len(values) not in ok:
        want = " or ".join(str(a) for a in ok)
        raise ValueError(f"{what} must hold {want} strings (one per {what[:3]}), got {len(values)}")
    return [str(v) for v in values]


# ---------------------------------------------------------------------------------------------------- explanations


def _resolve_methods(methods: Any, model: nn.Module | None) -> list[Attribution]:
    """Every method as an `Attribution`, resolved (names looked up, classes built) before any of them runs."""
    from .methods.base import Attribution, get_method

    if methods is None:
        raise ValueError(
            "grid got images but no methods: pass methods=[...] (registry names such as 'gradcam', Attribution "
            "instances or classes) and model=, or a list of Explanation objects"
        )
    if isinstance(methods, (str, Attribution)) or (isinstance(methods, type) and issubclass(methods, Attribution)):
        methods = [methods]
    if not isinstance(methods, Sequence) or not methods:
        raise ValueError(f"methods must be a non-empty list of method names or Attribution objects, got {methods!r}")
    for m in methods:
        if not (isinstance(m, (str, Attribution)) or (isinstance(m, type) and issubclass(m, Attribution))):
            raise TypeError(
                f"methods must hold registry names (str), Attribution instances or classes, got {type(m).__name__}"
            )
    for m in methods:
        if isinstance(m, str):
            get_method(m)  # an unknown name raises now, listing the registry
    if model is None and any(not isinstance(m, Attribution) for m in methods):
        m = next(m for m in methods if not isinstance(m, Attribution))
        raise ValueError(f"method {m!r} needs model=: pass the nn.Module to explain")
    out = []
    for m in methods:
        if isinstance(m, Attribution):
            out.append(m)
        elif isinstance(m, str):
            out.append(get_method(m)(model))
        else:
            out.append(m(model))
    return out


def _explain(
    images: Any,
    methods: list[Attribution],
    targets: Any,
    labels: Sequence[str] | None,
    preprocess: Any,
    weights: Any = None,
) -> list[Explanation]:
    """Run each (resolved) method over the images: one Explanation per method."""
    return [
        method.visualize(images, targets, preprocess=preprocess, weights=weights, labels=labels) for method in methods
    ]


def _as_explanations(items: Any) -> list[Explanation] | None:
    if isinstance(items, Explanation):
        return [items]
    if isinstance(items, (list, tuple)) and items and all(isinstance(e, Explanation) for e in items):
        return list(items)
    if isinstance(items, (list, tuple)) and any(isinstance(e, Explanation) for e in items):
        raise TypeError("items mixes Explanation objects and other things: pass only Explanations, or only images")
    return None


def _check_same_images(exps: list[Explanation]) -> None:
    first = exps[0]
    for i, e in enumerate(exps[1:], start=1):
        if len(e) != len(first) or e.images.shape[-2:] != first.images.shape[-2:]:
            raise ValueError(
                f"every Explanation must explain the same images: items[0] has N={len(first)} images of "
                f"{tuple(first.images.shape[-2:])}, items[{i}] has N={len(e)} of {tuple(e.images.shape[-2:])}"
            )
    if len(first) == 0:
        raise ValueError("cannot draw a grid of an empty Explanation (N=0)")


# ---------------------------------------------------------------------------------------------------- labels


def _target_ids(col: _Column) -> list[int | None]:
    if col.exp.targets is None:
        return [None] * len(col.exp)
    return [int(t) for t in col.exp.targets[:, col.k].detach().cpu().tolist()]


def _default_labels(columns: list[_Column], labels: Sequence[str] | None, n: int) -> tuple[list[str], list[str]]:
    """(row labels, column labels): rows name the target class, columns the method (and target, with K > 1)."""
    ids = [_target_ids(c) for c in columns]
    names = [
        [_panels.target_title(t, labels if labels is not None else c.exp.labels) for t in col]
        for c, col in zip(columns, ids, strict=True)
    ]
    multi_k = any(c.exp.num_targets > 1 for c in columns)
    multi_method = len({id(c.exp) for c in columns}) > 1
    col_labels = []
    for c, col_names in zip(columns, names, strict=True):
        method = _panels.pretty_method(c.exp.method)
        if not multi_k:
            col_labels.append(method)
            continue
        target = col_names[0] if len(set(col_names)) == 1 else f"target {c.k + 1}"
        col_labels.append(f"{method}\n{target}" if multi_method else target)
    per_column_named = multi_k and all(len(set(col_names)) == 1 for col_names in names)
    row_labels = []
    for i in range(n):
        unique = list(dict.fromkeys(col_names[i] for col_names in names))
        if len(unique) == 1:
            row_labels.append(unique[0])
        elif per_column_named:
            row_labels.append("")  # the column titles already name each column's target
        else:
            row_labels.append(" / ".join(unique))
    return row_labels, col_labels


# ---------------------------------------------------------------------------------------------------- pixels


def _norm_options(c: _Column) -> dict[str, Any]:
    return {"sign": c.sign, "percentile": c.percentile}


def _normalize(columns: list[_Column], reduced: list[Tensor], scale: str) -> list[Tensor]:
    """Normalize each column's reduced maps (N, C, h, w) to [0, 1] with one scale per map, column or figure."""
    if scale in ("sample", "column"):
        how = "sample" if scale == "sample" else "shared"  # a column is one batch: display's "shared" over it
        return [
            _display.normalize(r, c.mode, sample_dims=1, scale=how, **_norm_options(c))
            for c, r in zip(columns, reduced, strict=True)
        ]
    # shared: one set of statistics over every value in the figure (maps of any size, concatenated), each column
    # still with its own mode and sign
    flat = _pooled(reduced)
    out, start = [], 0
    cache: dict[tuple, Tensor] = {}
    for c, r in zip(columns, reduced, strict=True):
        key = (c.mode, c.sign, c.percentile)
        if key not in cache:
            cache[key] = _display.normalize(flat, c.mode, sample_dims=0, **_norm_options(c))
        out.append(cache[key][start : start + r.numel()].reshape(r.shape).to(r.dtype))
        start += r.numel()
    return out


def _pooled(reduced: list[Tensor]) -> Tensor:
    """Every value of the figure's maps, as one flat tensor (M,)."""
    return torch.cat([r.float().flatten() for r in reduced])


def _bounds(c: _Column, r: Tensor, reduced: list[Tensor], scale: str) -> tuple[float, float]:
    """The raw values a column's colours 0 and 1 stand for (``display.normalize_bounds``); 0..1 per sample."""
    if scale == "sample":
        return 0.0, 1.0
    if scale == "column":
        lo, hi = _display.normalize_bounds(r, c.mode, sample_dims=1, scale="shared", **_norm_options(c))
    else:
        lo, hi = _display.normalize_bounds(_pooled(reduced), c.mode, sample_dims=0, **_norm_options(c))
    return float(lo.flatten()[0]), float(hi.flatten()[0])


def _font_pt(rc: Mapping[str, Any], key: str) -> float:
    from matplotlib.font_manager import FontProperties

    size = rc.get(key, rc.get("font.size", 10))
    return float(size) if isinstance(size, Real) else FontProperties(size=size).get_size_in_points()


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def _bare(ax: Any) -> None:
    """No ticks, no frame: the image is the cell (labels still show)."""
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def _colorbar(fig: Figure, cax: Any, cmap: str, lo: float, hi: float) -> Any:
    """A horizontal colour bar filling ``cax`` (a cell of the colour bar row).

    Ticks at both ends only (and at 0 for a signed range), labels kept inside the bar's width, so neighbouring
    bars never collide and the columns keep their widths.
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    cb = fig.colorbar(ScalarMappable(norm=Normalize(lo, hi), cmap=cmap), cax=cax, orientation="horizontal")
    cb.outline.set_linewidth(0.3)
    ticks = [lo, hi] if hi > lo else [lo]
    if lo < 0 < hi:
        ticks.insert(1, 0.0)
    # a value within 1% of the range from 0 is labelled 0 (minmax ranges of |gradients| start at 1e-6, not at 0)
    cb.set_ticks(ticks, labels=["0" if abs(t) < 0.01 * (hi - lo) else f"{t:.2g}" for t in ticks])
    majors = cax.xaxis.get_major_ticks()
    if len(majors) > 1:
        majors[0].label1.set_horizontalalignment("left")
        majors[-1].label1.set_horizontalalignment("right")
    return cb


def _hwc(t: Tensor) -> np.ndarray:
    """(N, C, H, W) -> (N, H, W, C) float32 numpy on the cpu; one transfer per column."""
    return t.detach().clamp(0, 1).movedim(-3, -1).float().cpu().numpy()


# ---------------------------------------------------------------------------------------------------- grid


def _columns(
    exps: list[Explanation],
    *,
    overlay: bool | str,
    mode: str | None,
    cmap: str | None,
    sign: str | None,
    alpha: float | None,
) -> list[_Column]:
    """One column per (Explanation, target): the grid's overrides over each method's display defaults."""
    columns = []
    for e in exps:
        for k in range(e.num_targets):
            maps = e.attribution[:, k] if e.multi_target else e.attribution
            show_overlay = bool(e.display.get("overlay", False)) if overlay == "auto" else overlay
            reduce = e.display.get("reduce")
            channels = maps.shape[-3]
            if reduce is None and (channels not in (1, 3) or (show_overlay and channels != 1)):
                reduce = "max-abs"  # as Explanation.heatmap/overlay: no faithful way to show these channels
            columns.append(
                _Column(
                    maps=maps.detach(),
                    exp=e,
                    k=k,
                    mode=mode or e.display.get("mode") or "minmax",
                    reduce=reduce,
                    cmap=cmap or e.display.get("cmap") or "jet",
                    overlay=show_overlay,
                    sign=sign or e.display.get("sign") or "all",
                    percentile=e.display.get("percentile") if mode is None else None,
                    alpha=float(e.display.get("alpha", 0.5) if alpha is None else alpha),
                    alpha_by_map=bool(e.display.get("alpha_by_map", False)),
                )
            )
    for c in columns:
        _display.colormap(torch.zeros(1, 1, 1), c.cmap)  # an unknown cmap raises now, naming close ones
    return columns


def _shown(
    columns: list[_Column], normed: list[Tensor], reduced: list[Tensor], images: Tensor
) -> list[tuple[np.ndarray, str | None]]:
    """The pixels of each column, in torch on the maps' device, one cpu transfer per column: (N, H, W[, 3]), and
    the cmap of scalar maps (None for RGB maps and overlays)."""
    image_size = tuple(int(s) for s in images.shape[-2:])
    shown: list[tuple[np.ndarray, str | None]] = []
    for c, v, r in zip(columns, normed, reduced, strict=True):
        if c.overlay:
            # the opacity follows where the map is (Explanation.overlay's rule), each map on its own scale
            weight = _display.magnitude(r, c.mode, percentile=c.percentile, sign=c.sign) if c.alpha_by_map else None
            over = _display.overlay(images, v, alpha=c.alpha, cmap=c.cmap, alpha_by_map=c.alpha_by_map, weight=weight)
            shown.append((_hwc(over), None))
        elif v.shape[-3] == 1:
            shown.append((_hwc(_display.resize(v, image_size))[..., 0], c.cmap))
        else:
            shown.append((_hwc(_display.resize(v, image_size)), None))
    return shown


def grid(
    items: Any,
    methods: Any = None,
    *,
    model: nn.Module | None = None,
    targets: Any = None,
    labels: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    scale: str = "column",
    colorbar: bool = False,
    size: tuple[float, float] | None = None,
    dpi: float = 300,
    overlay: bool | str = False,
    cmap: str | None = None,
    mode: str | None = None,
    sign: str | None = None,
    title: str | None = None,
    preprocess: Any = "auto",
    weights: Any = None,
    show_input: bool = True,
    alpha: float | None = None,
    rc: Mapping[str, Any] | None = None,
    out: str | PathLike[str] | None = None,
) -> Figure:
    """A paper figure: one row per image, one column per method (or per target), the inputs first.

    Args:
        items: a list of `Explanation` (one per column, all of the same images, e.g.
            ``[GuidedBackprop(m).visualize(imgs), GradCAM(m).visualize(imgs)]``), a single `Explanation`, or images
            (a path, PIL image, numpy array, tensor batch, or a list of them) to explain with ``methods`` and
            ``model``. An Explanation with K targets per image (``multi_target``) gives K columns, one per target.
        methods: with images: registry names (``"gradcam"``, see `hookviz.METHODS`), `Attribution` instances or
            classes. ``targets`` (any target form, e.g. an (N, K) tensor for K target columns), ``labels``,
            ``preprocess`` and ``weights`` go to ``visualize``: images are preprocessed as ``visualize`` does
            (``"auto"``, the default: the model's own preprocessing, `hookviz.images.auto_preprocess`).
        labels: class names used in the default row/column labels (default: the Explanations' own labels).
        row_labels, col_labels: override the defaults (rows: the target class name or id; columns: the method
            name, or the target with K targets). ``col_labels`` names the map columns, or every column when it
            holds one more label, for the input column.
        scale: how maps are put on the [0, 1] colour scale (each column keeps its method's normalization mode):
            ``"column"`` one scale per column across images (images compare within a method), ``"sample"`` one per
            map (the shape of each map, no comparison of magnitudes), ``"shared"`` one scale for the whole figure.
            ``"shared"`` is only meaningful when every column has the same units, e.g. one method for K targets
            or several gradient methods on one model (Saliency vs SmoothGrad); across method families (Grad-CAM
            activations vs input gradients) magnitudes are not comparable and one column would drown the others.
        colorbar: a colour bar under each column that shows a scalar map (not under the RGB maps Guided Backprop
            shows): ticks at the raw values (after channel reduction and sign) that the ends of the colour map stand
            for (`hookviz.display.normalize_bounds`) with ``"column"`` and ``"shared"``,
            0..1 (per image) for ``"sample"``.
        size: figure (width, height) in inches, fixed (constrained layout fits the cells into it); default:
            about 1.1 in per cell.
        dpi: the figure's resolution; PNG output is written at it.
        overlay: draw maps over the images (``True``), plain (``False``), or ``"auto"``: as each method's
            ``display["overlay"]`` says (Grad-CAM family over the image, input-space maps plain).
        cmap, mode, sign: override every column's colour map, `hookviz.display.normalize` mode and sign
            (``"all"``, ``"positive"``, ``"negative"``, ``"absolute"``); default: each method's display defaults.
            3-channel maps (Guided Backprop) are shown as RGB unless overlaid.
        title: a figure title. ``show_input``: draw the input column. ``alpha``: overlay opacity (default: the
            method's ``display["alpha"]``, else 0.5).
        rc: matplotlib rcParams overriding `PAPER_RC` for this figure (e.g. ``{"font.sans-serif": ["Arial"]}``).
        out: also write the figure there with `save_figure` (.pdf, .svg, .png, ...).

    Returns a `matplotlib.figure.Figure` (no pyplot). ``fig.axes`` starts with the grid's axes row by row, then
    the colour bars; each map cell's ``ax.images[0].get_array()`` holds the shown values ((H, W) in [0, 1] for
    scalar maps, (H, W, 3) RGB otherwise).
    """
    labels = _check_grid_options(scale, overlay, mode, dpi, alpha, sign, labels, items, cmap, rc, out)
    fig_size = _check_size(size)
    # every option is checked before any method runs: a mistake costs no explanation
    exps = _as_explanations(items)
    if exps is None:
        exps = _explain(items, _resolve_methods(methods, model), targets, labels, preprocess, weights)
    elif methods is not None or targets is not None:
        raise ValueError("methods= and targets= are for explaining images; items already holds Explanations")
    _check_same_images(exps)
    columns = _columns(exps, overlay=overlay, mode=mode, cmap=cmap, sign=sign, alpha=alpha)
    rows_text, cols_text = _grid_text(columns, labels, row_labels, col_labels, len(exps[0]), show_input)
    fig = _draw_grid(
        exps[0]._rgb_images(), columns, rows_text, cols_text, scale, colorbar, fig_size, dpi, title, show_input, rc
    )
    if out is not None:
        save_figure(fig, out)
    return fig


def _check_grid_options(
    scale: str,
    overlay: Any,
    mode: str | None,
    dpi: Any,
    alpha: Any,
    sign: str | None,
    labels: Any,
    items: Any,
    cmap: str | None,
    rc: Any,
    out: Any,
) -> Sequence[str] | None:
    """`grid`'s options checked, in the order a reader meets them; returns `labels` as class names."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if overlay not in (True, False, "auto"):
        raise ValueError(f"overlay must be True, False or 'auto', got {overlay!r}")
    if mode is not None and mode not in _display.NORMALIZATIONS:
        raise ValueError(f"mode must be one of {_display.NORMALIZATIONS} or None, got {mode!r}")
    number_option("dpi", dpi, "a positive number", lambda v: v > 0)
    number_option("alpha", alpha, "a number in [0, 1] or None", lambda v: 0 <= v <= 1, optional=True)
    if sign is not None and sign not in _display.SIGNS:
        raise ValueError(f"sign must be one of {_display.SIGNS} or None, got {sign!r}")
    if isinstance(getattr(labels, "meta", None), Mapping) and "categories" in labels.meta:
        labels = labels.meta["categories"]  # a torchvision weights enum member
    if labels is not None and (isinstance(labels, str) or not isinstance(labels, Sequence)):
        raise TypeError(f"labels must be a sequence of class names or torchvision weights, got {type(labels).__name__}")
    if isinstance(items, (list, tuple)) and not items:
        raise ValueError(
            "items is an empty list: pass Explanation objects (one per column), or images with methods= and model="
        )
    if cmap is not None:
        _display.colormap(torch.zeros(1, 1, 1), cmap)  # an unknown cmap raises now, naming close ones
    if rc is not None:
        _check_rc(rc)
    if out is not None:
        save_format(Path(out), "out")
    return labels


def _grid_text(
    columns: list[_Column],
    labels: Sequence[str] | None,
    row_labels: Any,
    col_labels: Any,
    n: int,
    show_input: bool,
) -> tuple[list[str], list[str]]:
    """(row labels, column labels, the input column's included): the given ones, else the defaults."""
    default_rows, default_cols = _default_labels(columns, labels, n)
    rows_text = _check_labels(row_labels, n, "row_labels") or default_rows
    n_cols = len(columns) + int(show_input)
    cols_given = _check_labels(col_labels, len(columns), "col_labels", (len(columns), n_cols))
    if cols_given is not None and len(cols_given) == n_cols:
        return rows_text, cols_given
    return rows_text, (["Input"] if show_input else []) + (default_cols if cols_given is None else cols_given)


def _draw_grid(
    images: Tensor,
    columns: list[_Column],
    rows_text: list[str],
    cols_text: list[str],
    scale: str,
    colorbar: bool,
    fig_size: tuple[float, float] | None,
    dpi: float,
    title: str | None,
    show_input: bool,
    rc: Mapping[str, Any] | None,
) -> Figure:
    """The grid figure of `images` (N, 3, H, W) and the map `columns`, laid out under `PAPER_RC` and `rc`."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    n, n_cols = len(images), len(columns) + int(show_input)
    reduced = [_display.reduce_channels(c.maps, c.reduce) for c in columns]
    shown = _shown(columns, _normalize(columns, reduced, scale), reduced, images)
    cells = [(_hwc(images), None)] * int(show_input) + shown  # (pixels, colour map or None for RGB) per column
    rc_all = {**PAPER_RC, **(rc or {})}
    with rc_context(rc_all):
        if fig_size is None:
            extra_h = 0.2 + (0.3 if colorbar else 0) + (0.25 if title else 0)
            fig_size = (_CELL_IN * n_cols + 0.3, _CELL_IN * n + extra_h)
        fig = Figure(figsize=fig_size, dpi=float(dpi), layout="constrained")
        # colour bars get a row of their own, so every image cell keeps the same size and rows stay aligned
        heights = [1.0] * n + ([_CBAR_ROW] if colorbar else [])
        axes = fig.subplots(len(heights), n_cols, squeeze=False, gridspec_kw={"height_ratios": heights})
        # wrap column titles to the cell width (about 0.6 em per character)
        title_chars = max(6, int(fig_size[0] / n_cols * 72 / (0.6 * _font_pt(rc_all, "axes.titlesize"))))
        for r in range(n):
            for j, (pixels, cm) in enumerate(cells):
                _bare(axes[r, j])
                style = {} if cm is None else {"cmap": cm, "vmin": 0.0, "vmax": 1.0}
                axes[r, j].imshow(pixels[r], interpolation="nearest", **style)
                if r == 0 and cols_text[j]:
                    axes[r, j].set_title(_wrap(cols_text[j], title_chars))
            if rows_text[r]:
                axes[r, 0].set_ylabel(_wrap(rows_text[r], _LABEL_WIDTH))
        if colorbar:
            if show_input:
                fig.delaxes(axes[n, 0])
            for c, col in enumerate(columns):
                cm = col.cmap if col.overlay or shown[c][1] is not None else None
                if cm is None:  # RGB maps have no colour scale
                    fig.delaxes(axes[n, c + int(show_input)])
                    continue
                lo, hi = _bounds(col, reduced[c], reduced, scale)
                _colorbar(fig, axes[n, c + int(show_input)], cm, lo, hi)
        if title:
            fig.suptitle(_wrap(title, int(fig_size[0] * 72 / (0.6 * _font_pt(rc_all, "figure.titlesize")))))
        fig.draw_without_rendering()  # layout and ticks now, under this figure's rc (fonts, sizes)
    fig._hookviz_rc = rc_all  # save_figure writes under the same rc
    return fig


def _check_rc(rc: Any) -> None:
    import matplotlib

    if not isinstance(rc, Mapping):
        raise TypeError(f"rc must be a mapping of matplotlib rcParams, got {type(rc).__name__}")
    unknown = [k for k in rc if k not in matplotlib.rcParams]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(matplotlib.rcParams), n=3)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else "see matplotlib.rcParams.keys()"
        raise ValueError(f"rc: {unknown[0]!r} is not a matplotlib rcParam; {hint}")
    try:
        matplotlib.RcParams(rc)  # validates every value the way rc_context would, without touching global state
    except (ValueError, TypeError) as exc:
        raise ValueError(f"rc: {exc}") from None


def save_figure(fig: Figure, path: str | PathLike[str], *, dpi: float | None = None) -> Path:
    """Write ``fig`` to ``path``, the format from the suffix (.pdf, .svg, .png, .eps, .jpg); returns the Path.

    Written under the figure's rc (`PAPER_RC` for `grid` figures) with fonts embedded: TrueType in PDF/EPS
    (``pdf.fonttype: 42``, editable text, accepted by publishers that reject Type 3 fonts), text as paths in SVG;
    no dates in the files, so a figure made the same way gives the same bytes. The figure size is kept as it is
    (no tight bounding box); ``dpi`` (default: the figure's) sets the PNG resolution and that of images in PDF/SVG.
    """
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure (e.g. from hookviz.grid), got {type(fig).__name__}")
    path = Path(path)
    fmt = save_format(path)
    number_option("dpi", dpi, "a positive number or None", lambda v: v > 0, optional=True)
    rc = {
        **getattr(fig, "_hookviz_rc", {}),
        **{k: PAPER_RC[k] for k in ("pdf.fonttype", "ps.fonttype", "svg.fonttype", "svg.hashsalt")},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with rc_context(rc):
        fig.savefig(path, format=fmt, dpi=dpi or fig.dpi, metadata=_METADATA.get(fmt))
    return path
