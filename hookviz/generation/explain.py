"""`explain_generation`: a causal language model's continuation of each prompt, explained token by token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._checks import bool_option, int_option
from .._device import to_device, to_host
from .._modes import training_restored
from ..inputs import model_device
from ..methods.scope import model_lock
from .attribute import attribute_steps, check_method
from .explanation import GenerationExplanation
from .generate import generate
from .model import LanguageModel, language_model
from .scores import SCORES, STEP_SCORES, Steps
from .scores import step_scores as scores_of_steps  # `step_scores` is an argument of explain_generation
from .tokens import (
    check_chat_template,
    check_tokenizer,
    encode,
    encode_prompt,
    eos_ids,
    pad_id,
    pad_left,
    special_ids,
    token_texts,
    tokenizer_size,
    word_starts,
)


def explain_generation(
    model: Any,
    tokenizer: Any,
    prompts: str | Sequence[str],
    *,
    method: str = "input-x-gradient",
    target: str | Sequence[str] | None = None,
    max_new_tokens: int = 32,
    generation_kwargs: dict[str, Any] | None = None,
    step_scores: Sequence[str] = ("probability",),
    contrast: str | Sequence[str] | None = None,
    chat_template: bool = False,
    skip_special_tokens: bool = True,
    batch_size: int = 8,
    score: str | None = None,
    method_kwargs: dict[str, Any] | None = None,
) -> GenerationExplanation:
    """Explain what a causal language model writes after each prompt: every generated token's scores over the
    prompt and the tokens generated before it (the task of inseq and captum's ``LLMAttribution``).

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``), or any `nn.Module` mapping token ids (N, T) to
            next-token logits (N, T, V) (a tensor or an output with ``.logits``); left exactly as it came.
        tokenizer: its tokenizer, with the Hugging Face interface (``encode`` / ``__call__``, ``decode``,
            ``convert_ids_to_tokens``, ``pad_token_id``, ``eos_token_id``, ``all_special_ids``).
        prompts: one prompt or a list.
        method: ``"saliency"`` (Simonyan et al., 2014; the L2 norm of each token's embedding gradient),
            ``"input-x-gradient"`` (Shrikumar et al., 2016), ``"integrated-gradients"`` (Sundararajan et al., 2017;
            from the embedding of the tokenizer's unknown token, else its pad token), ``"attn-lrp"`` (Achtibat et
            al., 2024), ``"cp-lrp"`` (Ali et al., 2022), all at the token embedding and summed over it (Saliency:
            its norm); ``"attention-rollout"`` (Abnar & Zuidema, 2020) and ``"gradient-rollout"`` (Chefer et al.,
            2021), each step's row of the rollout; or ``"occlusion"`` (Zeiler & Fergus, 2014: each source token
            replaced by that baseline token, forward passes only). `method_kwargs`: the method's options (``steps``
            and ``method`` of Integrated Gradients, ``baseline`` a token id, ``epsilon`` of LRP, ``backward``,
            Occlusion's ``batch_size``, ``head_fusion`` and ``discard_ratio`` of the attention rollout).
        target: None (the model's own continuation: greedy unless `generation_kwargs` say otherwise), or a string
            (one per prompt in a list) explained as the forced continuation (encoded without special tokens).
        max_new_tokens: the most tokens generated (with ``target=None``).
        generation_kwargs: passed to the model's ``generate`` (Hugging Face models only).
        step_scores: per generation step, any of ``"probability"`` and ``"log-probability"`` (of the generated
            token) and ``"entropy"`` (of the next-token distribution, in nats).
        contrast: a string (or one per prompt) of as many tokens as the continuation: step k explains
            score(target token k) - score(contrast token k) over the same prefix (Yin & Neubig, 2022).
        chat_template: apply the tokenizer's chat template to each prompt (one user turn plus the generation prompt).
        skip_special_tokens: leave special tokens (beginning / end of sequence, chat markers) out of the result.
        batch_size: prompts per forward pass (left-padded with an attention mask).
        score: what is explained of each step: ``"logit"`` (default; ``"probability"`` with a contrast),
            ``"probability"`` (inseq's default) or ``"log-probability"`` (captum's).

    Returns a `GenerationExplanation`: ``scores[i]`` (G_i, S_i), generated token x source token (the prompt's tokens,
    then the generated ones; entries at or after a generated token's own position are 0).

    Cost: per batch of prompts, one forward pass over prompt and continuation (one per path point for Integrated
    Gradients) and one backward pass per generated token over that one graph; the steps are taken in chunks that
    bound the memory of the (steps, tokens, embedding) attribution (`hookviz.generation.attribute.CHUNK_BYTES`).
    Occlusion: one forward pass per source token, scoring every generated token at once.

    Example::

        exp = hookviz.explain_generation(model, tokenizer, "The capital of France is", max_new_tokens=4)
        exp.scores[0]         # (4, prompt tokens + 4)
        exp.save("gen.html")
    """
    # -- every check before the model runs ---------------------------------------------------------------------
    prompt_list = _texts("prompts", prompts, None)
    n = len(prompt_list)
    targets = None if target is None else _texts("target", target, n)
    contrasts = None if contrast is None else _texts("contrast", contrast, n)
    int_option("max_new_tokens", max_new_tokens, "an int >= 1 (the most tokens generated)")
    int_option("batch_size", batch_size, "an int >= 1 (prompts per forward pass)")
    bool_option("chat_template", chat_template)
    bool_option("skip_special_tokens", skip_special_tokens)
    if generation_kwargs is not None and not isinstance(generation_kwargs, dict):
        raise TypeError(f"generation_kwargs must be None or a dict, got {type(generation_kwargs).__name__}")
    if generation_kwargs and target is not None:
        raise ValueError("generation_kwargs apply to generation; with a forced target nothing is generated")
    names = _step_score_names(step_scores)
    kind = _score_kind(score, contrast is not None)
    if method_kwargs is not None and not isinstance(method_kwargs, dict):
        raise TypeError(f"method_kwargs must be None or a dict of the method's options, got {type(method_kwargs)}")
    options = dict(method_kwargs or {})
    spec = check_method(method, options)
    check_tokenizer(tokenizer)
    if chat_template:
        check_chat_template(tokenizer)
    lm = language_model(model, tokenizer_size(tokenizer))
    rows = getattr(lm.embedding, "num_embeddings", None)
    specials = special_ids(tokenizer)
    pad, eos = pad_id(tokenizer), eos_ids(tokenizer)
    encoded = _nonempty(
        "prompts", prompt_list, [encode_prompt(tokenizer, p, chat_template=chat_template, where=f"prompts[{i}]")
                                 for i, p in enumerate(prompt_list)], "; give some text"
    )  # fmt: skip
    forced = None
    if targets is not None:
        ids = [encode(tokenizer, t, special=False, where=f"target[{i}]") for i, t in enumerate(targets)]
        forced = _nonempty("target", targets, ids, "; give the text to explain")
    contrast_ids = None
    if contrasts is not None:
        ids = [encode(tokenizer, c, special=False, where=f"contrast[{i}]") for i, c in enumerate(contrasts)]
        contrast_ids = _nonempty("contrast", contrasts, ids, "")
        for i, c in enumerate(contrast_ids):
            if forced is not None and len(c) != len(forced[i]):
                raise ValueError(_contrast_length(i, len(c), len(forced[i])))
    baseline = _baseline_id(tokenizer, pad)
    options_baseline = options.get("baseline", baseline)
    if isinstance(options_baseline, bool) or not isinstance(options_baseline, int) or options_baseline < 0:
        raise TypeError(f"method_kwargs['baseline'] must be a token id (an int >= 0), got {options_baseline!r}")
    _check_ids("method_kwargs['baseline']", 0, [options_baseline], rows)
    if spec.build is not None:  # the method's own checks of its options (and of the model: LRP's layer map) now
        spec.build(model, lm.embedding, options_baseline, 1, **{k: v for k, v in options.items() if k != "baseline"})
    elif options.get("batch_size") is not None:
        int_option("method_kwargs['batch_size']", options["batch_size"], "None or an int >= 1 (occluded copies)")
    for where, seqs in (("prompts", encoded), ("target", forced or []), ("contrast", contrast_ids or [])):
        for i, ids in enumerate(seqs):
            _check_ids(where, i, ids, rows)
    for i, ids in enumerate(encoded):
        new = len(forced[i]) if forced is not None else max_new_tokens
        if lm.max_positions is not None and len(ids) + new > lm.max_positions:
            raise ValueError(
                f"prompts[{i}] has {len(ids)} tokens and {new} more are {'forced' if forced else 'generated'}: "
                f"{len(ids) + new} > the model's {lm.max_positions} positions; shorten the prompt or "
                f"{'the target' if forced else 'lower max_new_tokens'}"
            )

    device = model_device(model)
    module = lm.module
    with model_lock(module), training_restored(module):
        module.eval()
        # -- the continuations ----------------------------------------------------------------------------------
        if forced is None:
            forced = []
            for start in range(0, n, batch_size):
                forced += generate(
                    lm,
                    encoded[start : start + batch_size],
                    max_new_tokens=max_new_tokens,
                    generation_kwargs=dict(generation_kwargs or {}),
                    pad=pad,
                    eos=eos,
                    device=device,
                )
            if contrast_ids is not None:
                for i, ids in enumerate(contrast_ids):
                    if len(ids) != len(forced[i]):
                        raise ValueError(_contrast_length(i, len(ids), len(forced[i])))
        # -- the attributions -----------------------------------------------------------------------------------
        raw: list[Tensor] = []
        per_step: list[dict[str, Tensor]] = []
        order: list[int] = []  # the prompt of each map, in the order of `raw`
        for batch in _batches(lm, encoded, forced, batch_size):
            seqs = [encoded[i] + forced[i] for i in batch]
            ids, mask = pad_left(seqs, pad, device)
            steps = _steps(
                ids.shape[1],
                [len(forced[i]) for i in batch],
                [forced[i] for i in batch],
                None if contrast_ids is None else [contrast_ids[i] for i in batch],
            )
            a, lg = attribute_steps(
                lm, spec, ids, mask, steps, kind=kind, baseline=options_baseline, method_kwargs=options
            )
            scores = scores_of_steps(lg, to_device(steps.token, lg.device), names)  # (n, K) each, on the device
            for r, i in enumerate(batch):
                total, g = len(seqs[r]), len(forced[i])
                raw.append(a[r, :g, ids.shape[1] - total :])  # (G, P + G): the sequence's own columns
                per_step.append({k: v[r, :g] for k, v in scores.items()})
                order.append(i)
    # every map and step score of the call on the host with one wait
    host = iter(to_host([*raw, *(s[k] for s in per_step for k in names)]))
    maps: list[Tensor] = [torch.empty(0)] * n
    for i in order:
        maps[i] = next(host)
    step_values: list[dict[str, Tensor]] = [{}] * n
    for i in order:
        step_values[i] = {k: next(host) for k in names}
    return _assemble(
        tokenizer,
        prompt_list,
        encoded,
        forced,
        contrast_ids,
        maps,
        step_values,
        names,
        specials if skip_special_tokens else set(),
        specials,
        method=method,
        kind=kind,
    )


def _texts(name: str, value: object, n: int | None) -> list[str]:
    if isinstance(value, str):
        texts = [value] if n is None else [value] * n
    elif isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        texts = list(value)
    else:
        what = "a string or a non-empty list of strings" + ("" if n is None else " (one per prompt)")
        raise TypeError(f"{name} must be {what}, got {value!r}"[:300])
    if n is not None and len(texts) != n:
        raise ValueError(f"{name} has {len(texts)} strings for {n} prompts; give one per prompt (or one string)")
    return texts


def _step_score_names(step_scores: object) -> tuple[str, ...]:
    if isinstance(step_scores, str) or not isinstance(step_scores, Sequence):
        raise TypeError(f"step_scores must be a tuple of names from {STEP_SCORES}, got {step_scores!r}")
    bad = [s for s in step_scores if s not in STEP_SCORES]
    if bad:
        raise ValueError(f"step_scores: unknown {bad}; choose from {', '.join(STEP_SCORES)}")
    return tuple(dict.fromkeys(step_scores))


def _nonempty(name: str, texts: Sequence[str], encoded: list[list[int]], hint: str) -> list[list[int]]:
    """`encoded` (the token ids of each of `texts`), `ValueError` naming the first text that tokenizes to nothing."""
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"{name}[{i}] ({texts[i]!r}) tokenizes to nothing{hint}")
    return encoded


def _score_kind(score: object, contrastive: bool) -> str:
    if score is None:
        return "probability" if contrastive else "logit"
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)} (what is explained of each step), got {score!r}")
    return score  # type: ignore[return-value]


def _contrast_length(i: int, got: int, want: int) -> str:
    return (
        f"contrast[{i}] has {got} tokens but the continuation it is contrasted with has {want}; a contrast gives one "
        "token per step (same positions), so it must tokenize to as many tokens"
    )


def _check_ids(where: str, i: int, ids: list[int], rows: int | None) -> None:
    if rows is not None and ids and max(ids) >= rows:
        raise ValueError(
            f"{where}[{i}] holds token id {max(ids)}, but the model's token embedding has {rows} rows: the tokenizer "
            "does not belong to this model"
        )


def _baseline_id(tokenizer: Any, pad: int) -> int:
    unk = getattr(tokenizer, "unk_token_id", None)
    return unk if isinstance(unk, int) else pad


def _batches(lm: LanguageModel, prompts: list[list[int]], forced: list[list[int]], size: int) -> list[list[int]]:
    """Indices of the sequences run together: `size` at a time, sorted by length so that padding stays small; only
    sequences of equal length together when ``forward`` takes no attention mask."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(forced[i]))
    if lm.takes_mask:
        return [order[s : s + size] for s in range(0, len(order), size)]
    batches: list[list[int]] = []
    for i in order:
        length = len(prompts[i]) + len(forced[i])
        last = batches[-1] if batches else None
        if last and len(last) < size and len(prompts[last[0]]) + len(forced[last[0]]) == length:
            last.append(i)
        else:
            batches.append([i])
    return batches


def _steps(length: int, counts: list[int], tokens: list[list[int]], contrast: list[list[int]] | None) -> Steps:
    """The steps of a left-padded batch of sequences of `length` columns ending with `counts` generated tokens."""
    k = max(counts)
    n = len(counts)
    pos = torch.zeros((n, k), dtype=torch.long)
    tok = torch.zeros((n, k), dtype=torch.long)
    con = None if contrast is None else torch.zeros((n, k), dtype=torch.long)
    valid = torch.zeros((n, k), dtype=torch.bool)
    for r, g in enumerate(counts):
        # generated token j sits at column length - g + j and is predicted one column before
        pos[r, :g] = torch.arange(length - g - 1, length - 1)
        tok[r, :g] = torch.tensor(tokens[r])
        if con is not None and contrast is not None:
            con[r, :g] = torch.tensor(contrast[r])
        valid[r, :g] = True
    return Steps(pos, tok, con, valid)


def _assemble(
    tokenizer: Any,
    prompts: list[str],
    encoded: list[list[int]],
    forced: list[list[int]],
    contrast_ids: list[list[int]] | None,
    raw: list[Tensor],
    per_step_scores: list[dict[str, Tensor]],
    names: tuple[str, ...],
    dropped: set[int],
    specials: set[int],
    *,
    method: str,
    kind: str,
) -> GenerationExplanation:
    """The explanation, with the dropped (special) tokens' rows and columns left out; `raw` and `per_step_scores` are
    each prompt's map and step scores, on the host."""
    scores, sources, generated, lengths, starts = [], [], [], [], []
    steps: dict[str, list[Tensor]] = {k: [] for k in names}
    contrast: list[list[str]] | None = None if contrast_ids is None else []
    for i in range(len(prompts)):
        seq = encoded[i] + forced[i]
        p, g = len(encoded[i]), len(forced[i])
        keep = torch.tensor([t not in dropped for t in seq], dtype=torch.bool)
        keep_rows = keep[p:]
        a = raw[i]
        # causality: generated token j sees columns < p + j only (exact zeros from the methods, kept exact here)
        future = torch.arange(p + g).unsqueeze(0) >= (p + torch.arange(g)).unsqueeze(1)
        a = a.masked_fill(future, 0.0)
        scores.append(a[keep_rows][:, keep])
        texts = token_texts(tokenizer, seq)
        flags = word_starts(tokenizer, seq, specials)
        sources.append([t for t, k in zip(texts, keep.tolist(), strict=True) if k])
        starts.append([f for f, k in zip(flags, keep.tolist(), strict=True) if k])
        generated.append([t for t, k in zip(texts[p:], keep_rows.tolist(), strict=True) if k])
        lengths.append(int(keep[:p].sum()))
        for k, v in per_step_scores[i].items():
            steps[k].append(v[keep_rows])
        if contrast is not None and contrast_ids is not None:
            ctexts = token_texts(tokenizer, encoded[i] + contrast_ids[i])[p:]  # read after the prompt, as the target
            contrast.append([t for t, k in zip(ctexts, keep_rows.tolist(), strict=True) if k])
    return GenerationExplanation(
        scores=scores,
        source_tokens=sources,
        generated_tokens=generated,
        prompt_lengths=lengths,
        step_scores=steps,
        method=method,
        score=kind,
        contrast_tokens=contrast,
        word_starts=starts,
        prompts=list(prompts),
    )
