"""SAE training speed on the CPU (or a GPU) against the floor, and the evaluation table of the SAE it trains
(issue 37).

Usage::

    python benchmarks/bench_sae.py [--steps 600] [--layer blocks.0] [--d-sae 512] [--k 16] [--batch-size 1024]
        [--threads 1] [--device cpu] [--save DIR] [--out PATH.md]

The zoo's retrieval language model (`hookviz.zoo.retrieval_lm`, shipped weights): a TopK SAE (Gao et al. 2024) is
trained with `hv.train_sae` on the residual stream after ``--layer`` (``blocks.0``: between the two blocks), on the
real tokens of `hookviz.zoo.retrieval` prompts (seed 1; dict batches of 64 rows with their attention mask, so the
padding is left out), then evaluated with `hv.evaluate_sae` on 2000 fresh prompts (seed 2), the cross-entropy and
KL at the two predictions the task defines (the answer after the asked key, <eos> after the answer).

Speed, in activation rows (tokens) per second:

- ``train_sae``: the whole call (forwards, buffer, SAE steps, progress bookkeeping) after its first batch;
- ``floor``: 1 / (t_forward + t_step): t_forward, the model's forward up to the layer per token (the rest of the
  forward skipped, as train_sae does), timed over the first 100 training batches; t_step, the SAE's own step per
  token (encode, TopK, decode, loss with AuxK for the trained SAE's dead latents, backward, Adam, decoder
  renormalisation) on those batches' rows, already in memory.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch

import hookviz as hv
from hookviz.features._acts import _Stop
from hookviz.features.train import _loss
from hookviz.zoo import retrieval, retrieval_lm
from hookviz.zoo.retrieval import PAD_ID


def token_batches(n: int, seed: int, size: int = 64) -> list[dict[str, torch.Tensor]]:
    ids = retrieval(n, seed=seed).ids
    return [{"input_ids": b, "attention_mask": (b != PAD_ID).long()} for b in ids.split(size)]


def answer_positions(ids: torch.Tensor) -> torch.Tensor:
    """The positions predicting the answer and <eos>: the asked key (L - 3) and the value (L - 2) of each row of
    real length L. The other tokens are random keys and values, unpredictable by design: their cross-entropy is
    noise."""
    length = (ids != PAD_ID).sum(1, keepdim=True)
    t = torch.arange(ids.shape[1], device=ids.device)
    return (t == length - 3) | (t == length - 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--layer", default="blocks.0")
    p.add_argument("--d-sae", type=int, default=512)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--save", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = retrieval_lm()
    model = model.float().to(a.device)
    train = token_batches(40_000, seed=1)
    held_out = token_batches(2_000, seed=2)

    start = time.perf_counter()
    result = hv.train_sae(
        model, a.layer, train, d_sae=a.d_sae, k=a.k, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
        dead_after=200_000, progress=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    sae = result.sae

    ev = hv.evaluate_sae(model, a.layer, sae, held_out, scored=answer_positions)

    # floor 1: the forward up to the layer, per real token; its rows are kept for floor 2
    rows, seconds, kept = 0, 0.0, []
    with torch.no_grad(), hv.HookManager(model) as hooks:

        def stop(module, args, out):  # noqa: ANN001, ANN202
            kept.append(out)
            raise _Stop

        hooks.forward(a.layer, stop)
        for batch in train[:100]:
            batch = {k: v.to(a.device) for k, v in batch.items()}
            t0 = time.perf_counter()
            try:
                model(**batch)
            except _Stop:
                pass
            seconds += time.perf_counter() - t0
            rows += int(batch["attention_mask"].sum())
            kept[-1] = kept[-1][batch["attention_mask"].bool()]
    t_forward = seconds / rows
    # floor 2: the SAE's own step on real rows in memory, from the trained SAE with its dead latents (those that
    # never fire on the held-out data) counted dead, so that AuxK's cost is in the floor as it is in training
    x_all = torch.cat(kept)
    probe = copy.deepcopy(sae)
    opt = torch.optim.Adam(probe.parameters(), lr=a.lr)
    since = torch.where(ev.frequency == 0, 200_000, 0).to(a.device)
    hyper = {"act": "topk", "dead_after": 200_000, "aux_coeff": 1 / 32}
    n_steps = 100
    t0 = time.perf_counter()
    for i in range(n_steps):
        x = x_all[(i * a.batch_size) % (x_all.shape[0] - a.batch_size) :][: a.batch_size]
        loss, _, _ = _loss(probe, x, since, hyper)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            g, w = probe.W_dec.grad, probe.W_dec
            g -= (g * w).sum(1, keepdim=True) * w
        opt.step()
        probe.normalize_decoder()
    t_step = (time.perf_counter() - t0) / (n_steps * a.batch_size)
    floor = 1 / (t_forward + t_step)

    lines = [
        f"# SAE on the retrieval LM's residual stream after `{a.layer}` (TopK, d_sae {a.d_sae}, k {a.k})",
        "",
        f"device {a.device}, {a.threads} thread(s) (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}), "
        f"torch {torch.__version__}; {a.steps} steps of {a.batch_size} tokens, lr {a.lr}",
        "",
        "| | tokens / s | seconds |",
        "|---|---|---|",
        f"| train_sae (whole call) | {result.rows_per_second:,.0f} | {result.seconds:.1f} (call {wall:.1f}) |",
        f"| floor: forward to the layer + SAE step | {floor:,.0f} | {(t_forward + t_step) * result.rows:.1f} |",
        f"| forward to the layer alone | {1 / t_forward:,.0f} | |",
        f"| SAE step alone | {1 / t_step:,.0f} | |",
        "",
        f"train_sae / floor: {result.rows_per_second / floor:.2f}; loss {result.loss[:10].mean():.4g} (first 10 "
        f"steps) -> {result.loss[-10:].mean():.4g} (last 10)",
        "",
        "Evaluation on 2000 held-out prompts (seed 2); cross-entropy and KL at the answer and <eos> predictions:",
        "",
        ev.table(),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    if a.save:
        sae.save(a.save)


if __name__ == "__main__":
    main()
