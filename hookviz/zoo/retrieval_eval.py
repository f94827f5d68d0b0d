"""Which attribution method finds the answer: the zoo's retrieval language model explained on fresh prompts whose
evidence is known.

``python -m hookviz.zoo.retrieval_eval --n 500 --out docs/generation-retrieval.md`` explains the model's answer to
each prompt with `hookviz.explain_generation` (the right answer forced as the target), once per method, and counts
how often the answer's top-scored prompt token is the queried key's occurrence in the list, or its value; a method
that scores tokens at random finds either about as often as the random baseline column says.

This module sits above the public API (it calls ``hv.explain_generation``), not with the zoo's models below the
methods: ``hookviz.zoo`` does not import it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hookviz as hv

from .lm import retrieval_accuracy, retrieval_lm
from .retrieval import VOCAB, Retrieval, retrieval

METHODS: tuple[str, ...] = (
    "saliency",
    "input-x-gradient",
    "integrated-gradients",
    "attn-lrp",
    "cp-lrp",
    "attention-rollout",
    "gradient-rollout",
    "occlusion",
)
EVAL_SEED = 20_260  # fresh prompts: training draws from seeds >= 1_000_000, the reported split is seed 0


@dataclass(frozen=True)
class RetrievalScore:
    """One method's row: the fraction of prompts whose answer's top-scored prompt token is the queried key in the
    list (`key`), its value in the list (`value`), either of them (`either`), the queried key after ``?``
    (`query`); `random` is what a uniformly random choice of a prompt token would score for `key` (and for
    `value`): the mean of 1 / (number of scored prompt tokens). `error`: why the method gave no row (a method
    ``hv.explain_generation`` does not offer), the rates then NaN."""

    method: str
    n: int
    key: float
    value: float
    either: float
    query: float
    random: float
    seconds: float
    error: str | None = None


def prompt_length(source_tokens: Sequence[str], generated_tokens: Sequence[str]) -> int:
    """How many of `source_tokens` are the prompt's: the sources are the prompt's tokens, then the generated tokens
    (all G of them, the entries at and after a token's own position zero, as ``hv.GenerationExplanation`` lays them
    out, or the G - 1 before the last)."""
    src, gen = [t.strip() for t in source_tokens], [t.strip() for t in generated_tokens]
    g = len(gen)
    if g and len(src) >= g and src[len(src) - g :] == gen:
        return len(src) - g
    if len(src) >= g - 1 and src[len(src) - (g - 1) :] == gen[: g - 1]:
        return len(src) - (g - 1)
    raise ValueError(f"the source tokens {list(source_tokens)} do not end with the generated {list(generated_tokens)}")


def top_prompt_token(scores: torch.Tensor, prompt: int) -> int:
    """The index of the highest score of the first generated token over the `prompt` first source tokens.

    `scores` is one prompt's (G, S) matrix (generated token x source token: the prompt's tokens, then generated ones).
    """
    if scores.ndim != 2 or not 0 < prompt <= scores.shape[1]:
        raise ValueError(f"scores must be (G, S) with S >= {prompt} (the prompt's tokens), got {tuple(scores.shape)}")
    return int(scores[0, :prompt].double().argmax())


def score_explanation(exp: Any, data: Retrieval) -> dict[str, float]:
    """Hit rates of one `hv.GenerationExplanation` of `data`'s prompts with their answers forced (see
    `RetrievalScore`). The evidence is found by its token: the first occurrence of the asked key among the source
    tokens is its place in the list (the second is the query after ``?``), and values are distinct."""
    if len(exp.scores) != len(data):
        raise ValueError(f"the explanation holds {len(exp.scores)} prompts, the data {len(data)}")
    hits = {"key": 0, "value": 0, "either": 0, "query": 0}
    chance = 0.0
    for i, (scores, sources) in enumerate(zip(exp.scores, exp.source_tokens, strict=True)):
        n_prompt = prompt_length(sources, exp.generated_tokens[i])
        prompt = [t.strip() for t in sources[:n_prompt]]
        words = data.prompts[i].split()
        asked, answer = words[int(data.key_positions[i])], VOCAB[int(data.answers[i])]
        key_at = [j for j, t in enumerate(prompt) if t == asked]
        if len(key_at) != 2 or answer not in prompt:
            raise ValueError(
                f"prompt {i}: the source tokens {prompt} do not hold the asked key {asked!r} twice and its value "
                f"{answer!r}: not a prompt of the retrieval task"
            )
        top = top_prompt_token(scores, n_prompt)
        value_at = prompt.index(answer)
        hits["key"] += top == key_at[0]
        hits["value"] += top == value_at
        hits["either"] += top in (key_at[0], value_at)
        hits["query"] += top == key_at[1]
        chance += 1 / len(prompt)
    n = max(len(data), 1)
    return {**{k: v / n for k, v in hits.items()}, "random": chance / n}


def evaluate_retrieval(
    methods: Sequence[str] = METHODS,
    *,
    n: int = 500,
    seed: int = EVAL_SEED,
    batch_size: int = 50,
    model: nn.Module | None = None,
    tokenizer: Any = None,
) -> list[RetrievalScore]:
    """For each method, how often ``hv.explain_generation`` puts the top score of the retrieval model's answer on the
    evidence, over `n` fresh prompts of seed `seed` (see `RetrievalScore`). `model` and `tokenizer` default to the
    zoo's trained `retrieval_lm()`."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"methods must be among {', '.join(METHODS)}, got {unknown}")
    if model is None or tokenizer is None:
        model, tokenizer = retrieval_lm()
    data = retrieval(n, seed=seed)
    rows = []
    for method in methods:
        start = time.perf_counter()
        try:
            exp = hv.explain_generation(
                model, tokenizer, data.prompts, method=method, target=data.answer_texts, batch_size=batch_size
            )
        except (ValueError, NotImplementedError) as exc:
            if method not in str(exc):  # only a method the API does not offer (refused before any work) is a row
                raise
            nan = float("nan")
            rows.append(RetrievalScore(method, len(data), nan, nan, nan, nan, nan, 0.0, f"{exc}".splitlines()[0]))
            continue
        rates = score_explanation(exp, data)
        rows.append(RetrievalScore(method, len(data), **rates, seconds=time.perf_counter() - start))
    return rows


def markdown(rows: Sequence[RetrievalScore], accuracy: float | None = None) -> str:
    """The rows as a markdown table (percentages), with the model's own accuracy on the prompts when given."""
    lines = []
    if rows:
        acc = "" if accuracy is None else f"; the model answers {100 * accuracy:.1f} % of them exactly"
        lines += [f"{rows[0].n} fresh prompts (seed {EVAL_SEED}){acc}.", ""]
    lines += [
        "| method | top token = key in the list | = its value | either | = the key after ? | random | s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.error is not None:
            lines.append(f"| {r.method} | - | - | - | - | - | - |")
            continue
        lines.append(
            f"| {r.method} | {100 * r.key:.1f} % | {100 * r.value:.1f} % | {100 * r.either:.1f} % | "
            f"{100 * r.query:.1f} % | {100 * r.random:.1f} % | {r.seconds:.1f} |"
        )
    notes = [f"- {r.method}: {r.error}" for r in rows if r.error is not None]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hookviz.zoo.retrieval_eval [--n 500] [--methods ...] [--out FILE.md]``."""
    p = argparse.ArgumentParser(prog="python -m hookviz.zoo.retrieval_eval", description=__doc__)
    p.add_argument("--n", type=int, default=500, help="fresh prompts (default: %(default)s)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--out", default=None, help="write the markdown table there (else print it)")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error(f"--n must be at least 1, got {args.n}")
    rows = evaluate_retrieval(args.methods, n=args.n, batch_size=args.batch_size)
    table = markdown(rows, retrieval_accuracy(retrieval_lm()[0], retrieval(args.n, seed=EVAL_SEED)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table, encoding="utf-8")
        print(f"wrote {Path(args.out).resolve()}")
    else:
        print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
