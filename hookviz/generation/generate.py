"""The model's own continuation of each prompt: greedy decoding unless ``generation_kwargs`` say otherwise.

A model with a ``generate`` method (Hugging Face transformers) decodes through it, with the prompts left-padded in
batches and ``do_sample=False`` unless overridden; any other model decodes with `greedy`, a loop of full forward
passes (no key/value cache: each step recomputes the whole sequence, which is what makes it model-agnostic) that
takes the argmax of the last position's logits until ``max_new_tokens`` or an end-of-sequence token. A continuation
ends after its first end-of-sequence token (which it keeps); what ``generate`` pads finished sequences with is cut.
The model runs in eval mode under ``torch.no_grad()``; its ``training`` flags are restored on any exit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .model import LanguageModel
from .tokens import pad_left


def cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The continuation up to and including its first end-of-sequence token."""
    for j, t in enumerate(tokens):
        if t in eos:
            return tokens[: j + 1]
    return tokens


def generate(
    lm: LanguageModel,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    generation_kwargs: dict[str, Any],
    pad: int,
    eos: set[int],
    device: torch.device,
) -> list[list[int]]:
    """One continuation (token ids) per prompt; the model is in eval mode (the caller restores its flags)."""
    model = lm.module
    if callable(getattr(model, "generate", None)) and lm.takes_mask:
        ids, mask = pad_left(prompts, pad, device)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False, "pad_token_id": pad}
        if eos:
            kwargs["eos_token_id"] = sorted(eos)
        kwargs.update(generation_kwargs)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        new = sequences[:, ids.shape[1] :].tolist()
        return [cut_at_eos(row, eos) for row in new]
    if generation_kwargs:
        raise ValueError(
            f"generation_kwargs {sorted(generation_kwargs)} need a model with a Hugging Face generate() method; "
            f"{type(model).__name__} has none, so it decodes greedily (pass generation_kwargs=None)"
        )
    return greedy(lm, prompts, max_new_tokens=max_new_tokens, pad=pad, eos=eos, device=device)


def greedy(
    lm: LanguageModel,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    pad: int,
    eos: set[int],
    device: torch.device,
) -> list[list[int]]:
    """Greedy decoding by full forward passes: left-padded batches where ``forward`` takes an attention mask, one
    sequence at a time where it does not."""
    if not lm.takes_mask and len(prompts) > 1:
        return [greedy(lm, [p], max_new_tokens=max_new_tokens, pad=pad, eos=eos, device=device)[0] for p in prompts]
    seqs = [list(p) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids, mask = pad_left(seqs, pad, device)
            nxt = lm(ids, mask)[:, -1].argmax(-1).tolist()
            for i, t in enumerate(nxt):
                if done[i]:
                    continue
                new[i].append(t)
                seqs[i].append(t)
                done[i] = t in eos
            if all(done):
                break
    return new
