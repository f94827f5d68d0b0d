"""Drawing from plain data: the rows and columns of pixels that an explanation's figures and HTML views show
(`Panels`, computed by `hookviz.Explanation` in torch, one cpu transfer per column), a matplotlib figure of them, an
HTML table of them with inline PNGs, and the one rule that names a target in every figure and view (`target_title`).
Nothing here knows the result objects: they hand their pixels over as data."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure


# the titles of hookviz's own methods in figures (Explanation.method is the class name or a method_label)
PRETTY_NAMES = {
    "Saliency": "Saliency",
    "InputXGradient": "Input \u00d7 Gradient",
    "SmoothGrad": "SmoothGrad",
    "IntegratedGradients": "Integrated Gradients",
    "GuidedBackprop": "Guided Backprop",
    "Deconvnet": "Deconvnet",
    "GradCAM": "Grad-CAM",
    "GradCAMPlusPlus": "Grad-CAM++",
    "LayerCAM": "LayerCAM",
    "XGradCAM": "XGrad-CAM",
    "HiResCAM": "HiResCAM",
    "ScoreCAM": "Score-CAM",
    "GuidedGradCAM": "Guided Grad-CAM",
    "AttentionRollout": "Attention Rollout",
    "GradientRollout": "Gradient Rollout",
    "LRP (attn-lrp)": "AttnLRP",
    "LRP (cp-lrp)": "CP-LRP",
}


def pretty_method(method: str) -> str:
    """The title a figure gives `method` (``"GradCAM"`` -> ``"Grad-CAM"``); other names as they are."""
    return PRETTY_NAMES.get(method, method)


def _png_data_uri(pixels: np.ndarray) -> str:
    """(H, W, 3) uint8 -> ``data:image/png;base64,...``."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


_HTML_WIDTH = 192  # px per panel in the HTML view; small maps are scaled up without smoothing


@dataclass
class Panels:
    """What a figure or HTML view of an explanation draws."""

    rows: list[tuple[int, int]]  # (sample, target) per drawn row
    columns: list[tuple[str, np.ndarray]]  # (title, (n, K, H, W, 3) uint8)
    scores: list[list[float]]
    targets: list[list[int]] | None
    total: int  # rows there would be without max_rows
    labels: Sequence[str] | None = None  # class names indexed by class id
    multi_target: bool = False  # K targets per sample: rows name the target too
    header: str = ""  # a line above the HTML table (the explanation's repr)
    colorbar: ColorBar | None = None  # a colour bar beside the rows (figures only)


@dataclass(frozen=True)
class ColorBar:
    """A colour bar from 0 to 1 of the normalized maps: the colour map, what the colours mean, ticks and their
    labels (`colorbar_for`)."""

    cmap: str
    label: str
    ticks: tuple[float, ...]
    tick_labels: tuple[str, ...]


def colorbar_for(cmap: str, mode: str, sign: str) -> ColorBar:
    """What the colours of maps normalized with `mode` and `sign` (`hookviz.display.normalize`) mean.

    Signed maps on a scale centred at 0 (sign ``"all"`` with ``"absmax"``, ``"percentile"``, ``"mass"``, drawn on a
    diverging map): "signed relevance", 0 at the centre; ``"seed"``: a standardised value, the mean at the centre and
    5 standard deviations at the ends; otherwise a "normalised magnitude" from 0 (``"minmax"``: the minimum) to the
    maximum (or the clip point of ``"percentile"`` and ``"mass"``)."""
    if mode == "seed":
        return ColorBar(cmap, "standardised value", (0.0, 0.5, 1.0), ("\u22125\u03c3", "mean", "+5\u03c3"))
    if sign == "all" and mode in ("absmax", "percentile", "mass"):
        return ColorBar(cmap, "signed relevance", (0.0, 0.5, 1.0), ("\u2212", "0", "+"))
    return ColorBar(cmap, "normalised magnitude", (0.0, 1.0), ("min" if mode == "minmax" else "0", "max"))


def score_text(score: float, class_id: int | None, digits: int = 3) -> str:
    """A target's score, labelled with what it is, the one rule of every figure and view: ``logit 10.2`` for a
    class target (the model's output for that class, what the attribution explains; not a probability), ``score
    0.93`` for a callable target (whatever it returned)."""
    value = f"{score:.{digits}g}"
    if value.lstrip("-").isdigit():
        value += ".0"  # 10.0, not 10: a logit is not a count
    return f"{'score' if class_id is None else 'logit'} {value}"


def target_title(class_id: int | None, labels: Sequence[str] | None, *, with_id: bool = False) -> str:
    """A target's title in every figure and view: its label when `labels` has one (followed by ``(class i)`` when
    `with_id`), else ``class i``; ``custom target`` for a callable target (no class id)."""
    if class_id is None:
        return "custom target"
    if labels is not None and 0 <= class_id < len(labels):
        return f"{labels[class_id]} (class {class_id})" if with_id else str(labels[class_id])
    return f"class {class_id}"


def draw(fig: Figure, panels: Panels) -> None:
    """Draw the panels on `fig`: one row of axes per panel row, titled with the target and its labelled score
    (`score_text`), and ``panels.colorbar`` beside the rows when set."""
    if panels.colorbar is not None:
        fig.set_layout_engine("constrained")  # makes room for the colour bar; tight_layout cannot
    axes = fig.subplots(len(panels.rows), len(panels.columns), squeeze=False)
    for r, (i, j) in enumerate(panels.rows):
        class_id = None if panels.targets is None else panels.targets[i][j]
        target = target_title(class_id, panels.labels)
        titles = [f"{target}  {score_text(panels.scores[i][j], class_id)}"] + [name for name, _ in panels.columns[1:]]
        for c, (_, pixels) in enumerate(panels.columns):
            ax = axes[r, c]
            ax.imshow(pixels[i, j], interpolation="nearest")
            ax.set_title(titles[c], fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    if panels.colorbar is None:
        fig.tight_layout()
        return
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    bar = panels.colorbar
    cb = fig.colorbar(
        ScalarMappable(norm=Normalize(0.0, 1.0), cmap=bar.cmap), ax=axes.ravel().tolist(), fraction=0.04, pad=0.02
    )
    cb.set_ticks(list(bar.ticks), labels=list(bar.tick_labels))
    cb.set_label(bar.label, fontsize=9)
    cb.ax.tick_params(labelsize=8)


def figsize(panels: Panels) -> tuple[float, float]:
    """Inches: 2.6 per panel."""
    return 2.6 * len(panels.columns), 2.6 * len(panels.rows)


def html_table(panels: Panels) -> str:
    """The panels as an HTML table with inline PNGs, headed by ``panels.header``."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in panels.columns)
    body = []
    for i, j in panels.rows:
        class_id = None if panels.targets is None else panels.targets[i][j]
        target = target_title(class_id, panels.labels, with_id=True)
        sample = f"sample {i}" + (f", target {j}" if panels.multi_target else "")
        info = f"{sample}<br><b>{html.escape(target)}</b><br>{score_text(panels.scores[i][j], class_id, 4)}"
        cells = "".join(
            f'<td><img src="{_png_data_uri(pixels[i, j])}" alt="{html.escape(name)}" width="{_HTML_WIDTH}" '
            'style="image-rendering: pixelated"></td>'
            for name, pixels in panels.columns
        )
        body.append(f'<tr><td style="text-align: left">{info}</td>{cells}</tr>')
    more = len(panels.rows) < panels.total
    note = f"<div>showing {len(panels.rows)} of {panels.total} rows</div>" if more else ""
    return (
        f'<div class="hookviz-explanation"><div><code>{html.escape(panels.header)}</code></div>'
        f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>{note}</div>"
    )
