"""The zoo language model's tokenizer: `RetrievalTokenizer`, one token per space-separated word, with the part of
the Hugging Face tokenizer interface that code explaining a language model uses (no transformers needed)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .retrieval import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIAL_TOKENS, VOCAB


class Encoding(dict):
    """What `RetrievalTokenizer.__call__` returns, as Hugging Face's ``BatchEncoding``: a dict of ``input_ids`` and
    ``attention_mask`` whose entries are also attributes, with ``.to(device)`` and ``.word_ids(i)``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: torch.device | str) -> Encoding:
        """The tensors moved to `device` (a new Encoding)."""
        return Encoding({k: v.to(device) if isinstance(v, Tensor) else v for k, v in self.items()})

    def word_ids(self, index: int = 0) -> list[int | None]:
        """The word of each token of row `index` (each word is one token), None for special tokens and padding."""
        ids = self["input_ids"][index]
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        words: list[int | None] = []
        count = 0
        for i in ids:
            if i in (PAD_ID, BOS_ID, EOS_ID):
                words.append(None)
            else:
                words.append(count)
                count += 1
        return words


class RetrievalTokenizer:
    """A word-level tokenizer over `hookviz.zoo.retrieval.VOCAB` with the Hugging Face interface.

    Text is tokens separated by whitespace (``"k3 v7 ? k3"``); ``add_special_tokens=True`` puts ``<bos>`` first
    (as Llama's tokenizers do; no <eos> is added). Batches are padded with ``<pad>`` on `padding_side` (``"right"``
    by default, ``"left"`` for generation). There is no chat template (``chat_template = None``). A word outside the
    vocabulary is an error (there is no unknown token: every prompt of the task is in the vocabulary).
    """

    chat_template = None
    model_input_names = ("input_ids", "attention_mask")

    def __init__(self, padding_side: str = "right") -> None:
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(VOCAB)}
        self._padding_side = "right"
        self.padding_side = padding_side
        self.model_max_length = 32

    @property
    def padding_side(self) -> str:
        return self._padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        self._padding_side = side

    pad_token, bos_token, eos_token = PAD, BOS, EOS
    pad_token_id, bos_token_id, eos_token_id = PAD_ID, BOS_ID, EOS_ID
    unk_token = unk_token_id = None
    all_special_tokens = list(SPECIAL_TOKENS)
    all_special_ids = [PAD_ID, BOS_ID, EOS_ID]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        """The words of `text` (split on whitespace), each checked against the vocabulary."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        words = text.split()
        unknown = [w for w in words if w not in self.vocab]
        if unknown:
            raise ValueError(
                f"text holds words outside the retrieval vocabulary: {unknown[:5]}; expected tokens separated by "
                f"spaces among {', '.join(VOCAB[:4])}, k0..k15, v0..v15"
            )
        return words

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.convert_tokens_to_ids([tokens])[0]
        unknown = [t for t in tokens if t not in self.vocab]
        if unknown:
            raise ValueError(f"tokens outside the retrieval vocabulary: {unknown[:5]}")
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(
        self, ids: int | Iterable[int] | Tensor, skip_special_tokens: bool = False
    ) -> str | list[str]:
        if isinstance(ids, Tensor) and ids.ndim == 0:
            ids = int(ids)
        if isinstance(ids, int):
            return VOCAB[self._check_id(ids)]
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return [VOCAB[self._check_id(i)] for i in ids if not (skip_special_tokens and i in self.all_special_ids)]

    def _check_id(self, i: int) -> int:
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"token id {i} is outside the vocabulary of {len(VOCAB)} tokens")
        return i

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        """The token ids of `text`: ``<bos>`` first when `add_special_tokens`."""
        ids = [self.vocab[w] for w in self.tokenize(text)]
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, ids: int | Iterable[int] | Tensor, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        """The text of `ids`: the tokens joined by single spaces, special tokens left out when asked."""
        tokens = self.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
        return tokens if isinstance(tokens, str) else " ".join(tokens)

    def batch_decode(self, sequences: Iterable[Iterable[int]] | Tensor, **kwargs: Any) -> list[str]:
        return [self.decode(s, **kwargs) for s in sequences]

    def __call__(
        self,
        text: str | Sequence[str],
        padding: bool | str = False,
        return_tensors: str | None = None,
        add_special_tokens: bool = True,
        truncation: bool = False,
        **kwargs: Any,
    ) -> Encoding:
        """``input_ids`` and ``attention_mask`` of one text or a batch of texts.

        `padding`: False (rows must then be of one length for tensors), True or ``"longest"`` (padded on
        `padding_side` to the longest row). `return_tensors`: ``"pt"`` for (N, T) int64 tensors (a single text gives
        N = 1), None for lists. Truncation is not supported (a prompt of the task fits the model).
        """
        if truncation:
            raise ValueError("truncation is not supported by RetrievalTokenizer (every prompt of the task fits)")
        if padding not in (False, True, "longest", "do_not_pad"):
            raise ValueError(f"padding must be False, True or 'longest', got {padding!r}")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        single = isinstance(text, str)
        if not single and not (isinstance(text, Sequence) and all(isinstance(t, str) for t in text)):
            raise TypeError(f"text must be a str or a sequence of str, got {type(text).__name__}")
        rows = [self.encode(t, add_special_tokens=add_special_tokens) for t in ([text] if single else text)]
        masks = [[1] * len(r) for r in rows]
        if padding in (True, "longest") and rows:
            width = max(map(len, rows))
            for r, m in zip(rows, masks, strict=True):
                fill = width - len(r)
                if self.padding_side == "left":
                    r[:0], m[:0] = [PAD_ID] * fill, [0] * fill
                else:
                    r += [PAD_ID] * fill
                    m += [0] * fill
        if return_tensors is None:
            return Encoding(input_ids=rows[0] if single else rows, attention_mask=masks[0] if single else masks)
        if len({len(r) for r in rows}) > 1:
            raise ValueError("texts of different lengths need padding=True to be returned as one tensor")
        return Encoding(
            input_ids=torch.tensor(rows, dtype=torch.long).reshape(len(rows), -1),
            attention_mask=torch.tensor(masks, dtype=torch.long).reshape(len(rows), -1),
        )
