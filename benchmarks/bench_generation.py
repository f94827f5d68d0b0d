"""Explaining a generated continuation: hookviz against its floor and against inseq and captum, time and peak memory.

    python benchmarks/bench_generation.py [--size full|medium|small] [--rows floor-ixg inseq-ixg ...] [--repeats 3]
        [--out benchmarks/results/generation-peers-cpu]
    /work/venv-inseq/bin/python benchmarks/bench_generation.py --dump peers.npz     # the equality check's matrices

The work (issue 26): a GPT-2 from a config (``full``: GPT-2 small's 12 layers, width 768, 12 heads, 50,257 tokens;
random weights, seed 0, eval mode, parameters frozen), a prompt of 256 random token ids and a forced continuation of
64 random token ids (seed 0, the same for every row), one CPU thread. ``medium`` and ``small`` shrink the model and
the sequence for rows that cannot run at full size on a shared machine (the results file says which ran where).

Tokens are the words ``w0`` .. ``w50256`` of a word-level ``PreTrainedTokenizerFast`` built here (no download: GPT-2's
own tokenizer files are not on the machine), so a text of ids round-trips exactly through every library's tokenizer.

Rows (one fresh process each: its time and its peak RSS above the resident memory just before the call, as in
``bench_peers.py``):

- ``floor-ixg``: the least any gradient method costs, by hand: one forward over prompt + continuation with the input
  embeddings as a leaf (the output layer on the generated tokens' positions only: ``logits_to_keep``), then one
  ``autograd.grad`` of each generated token's probability to the embeddings (64 backward passes over the one graph).
- ``floor-ig8``: the same per path point of 8-step Integrated Gradients (8 forwards, 8 x 64 backwards).
- ``floor-occlusion``: one no-grad forward of the teacher-forced sequence per source token (each occluded source
  scores every generated token at once), plus the unoccluded one.
- ``inseq-ixg``, ``inseq-ig8``, ``inseq-occlusion``: inseq 0.7.1 (``inseq.load_model(model, method,
  tokenizer=...)``, ``attribute(input_texts=prompt, generated_texts=prompt + continuation)``, its default target:
  the probability of each generated token). inseq needs typeguard <= 2.13.3, which hookviz's environment does not
  pin: it runs from its own virtual environment (``--inseq-python``; made with ``python -m venv
  --system-site-packages``, inseq installed ``--no-deps`` with only typeguard, jaxtyping and treescope added, and a
  ``.pth`` line that puts hookviz's environment after its own).
- ``captum-ixg``, ``captum-ig8``: captum's ``LLMGradientAttribution`` over ``LayerGradientXActivation`` /
  ``LayerIntegratedGradients`` at ``transformer.wte`` (target: log-probability), ``captum-ablation``:
  ``LLMAttribution(FeatureAblation)`` over the prompt tokens.
- ``hookviz-ixg``, ``hookviz-ig8``, ``hookviz-occlusion``: ``hv.explain_generation(model, tokenizer, [prompt],
  method=..., target=continuation)``; skipped with a note until ``hv.explain_generation`` exists (branch ``gen``).

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_peers import _reset_peak_kib, _status_kib  # noqa: E402

# (layers, width, heads, vocabulary, prompt tokens, generated tokens)
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "full": (12, 768, 12, 50257, 256, 64),
    "medium": (6, 384, 6, 50257, 128, 32),
    "small": (4, 256, 4, 50257, 64, 16),
    "tiny": (2, 32, 2, 1000, 12, 4),  # the equality check's model (--dump)
}
ROWS = (
    "floor-ixg",
    "floor-ig8",
    "floor-occlusion",
    "hookviz-ixg",
    "hookviz-ig8",
    "hookviz-occlusion",
    "inseq-ixg",
    "inseq-ig8",
    "inseq-occlusion",
    "captum-ixg",
    "captum-ig8",
    "captum-ablation",
)
IG_STEPS = 8
DEFAULT_INSEQ_PYTHON = ROOT.parent / "venv-inseq" / "bin" / "python"


def word_tokenizer(vocab: int) -> Any:
    """A word-level Hugging Face tokenizer over ``w0`` .. ``w{vocab - 1}`` (the last one is <eos>, as GPT-2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")  # joins the words with single spaces
    eos = f"w{vocab - 1}"
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, bos_token=eos, pad_token=eos, unk_token="w0")


def make_model(size: str) -> torch.nn.Module:
    """GPT-2 (``GPT2LMHeadModel``, sdpa attention) of `size` from its config, random weights of seed 0, eval mode,
    parameters frozen."""
    import transformers as tf

    layers, width, heads, vocab, prompt, gen = SIZES[size]
    cfg = tf.GPT2Config(
        vocab_size=vocab, n_positions=max(1024, prompt + gen), n_embd=width, n_layer=layers, n_head=heads,
        bos_token_id=vocab - 1, eos_token_id=vocab - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def make_work(size: str) -> tuple[torch.Tensor, torch.Tensor, str, str]:
    """(prompt ids (P,), continuation ids (G,), prompt text, continuation text): random ids of seed 0, the
    end-of-text id left out so that no library treats one as special."""
    *_, vocab, prompt, gen = SIZES[size]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab - 1, (prompt + gen,), generator=g)
    p, c = ids[:prompt], ids[prompt:]
    return p, c, " ".join(f"w{i}" for i in p.tolist()), " ".join(f"w{i}" for i in c.tolist())


# ---------------------------------------------------------------------------------------------------- the rows


def floor_gradients(
    model: torch.nn.Module, ids: torch.Tensor, n_gen: int, emb: torch.Tensor | None = None
) -> torch.Tensor:
    """(G, S, D): the gradient of each generated token's probability w.r.t. the input embeddings (or at `emb` (1, T,
    D): a path point of Integrated Gradients), one forward and G backward passes over one graph."""
    emb = model.get_input_embeddings()(ids[None]) if emb is None else emb
    emb = emb.detach().requires_grad_(True)
    t = ids.shape[0]
    start = t - n_gen - 1  # position P - 1 predicts the first generated token
    # the output layer on the G + 1 last positions only (transformers' logits_to_keep): the (T, V) product over a
    # 50k vocabulary at every position is work no method needs
    logits = model(inputs_embeds=emb, logits_to_keep=n_gen + 1).logits[0, :-1]  # (G, V)
    probs = torch.softmax(logits, -1).gather(1, ids[start + 1 :, None]).squeeze(1)  # (G,)
    grads = []
    for k in range(n_gen):
        (g,) = torch.autograd.grad(probs[k], emb, retain_graph=k < n_gen - 1)
        grads.append(g[0, : start + 1 + k])  # the sources of token k: the prompt and the tokens before it
    width = grads[-1].shape[0]
    return torch.stack([torch.nn.functional.pad(g, (0, 0, 0, width - g.shape[0])) for g in grads])


def floor_ixg(model: torch.nn.Module, ids: torch.Tensor, n_gen: int) -> torch.Tensor:
    emb = model.get_input_embeddings()(ids[None])[0].detach()
    return (floor_gradients(model, ids, n_gen) * emb[: ids.shape[0] - 1]).sum(-1)  # (G, S)


def floor_ig(
    model: torch.nn.Module, ids: torch.Tensor, n_gen: int, steps: int = IG_STEPS, baseline: int = 0
) -> torch.Tensor:
    """Integrated Gradients (Sundararajan et al. 2017) from the embedding of token `baseline` at every position (id 0
    is the unknown token inseq and captum start from here), Gauss-Legendre points as captum's default: one forward and
    G backwards per point."""
    from captum.attr._utils.approximation_methods import approximation_parameters

    weights_fn, alphas_fn = approximation_parameters("gausslegendre")  # (step sizes, alphas), captum's order
    wte = model.get_input_embeddings()
    emb, base = wte(ids[None]).detach(), wte(torch.full_like(ids[None], baseline)).detach()
    total = 0.0
    for a, w in zip(alphas_fn(steps), weights_fn(steps), strict=True):
        total = total + w * floor_gradients(model, ids, n_gen, emb=base + a * (emb - base))
    return (total * (emb - base)[0, : ids.shape[0] - 1]).sum(-1)


@torch.no_grad()
def floor_occlusion(model: torch.nn.Module, ids: torch.Tensor, n_gen: int, baseline: int = 0) -> torch.Tensor:
    """(G, S): p(token k) - p(token k | source j replaced by `baseline`), the continuation teacher-forced: one
    forward per source token scores every generated token at once."""
    t = ids.shape[0]
    start = t - n_gen - 1

    def probs(seq: torch.Tensor) -> torch.Tensor:
        logits = model(seq[None], logits_to_keep=n_gen + 1).logits[0, :-1]
        return torch.softmax(logits, -1).gather(1, seq[start + 1 :, None]).squeeze(1)

    base = probs(ids)
    out = torch.zeros(n_gen, t - 1)
    for j in range(t - 1):
        seq = ids.clone()
        seq[j] = baseline
        out[:, j] = base - probs(seq)
    # a source after a generated token's position cannot reach it: its entries are not sources of that token
    return out * (torch.arange(t - 1)[None] <= torch.arange(start, t - 1)[:, None])


def inseq_run(model: torch.nn.Module, tok: Any, prompt: str, continuation: str, method: str) -> Any:
    import inseq

    name = {"ixg": "input_x_gradient", "ig8": "integrated_gradients", "occlusion": "occlusion"}[method]
    m = inseq.load_model(model, name, tokenizer=tok)
    kwargs: dict[str, Any] = {"n_steps": IG_STEPS} if method == "ig8" else {}
    out = m.attribute(input_texts=prompt, generated_texts=prompt + " " + continuation, show_progress=False, **kwargs)
    return out


def inseq_matrix(out: Any) -> np.ndarray:
    """inseq's (S, G[, D]) target attributions as a (G, S) matrix: the embedding axis summed (its convention for
    Input x Gradient and Integrated Gradients), the positions after each generated token's own set to 0."""
    a = out.sequence_attributions[0].target_attributions.detach().float()
    if a.ndim == 3:
        a = a.sum(-1)
    a = torch.nan_to_num(a.T, nan=0.0)  # (G, S), NaN where a source comes after the token
    return a.numpy()


def captum_run(
    model: torch.nn.Module, tok: Any, prompt: str, target_ids: torch.Tensor, method: str, cached: bool = True
) -> Any:
    from captum.attr import (
        FeatureAblation,
        LayerGradientXActivation,
        LayerIntegratedGradients,
        LLMAttribution,
        LLMGradientAttribution,
        TextTokenInput,
    )

    inp = TextTokenInput(prompt, tok)
    wte = model.get_input_embeddings()
    if method == "ixg":
        return LLMGradientAttribution(LayerGradientXActivation(model, wte), tok).attribute(inp, target=target_ids)
    if method == "ig8":
        return LLMGradientAttribution(LayerIntegratedGradients(model, wte), tok).attribute(
            inp, target=target_ids, n_steps=IG_STEPS
        )
    # captum's default (use_cached_outputs=True: the ablated prompt's continuation decoded with the key-value cache)
    # gives, under transformers 5, logits that differ from the full forward pass from the second target token on
    # (tests/test_generation_peers.py) and an IndexError at 16 target tokens or more: the benchmark times
    # cached=False, the equality dump holds both
    return LLMAttribution(FeatureAblation(model), tok).attribute(inp, target=target_ids, use_cached_outputs=cached)


def hookviz_run(model: torch.nn.Module, tok: Any, prompt: str, continuation: str, method: str) -> Any:
    import hookviz as hv

    if not hasattr(hv, "explain_generation"):
        raise NotImplementedError("needs hv.explain_generation (branch gen, issue 26 parts 1-3): not merged yet")
    name = {"ixg": "input-x-gradient", "ig8": "integrated-gradients", "occlusion": "occlusion"}[method]
    # inseq's target (the probability of each generated token) and its IG (8 Gauss-Legendre points from the unknown
    # token's embedding): the same work as the floor and inseq rows
    kwargs: dict[str, Any] = {"score": "probability", "step_scores": ()}
    if method == "ig8":
        kwargs["method_kwargs"] = {"steps": IG_STEPS}
    return hv.explain_generation(model, tok, [prompt], method=name, target=continuation, **kwargs)


def build(row: str, size: str) -> Callable[[], Any]:
    """A zero-argument call doing `row`'s whole work on `size` (model, tokenizer and ids made here, outside it)."""
    model = make_model(size)
    tok = word_tokenizer(SIZES[size][3])
    p, c, prompt, continuation = make_work(size)
    ids = torch.cat([p, c])
    lib, method = row.split("-", 1)
    if lib == "floor":
        fn = {"ixg": floor_ixg, "ig8": floor_ig, "occlusion": floor_occlusion}[method]
        return lambda: fn(model, ids, c.shape[0])
    if lib == "inseq":
        return lambda: inseq_run(model, tok, prompt, continuation, method)
    if lib == "captum":
        # FeatureAblation uncached: captum's default cached decoding raises an IndexError in GPT-2's embedding under
        # transformers 5 at 16 or more target tokens (and differs from the second on, see `captum_run`)
        return lambda: captum_run(model, tok, prompt, c, method, cached=False)
    if lib == "hookviz":
        return lambda: hookviz_run(model, tok, prompt, continuation, method)
    raise ValueError(f"unknown row {row!r}")


# ---------------------------------------------------------------------------------------------------- processes


def child(row: str, size: str, repeats: int) -> None:
    torch.set_num_threads(1)
    fn = build(row, size)
    before = _reset_peak_kib()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if not times or times[0] > 60:  # a big row: once (its time then is one run, said in the table)
            break
    print(json.dumps({"s": times, "peak_mib": max(0.0, (_status_kib("VmHWM") - before) / 1024)}))


def run_row(row: str, size: str, repeats: int, python: str, timeout: float, path: str) -> dict[str, Any]:
    cmd = [python, __file__, "--child", row, "--size", size, "--repeats", str(repeats)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=path)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"row": row, "size": size, "error": f"did not finish in {timeout:.0f} s"}
    if proc.returncode != 0:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        return {"row": row, "size": size, "error": last[0][:300]}
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "row": row, "size": size, "runs": len(got["s"]), "s": statistics.median(got["s"]), "times": got["s"],
        "peak_mib": got["peak_mib"],
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------- equality dump


def dump(path: str) -> None:
    """The peers' (G, S) matrices on the tiny GPT-2 (`SIZES["tiny"]`), for tests/test_generation_peers.py: inseq's
    (when it imports), captum's, the floor's (float32, by hand) and the step probabilities, in one .npz."""
    torch.set_num_threads(1)
    size = "tiny"
    model = make_model(size)
    tok = word_tokenizer(SIZES[size][3])
    p, c, prompt, continuation = make_work(size)
    ids = torch.cat([p, c])
    out: dict[str, np.ndarray] = {"ids": ids.numpy(), "n_prompt": np.array(p.shape[0])}
    with torch.no_grad():
        logits = model(ids[None]).logits[0, p.shape[0] - 1 : -1]
    out["probability"] = torch.softmax(logits, -1).gather(1, c[:, None]).squeeze(1).numpy()
    out["floor_ixg"] = floor_ixg(model, ids, c.shape[0]).numpy()
    out["floor_ig8"] = floor_ig(model, ids, c.shape[0]).numpy()
    out["floor_occlusion"] = floor_occlusion(model, ids, c.shape[0]).numpy()
    for method in ("ixg", "ig8"):
        res = captum_run(model, tok, prompt, c, method)
        out[f"captum_{method}"] = res.token_attr.detach().float().numpy()  # (G, P): the prompt only, log-prob
    res = captum_run(model, tok, prompt, c, "ablation")
    out["captum_ablation"] = res.token_attr.detach().float().numpy()  # log p - log p(occluded), the prompt only
    res = captum_run(model, tok, prompt, c, "ablation", cached=False)
    out["captum_ablation_uncached"] = res.token_attr.detach().float().numpy()
    try:
        import inseq  # noqa: F401
    except ImportError as exc:
        out["inseq_missing"] = np.array(str(exc))
    else:
        for method in ("ixg", "ig8", "occlusion"):
            out[f"inseq_{method}"] = inseq_matrix(inseq_run(model, tok, prompt, continuation, method))
    np.savez(path, **out)
    print(f"wrote {path}: {', '.join(sorted(out))}")


# ---------------------------------------------------------------------------------------------------- main


def conditions() -> dict[str, Any]:
    import transformers

    try:
        import captum

        captum_version = captum.__version__
    except ImportError:
        captum_version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "captum": captum_version,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": 1,
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=tuple(SIZES), default="full")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--repeats", type=int, default=3, help="runs per row (a row over 60 s runs once)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a row may take before it is given up")
    ap.add_argument("--inseq-python", default=str(DEFAULT_INSEQ_PYTHON), help="the python of inseq's environment")
    ap.add_argument("--out", default=None, help="write <out>.json (appended to when it exists) and <out>.md")
    ap.add_argument("--pythonpath", default=str(ROOT), help="where the rows import hookviz from (default: this tree)")
    ap.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    ap.add_argument("--dump", metavar="NPZ", help="write the peers' matrices on the tiny GPT-2 to NPZ and stop")
    args = ap.parse_args()
    if args.dump:
        dump(args.dump)
        return
    if args.child:
        child(args.child, args.size, args.repeats)
        return
    results = []
    if args.out and Path(f"{args.out}.json").exists():
        results = json.loads(Path(f"{args.out}.json").read_text())["rows"]
    meta = conditions()
    for row in args.rows:
        python = args.inseq_python if row.startswith("inseq") else sys.executable
        if row.startswith("inseq") and not Path(python).exists():
            r = {"row": row, "size": args.size, "error": f"inseq's environment {python} does not exist"}
        else:
            r = run_row(row, args.size, args.repeats, python, args.timeout, args.pythonpath)
        r["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        results = [x for x in results if (x["row"], x["size"]) != (row, args.size)] + [r]
        msg = r.get("error") or f"{r['s']:.2f} s (median of {r['runs']})  peak +{r['peak_mib']:.0f} MiB"
        print(f"{args.size:6s} {row:18s} {msg}", flush=True)
        if args.out:
            Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    if args.out:
        Path(f"{args.out}.md").write_text(table(results, meta))


def table(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "| size | row | s | runs | x floor | peak MiB above baseline | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    floors = {
        (r["size"], r["row"].split("-", 1)[1]): r["s"] for r in results if r["row"].startswith("floor") and "s" in r
    }
    floors.update({(s, "ablation"): v for (s, m), v in list(floors.items()) if m == "occlusion"})
    for size in SIZES:
        for row in ROWS:
            r = next((x for x in results if x["row"] == row and x["size"] == size), None)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {size} | {row} | - | - | - | - | {r['error']} |")
                continue
            f = floors.get((size, row.split("-", 1)[1]))
            ratio = f"{r['s'] / f:.2f}" if f else "-"
            lines.append(f"| {size} | {row} | {r['s']:.2f} | {r['runs']} | {ratio} | {r['peak_mib']:.0f} | |")
    head = (
        f"Conditions: torch {meta['torch']}, transformers {meta['transformers']}, captum {meta['captum']}, "
        f"{meta['cores']} cores, 1 thread per row.\n\n"
    )
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
