"""How a `GenerationExplanation` looks: self-contained HTML (no script, no network) and a matplotlib heat map.

HTML: per prompt, one line per generated token: the source up to that token, each source token's background
coloured by its score (`hookviz.text.token_colour`: red for the token, blue against, strength |score| / scale), the
exact score in its tooltip, then the generated token itself, outlined, with its step scores. The figure: per prompt a
heat map, generated tokens (rows) x source tokens (columns), a symmetric diverging colour scale, entries a causal
model cannot use (at and after the generated token's own position) grey; the labels shrink with the number of
tokens and the figure grows, so 100 source tokens stay readable.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from .._checks import int_option, number_option
from ..text import token_colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class GenerationExplanation(Protocol):
    """What the views read of a `hookviz.generation.explanation.GenerationExplanation` (which imports this module
    for its `to_html` and `figure`: the views name its fields, not the class)."""

    @property
    def method(self) -> str: ...
    @property
    def score(self) -> str: ...
    @property
    def scores(self) -> Sequence[Tensor]: ...
    @property
    def prompt_lengths(self) -> Sequence[int]: ...
    @property
    def source_tokens(self) -> Sequence[Sequence[str]]: ...
    @property
    def generated_tokens(self) -> Sequence[Sequence[str]]: ...
    @property
    def step_scores(self) -> Mapping[str, Sequence[Tensor]]: ...
    @property
    def contrast_tokens(self) -> Sequence[Sequence[str]] | None: ...


def finite_max(t: Tensor) -> float:
    """The largest |value| of `t` (0 for an empty tensor), for colour scales."""
    m = float(t.detach().abs().max()) if t.numel() else 0.0
    return m if math.isfinite(m) else 0.0


# inline blocks: a line of tokens wraps between them, and a token's own spaces stay visible inside its box
_LINE = "line-height: 1.9; font-family: monospace; border-bottom: 1px solid #ddd"
_SPAN = "display: inline-block; padding: 0 2px; margin: 1px 0; border-radius: 3px; white-space: pre"


def _shown(text: str) -> str:
    # whitespace tokens and newlines stay visible as tokens
    return html.escape(text.replace("\n", "\u21b5"))


def _scale_of(exp: GenerationExplanation, i: int, scale: str | float) -> float | None:
    if scale == "row":
        return None
    if scale == "prompt":
        return finite_max(exp.scores[i])
    return float(number_option("scale", scale, "'row', 'prompt' or a number > 0", lambda v: v > 0))


def to_html(exp: GenerationExplanation, *, max_prompts: int | None = 20, scale: str | float = "row") -> str:
    """The HTML view (see the module docstring)."""
    int_option("max_prompts", max_prompts, "None or an int >= 1", optional=True)
    if not (isinstance(scale, str) and scale in ("row", "prompt")):
        number_option("scale", scale, "'row', 'prompt' or a number > 0", lambda v: v > 0)
    shown = range(len(exp)) if max_prompts is None else range(min(len(exp), max_prompts))
    blocks = []
    for i in shown:
        fixed = _scale_of(exp, i, scale)
        p = exp.prompt_lengths[i]
        src = exp.source_tokens[i]
        lines = []
        for g, tok in enumerate(exp.generated_tokens[i]):
            row = exp.scores[i][g].detach().double().cpu().tolist()
            s = fixed if fixed is not None else finite_max(exp.scores[i][g])
            spans = []
            for j in range(p + g):
                r, gr, b, a = token_colour(row[j], s)
                spans.append(
                    f'<span title="{html.escape(src[j])}: {row[j]:+.4g}" style="background-color: rgba({r}, {gr}, {b}, '
                    f'{a:.3f}); {_SPAN}">{_shown(src[j])}</span>'
                )
            info = ", ".join(f"{k} {float(v[i][g]):.4g}" for k, v in exp.step_scores.items())
            versus = ""
            if exp.contrast_tokens is not None:
                versus = f" vs <b>{_shown(exp.contrast_tokens[i][g])}</b>"
            spans.append(
                f'<span title="generated token {g}{(": " + info) if info else ""}" style="outline: 2px solid #333; '
                f'{_SPAN}"><b>{_shown(tok)}</b></span>{versus}'
            )
            lines.append(f'<div style="{_LINE}">{"".join(spans)}</div>')
        head = f"prompt {i}: {p} prompt tokens, {len(exp.generated_tokens[i])} generated"
        generated = "".join(exp.generated_tokens[i])
        blocks.append(
            f'<div style="margin: 8px 0"><div><b>{html.escape(head)}</b>: <i>{_shown(generated)}</i></div>'
            f"{''.join(lines)}</div>"
        )
    note = f"<div>showing {len(shown)} of {len(exp)} prompts</div>" if len(shown) < len(exp) else ""
    what = (
        "scale per generated token" if scale == "row" else "scale per prompt" if scale == "prompt" else f"scale {scale}"
    )
    legend = (
        f"<div>{html.escape(exp.method)}, explaining the {html.escape(exp.score)} of each generated token "
        f"(outlined){' against the contrast' if exp.contrast_tokens is not None else ''}; red: for it, blue: "
        f"against; {what}; hover a token for its score</div>"
    )
    head = f"<div><code>{html.escape(repr(exp))}</code></div>"
    return f'<div class="hookviz-generation">{head}{legend}{"".join(blocks)}{note}</div>'


def figure(exp: GenerationExplanation, *, max_prompts: int | None = 4) -> Figure:
    """The heat map figure (see the module docstring)."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    int_option("max_prompts", max_prompts, "None or an int >= 1", optional=True)
    shown = list(range(len(exp) if max_prompts is None else min(len(exp), max_prompts)))
    cell = 0.16  # inches per token: room for a 7-point label
    widths = [len(exp.source_tokens[i]) for i in shown]
    heights = [max(1, len(exp.generated_tokens[i])) for i in shown]
    width = max(4.0, max(widths, default=1) * cell + 2.5)
    fig = Figure(figsize=(width, sum(h * cell + 1.6 for h in heights) + 0.4), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False, height_ratios=[h * cell + 1.6 for h in heights])[:, 0]
    cmap = colormaps["bwr"].with_extremes(bad="0.85")
    for ax, i in zip(axes, shown, strict=True):
        s = exp.scores[i].detach().double().cpu().numpy()
        p, g = exp.prompt_lengths[i], s.shape[0]
        future = np.arange(s.shape[1])[None, :] >= (p + np.arange(g))[:, None]
        vmax = finite_max(exp.scores[i]) or 1.0
        image = ax.imshow(np.ma.masked_array(s, future), cmap=cmap, vmin=-vmax, vmax=vmax, aspect="auto",
                          interpolation="nearest")  # fmt: skip
        size = 7 if s.shape[1] <= 120 else 5
        ax.set_xticks(range(s.shape[1]), [t.replace("\n", "\u21b5") for t in exp.source_tokens[i]], rotation=90,
                      fontsize=size, family="monospace")  # fmt: skip
        ax.set_yticks(range(g), [t.replace("\n", "\u21b5") for t in exp.generated_tokens[i]], fontsize=size,
                      family="monospace")  # fmt: skip
        ax.axvline(p - 0.5, color="0.2", linewidth=0.8)  # where the prompt ends
        ax.set_title(f"prompt {i}: {exp.method}, {exp.score} of each generated token", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.02, pad=0.01)
    return fig
