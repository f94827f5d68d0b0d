"""`explain_generation` against its floor and against one forward and one backward pass per generated token.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_generation.py [--layers 12 --width 768 --heads 12] [--prompt 256]
        [--generated 64] [--steps 8] [--repeats 3] [--threads 1] [--cases floor ixg ixg-vmap per-token ...]

A GPT-2 from a config (random weights, seed 0, vocabulary 50,257, eval mode) and a word-level tokenizer of as many
words, built here (no download); one prompt of ``--prompt`` random words and a forced continuation of
``--generated`` words (forcing keeps every case on the same work). Each case runs in a fresh process (its peak
resident memory above the process after setup is its memory), the median of ``--repeats`` calls
after one warm-up (Linux: the peak is ``VmHWM``, reset before the calls). Cases:

- ``floor``: by hand, one forward pass over prompt + continuation with the token embeddings as a leaf, then one
  ``torch.autograd.grad`` to the embeddings per generated token over that graph (the issue's floor);
- ``floor-keep``: the same with the output layer run on the generated positions only (``logits_to_keep``, what
  ``explain_generation`` does): the floor of that computation;
- ``ixg`` / ``ixg-vmap``: ``explain_generation(method="input-x-gradient")`` with the backward passes looped (the
  CPU default) or vectorized (``backward="vmap"``);
- ``per-token``: by hand, one forward pass over the prefix and one backward pass per generated token (what inseq
  and captum's ``LLMGradientAttribution`` do);
- ``captum``: captum's ``LLMGradientAttribution(LayerGradientXActivation)`` (its log-probability target);
- ``ig-floor`` / ``ig``: Integrated Gradients with ``--steps`` Gauss-Legendre points: by hand (one forward per path
  point, one backward per generated token and point) and through ``explain_generation``;
- ``occlusion``: ``explain_generation(method="occlusion")``: one forward pass per source token.

Prints a Markdown table: median seconds, the ratio to the floor of the same family, and peak memory (MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

CASES = ("floor", "floor-keep", "ixg", "ixg-vmap", "per-token", "captum", "ig-floor", "ig", "occlusion")
FLOOR = {
    "floor-keep": "floor", "ixg": "floor", "ixg-vmap": "floor", "per-token": "floor", "captum": "floor",
    "ig": "ig-floor",
}  # fmt: skip


def build(args: argparse.Namespace) -> tuple[Any, Any, str, str]:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = 50257
    words = ["<unk>"] + [f"t{i}" for i in range(1, vocab)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<unk>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
        n_positions=max(1024, args.prompt + args.generated), bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (args.prompt + args.generated,), generator=g).tolist()
    prompt = " ".join(words[i] for i in ids[: args.prompt])
    target = " ".join(words[i] for i in ids[args.prompt :])
    return model, tok, prompt, target


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    import hookviz as hv

    torch.set_num_threads(args.threads)
    model, tok, prompt, target = build(args)
    p_ids = tok.encode(prompt)
    t_ids = tok.encode(target, add_special_tokens=False)
    seq = torch.tensor([p_ids + t_ids])
    p, g = len(p_ids), len(t_ids)
    emb = model.get_input_embeddings()

    def floor(points: list[tuple[float, float]], keep: bool = False) -> None:
        e = emb(seq).detach()
        base = emb(torch.zeros_like(seq)).detach()
        for a, _ in points:
            x = (base + a * (e - base)).requires_grad_(True)
            if keep:  # logits of the last g + 1 positions only
                logits = model(inputs_embeds=x, use_cache=False, logits_to_keep=g + 1).logits[0]
                scores = logits[torch.arange(0, g), torch.tensor(t_ids)]
            else:
                logits = model(inputs_embeds=x, use_cache=False).logits[0]
                scores = logits[torch.arange(p - 1, p + g - 1), torch.tensor(t_ids)]
            for k in range(g):
                torch.autograd.grad(scores[k], x, retain_graph=k < g - 1)

    def per_token() -> None:
        for k in range(g):
            x = emb(seq[:, : p + k]).detach().requires_grad_(True)
            score = model(inputs_embeds=x, use_cache=False).logits[0, -1, t_ids[k]]
            torch.autograd.grad(score, x)

    nodes, weights = np.polynomial.legendre.leggauss(args.steps)
    gl = [(float((n + 1) / 2), float(w / 2)) for n, w in zip(nodes, weights, strict=True)]
    captum_run = None
    if case == "captum":
        from captum.attr import LayerGradientXActivation, LLMGradientAttribution, TextTokenInput

        attr = LLMGradientAttribution(LayerGradientXActivation(model, emb), tok)

        def captum_run() -> None:
            attr.attribute(TextTokenInput(prompt, tok), target=target)

    def explain(method: str, **kw: Any) -> Any:
        return lambda: hv.explain_generation(model, tok, prompt, target=target, method=method, method_kwargs=kw or None)

    fns = {
        "floor": lambda: floor([(1.0, 1.0)]),
        "floor-keep": lambda: floor([(1.0, 1.0)], keep=True),
        "ixg": explain("input-x-gradient", backward="loop"),
        "ixg-vmap": explain("input-x-gradient", backward="vmap"),
        "per-token": per_token,
        "captum": captum_run,
        "ig-floor": lambda: floor(gl),
        "ig": explain("integrated-gradients", steps=args.steps),
        "occlusion": explain("occlusion"),
    }
    fn = fns[case]
    # the peak resident memory of the calls above the process after setup: VmHWM reset here (ru_maxrss would carry
    # the parent's peak over exec and hide a smaller one)
    rss0 = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    fn()  # warm-up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    peak = (_status_kib("VmHWM") - rss0) / 1024  # KiB -> MiB
    return {"case": case, "median_s": statistics.median(times), "times": times, "peak_mib": peak}


def _status_kib(key: str) -> int:
    """A ``/proc/self/status`` value in KiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--generated", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one case, in a child process
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args)))
        return
    forwarded = [a for a in sys.argv[1:] if a != "--cases" and a not in CASES]
    results = {}
    for case in args.cases:
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        out = subprocess.run(
            [sys.executable, __file__, *forwarded, "--case", case], capture_output=True, text=True, env=env, check=False
        )
        if out.returncode != 0:
            print(f"{case}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"GPT-2 config: {args.layers} layers, width {args.width}, {args.heads} heads, vocabulary 50257; "
        f"{args.prompt} prompt + {args.generated} generated tokens; IG {args.steps} steps; {args.threads} thread(s); "
        f"torch {torch.__version__}; median of {args.repeats}; load average {os.getloadavg()[0]:.2f}\n"
    )
    print("| case | median s | / floor | peak MiB |\n|---|---:|---:|---:|")
    for case, r in results.items():
        base = results.get(FLOOR.get(case, ""))
        ratio = f"{r['median_s'] / base['median_s']:.2f}" if base else ""
        print(f"| {case} | {r['median_s']:.2f} | {ratio} | {r['peak_mib']:.0f} |")


if __name__ == "__main__":
    main()
