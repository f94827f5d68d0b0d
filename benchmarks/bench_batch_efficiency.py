"""Does batching sequences make a forward or a backward pass cheaper per sequence on one CPU thread?

Why it matters: inseq batches Integrated Gradients' path points per generated token; hookviz runs one path point per
pass and all generated tokens' backward passes over it (docs/generation.md). If a batch of 8 were cheaper per
sequence, batching path points would lower hookviz's floor.

    OMP_NUM_THREADS=1 python benchmarks/bench_batch_efficiency.py [--tokens 320] [--repeats 3]

The model is issue 26's GPT-2 from a config (12 layers, width 768, vocabulary 50,257, random weights of seed 0,
parameters frozen), the output layer on the last 64 positions (`logits_to_keep`), gradients to the input embeddings.
Prints per batch size the median forward time per sequence and the median time of one backward pass per sequence.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    """Run the measurement and print one line per batch size."""
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=320)
    ap.add_argument("--backward", type=int, default=4, help="backward passes per forward")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    model = transformers.GPT2LMHeadModel(cfg).eval().requires_grad_(False)
    ids = torch.randint(0, cfg.vocab_size, (8, args.tokens))
    times: dict[int, tuple[list[float], list[float]]] = {1: ([], []), 8: ([], [])}
    for _ in range(args.repeats):
        for b, (fwd, bwd) in times.items():
            emb = model.transformer.wte(ids[:b]).detach().requires_grad_(True)
            t0 = time.perf_counter()
            logits = model(inputs_embeds=emb, logits_to_keep=64).logits
            t1 = time.perf_counter()
            for k in range(args.backward):
                torch.autograd.grad(logits[:, k, 5].sum(), emb, retain_graph=True)
            t2 = time.perf_counter()
            fwd.append((t1 - t0) / b)
            bwd.append((t2 - t1) / args.backward / b)
    for b, (fwd, bwd) in times.items():
        print(
            f"batch {b}: forward {statistics.median(fwd):.3f} s per sequence, "
            f"one backward {statistics.median(bwd):.3f} s per sequence (median of {args.repeats})"
        )


if __name__ == "__main__":
    main()
