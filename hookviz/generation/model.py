"""What this package needs of a causal language model, read once and checked before it runs.

A model is any `nn.Module` that maps token ids (N, T) to next-token logits (N, T, V): a tensor, or an object with a
``logits`` attribute or key (a Hugging Face ``CausalLMOutput``). Its token embedding is
``model.get_input_embeddings()`` (every Hugging Face model), else its only `nn.Embedding` with as many rows as the
tokenizer has ids. Which keyword arguments its ``forward`` takes decides how a batch of prompts of different lengths
runs: with ``attention_mask`` (and ``position_ids`` where taken) left-padded sequences are batched; without, every
sequence runs alone (`LanguageModel.batches`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from .tokens import position_ids


def logits_of(output: Any) -> Tensor | None:
    """The logits in a model output: the tensor itself, its ``logits`` attribute or key, a tuple's first element."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        return output["logits"]
    if isinstance(getattr(output, "logits", None), Tensor):
        return output.logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


class NotLogitsError(ValueError):
    """The model's output holds no next-token logits (raised as itself, also from inside a method's target)."""


def next_token_logits(output: Any, n: int, t: int | None = None, vocab: int | None = None) -> Tensor:
    """The (N, T, V) next-token logits of a model output (T unchecked if None; V at least `vocab`, the tokenizer's
    ids, if given), or a ValueError saying what came."""
    logits = logits_of(output)
    ok = logits is not None and logits.dim() == 3 and logits.is_floating_point() and logits.shape[0] == n
    if ok and vocab is not None and logits.shape[-1] < vocab:
        raise NotLogitsError(
            f"the model's output has no next-token logits over the tokenizer's {vocab} ids: its last dimension is "
            f"{logits.shape[-1]} (shape {tuple(logits.shape)}); hidden states are not logits, explain_generation "
            "needs a causal language model with its output layer (AutoModelForCausalLM, not AutoModel)"
        )
    if not ok or (t is not None and logits.shape[1] != t):
        got = f"a tensor of shape {tuple(logits.shape)}" if logits is not None else type(output).__name__
        raise NotLogitsError(
            f"the model's output has no next-token logits: expected (N, T, V) = ({n}, {t or 'T'}, vocabulary) float "
            "logits "
            f"(a tensor, or an output with a logits attribute such as a Hugging Face CausalLMOutput), got {got}; "
            "explain_generation needs a causal language model (AutoModelForCausalLM, not AutoModel)"
        )
    return logits


@dataclass
class LanguageModel:
    """A causal language model with what is known of it before it runs."""

    module: nn.Module
    embedding: nn.Module
    takes_mask: bool
    takes_positions: bool
    takes_cache_flag: bool
    max_positions: int | None
    takes_logits_to_keep: bool = False
    vocab_size: int | None = None  # the tokenizer's ids: the logits must cover them

    def forward_kwargs(self, mask: Tensor, keep: int | None = None) -> dict[str, Any]:
        """Keyword arguments of ``forward`` for a left-padded batch with this attention mask; `keep`: only the last
        `keep` positions' logits are needed (passed on where ``forward`` takes ``logits_to_keep``)."""
        kwargs: dict[str, Any] = {}
        if self.takes_mask:
            kwargs["attention_mask"] = mask
        if self.takes_positions:
            kwargs["position_ids"] = position_ids(mask)
        if self.takes_cache_flag:
            kwargs["use_cache"] = False  # no key/value cache built (memory) nor kept
        if keep is not None and self.takes_logits_to_keep:
            # the output layer runs on the last `keep` positions only: the steps' logits are all there, and the
            # (T, V) product of a large vocabulary is no longer paid at every position, forward and backward
            kwargs["logits_to_keep"] = keep
        return kwargs

    def offset(self, length: int, keep: int | None) -> int:
        """The position of the first logits row `forward_kwargs(mask, keep)` gives, in a batch of `length` columns."""
        return length - keep if keep is not None and self.takes_logits_to_keep else 0

    def __call__(self, ids: Tensor, mask: Tensor, keep: int | None = None) -> Tensor:
        """(N, T, V) logits of a left-padded batch ((N, keep, V), the last positions', where `keep` is honoured)."""
        length = ids.shape[1] - self.offset(ids.shape[1], keep)
        output = self.module(ids, **self.forward_kwargs(mask, keep))
        return next_token_logits(output, ids.shape[0], length, self.vocab_size)


def _forward_params(model: nn.Module) -> tuple[set[str], bool]:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return set(), False
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return set(params), var_kw


def language_model(model: Any, vocab_size: int | None) -> LanguageModel:
    """`model` read and checked: a module, its token embedding (matching the tokenizer), what ``forward`` takes."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module mapping token ids (N, T) to logits (N, T, V), got {type(model).__name__}"
        )
    embedding = _embedding(model, vocab_size)
    rows = getattr(embedding, "num_embeddings", None)
    if vocab_size is not None and isinstance(rows, int) and vocab_size > rows:
        raise ValueError(
            f"the tokenizer has {vocab_size} token ids but the model's token embedding has {rows} rows: the tokenizer "
            "does not belong to this model (load both from the same checkpoint, or resize the embeddings with "
            "model.resize_token_embeddings(len(tokenizer)))"
        )
    head = getattr(model, "get_output_embeddings", None)
    if callable(head) and hasattr(model, "config") and head() is None:
        raise ValueError(
            f"{type(model).__name__} has no language-model head (get_output_embeddings() is None), so its output has "
            "no next-token logits; load it with AutoModelForCausalLM, not AutoModel"
        )
    names, _ = _forward_params(model)
    config = getattr(model, "config", None)
    limit = None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            limit = value
            break
    return LanguageModel(
        module=model,
        embedding=embedding,
        takes_mask="attention_mask" in names,
        takes_positions="position_ids" in names,
        takes_cache_flag="use_cache" in names,
        max_positions=limit,
        takes_logits_to_keep="logits_to_keep" in names,
        vocab_size=vocab_size,
    )


def _embedding(model: nn.Module, vocab_size: int | None) -> nn.Module:
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        try:
            found = getter()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module):
            return found
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if vocab_size is not None:
        fitting = [m for m in embeddings if m.num_embeddings >= vocab_size]
        embeddings = fitting or embeddings
    if len(embeddings) == 1:
        return embeddings[0]
    raise ValueError(
        f"cannot tell the token embedding of {type(model).__name__}: it has no get_input_embeddings() and "
        f"{len(embeddings)} nn.Embedding modules{' fit the tokenizer' if vocab_size is not None else ''}; give the "
        "model a get_input_embeddings() method returning the token embedding module"
    )
