"""Text -> token ids for a causal language model, through a tokenizer with the Hugging Face interface.

Prompts are encoded with the tokenizer's own special tokens (a LLaMA tokenizer's beginning-of-sequence token), or
through its chat template (``chat_template=True``: one user turn, then the assistant's generation prompt); forced
targets and contrasts are encoded without special tokens, as the continuation of the prompt. `pad_left` lays
sequences of different lengths out in one batch, padded on the left so that every sequence ends at the same column
and its next token is predicted at the last one; `position_ids` numbers each sequence's real tokens from 0, as if it
were alone (what Hugging Face's ``generate`` does for left-padded prompts).

`token_texts` and `word_starts` read the tokenizer once per explanation, so the result object needs no tokenizer:
a token's text is what it adds to the decoded text (``" cat"`` for GPT-2's ``"Ġcat"``), and a token starts a word
when that text starts with whitespace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .._device import to_device


def tokenizer_size(tokenizer: Any) -> int | None:
    """How many token ids the tokenizer can produce (``len(tokenizer)``, added tokens included), if it says."""
    try:
        return int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return int(size) if isinstance(size, int) else None


def check_tokenizer(tokenizer: Any) -> None:
    """The Hugging Face interface this package uses: encoding, ``decode`` and ``convert_ids_to_tokens``."""
    missing = [name for name in ("decode", "convert_ids_to_tokens") if not callable(getattr(tokenizer, name, None))]
    if not (callable(getattr(tokenizer, "encode", None)) or callable(tokenizer)):
        missing.insert(0, "encode or __call__")
    if missing:
        raise TypeError(
            f"tokenizer must have the Hugging Face tokenizer interface (encode / __call__, decode, "
            f"convert_ids_to_tokens, pad_token_id, eos_token_id, all_special_ids); {type(tokenizer).__name__} lacks "
            f"{', '.join(missing)}"
        )


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of the tokenizer's special tokens (beginning / end of sequence, padding, chat markers)."""
    ids = getattr(tokenizer, "all_special_ids", None) or []
    return {int(i) for i in ids}


def _as_ids(encoded: Any, where: str) -> list[int]:
    if isinstance(encoded, Mapping) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded.input_ids
    if isinstance(encoded, Tensor):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):  # a batch of one
        if len(encoded) != 1:
            raise ValueError(f"{where}: the tokenizer returned {len(encoded)} sequences for one text")
        encoded = encoded[0]
    return [int(i) for i in encoded]


def encode(tokenizer: Any, text: str, *, special: bool, where: str) -> list[int]:
    """`text` as token ids; `special`: with the tokenizer's special tokens (a prompt) or without (a continuation)."""
    if callable(getattr(tokenizer, "encode", None)):
        return _as_ids(tokenizer.encode(text, add_special_tokens=special), where)
    return _as_ids(tokenizer(text, add_special_tokens=special), where)


def encode_prompt(tokenizer: Any, prompt: str, *, chat_template: bool, where: str) -> list[int]:
    """A prompt's ids: encoded with special tokens, or as one user turn of the chat template plus the assistant's
    generation prompt (the template adds its own special tokens, so none are added again)."""
    if not chat_template:
        return encode(tokenizer, prompt, special=True, where=where)
    messages = [{"role": "user", "content": prompt}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return _as_ids(out, where)


def check_chat_template(tokenizer: Any) -> None:
    """``chat_template=True`` needs a tokenizer that has a template to apply."""
    if not callable(getattr(tokenizer, "apply_chat_template", None)) or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"chat_template=True, but the tokenizer ({type(tokenizer).__name__}) has no chat template "
            "(tokenizer.chat_template is empty); set one (tokenizer.chat_template = '...') or pass chat_template=False "
            "and write the prompt in the model's format yourself"
        )


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask), both (N, L) long, L the longest sequence: shorter ones padded on the left."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, length - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, length - len(s) :] = 1
    return to_device(ids, device), to_device(mask, device)


def position_ids(mask: Tensor) -> Tensor:
    """(N, L) positions counting each sequence's real tokens from 0 (pads get 0): the positions it has alone."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def pad_id(tokenizer: Any) -> int:
    """The id used to pad (the tokenizer's pad token, else its end-of-sequence token, else 0): pads are masked out
    of attention and of the scores, so which id fills them changes nothing."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def eos_ids(tokenizer: Any) -> set[int]:
    """End-of-sequence ids: generation stops after one."""
    value = getattr(tokenizer, "eos_token_id", None)
    if isinstance(value, int):
        return {value}
    if isinstance(value, list | tuple):
        return {int(v) for v in value}
    return set()


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text as it reads in the sequence: what the token adds to the decoded text of the token before it
    (``" cat"`` for GPT-2's ``"Ġcat"``, ``" w2"`` for a word-level tokenizer that joins words with spaces, ``"able"``
    for WordPiece's ``"##able"``); the first token decoded alone; a token with no text its piece's name."""
    ids = [int(i) for i in ids]
    pieces = tokenizer.convert_ids_to_tokens(ids)

    def decode(seq: list[int]) -> str:
        return tokenizer.decode(seq, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    alone = [decode([i]) for i in ids]
    texts = []
    for j, i in enumerate(ids):
        text = alone[j]
        if j > 0:
            pair = decode([ids[j - 1], i])
            if pair.startswith(alone[j - 1]) and len(pair) > len(alone[j - 1]):
                text = pair[len(alone[j - 1]) :]
        texts.append(text if text != "" else str(pieces[j]))
    return texts


def word_starts(tokenizer: Any, ids: Sequence[int], specials: set[int]) -> list[bool]:
    """Whether each token starts a new word: the first, a special token and the token after one, and a token whose
    text in the sequence (`token_texts`) starts with whitespace (or whose piece starts with ``Ġ`` / ``▁``); a
    WordPiece continuation (``##``) never does."""
    ids = [int(i) for i in ids]
    texts = token_texts(tokenizer, ids)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    starts = []
    for j, i in enumerate(ids):
        piece = str(pieces[j])
        if j == 0 or i in specials or ids[j - 1] in specials:
            starts.append(True)
        elif piece.startswith("##"):
            starts.append(False)
        else:
            starts.append(texts[j][:1].isspace() or piece[:1] in ("Ġ", "▁"))
    return starts
