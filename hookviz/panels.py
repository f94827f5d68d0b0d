"""An `Explanation` drawn: the rows and columns of pixels that its figures and HTML views show (computed in torch, one
cpu transfer per column), a matplotlib figure of them, and an HTML table of them with inline PNGs."""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from . import display as _display

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

    from .explanation import Explanation


def _png_data_uri(pixels: np.ndarray) -> str:
    """(H, W, 3) uint8 -> ``data:image/png;base64,...``."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


_HTML_WIDTH = 192  # px per panel in the HTML view; small maps are scaled up without smoothing


@dataclass
class _Panels:
    """What a figure or HTML view of an Explanation draws."""

    rows: list[tuple[int, int]]  # (sample, target) per drawn row
    columns: list[tuple[str, np.ndarray]]  # (title, (n, K, H, W, 3) uint8)
    scores: list[list[float]]
    targets: list[list[int]] | None
    total: int  # rows there would be without max_rows


def target_title(exp: Explanation, class_id: int | None) -> str:
    """A target's column title: its label when `labels` has one, else its class id."""
    if class_id is None:
        return "custom target"
    if exp.labels is not None and 0 <= class_id < len(exp.labels):
        return str(exp.labels[class_id])
    return f"class {class_id}"


def build(exp: Explanation, where: str, options: dict[str, Any]) -> _Panels:
    """The rows a figure or HTML view draws: ``(sample, target)`` pairs, column titles and uint8 HWC pixels."""
    o = exp._options(where, **options)
    if len(exp) == 0:
        raise ValueError(f"cannot draw an empty Explanation (N=0) with {where}()")
    k = exp.num_targets
    n_rows = min(o["max_rows"], len(exp) * k)
    n_samples = math.ceil(n_rows / k)
    # only compute what is drawn; but shared statistics come from the whole batch, so the colours of a row do
    # not depend on how many rows are drawn
    src = exp if o["scale"] == "shared" else exp[:n_samples]
    view = {key: o[key] for key in ("cmap", "mode", "reduce", "sign", "scale", "percentile")}

    def with_k(t: Tensor) -> Tensor:
        t = t[:n_samples]
        return t if exp.multi_target else t.unsqueeze(1)

    def to_hwc(t: Tensor) -> np.ndarray:
        # (N, K, 3, H, W) -> (N, K, H, W, 3) uint8 on the device, then one cpu transfer for the whole column
        return _display.to_uint8(t.clamp(0, 1)).movedim(-3, -1).cpu().numpy()

    images = exp._rgb_images()[:n_samples].unsqueeze(1).expand(-1, k, -1, -1, -1)
    columns = [("image", to_hwc(images)), (exp.method, to_hwc(with_k(src.heatmap(**view))))]
    if o["overlay"]:
        over = src.overlay(o["alpha"], alpha_by_map=o["alpha_by_map"], **view)
        columns.append(("overlay", to_hwc(with_k(over))))
    scores = exp.scores[:n_samples].detach().float().cpu().tolist()
    targets = None if exp.targets is None else exp.targets[:n_samples].detach().cpu().tolist()
    rows = [divmod(r, k) for r in range(n_rows)]
    return _Panels(rows=rows, columns=columns, scores=scores, targets=targets, total=len(exp) * k)


def draw(fig: Figure, exp: Explanation, panels: _Panels) -> None:
    """Draw the panels on `fig`: one row of axes per panel row, titled with the target and score."""
    axes = fig.subplots(len(panels.rows), len(panels.columns), squeeze=False)
    for r, (i, j) in enumerate(panels.rows):
        target = target_title(exp, None if panels.targets is None else panels.targets[i][j])
        titles = [f"{target}  score {panels.scores[i][j]:.3g}"] + [name for name, _ in panels.columns[1:]]
        for c, (_, pixels) in enumerate(panels.columns):
            ax = axes[r, c]
            ax.imshow(pixels[i, j], interpolation="nearest")
            ax.set_title(titles[c], fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.tight_layout()


def figsize(panels: _Panels) -> tuple[float, float]:
    return 2.6 * len(panels.columns), 2.6 * len(panels.rows)


def html_table(exp: Explanation, panels: _Panels) -> str:
    """The panels as an HTML table with inline PNGs, headed by the Explanation's repr."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in panels.columns)
    body = []
    for i, j in panels.rows:
        class_id = None if panels.targets is None else panels.targets[i][j]
        target = target_title(exp, class_id)
        if class_id is not None and target != f"class {class_id}":
            target += f" (class {class_id})"
        sample = f"sample {i}" + (f", target {j}" if exp.multi_target else "")
        info = f"{sample}<br><b>{html.escape(target)}</b><br>score {panels.scores[i][j]:.4g}"
        cells = "".join(
            f'<td><img src="{_png_data_uri(pixels[i, j])}" alt="{html.escape(name)}" width="{_HTML_WIDTH}" '
            'style="image-rendering: pixelated"></td>'
            for name, pixels in panels.columns
        )
        body.append(f'<tr><td style="text-align: left">{info}</td>{cells}</tr>')
    more = len(panels.rows) < panels.total
    note = f"<div>showing {len(panels.rows)} of {panels.total} rows</div>" if more else ""
    return (
        f'<div class="hookviz-explanation"><div><code>{html.escape(repr(exp))}</code></div>'
        f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>{note}</div>"
    )
