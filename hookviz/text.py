"""`TokenExplanation`: token attributions for people, as highlighted text.

``IntegratedGradients(model, layer="embedding").visualize(token_ids, vocab=vocab)`` returns one: the attribution at
the embedding, (N, T, D), reduced over the embedding dimension to one score per token, (N, T), by the method's
convention (`Attribution.token_reduction`): summed where the attribution is a signed share of the score (Input x
Gradient, Integrated Gradients, relevance), the L2 norm for a plain gradient (Saliency: its signed sum over the
embedding is no attribution, e.g. rounding noise of 1e-10 after a LayerNorm where the norm is 1e-3 to 1). Tokens are
drawn with a background colour whose hue is the sign (red: for the target, blue: against) and whose strength is
``|score| / scale``, where the scale is shared by all rows (the largest ``|score|`` of the explanation, or one given),
so rows can be compared. It shows itself in Jupyter (`_repr_html_`), saves as HTML (``.html``) or as a figure
(``.png``, ``.pdf``, ``.svg``), and keeps the raw tensors for code.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ._checks import int_option, number_option
from ._formats import save_format
from ._present import presenter
from .explanation import resolve_labels
from .panels import score_text, target_title

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .methods.base import Attribution
    from .targets import TargetSpec

__all__ = ["TokenExplanation", "explain_tokens", "token_colour"]

Vocab = Sequence[str] | Callable[[int], str]
_POSITIVE = (214, 39, 40)  # red: the token speaks for the target
_NEGATIVE = (31, 119, 180)  # blue: against it


def token_colour(value: float, scale: float) -> tuple[int, int, int, float]:
    """RGBA background of a token scored `value` on the shared `scale`: the sign's hue, alpha ``|value| / scale``."""
    alpha = min(abs(value) / scale, 1.0) if scale > 0 else 0.0
    return (*(_POSITIVE if value >= 0 else _NEGATIVE), alpha)


def _check_vocab(vocab: object) -> None:
    if vocab is None or callable(vocab):
        return
    if isinstance(vocab, str) or not isinstance(vocab, Sequence):
        raise TypeError(
            "vocab must be a sequence of token strings indexed by id, or a callable id -> str; got "
            f"{type(vocab).__name__}"
        )


@dataclass
class TokenExplanation:
    """Per-token attributions of a batch of token sequences.

    - ``attribution``: the raw attribution at the layer, (N, T, ...) or (N, K, T, ...) with K targets per input;
    - ``tokens``: the (N, T) token ids;
    - ``targets``: (N, K) class indices (None for a callable target), ``scores``: (N, K) target scores;
    - ``vocab``: token strings indexed by id, or a callable id -> str (None: the ids are shown);
    - ``labels``: class names indexed by class id;
    - ``reduction``: how ``token_scores`` reduces the dimensions after the token axis, (N, K, T): ``"sum"`` (signed
      shares: Input x Gradient, Integrated Gradients, relevance) or ``"norm"`` (L2: Saliency's plain gradients).
    """

    attribution: Tensor
    tokens: Tensor
    targets: Tensor | None
    scores: Tensor
    method: str
    multi_target: bool = False
    vocab: Vocab | None = None
    labels: Sequence[str] | None = None
    reduction: str = "sum"

    def __post_init__(self) -> None:
        if self.reduction not in ("sum", "norm"):
            raise ValueError(f"reduction must be 'sum' or 'norm', got {self.reduction!r}")
        if not isinstance(self.tokens, Tensor) or self.tokens.dim() != 2:
            got = tuple(self.tokens.shape) if isinstance(self.tokens, Tensor) else type(self.tokens).__name__
            raise ValueError(f"tokens must be an (N, T) tensor of token ids, got {got}")
        n, t = self.tokens.shape
        axis = 2 if self.multi_target else 1
        a = self.attribution
        if not isinstance(a, Tensor) or a.dim() <= axis or a.shape[0] != n or a.shape[axis] != t:
            got = tuple(a.shape) if isinstance(a, Tensor) else type(a).__name__
            want = "(N, K, T, ...)" if self.multi_target else "(N, T, ...)"
            raise ValueError(
                f"attribution must be {want} with N = {n}, T = {t} (the token axis of the layer); got {got}: choose "
                "a layer whose output is (N, T, D), such as the embedding"
            )
        _check_vocab(self.vocab)
        self.labels = resolve_labels(self.labels)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def token_scores(self) -> Tensor:
        """(N, K, T) float scores: the attribution reduced over the embedding (and any further) dimensions, by
        `reduction` (a sum, or the L2 norm)."""
        a = self.attribution.detach()
        if not self.multi_target:
            a = a.unsqueeze(1)
        if a.dim() <= 3:
            return a
        return a.flatten(3).norm(dim=3) if self.reduction == "norm" else a.flatten(3).sum(3)

    def token_strings(self) -> list[list[str]]:
        """The tokens of every sequence as strings, through `vocab` (the ids themselves without one)."""
        ids = self.tokens.detach().cpu().tolist()
        vocab = self.vocab
        if vocab is None:
            return [[str(i) for i in row] for row in ids]
        if callable(vocab):
            return [[str(vocab(i)) for i in row] for row in ids]
        out = []
        for row in ids:
            try:
                out.append([str(vocab[i]) for i in row])
            except IndexError:
                bad = max(row)
                raise ValueError(f"token id {bad} is out of range for a vocab of {len(vocab)} entries") from None
        return out

    def _scale(self, scale: float | None) -> float:
        if scale is None:
            return float(self.token_scores.abs().max()) if self.token_scores.numel() else 0.0
        number_option("scale", scale, "None (the largest |score| of the explanation) or a number > 0", lambda v: v > 0)
        return float(scale)

    def _rows(self, max_rows: int | None) -> tuple[list[tuple[int, int]], int]:
        k = self.token_scores.shape[1]
        rows = [(i, j) for i in range(len(self)) for j in range(k)]
        if max_rows is not None:
            int_option("max_rows", max_rows, "None or an int >= 1")
            return rows[:max_rows], len(rows)
        return rows, len(rows)

    def _target_title(self, i: int, j: int) -> str:
        return target_title(None if self.targets is None else int(self.targets[i, j]), self.labels, with_id=True)

    def to_html(self, max_rows: int | None = 20, scale: float | None = None) -> str:
        """Highlighted text, one line per (sequence[, target]); the colour scale is shared by all lines.

        Each token's tooltip gives its score. `scale`: the |score| of full colour (default: the largest |score|).
        """
        s = self._scale(scale)
        scores = self.token_scores.float().cpu()
        words = self.token_strings()
        rows, total = self._rows(max_rows)
        lines = []
        for i, j in rows:
            spans = []
            for w, v in zip(words[i], scores[i, j].tolist(), strict=True):
                r, g, b, a = token_colour(v, s)
                spans.append(
                    f'<span title="{v:+.4g}" style="background-color: rgba({r}, {g}, {b}, {a:.3f}); '
                    f'padding: 1px 3px; margin: 1px; border-radius: 3px">{html.escape(w)}</span>'
                )
            head = f"sample {i}" + (f", target {j}" if self.multi_target else "")
            class_id = None if self.targets is None else int(self.targets[i, j])
            score = score_text(float(self.scores[i, j]), class_id, 4)
            info = f"{head}: <b>{html.escape(self._target_title(i, j))}</b>, {score}"
            lines.append(
                f'<div style="margin: 4px 0"><div>{info}</div>'
                f'<div style="line-height: 1.9">{"".join(spans)}</div></div>'
            )
        note = f"<div>showing {len(rows)} of {total} rows</div>" if len(rows) < total else ""
        legend = f"<div>colour scale: &plusmn;{s:.4g} (red: for the target, blue: against; shared by all rows)</div>"
        return (
            f'<div class="hookviz-tokens"><div><code>{html.escape(repr(self))}</code></div>{legend}'
            f"{''.join(lines)}{note}</div>"
        )

    def _repr_html_(self) -> str:
        """Jupyter's rich view: `to_html`."""
        return self.to_html()

    def figure(self, max_rows: int | None = 20, scale: float | None = None) -> Figure:
        """A matplotlib Figure of the highlighted text (no pyplot), one line per (sequence[, target])."""
        from matplotlib.figure import Figure

        s = self._scale(scale)
        scores = self.token_scores.float().cpu()
        words = self.token_strings()
        rows, _ = self._rows(max_rows)
        char_w, line_h, row_h = 0.11, 0.28, 0.72  # inches: a character of 10 pt monospace, a line, a row
        width = max(3.0, max((sum(len(w) + 1 for w in words[i]) for i, _ in rows), default=1) * char_w + 0.4)
        height = row_h * len(rows) + 0.1
        fig = Figure(figsize=(width, height))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
        for r, (i, j) in enumerate(rows):
            y = 0.2 + r * row_h
            head = f"sample {i}" + (f", target {j}" if self.multi_target else "")
            ax.text(0.2, y, f"{head}: {self._target_title(i, j)}", fontsize=8, va="center", color="0.3")
            x = 0.2
            for w, v in zip(words[i], scores[i, j].tolist(), strict=True):
                red, green, blue, alpha = token_colour(v, s)
                ax.text(
                    x, y + line_h, w, family="monospace", fontsize=10, va="center",
                    bbox={"boxstyle": "round,pad=0.15", "linewidth": 0,
                          "facecolor": (red / 255, green / 255, blue / 255, alpha)},
                )  # fmt: skip
                x += (len(w) + 1) * char_w
        return fig

    def save(self, path: str | PathLike[str], **options: Any) -> Path:
        """Save as HTML (``.html``) or as a figure (a suffix of `SAVE_FORMATS`); options of `to_html` / `figure`."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix in (".html", ".htm"):
            path.write_text(f'<!DOCTYPE html><meta charset="utf-8">{self.to_html(**options)}', encoding="utf-8")
            return path
        fmt = save_format(path, also=".html or ")
        self.figure(**options).savefig(path, format=fmt, dpi=150)
        return path

    def __repr__(self) -> str:
        k = f", K={self.token_scores.shape[1]}" if self.multi_target else ""
        return f"TokenExplanation(method={self.method!r}, N={len(self)}{k}, tokens={tuple(self.tokens.shape)})"


@presenter("tokens")  # `Attribution.visualize` of token ids comes here through the seam
def explain_tokens(
    method: Attribution,
    tokens: Tensor,
    target: TargetSpec = None,
    *,
    vocab: Vocab | None = None,
    labels: Any = None,
    additional_forward_args: Any = None,
    forward_kwargs: dict[str, Any] | None = None,
) -> TokenExplanation:
    """`method` on integer token ids (N, T) -> `TokenExplanation`; the method must attribute to a layer (``layer=``)
    or give token scores itself (``token_scores``: the attention rollouts, (N, T)).

    `forward_kwargs` (e.g. ``{"attention_mask": mask}``) are passed to ``forward`` (`Attribution.attribute`)."""
    if getattr(method, "_tap", None) is None and not getattr(method, "token_scores", False):
        raise TypeError(
            f"visualize got integer token ids {tuple(tokens.shape)}, but {method!r} has no layer=; explain token ids "
            "at a layer, e.g. IntegratedGradients(model, layer='embedding').visualize(ids, vocab=vocab)"
        )
    if tokens.dim() != 2:
        raise ValueError(f"token ids must be an (N, T) tensor, got shape {tuple(tokens.shape)}")
    _check_vocab(vocab)
    extra = additional_forward_args
    attribution, targets = method.attribute_with_targets(
        tokens, target, additional_forward_args=extra, forward_kwargs=forward_kwargs
    )
    return TokenExplanation(
        attribution=attribution.detach(),
        tokens=tokens.detach().cpu(),
        targets=None if targets.indices is None else targets.indices.detach().cpu(),
        scores=targets.scores.detach().cpu(),
        method=method.method_label,
        multi_target=targets.multi,
        vocab=vocab,
        labels=labels,
        reduction=getattr(method, "token_reduction", "sum"),
    )
