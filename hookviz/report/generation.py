"""`report_generation`: a static HTML report (no server, no CDN) over the explanations of a file of prompts."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..generation import GenerationExplanation
from . import gendata, pages
from .output import VERSION, mark, prepare_out


def report_generation(
    explanations: GenerationExplanation | Mapping[str, GenerationExplanation],
    out: str | os.PathLike[str],
    *,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a static HTML report of what a language model generated after each prompt, and why, to `out`; returns
    the path of its ``index.html``.

    The site (plain HTML, CSS and a small script; no server, no CDN: it opens from the file system) lists one row per
    prompt: the prompt (shortened), the generated continuation, the prompt's and the continuation's token counts and
    the mean of each step score (probability, log-probability, entropy: whichever were computed), sortable and
    filtered by text, the state in the URL fragment. A prompt's detail view shows, per method (one, or all of them
    stacked), each generated token's scores over the source (the prompt and the tokens generated before it): the
    source coloured by the chosen generated token (red: for it, blue: against, `hookviz.text.token_colour`) and the
    (generated x source) heat map, both drawn in the page from the stored scores, exact on hover; tokens or words
    (`GenerationExplanation.aggregate("words")`, redone in the page); a scale per generated token or per prompt.
    The scores are stored exactly, per block of prompts in a file loaded when one of its prompts is opened
    (`hookviz.report.gendata`), so 1,000 prompts x 64 tokens x 3 methods open as fast as 10.

    A separate function from `hookviz.report` (the image report) because nothing of that one's options (data,
    model, evaluation, sanity figure, thumbnail workers) applies here; both share the output folder's rules, the
    page shell, its style and the scripts' common parts.

    Args:
        explanations: one `GenerationExplanation` (from `hookviz.explain_generation`), or a mapping ``{name:
            explanation}`` of several methods over the same prompts and the same continuations (the first method's
            continuation forced on the others with ``target=``, as ``hookviz explain-generation --method a,b,c
            --report DIR`` does); refused if their prompts or generated tokens differ.
        out: the report folder; created if missing, replaced if it holds a previous hookviz report (of either kind),
            refused if it holds anything else unless `overwrite` (then only the report's own files are replaced).
        title: the report's title (default: the methods and the number of prompts).

    Example::

        exp = hookviz.explain_generation(model, tokenizer, prompts, step_scores=("probability", "entropy"))
        hookviz.report_generation(exp, "report/")   # then open report/index.html
    """
    exps = _checked(explanations)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    path = prepare_out(out, overwrite)
    start = time.perf_counter()
    n = len(next(iter(exps.values())))
    title = title or f"{', '.join(exps)} on {n} prompt{'s' if n != 1 else ''}"
    (path / "data" / "g").mkdir(parents=True)
    for a in range(0, n, gendata.BLOCK):
        gendata.write_block(path, exps, a, min(n, a + gendata.BLOCK))
    pages.write_index(path, title, gendata.index_data(title, exps), "generation.html")
    info = {"format": "hookviz-report", "version": VERSION, "kind": "generation", "complete": True, "items": n}
    mark(path, {**info, "methods": list(exps), "seconds": round(time.perf_counter() - start, 3)})
    return path / "index.html"


def _checked(explanations: Any) -> dict[str, GenerationExplanation]:
    """``{name: explanation}``, every one over the same prompts and continuations; checked before anything is
    written."""
    if isinstance(explanations, GenerationExplanation):
        exps = {explanations.method: explanations}
    elif isinstance(explanations, Mapping):
        if not explanations:
            raise ValueError("explanations is an empty mapping; pass {method name: GenerationExplanation, ...}")
        for name, e in explanations.items():
            if not isinstance(name, str) or not name or not isinstance(e, GenerationExplanation):
                raise TypeError(
                    "explanations given as a mapping must map names (non-empty str) to GenerationExplanation "
                    f"(from hookviz.explain_generation), got {name!r}: {type(e).__name__}"
                )
        exps = dict(explanations)
    else:
        raise TypeError(
            "explanations must be a GenerationExplanation (from hookviz.explain_generation) or a mapping {name: "
            f"GenerationExplanation}}, got {type(explanations).__name__}"
        )
    (first_name, first), *others = exps.items()
    if len(first) == 0:
        raise ValueError(f"explanations[{first_name!r}] explains no prompt; nothing to report")
    for i, s in enumerate(first.scores):
        if not s.is_floating_point():
            raise TypeError(f"explanations[{first_name!r}].scores[{i}] must be floating point, got {s.dtype}")
    for name, e in others:
        if len(e) != len(first):
            raise ValueError(
                f"explanations[{name!r}] explains {len(e)} prompts and explanations[{first_name!r}] {len(first)}; "
                "every method must explain the same prompts"
            )
        for i in range(len(first)):
            for what, mine, theirs in (
                ("prompt tokens", first.source_tokens[i][: first.prompt_lengths[i]],
                 e.source_tokens[i][: e.prompt_lengths[i]]),
                ("generated tokens", first.generated_tokens[i], e.generated_tokens[i]),
                ("prompt", gendata.prompt_text(first, i), gendata.prompt_text(e, i)),
            ):  # fmt: skip
                if list(mine) != list(theirs):
                    raise ValueError(
                        f"explanations[{name!r}] and explanations[{first_name!r}] differ at prompt {i}: {what} "
                        f"{_short(theirs)} against {_short(mine)}; every method must explain the same continuations "
                        f"(explain the first one's with target=[''.join(t) for t in first.generated_tokens])"
                    )
            if not e.scores[i].is_floating_point():
                raise TypeError(f"explanations[{name!r}].scores[{i}] must be floating point, got {e.scores[i].dtype}")
    return exps


def _short(value: Any) -> str:
    text = repr(value if isinstance(value, str) else list(value))
    return text if len(text) <= 120 else text[:80] + " ... " + text[-35:]
