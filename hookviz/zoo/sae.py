"""The zoo's shipped sparse autoencoder: a TopK SAE (Gao et al. 2024, "Scaling and evaluating sparse autoencoders")
of the retrieval language model's residual stream after ``blocks.0`` (`hookviz.zoo.lm`), with its metrics (issue 37).

``retrieval_sae()`` loads it from ``hookviz/zoo/retrieval_sae/`` (``cfg.json`` + ``sae_weights.safetensors``: no
pickle); ``retrieval_sae_metrics()`` reads the ``metrics.json`` written beside it. ``python
benchmarks/train_retrieval_sae.py --out hookviz/zoo/retrieval_sae`` reproduces the three files (about a minute on one
CPU thread). This module sits above `hookviz.features` (it returns a `hookviz.features.SAE`), so ``hookviz.zoo``'s
``__init__`` does not import it: ``from hookviz.zoo.sae import retrieval_sae``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..features.sae import SAE
from .retrieval import PAD_ID, retrieval

__all__ = ["SAE_FOLDER", "SAE_LAYER", "answer_positions", "retrieval_sae", "retrieval_sae_metrics", "token_batches"]

SAE_FOLDER = Path(__file__).resolve().parent / "retrieval_sae"
SAE_LAYER = "blocks.0"  # the residual stream between the two blocks
METRICS_FILE = "metrics.json"


def retrieval_sae() -> SAE:
    """The shipped TopK SAE of `retrieval_lm`'s ``blocks.0`` output (d_in 64, d_sae 512, k 16), in eval mode on the
    CPU. Its layer is `SAE_LAYER`; its metrics, `retrieval_sae_metrics`."""
    if not (SAE_FOLDER / "cfg.json").is_file():
        raise FileNotFoundError(
            f"the shipped SAE's folder {SAE_FOLDER} is missing or incomplete; reinstall hookviz, or rebuild it with "
            f"`python benchmarks/train_retrieval_sae.py --out {SAE_FOLDER}`"
        )
    return SAE.load(SAE_FOLDER).eval()


def retrieval_sae_metrics() -> dict[str, Any]:
    """The shipped SAE's training settings and `evaluate_sae` metrics (``metrics.json``): ``"evaluation"`` on 2000
    held-out prompts (seed 2), ``"check"`` on the first `check_prompts` of them (what the tests recompute)."""
    return json.loads((SAE_FOLDER / METRICS_FILE).read_text(encoding="utf-8"))


def token_batches(n: int, seed: int, size: int = 64) -> list[dict[str, Tensor]]:
    """`n` retrieval prompts (full sequences, right-padded) as dict batches of `size` rows with their attention mask,
    so that training and evaluation leave the padding out."""
    ids = retrieval(n, seed=seed).ids
    return [{"input_ids": b, "attention_mask": (b != PAD_ID).long()} for b in ids.split(size)]


def answer_positions(ids: Tensor) -> Tensor:
    """bool (N, T): the positions whose next token the task determines, the asked key after ``?`` (predicting the
    answer, at L - 3 for a row of real length L) and the answer (predicting <eos>, at L - 2). The other tokens are
    random keys and values, unpredictable by design: their cross-entropy is noise (`evaluate_sae`'s ``scored=``)."""
    length = (ids != PAD_ID).sum(1, keepdim=True)
    t = torch.arange(ids.shape[1], device=ids.device)
    return (t == length - 3) | (t == length - 2)
