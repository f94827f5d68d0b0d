"""`explain_generation_latents`: a generation scored against SAE latents instead of prompt tokens (issue 37, part 5).

Each generated token's score (its logit, probability or log-probability at the position that predicts it, as
`explain_generation` explains it) is attributed to every latent, at every position, of SAEs spliced at chosen layers,
and to their error nodes (`hookviz.features.latent_attribution`: gradient x activation, or integrated gradients from
zero latents; Marks et al. 2024, "Sparse Feature Circuits"). The G steps run as G rows of one batch, row k scoring
step k, so gradient x activation costs one forward and one backward pass for the whole continuation.

Why a function of its own rather than an option of `explain_generation`: its result is (step, position, latent), not
the (step, source token) map that `GenerationExplanation`, its views and the generation report are built on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._checks import int_option
from .._modes import training_restored
from ..features import SAE, latent_attribution
from ..inputs import model_device
from ..methods.scope import model_lock
from .generate import generate
from .model import language_model, logits_of, next_token_logits
from .scores import SCORES, token_score
from .tokens import (
    check_tokenizer,
    encode,
    encode_prompt,
    eos_ids,
    pad_id,
    token_texts,
    tokenizer_size,
)

__all__ = ["GenerationLatents", "explain_generation_latents"]

LATENT_METHODS = ("gradient", "integrated_gradients")


@dataclass
class GenerationLatents:
    """A generation explained by latents: ``latents[layer]`` (G, T, d_sae) and ``errors[layer]`` (G, T), step k's
    score attributed to each latent (error node) of `layer` at each of the T = prompt + G positions (exactly 0 at
    and after step k's own token: it cannot see them); `scores` (G,) the explained scores."""

    prompt: str
    tokens: list[str]
    prompt_length: int
    generated_tokens: list[str]
    latents: dict[str, Tensor]
    errors: dict[str, Tensor]
    scores: Tensor
    method: str
    score: str

    def top(self, step: int, layer: str, n: int = 5) -> list[tuple[int, str, int, float]]:
        """The `n` largest latent effects on step `step`: (position, its token, latent, effect)."""
        effects = self.latents[layer][step]
        flat = effects.flatten()
        idx = flat.topk(min(n, flat.numel())).indices
        d = effects.shape[-1]
        return [(int(i // d), self.tokens[int(i // d)], int(i % d), float(flat[i])) for i in idx]


def explain_generation_latents(
    model: Any,
    tokenizer: Any,
    prompt: str,
    saes: Mapping[str, SAE],
    *,
    target: str | None = None,
    max_new_tokens: int = 8,
    method: str = "gradient",
    score: str = "logit",
    steps: int = 16,
) -> GenerationLatents:
    """Attribute each generated token of `prompt`'s continuation to the latents of `saes` (module docstring).

    Args:
        model, tokenizer: a causal language model and its tokenizer, as `explain_generation` takes them.
        prompt: one prompt.
        saes: ``{layer name: SAE}`` spliced with their error terms (the model computes what it computed before).
        target: the continuation to explain (forced), or None: the model's greedy continuation.
        max_new_tokens: the most tokens generated (with ``target=None``).
        method: ``"gradient"`` (gradient x activation) or ``"integrated_gradients"`` (from zero latents and error,
            `steps` points).
        score: ``"logit"``, ``"probability"`` or ``"log-probability"`` of each generated token.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be one string, got {type(prompt).__name__}")
    if target is not None and not isinstance(target, str):
        raise TypeError(f"target must be None or a string, got {type(target).__name__}")
    if method not in LATENT_METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, LATENT_METHODS))}, got {method!r}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    int_option("max_new_tokens", max_new_tokens, "an int >= 1 (the most tokens generated)")
    check_tokenizer(tokenizer)
    lm = language_model(model, tokenizer_size(tokenizer))
    ids = encode_prompt(tokenizer, prompt, chat_template=False, where="prompt")
    if not ids:
        raise ValueError(f"prompt ({prompt!r}) tokenizes to nothing")
    device = model_device(model)
    module = lm.module
    with model_lock(module), training_restored(module):
        module.eval()
        if target is None:
            kw = {"max_new_tokens": max_new_tokens, "generation_kwargs": {}, "pad": pad_id(tokenizer)}
            forced = generate(lm, [ids], eos=eos_ids(tokenizer), device=device, **kw)[0]
        else:
            forced = encode(tokenizer, target, special=False, where="target")
        if not forced:
            raise ValueError("the continuation is empty: nothing to explain")
    seq = ids + forced
    p, g = len(ids), len(forced)
    full = torch.tensor([seq], dtype=torch.long, device=device).expand(g, -1)
    mask = torch.ones_like(full)
    inputs = {"input_ids": full, **lm.forward_kwargs(mask)}
    rows = torch.arange(g, device=device)
    wanted = torch.tensor(forced, dtype=torch.long, device=device)

    def metric(output: Any) -> Tensor:
        # row k scores step k: its token at the position that predicts it; integrated gradients runs `steps` copies
        # of the G rows one after the other, so row r is step r % G
        found = logits_of(output)
        n = found.shape[0] if found is not None else g
        logits = next_token_logits(output, n, vocab=lm.vocab_size)
        k = torch.arange(n, device=logits.device) % g
        return token_score(logits[torch.arange(n, device=logits.device), p - 1 + k], wanted[k], score)

    res = latent_attribution(module, inputs, saes, metric, method=method, steps=steps)
    # step k's token stands at p + k: it and the later positions cannot move its score (exact zeros, as in
    # explain_generation)
    future = torch.arange(p + g, device=device)[None, :] >= (p + rows)[:, None]  # (G, T)
    latents, errors = {}, {}
    for layer in saes:
        lat, err = res.latents[layer], res.errors[layer]
        if lat.dim() != 3 or lat.shape[1] != p + g:
            raise ValueError(f"{layer!r} is not a token layer (N, T, D): its latents have shape {tuple(lat.shape)}")
        latents[layer] = lat.masked_fill(future[..., None], 0.0).cpu()
        errors[layer] = err.masked_fill(future, 0.0).cpu()
    texts = token_texts(tokenizer, seq)
    return GenerationLatents(
        prompt=prompt,
        tokens=texts,
        prompt_length=p,
        generated_tokens=texts[p:],
        latents=latents,
        errors=errors,
        scores=res.metric.cpu(),
        method=method,
        score=score,
    )
