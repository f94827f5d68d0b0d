"""Attention rollouts against the gradient floor: what reading the attention (and decomposing fused attention calls)
costs.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_rollout.py [--repeats 5] [--threads 1] [--k 1]

Models (random weights, seed 0, eval mode, N = 1): timm ``vit_small_patch16_224`` at 224x224 with its fused attention
(``F.scaled_dot_product_attention``) and with the eager path (``fused_attn=False``), and a BERT-base-sized Hugging
Face ``BertForSequenceClassification`` (12 layers, hidden 768, 12 heads) at 128 tokens with ``"sdpa"``. Rows: the
plain forward pass under ``torch.no_grad()``, Saliency (one forward, one backward: the gradient floor; at the word
embedding for BERT), AttentionRollout and GradientRollout, each timed round-robin after one warm-up call; the median
of the repeats in ms, and each method's ratio to Saliency, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

import hookviz as hv


def vit(fused: bool) -> tuple[torch.nn.Module, torch.Tensor, dict, Callable]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False).eval()
    for block in model.blocks:
        block.attn.fused_attn = fused
    return model, torch.randn(1, 3, 224, 224), {}, lambda m: hv.Saliency(m)


def bert() -> tuple[torch.nn.Module, torch.Tensor, dict, Callable]:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=10, attn_implementation="sdpa")).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    mask = {"attention_mask": torch.ones(1, 128, dtype=torch.long)}
    return model, ids, mask, lambda m: hv.Saliency(m, layer=m.bert.embeddings.word_embeddings)


def explain(method: hv.Attribution, x: torch.Tensor, target: object, kwargs: dict) -> Callable[[], object]:
    return lambda: method.attribute(x, target, forward_kwargs=kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--k", type=int, default=1, help="targets per input (an (N, K) target when > 1)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.2f}; N=1, K={args.k}, median of {args.repeats} (ms)\n"
    )
    print("| model | forward | Saliency | AttentionRollout | GradientRollout | AR / Sal | GR / Sal |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    cases = {
        "vit_small 224 (sdpa)": lambda: vit(True),
        "vit_small 224 (eager)": lambda: vit(False),
        "bert-base 128": bert,
    }
    target = torch.arange(args.k)[None] if args.k > 1 else 1
    for name, build in cases.items():
        model, x, kwargs, saliency = build()

        def forward(model=model, x=x, kwargs=kwargs) -> None:
            with torch.no_grad():
                model(x, **kwargs)

        runs = {
            "forward": forward,
            "saliency": explain(saliency(model), x, target, kwargs),
            "rollout": explain(hv.AttentionRollout(model), x, target, kwargs),
            "gradient": explain(hv.GradientRollout(model), x, target, kwargs),
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        for fn in runs.values():
            fn()  # warm-up
        for _ in range(args.repeats):
            for key, fn in runs.items():
                start = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - start) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {name} | {med['forward']:.0f} | {med['saliency']:.0f} | {med['rollout']:.0f} | {med['gradient']:.0f} "
            f"| {med['rollout'] / med['saliency']:.2f} | {med['gradient'] / med['saliency']:.2f} |"
        )


if __name__ == "__main__":
    main()
