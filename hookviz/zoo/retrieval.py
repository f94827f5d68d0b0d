"""The synthetic key-value retrieval task of the zoo's language model: `retrieval(n, seed=...)` draws prompts with
known answers on the fly (no downloads).

A prompt lists K distinct keys, each followed by its value, then asks for one of the keys; the answer is that key's
value, then the end of the sequence: ``k3 v7 k1 v2 k9 v4 ? k1`` -> ``v2 <eos>``. The position of the queried
key's occurrence in the list and of its value are known, so an attribution method can be scored on whether it finds
them (`hookviz.zoo.retrieval_eval`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import int_option, is_int

N_KEYS = 16
N_VALUES = 16
MIN_PAIRS, MAX_PAIRS = 2, 6
PAD, BOS, EOS, QUERY = "<pad>", "<bos>", "<eos>", "?"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS)
KEYS: tuple[str, ...] = tuple(f"k{i}" for i in range(N_KEYS))
VALUES: tuple[str, ...] = tuple(f"v{i}" for i in range(N_VALUES))
# ids: <pad> 0, <bos> 1, <eos> 2, ? 3, k0..k15 4..19, v0..v15 20..35
VOCAB: tuple[str, ...] = (*SPECIAL_TOKENS, QUERY, *KEYS, *VALUES)
PAD_ID, BOS_ID, EOS_ID, QUERY_ID = range(4)
KEY_BASE, VALUE_BASE = 4, 4 + N_KEYS
# <bos>, K pairs, "? key", the value and <eos>: the longest full sequence
MAX_SEQUENCE = 1 + 2 * MAX_PAIRS + 2 + 2
_CHUNK = 1024


@dataclass(frozen=True)
class Retrieval:
    """A batch of the retrieval task (see `retrieval`).

    Attributes:
        ids: (N, MAX_SEQUENCE) int64, each full sequence ``<bos> k v ... ? k v <eos>`` right-padded with <pad>.
        lengths: (N,) int64, the number of real tokens of each row of `ids` (2 * pairs + 5).
        pairs: (N,) int64, the number of key-value pairs K (2 to 6).
        key_positions: (N,) int64, where the queried key stands in the list, counted in prompt words (the prompt
            text split on spaces, no <bos>): ``2 * i`` for the i-th pair; its value is at ``key_positions + 1``.
        query_positions: (N,) int64, where the queried key stands after ``?`` (``2 * pairs + 1``: the prompt's last
            word).
        answers: (N,) int64, the token id of the answer (the queried key's value).
    """

    ids: Tensor
    lengths: Tensor
    pairs: Tensor
    key_positions: Tensor
    query_positions: Tensor
    answers: Tensor

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def value_positions(self) -> Tensor:
        """(N,) int64: where the answer stands in the list, in prompt words."""
        return self.key_positions + 1

    @property
    def prompts(self) -> list[str]:
        """The prompts as text, words separated by one space, without <bos>: ``"k3 v7 k1 v2 ? k1"``."""
        return [
            " ".join(VOCAB[i] for i in row[1 : 2 * k + 3].tolist())
            for row, k in zip(self.ids, self.pairs.tolist(), strict=True)
        ]

    @property
    def answer_texts(self) -> list[str]:
        """The answers as text (``"v2"``), without <eos>."""
        return [VOCAB[i] for i in self.answers.tolist()]

    def __getitem__(self, index: int | slice | Sequence[int] | Tensor) -> Retrieval:
        """The items at `index` as a `Retrieval`; an int gives one of length 1 (the batch axis is kept)."""
        if is_int(index):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"index {index} is out of range for Retrieval of length {n}")
            index = slice(index, index + 1 if index != -1 else None)
        fields = (self.ids, self.lengths, self.pairs, self.key_positions, self.query_positions, self.answers)
        return Retrieval(*(f[index] for f in fields))


def retrieval(n: int, *, seed: int) -> Retrieval:
    """`n` prompts of the key-value retrieval task with their answers and the positions of the evidence.

    Each item draws K uniformly from 2 to 6, K distinct keys of `KEYS` and K distinct values of `VALUES` in random
    order, and one of the K keys to ask for. Deterministic: item i depends on (`seed`, i) only (a prefix of a longer
    set is the shorter set), and different seeds give different items.
    """
    int_option("n", n, "a non-negative int", minimum=0)
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    parts = [_draw_chunk(seed, c, min(_CHUNK, n - c * _CHUNK)) for c in range(-(-n // _CHUNK))]
    if not parts:
        empty = torch.zeros(0, dtype=torch.long)
        return Retrieval(torch.zeros(0, MAX_SEQUENCE, dtype=torch.long), empty, empty, empty, empty, empty)
    return Retrieval(*(torch.cat(f) for f in zip(*parts, strict=True)))


def _draw_chunk(seed: int, chunk: int, m: int) -> tuple[Tensor, ...]:
    digest = hashlib.sha256(f"hookviz.retrieval:{seed}:{chunk}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    # every random number of the full chunk is drawn, so an item does not depend on how many are drawn after it
    pairs = torch.randint(MIN_PAIRS, MAX_PAIRS + 1, (_CHUNK,), generator=g)[:m]
    keys = torch.rand(_CHUNK, N_KEYS, generator=g).argsort(1)[:m, :MAX_PAIRS] + KEY_BASE
    values = torch.rand(_CHUNK, N_VALUES, generator=g).argsort(1)[:m, :MAX_PAIRS] + VALUE_BASE
    asked = (torch.rand(_CHUNK, generator=g)[:m] * pairs).long()  # uniform over the K pairs
    rows = torch.arange(m)
    ids = torch.full((m, MAX_SEQUENCE), PAD_ID, dtype=torch.long)
    ids[:, 0] = BOS_ID
    listed = torch.stack([keys, values], dim=2).flatten(1)  # (m, 2 * MAX_PAIRS): k v k v ...
    inside = torch.arange(2 * MAX_PAIRS) < 2 * pairs[:, None]
    ids[:, 1 : 1 + 2 * MAX_PAIRS] = torch.where(inside, listed, PAD_ID)
    answers = values[rows, asked]
    tail = torch.stack(
        [torch.full_like(answers, QUERY_ID), keys[rows, asked], answers, torch.full_like(answers, EOS_ID)], dim=1
    )  # (m, 4): ? key value <eos>, after the list
    start = 1 + 2 * pairs
    ids.scatter_(1, start[:, None] + torch.arange(4), tail)
    return ids, start + 4, pairs, 2 * asked, 2 * pairs + 1, answers


def training_batch(data: Retrieval) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, labels) for next-token training on `data`, each (N, MAX_SEQUENCE - 1): the inputs
    are the sequences without their last column, the labels the next tokens where they are determined by the prompt
    (the answer, predicted at the asked key after ``?``, and <eos>, predicted at the answer) and -100 (ignored)
    elsewhere: the listed keys and values are random, nothing could predict them."""
    ids = data.ids
    inputs = ids[:, :-1]
    mask = (torch.arange(ids.shape[1] - 1) < (data.lengths - 1)[:, None]).long()
    labels = torch.full_like(inputs, -100)
    rows = torch.arange(len(data))
    answer_at = 2 * data.pairs + 2  # the asked key after "?": it predicts the value, the value predicts <eos>
    labels[rows, answer_at] = data.answers
    labels[rows, answer_at + 1] = EOS_ID
    return inputs, mask, labels
