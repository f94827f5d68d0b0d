"""The quantities of each generation step: the score that is explained, and the step scores reported beside it.

Generated token k of sequence n is predicted by the logits at position ``pos[n, k]`` (the position just before the
token's own). The explained score of that step is (`SCORES`):

- ``"logit"``: the token's logit (hookviz's class-score convention; the relevance methods start from it);
- ``"probability"``: its softmax probability (inseq's default ``attributed_fn``);
- ``"log-probability"``: its log-softmax (captum's ``LLMAttribution`` / ``LLMGradientAttribution``).

With a contrast token c at the same step, the explained score is score(token) - score(c) over the same prefix
(contrastive explanations, Yin & Neubig, 2022, "Interpreting Language Models with Contrastive Explanations",
EMNLP; inseq's ``contrast_prob_diff`` with the probability). Step scores (`STEP_SCORES`) describe the next-token
distribution at each step: the generated token's probability and log-probability, and the distribution's entropy
in nats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._device import to_device
from .model import next_token_logits

SCORES = ("logit", "probability", "log-probability")
STEP_SCORES = ("probability", "log-probability", "entropy")


@dataclass
class Steps:
    """The generation steps of a left-padded batch, (N, K) each (K the most steps of a sequence in the batch)."""

    pos: Tensor  # long: the position whose logits predict the step's token
    token: Tensor  # long: the token explained
    contrast: Tensor | None  # long: the contrast token, or None
    valid: Tensor  # bool: whether sequence n has a step k

    def columns(self, start: int, stop: int) -> Steps:
        c = None if self.contrast is None else self.contrast[:, start:stop]
        return Steps(self.pos[:, start:stop], self.token[:, start:stop], c, self.valid[:, start:stop])

    def shifted(self, offset: int) -> Steps:
        """The same steps read from logits that start at position `offset` (the model kept the last ones only)."""
        # the padding columns of shorter continuations (not valid, scored 0) are read at the first kept position
        return Steps((self.pos - offset).clamp(min=0), self.token, self.contrast, self.valid)


def token_score(logits: Tensor, token: Tensor, kind: str) -> Tensor:
    """The `kind` score of `token` (...,) under `logits` (..., V)."""
    if kind == "logit":
        return logits.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
    return logp if kind == "log-probability" else logp.exp()


def step_logits(logits: Tensor, steps: Steps, rows: Tensor) -> Tensor:
    """(n, K, V) logits at the steps' positions for the output rows `rows` (indices into the N sequences)."""
    pos = to_device(steps.pos[rows], logits.device)
    return logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))


def explained_score(
    steps: Steps, kind: str, stash: dict[str, Tensor] | None = None, vocab: int | None = None
) -> Callable[[Any, Tensor], Tensor]:
    """``fn(output, rows) -> (n, K)``: the explained score of every step of the rows' sequences (0, still connected
    to the graph, where a sequence has fewer steps); the first call's step logits go to ``stash["logits"]``; `vocab`:
    the tokenizer's ids, which the logits must cover."""

    def fn(output: Any, rows: Tensor) -> Tensor:
        logits = next_token_logits(output, rows.shape[0], vocab=vocab)
        at = step_logits(logits, steps, rows)
        if stash is not None and "logits" not in stash:
            stash["logits"] = at.detach()
        tok = to_device(steps.token[rows], at.device)
        score = token_score(at, tok, kind)
        if steps.contrast is not None:
            score = score - token_score(at, to_device(steps.contrast[rows], at.device), kind)
        return score * to_device(steps.valid[rows], score.device).to(score.dtype)

    fn.__name__ = f"{kind} of each generated token"
    return fn


def step_scores(logits: Tensor, token: Tensor, names: tuple[str, ...]) -> dict[str, Tensor]:
    """The step scores `names` from the step logits (K, V) and the generated tokens (K,): (K,) float each."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    out: dict[str, Tensor] = {}
    for name in names:
        if name == "entropy":
            out[name] = -(logp.exp() * logp).sum(-1)
        else:
            lp = logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)
            out[name] = lp if name == "log-probability" else lp.exp()
    return {k: v.to(logits.dtype if logits.dtype == torch.float64 else torch.float32) for k, v in out.items()}
