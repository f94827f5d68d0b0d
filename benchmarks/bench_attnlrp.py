"""AttnLRP and CP-LRP against the gradient floor: time and peak memory on a ViT-Small and a BERT-base (random weights).

    python benchmarks/bench_attnlrp.py [--models vit_small bert_base] [--batch 1] [--repeats 5] [--no-memory]
        [--rows floor hookviz-attn-lrp-eps0 lxt-attn-lrp ...] [--out benchmarks/results/attnlrp-cpu]

Models (eval mode, parameters frozen, random weights, seed 0): ``vit_small`` is timm's ``vit_small_patch16_224``
(fused attention: ``F.scaled_dot_product_attention``) on (N, 3, 224, 224) images; ``bert_base`` is Hugging Face's
``BertForSequenceClassification`` with bert-base's configuration (12 layers, hidden 768, 12 heads, "sdpa" attention)
on (N, 128) token ids, explained at the word embeddings. Rows: ``floor`` (one forward + ``autograd.grad`` of the
target score w.r.t. the input, or w.r.t. the word embeddings' output for BERT: the least any backward-pass method
can cost), hookviz ``LRP("attn-lrp")`` and ``LRP("cp-lrp")`` (``-eps0``: with lxt's rules, no stabilizers;
``-eps0-dense``: the same with the output layer's backward product taken whole, as lxt takes it), and ``lxt`` where
lxt 2.1 can explain the model (it
cannot here: it has no map for timm's ViT, and its BERT is a copy of transformers 4's modelling file, which does
not import under transformers 5; the row then says why). The rows of a model are timed round-robin, ``--repeats``
times, median in ms; peak memory of one call in a fresh process per row (peak RSS above the resident memory just
before the call, as in ``bench_peers.py``), and the live-heap peak of a second call in that process (glibc's
``mallinfo2``: bytes allocated, read after every aten operation, above those allocated before the call): what the
tensors need, without the heap glibc grows and keeps in a fresh process (the floor's first-call RSS is nearly twice its
live peak). Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import _reset_peak_kib, _status_kib  # noqa: E402

import hookviz as hv  # noqa: E402
from hookviz.methods.lrp import composite as composite_of  # noqa: E402

# "-eps0": the same composite with epsilon 0 and stabilizer 0, the rules lxt applies (it divides unstabilised),
# which hookviz runs in gradient-times-input form (one plain backward pass)
# "-dense": "-eps0" with the output layer's backward product taken whole, over every row and column of its gradient,
# as lxt and the floor take it (hookviz takes it over the rows and columns a target reaches, `output_rows`): the same
# work as lxt's, for the comparison of the rules' own cost. Models without declared output embeddings: as "-eps0".
ROWS = (
    "floor", "hookviz-attn-lrp", "hookviz-cp-lrp", "hookviz-attn-lrp-eps0", "hookviz-cp-lrp-eps0",
    "hookviz-attn-lrp-eps0-dense", "hookviz-cp-lrp-eps0-dense", "lxt-attn-lrp", "lxt-cp-lrp",
)  # fmt: skip
TARGET = 1
LAYER = {"bert_base": "bert.embeddings.word_embeddings", "llama": "model.embed_tokens"}
TOKENS = ("bert_base", "llama")


def _score(name: str, out: Any) -> torch.Tensor:
    """The explained score per sample: logit TARGET, at the last position for the language model."""
    if name == "llama":
        return out.logits[:, -1, TARGET]
    return (out.logits if hasattr(out, "logits") else out)[:, TARGET]


def _lxt_patches() -> types.ModuleType:
    """lxt 2.1's patches module, entered without lxt.efficient's __init__ (it imports lxt's BERT copy, written for
    transformers 4, which does not import under transformers 5), as tests/test_attnlrp.py does."""
    import lxt

    base = os.path.join(os.path.dirname(lxt.__file__), "efficient")
    for name, path in (("lxt.efficient", base), ("lxt.efficient.models", os.path.join(base, "models"))):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [path]
            sys.modules[name] = pkg
    import lxt.efficient.patches as patches

    return patches


def _bind(module: nn.Module, fn: Callable, keep_original: bool = False) -> None:
    # lxt patches the classes (every instance in the process); bound to this copy's instances instead, so the
    # floor and hookviz rows run the unpatched model in the same process, round-robin
    if keep_original:
        module.original_forward = module.forward
    module.forward = types.MethodType(fn, module)


def lxt_model(name: str, model: nn.Module, variant: str) -> nn.Module:
    """A copy of `model` with lxt 2.1's rules for `variant` ("attn-lrp" or "cp-lrp"): its maps for LLaMA
    (lxt.efficient.models.llama) and torchvision's ViT (vit_torch, CP-LRP only), applied to this copy's modules."""
    p = _lxt_patches()
    attn = variant == "attn-lrp"
    lxt = copy.deepcopy(model)
    if name == "llama":
        import transformers as tf
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import sdpa_mask
        from transformers.models.llama import modeling_llama as ml

        # lxt's patch_attention wraps every function of transformers' attention registry (and replaces the registry by
        # a plain dict, which transformers 5 cannot use): its wrapper around sdpa is registered under a name of its own
        key = f"lxt_{variant}_sdpa"
        wrap = p.wrap_attention_forward if attn else p.cp_wrap_attention_forward
        tf.AttentionInterface.register(key, wrap(sdpa_attention_forward))
        tf.AttentionMaskInterface.register(key, sdpa_mask)
        lxt.set_attn_implementation(key)
        for m in lxt.modules():
            if isinstance(m, ml.LlamaRMSNorm):
                _bind(m, p.rms_norm_forward)
            elif isinstance(m, ml.LlamaMLP):
                _bind(m, p.gated_mlp_forward if attn else p.cp_gated_mlp_forward)
        return lxt
    if name == "vit_b_16" and not attn:
        for m in lxt.modules():
            if isinstance(m, nn.GELU):
                _bind(m, p.non_linear_forward, keep_original=True)
            elif isinstance(m, nn.LayerNorm):
                _bind(m, p.layer_norm_forward)
            elif isinstance(m, nn.MultiheadAttention):
                _bind(m, p.cp_multi_head_attention_forward, keep_original=True)
        return lxt
    raise RuntimeError(
        {
            "vit_small": "lxt 2.1 has no map for timm's VisionTransformer",
            "bert_base": "lxt 2.1's BERT (a copy of transformers 4's modeling_bert) does not import under "
            "transformers 5",
            "vit_b_16": "lxt 2.1's torchvision ViT map is CP-LRP only",
        }[name]
    )


def lxt_fn(name: str, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """lxt's relevance: gradient x input of the score (at the embeddings' output for token models)."""
    if name in TOKENS:
        emb = model.get_input_embeddings()

        def run_tokens(ids: torch.Tensor) -> torch.Tensor:
            e = emb(ids).detach().requires_grad_(True)
            (g,) = torch.autograd.grad(_score(name, model(inputs_embeds=e)).sum(), e)
            return e.detach() * g

        return run_tokens

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(_score(name, model(x)).sum(), x)
        return x.detach() * g

    return run


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "vit_small":
        import timm

        model = timm.create_model("vit_small_patch16_224", pretrained=False)
    elif name == "vit_b_16":
        import torchvision

        model = torchvision.models.vit_b_16(weights=None)
        nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts the head at zero (a zero output)
    elif name == "llama":
        import transformers as tf

        cfg = tf.LlamaConfig(
            vocab_size=32000, hidden_size=768, num_hidden_layers=6, num_attention_heads=12, num_key_value_heads=12,
            intermediate_size=2048, max_position_embeddings=512,
        )  # fmt: skip
        model = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    else:
        import transformers as tf

        cfg = tf.BertConfig(num_labels=2)  # bert-base: 12 layers, hidden 768, 12 heads, 3072 intermediate
        model = tf.BertForSequenceClassification._from_config(cfg, attn_implementation="sdpa")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def make_input(name: str, batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if name in ("vit_small", "vit_b_16"):
        return torch.randn(batch, 3, 224, 224, generator=g)
    return torch.randint(1000, 30000, (batch, 128), generator=g)


def build(row: str, name: str, model: nn.Module) -> Callable[[torch.Tensor], Any]:
    layer = LAYER.get(name)
    if row == "floor":
        if layer is None:

            def floor(x: torch.Tensor) -> Any:
                x = x.detach().requires_grad_(True)
                return torch.autograd.grad(_score(name, model(x)).sum(), x)[0]

            return floor
        emb = model.get_input_embeddings()

        def floor_tokens(ids: torch.Tensor) -> Any:
            e = emb(ids).detach().requires_grad_(True)
            return torch.autograd.grad(_score(name, model(inputs_embeds=e)).sum(), e)[0]

        return floor_tokens
    if row.startswith("hookviz"):
        variant = row.removeprefix("hookviz-").removesuffix("-dense").removesuffix("-eps0")
        comp = composite_of(variant, epsilon=0.0, stabilizer=0.0) if "-eps0" in row else variant
        lrp = hv.LRP(model, comp, layer=layer)
        target = (lambda out: _score(name, out)) if name == "llama" else TARGET
        if row.endswith("-dense"):

            def dense(x: torch.Tensor) -> Any:
                with _whole_output_product():
                    return lrp.attribute(x, target)

            return dense
        return lambda x: lrp.attribute(x, target)
    return lxt_fn(name, lxt_model(name, model, row.removeprefix("lxt-")))


def output_layer_of(model: nn.Module) -> nn.Module | None:
    """The layer hookviz's output-layer rule acts on (`output_rows.output_layer`), None if the model has none."""
    from hookviz.methods.lrp.output_rows import output_layer

    return output_layer(model)


@contextlib.contextmanager
def _whole_output_product() -> Iterator[None]:
    """hookviz's gradient form without its output-layer rule (`output_rows`) for the block: the head's backward
    product over all rows and columns, as lxt's and the floor's plain autograd take it (a benchmark switch)."""
    import hookviz.methods.lrp.gradient_form as gf

    real = gf.output_layer
    gf.output_layer = lambda model: None
    try:
        yield
    finally:
        gf.output_layer = real


def agreement(name: str, model: nn.Module, x: torch.Tensor, variant: str) -> dict[str, float]:
    """max |hookviz - lxt| / max |lxt| of the two maps for `variant`, with the rules lxt uses (no epsilon, no
    stabilizer on the sums: lxt divides by activations unstabilised); "frozen" on `model` as timed (parameters
    frozen), "grad" on a copy whose parameters require a gradient (as in tests/test_attnlrp.py)."""
    target = (lambda out: _score(name, out)) if name == "llama" else TARGET
    comp = composite_of(variant, epsilon=0.0, stabilizer=0.0)
    out = {}
    for how in ("frozen", "grad"):
        m = model
        if how == "grad":
            m = copy.deepcopy(model)
            for p in m.parameters():
                p.requires_grad_(True)
        lxt = lxt_fn(name, lxt_model(name, m, variant))(x)
        ours = hv.LRP(m, comp, layer=LAYER.get(name)).attribute(x, target)
        out[how] = float((ours - lxt).abs().max() / lxt.abs().max())
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


def _heap_reader() -> Callable[[], int] | None:
    """Bytes allocated now (glibc: the heap's chunks in use plus mmapped ones); None off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None

    def read() -> int:
        m = libc.mallinfo2()
        return int(m.uordblks + m.hblkhd)

    return read


def live_peak_mib(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> float | None:
    """Peak of the bytes allocated during ``fn(x)`` above those allocated before, read after every aten operation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    read = _heap_reader()
    if read is None:
        return None

    class Peak(TorchDispatchMode):
        top = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            Peak.top = max(Peak.top, read())
            return out

    start = read()
    Peak.top = start
    with Peak():
        fn(x)
    return (Peak.top - start) / 2**20


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model = make_model(args.child_model)
    fn = build(args.child_row, args.child_model, model)
    x = make_input(args.child_model, args.batch)
    before = _reset_peak_kib()
    fn(x)
    rss = max(0.0, (_status_kib("VmHWM") - before) / 1024)
    print(json.dumps({"peak_mib": rss, "live_peak_mib": live_peak_mib(fn, x)}))


def peak(row: str, model: str, args: argparse.Namespace) -> dict[str, float | None] | None:
    cmd = [sys.executable, __file__, "--child-row", row, "--child-model", model, "--batch", str(args.batch),
           "--threads", str(args.threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"memory run failed for {row} {model}: {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vit_small", "bert_base"],
                    choices=["vit_small", "bert_base", "llama", "vit_b_16"])  # fmt: skip
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS, help="rows to time (the floor always)")
    ap.add_argument("--out", default="benchmarks/results/attnlrp-cpu")
    ap.add_argument("--child-row", help=argparse.SUPPRESS)
    ap.add_argument("--child-model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_row:
        child(args)
        return
    torch.set_num_threads(args.threads)
    results = []
    for name in args.models:
        model = make_model(name)
        x = make_input(name, args.batch)
        fns: dict[str, Callable[[torch.Tensor], Any]] = {}
        rows = [r for r in ROWS if r == "floor" or r in args.rows]  # the table's order; the floor for the ratios
        for row in rows:  # warm-up; a row that cannot explain the model gets a note, not a time
            try:
                fn = build(row, name, model)
                fn(x)
                fns[row] = fn
            except Exception as exc:  # noqa: BLE001 - reported in the table
                why = f"{type(exc).__name__}: {str(exc)[:120]}"
                results.append({"model": name, "row": row, "ms": None, "x_floor": None, "peak_mib": None,
                                "mem_x_floor": None, "error": why})  # fmt: skip
                print(f"{name:10s} {row:18s} fails: {why}", flush=True)
        times: dict[str, list[float]] = {row: [] for row in fns}
        for _ in range(args.repeats):
            for row, fn in fns.items():
                t = time.perf_counter()
                fn(x)
                times[row].append((time.perf_counter() - t) * 1000)
        floor = statistics.median(times["floor"])
        agree = {row: agreement(name, model, x, row.removeprefix("lxt-")) for row in fns if row.startswith("lxt")}
        for row, d in agree.items():
            print(f"{name:10s} {row:18s} max |hookviz - lxt| / max |lxt| = {d}", flush=True)
        mems = {row: (None if args.no_memory else peak(row, name, args)) for row in fns}
        for row in fns:
            med = statistics.median(times[row])
            m, m_floor = mems[row] or {}, mems["floor"] or {}
            mem, mem_floor = m.get("peak_mib"), m_floor.get("peak_mib")
            live, live_floor = m.get("live_peak_mib"), m_floor.get("live_peak_mib")
            ratio = None if mem is None or not mem_floor else mem / mem_floor
            live_ratio = None if live is None or not live_floor else live / live_floor
            results.append({"model": name, "row": row, "ms": med, "x_floor": med / floor, "peak_mib": mem,
                            "mem_x_floor": ratio, "live_peak_mib": live, "live_x_floor": live_ratio,
                            "vs_lxt": agree.get(row), "times": times[row]})  # fmt: skip
            print(f"{name:10s} {row:18s} {med:9.1f} ms  {med / floor:5.2f}x floor  peak {mem} MiB  live {live} MiB",
                  flush=True)  # fmt: skip
    meta = {"torch": torch.__version__, "threads": args.threads, "batch": args.batch, "repeats": args.repeats}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    lines = [
        f"AttnLRP / CP-LRP vs the gradient floor, CPU ({meta['threads']} thread(s)), N = {args.batch}, median of "
        f"{args.repeats}, torch {meta['torch']}; models {', '.join(args.models)}, random weights",
        "",
        "| model | row | ms | x floor | peak RSS MiB | RSS x floor | live heap MiB | live x floor "
        "| hookviz vs lxt: max rel. diff. (frozen / grad) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r["ms"] is None:
            lines.append(f"| {r['model']} | {r['row']} | fails: {r['error']} | - | - | - | - | - | - |")
            continue
        mem = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        mx = "-" if r["mem_x_floor"] is None else f"{r['mem_x_floor']:.2f}"
        live = "-" if r.get("live_peak_mib") is None else f"{r['live_peak_mib']:.0f}"
        lx = "-" if r.get("live_x_floor") is None else f"{r['live_x_floor']:.2f}"
        vs = "-" if r.get("vs_lxt") is None else f"{r['vs_lxt']['frozen']:.1e} / {r['vs_lxt']['grad']:.1e}"
        lines.append(
            f"| {r['model']} | {r['row']} | {r['ms']:.1f} | {r['x_floor']:.2f} | {mem} | {mx} | {live} | {lx} | {vs} |"
        )
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
