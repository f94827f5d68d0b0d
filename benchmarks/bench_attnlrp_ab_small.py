"""AttnLRP / CP-LRP's Python alone: `bench_attnlrp_ab`'s rows (this checkout, a revision, the floor, lxt) on a
6-layer LLaMA of hidden 48 and 16 tokens, where the compute is nothing, round-robin in one process, paired
differences (process time, one thread).

    OMP_NUM_THREADS=1 python benchmarks/bench_attnlrp_ab_small.py --base 67514a0 [--repeats 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attnlrp_ab as ab  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare with")
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    import transformers as tf

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        ab.extract(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        torch.manual_seed(0)
        cfg = tf.LlamaConfig(
            vocab_size=1000, hidden_size=48, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=96, max_position_embeddings=64,
        )  # fmt: skip
        model = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
        for p in model.parameters():
            p.requires_grad_(False)
        x = torch.randint(1, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
        for variant in ("attn", "cp"):
            fns = ab.rows_for("llama", variant, model)
            for fn in fns.values():  # warm-up
                fn(x)
                fn(x)
            times: dict[str, list[float]] = {r: [] for r in fns}
            order = list(fns)
            for i in range(args.repeats):
                for row in order if i % 2 == 0 else order[::-1]:
                    t0 = time.process_time()
                    fns[row](x)
                    times[row].append((time.process_time() - t0) * 1000)
            medians = ", ".join(f"{r} {statistics.median(v):.2f}" for r, v in times.items())
            print(f"small llama {variant}: {medians} ms", flush=True)
            for a, c in [("new", "base")] + [("new", "lxt")] * ("lxt" in times):
                d = statistics.median(u - v for u, v in zip(times[a], times[c], strict=True))
                print(f"small llama {variant} {a} - {c}: {d:+.2f} ms (median of {args.repeats} paired)", flush=True)


if __name__ == "__main__":
    main()
