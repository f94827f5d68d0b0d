"""`GenerationExplanation`: what each generated token owes to the prompt and to the tokens generated before it.

Per prompt i, ``scores[i]`` is a (G_i, S_i) float tensor: row g is generated token g, column s is source token s,
the source being the prompt's tokens followed by the generated ones (S_i = P_i + G_i, P_i = ``prompt_lengths[i]``).
Generated token g is source token P_i + g, so the entries of row g at columns >= P_i + g (the token itself and what
comes after it) are 0: a causal model's prediction of a token sees only what precedes it. ``step_scores[name][i]``
is a (G_i,) tensor. The object shows itself in Jupyter (`_repr_html_`), saves as HTML or as a figure, and turns into
plain JSON-ready data (`to_dict`); the drawing lives in `hookviz.generation.views`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .._formats import save_format
from . import views

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Spans = Sequence[tuple[int, int]] | Sequence[Sequence[tuple[int, int]]]


@dataclass
class GenerationExplanation:
    """Token attributions of generated continuations (see the module docstring for the layout).

    - ``scores``: one (G_i, S_i) float tensor per prompt, generated token x source token;
    - ``source_tokens`` / ``generated_tokens``: the tokens' texts (the source ends with the generated tokens);
    - ``prompt_lengths``: P_i, the source tokens that belong to the prompt;
    - ``step_scores``: name -> one (G_i,) tensor per prompt (``"probability"``, ``"log-probability"``,
      ``"entropy"``);
    - ``method``: the method's name; ``score``: what is explained of each step (``"logit"``, ``"probability"``,
      ``"log-probability"``; with ``contrast_tokens`` the difference target - contrast);
    - ``word_starts``: per prompt, whether each source token starts a word (`aggregate` reads it).
    """

    scores: list[Tensor]
    source_tokens: list[list[str]]
    generated_tokens: list[list[str]]
    prompt_lengths: list[int]
    step_scores: dict[str, list[Tensor]]
    method: str
    score: str = "logit"
    contrast_tokens: list[list[str]] | None = None
    word_starts: list[list[bool]] | None = None
    prompts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.scores)
        for name, items in (("source_tokens", self.source_tokens), ("generated_tokens", self.generated_tokens)):
            if len(items) != n:
                raise ValueError(f"{name} has {len(items)} entries for {n} score matrices; give one per prompt")
        for i, s in enumerate(self.scores):
            g, p = len(self.generated_tokens[i]), self.prompt_lengths[i]
            if not isinstance(s, Tensor) or tuple(s.shape) != (g, p + g) or len(self.source_tokens[i]) != p + g:
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                raise ValueError(
                    f"scores[{i}] must be (G, S) = ({g}, {p + g}) (generated tokens x prompt + generated tokens) with "
                    f"{p + g} source tokens; got {got} and {len(self.source_tokens[i])} source tokens"
                )

    def __len__(self) -> int:
        return len(self.scores)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{tuple(s.shape)}" for s in self.scores[:4]) + (", ..." if len(self) > 4 else "")
        return f"GenerationExplanation(method={self.method!r}, score={self.score!r}, N={len(self)}, scores=[{shapes}])"

    # -- aggregation ------------------------------------------------------------------------------------------------
    def aggregate(self, how: str | None = None, *, spans: Spans | None = None) -> GenerationExplanation:
        """Source tokens (and the generated tokens among them) grouped, their scores summed over each group.

        ``aggregate("words")``: the subword pieces of each word joined (`word_starts`); ``aggregate(spans=[(a, b),
        ...])``: source tokens ``a..b-1`` joined, the same spans for every prompt, or a list of span lists, one per
        prompt. A group never crosses the end of the prompt. Rows are grouped like the generated tokens: a
        generated word's row is the sum of its pieces' rows (entries on the word itself and after it stay 0); its
        step scores combine by the chain rule (probabilities multiplied, log-probabilities summed) and the entropy
        of its most uncertain piece (the largest).
        """
        if (how is None) == (spans is None):
            raise ValueError("aggregate takes either 'words' or spans=[(start, stop), ...], not both nor neither")
        if how is not None and how != "words":
            raise ValueError(f"aggregate's first argument must be 'words' (or use spans=...), got {how!r}")
        if how == "words" and self.word_starts is None:
            raise ValueError("this explanation has no word boundaries (word_starts); aggregate with spans=... instead")
        groups = [self._groups(i, how, spans) for i in range(len(self))]
        return self._merged(groups)

    def _groups(self, i: int, how: str | None, spans: Spans | None) -> list[list[int]]:
        total, p = len(self.source_tokens[i]), self.prompt_lengths[i]
        if how == "words":
            starts = list(self.word_starts[i])  # type: ignore[index]
        else:
            mine = _spans_of(spans, i, len(self))
            starts = [True] * (total + 1)
            covered = [False] * total
            for a, b in mine:
                if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b <= total):
                    raise ValueError(
                        f"spans of prompt {i}: ({a!r}, {b!r}) must be ints 0 <= start < stop <= {total} (its source "
                        "tokens)"
                    )
                if any(covered[a:b]):
                    raise ValueError(f"spans of prompt {i} overlap at ({a}, {b})")
                covered[a:b] = [True] * (b - a)
                for j in range(a + 1, b):
                    starts[j] = False
        groups: list[list[int]] = []
        for j in range(total):
            if j == 0 or starts[j] or j == p:  # the prompt's end always cuts
                groups.append([j])
            else:
                groups[-1].append(j)
        return groups

    def _merged(self, groups: list[list[list[int]]]) -> GenerationExplanation:
        scores, sources, generated, lengths = [], [], [], []
        steps: dict[str, list[Tensor]] = {k: [] for k in self.step_scores}
        contrast = None if self.contrast_tokens is None else []
        starts = [] if self.word_starts is not None else None
        for i, gs in enumerate(groups):
            p = self.prompt_lengths[i]
            col = torch.zeros(len(self.source_tokens[i]), dtype=torch.long)
            for c, members in enumerate(gs):
                col[members] = c
            gen_groups = [[j - p for j in members] for members in gs if members[0] >= p]
            n_prompt = len(gs) - len(gen_groups)
            s = self.scores[i]
            merged = s.new_zeros((len(gen_groups), len(gs)))
            for r, members in enumerate(gen_groups):
                row = s[members].sum(0)
                merged[r].index_add_(0, col, row)
                merged[r, n_prompt + r :] = 0  # the word itself and what follows it
            scores.append(merged)
            sources.append(["".join(self.source_tokens[i][j] for j in members) for members in gs])
            generated.append(["".join(self.generated_tokens[i][j] for j in members) for members in gen_groups])
            lengths.append(n_prompt)
            for name, items in self.step_scores.items():
                steps[name].append(_combine(name, items[i], gen_groups))
            if contrast is not None:
                contrast.append(["".join(self.contrast_tokens[i][j] for j in m) for m in gen_groups])  # type: ignore[index]
            if starts is not None:
                starts.append([True] * len(gs))
        return GenerationExplanation(
            scores=scores,
            source_tokens=sources,
            generated_tokens=generated,
            prompt_lengths=lengths,
            step_scores=steps,
            method=self.method,
            score=self.score,
            contrast_tokens=contrast,
            word_starts=starts,
            prompts=list(self.prompts),
        )

    # -- plain data and views ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data: the method, the score explained, and per prompt its tokens, scores and step scores."""
        items = []
        for i in range(len(self)):
            item: dict[str, Any] = {
                "source_tokens": list(self.source_tokens[i]),
                "generated_tokens": list(self.generated_tokens[i]),
                "prompt_length": self.prompt_lengths[i],
                "scores": self.scores[i].detach().double().cpu().tolist(),
                "step_scores": {k: v[i].detach().double().cpu().tolist() for k, v in self.step_scores.items()},
            }
            if self.prompts:
                item["prompt"] = self.prompts[i]
            if self.contrast_tokens is not None:
                item["contrast_tokens"] = list(self.contrast_tokens[i])
            items.append(item)
        return {"method": self.method, "score": self.score, "explanations": items}

    def to_html(self, max_prompts: int | None = 20, scale: str | float = "row") -> str:
        """Self-contained HTML (no script, no network): per prompt, one line per generated token with the source
        coloured by its scores (red for, blue against; hover for the number). `scale`: ``"row"`` (each generated
        token's largest |score| is full colour), ``"prompt"`` (one scale per prompt) or a number."""
        return views.to_html(self, max_prompts=max_prompts, scale=scale)

    def _repr_html_(self) -> str:
        """Jupyter's rich view: `to_html`."""
        return self.to_html()

    def figure(self, max_prompts: int | None = 4) -> Figure:
        """A matplotlib Figure (no pyplot): per prompt a heat map, generated tokens x source tokens, labelled with
        the tokens (readable at 100 source tokens), one symmetric colour scale per prompt, future entries grey."""
        return views.figure(self, max_prompts=max_prompts)

    def save(self, path: str | PathLike[str], **options: Any) -> Path:
        """Save as HTML (``.html``) or as a figure (``.png``, ``.pdf``, ``.svg``, ...); options of `to_html` /
        `figure`."""
        path = Path(path)
        if path.suffix.lower() in (".html", ".htm"):
            path.write_text(f'<!DOCTYPE html><meta charset="utf-8">{self.to_html(**options)}', encoding="utf-8")
            return path
        fmt = save_format(path, also=".html or ")
        self.figure(**options).savefig(path, format=fmt, dpi=150, bbox_inches="tight")
        return path


def _spans_of(spans: Any, i: int, n: int) -> list[tuple[int, int]]:
    if not isinstance(spans, Sequence) or isinstance(spans, str):
        raise TypeError(f"spans must be a list of (start, stop) pairs or one such list per prompt, got {spans!r}")
    per_prompt = bool(spans) and all(isinstance(s, Sequence) and s and not _is_pair(s) for s in spans)
    if per_prompt:
        if len(spans) != n:
            raise ValueError(f"spans has {len(spans)} lists for {n} prompts; give one list per prompt (or one for all)")
        chosen = spans[i]
    else:
        chosen = spans
    if not all(_is_pair(s) for s in chosen):
        raise TypeError(f"spans must hold (start, stop) pairs of ints, got {chosen!r}")
    return [(int(a), int(b)) for a, b in chosen]


def _is_pair(s: object) -> bool:
    return isinstance(s, Sequence) and len(s) == 2 and all(isinstance(v, int) for v in s)


def _combine(name: str, values: Tensor, groups: list[list[int]]) -> Tensor:
    out = []
    for members in groups:
        v = values[members]
        if name == "probability":
            out.append(v.prod())
        elif name == "log-probability":
            out.append(v.sum())
        else:
            out.append(v.max())
    return torch.stack(out) if out else values.new_zeros((0,))
