"""Train the zoo's shipped SAE (issue 37, part 8): a TopK SAE (Gao et al. 2024) of the retrieval LM's residual
stream after ``blocks.0``, written with its metrics to a folder (``hookviz/zoo/retrieval_sae`` to replace the shipped
one, loaded by `hookviz.zoo.sae.retrieval_sae`).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/train_retrieval_sae.py --out hookviz/zoo/retrieval_sae [--steps 1500]

Training: `hv.train_sae` on the real tokens of 40,000 `hookviz.zoo.retrieval` prompts (seed 1), seed 0, 1 thread
(other thread counts round differently, so the weights differ in the last bits). Evaluation: `hv.evaluate_sae` on
2000 held-out prompts (seed 2), the cross-entropy and KL at the two predictions the task defines
(`hookviz.zoo.sae.answer_positions`); ``"check"``: the same on the first 64 held-out prompts, which
tests/test_retrieval_sae.py recomputes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import hookviz as hv
from hookviz.zoo import retrieval_lm
from hookviz.zoo.sae import METRICS_FILE, SAE_LAYER, answer_positions, token_batches

CHECK_PROMPTS = 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--d-sae", type=int, default=512)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = retrieval_lm()
    train = token_batches(40_000, seed=1)
    held_out = token_batches(2_000, seed=2)
    start = time.perf_counter()
    result = hv.train_sae(
        model, SAE_LAYER, train, d_sae=a.d_sae, act="topk", k=a.k, steps=a.steps, batch_size=a.batch_size,
        lr=a.lr, dead_after=200_000, seed=0, progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    sae = result.sae.eval()
    full = hv.evaluate_sae(model, SAE_LAYER, sae, held_out, scored=answer_positions)
    check = hv.evaluate_sae(model, SAE_LAYER, sae, held_out[:1], scored=answer_positions)
    assert held_out[0]["input_ids"].shape[0] == CHECK_PROMPTS
    out = Path(a.out)
    sae.save(out)
    metrics = {
        "layer": SAE_LAYER,
        "training": {
            "prompts": 40_000, "seed_data": 1, "seed": 0, "steps": a.steps, "batch_size": a.batch_size,
            "d_sae": a.d_sae, "k": a.k, "lr": a.lr, "threads": a.threads, "seconds": round(seconds, 1),
            "rows": result.rows, "loss_first10": float(result.loss[:10].mean()),
            "loss_last10": float(result.loss[-10:].mean()), "torch": torch.__version__,
        },
        "evaluation": {"prompts": 2_000, "seed_data": 2, "scored": "answer_positions", **full.as_dict()},
        "check": {"prompts": CHECK_PROMPTS, "seed_data": 2, "scored": "answer_positions", **check.as_dict()},
    }  # fmt: skip
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    print(f"trained in {seconds:.1f} s; loss {metrics['training']['loss_first10']:.4g} -> "
          f"{metrics['training']['loss_last10']:.4g}")  # fmt: skip
    print(full.table())


if __name__ == "__main__":
    main()
