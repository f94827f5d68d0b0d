"""LRP's host time: hookviz against lxt and zennit on models too small to compute anything (issue 35, part 2).

    OMP_NUM_THREADS=1 python benchmarks/bench_lrp_host.py [--base REV] [--repeats 200] [--models llama cnn resnet]
        [--out benchmarks/results/lrp-host-cpu]

On a GPU the arithmetic of a small call takes microseconds and what a call costs is the Python that queues it: the
same Python runs on the CPU, where a model too small to compute anything shows it alone. Models (random weights,
eval mode, parameters frozen, seed 0, one thread):

- ``llama``: a 6-layer `LlamaForCausalLM` of hidden 48 (4 heads, intermediate 96, vocabulary 1000, "sdpa"), 32
  tokens, explained at ``embed_tokens`` for the next token's logit 1. Rows: hookviz ``attn-lrp`` and ``cp-lrp`` with
  their default stabilizers (1e-6), with lxt's rules (``-eps0``: epsilon and stabilizer 0) and with the sums' stabilizer
  alone (``-sums``: epsilon 0, stabilizer 1e-6: what turning the layer rules on costs), lxt 2.1's AttnLRP and
  CP-LRP (`bench_attnlrp.lxt_model`), the gradient floor, and the interception floor (`interception_floor`): the
  gradient floor run under what any rule engine that explains the user's model unmodified must place for the call (a
  ``TorchFunctionMode`` that passes every call on, a forward pre-hook and a forward hook on every module that do
  nothing), the least such an engine can cost where lxt rewrites the model's code once and then adds nothing.
- ``cnn``: two 3x3 convolutions (3 -> 8 -> 8 channels) with ReLUs, average pooling and a linear layer on 8x8 images.
  Rows: hookviz ``epsilon-plus-flat``, zennit's ``EpsilonPlusFlat`` (no canonizer needed), the floor.
- ``resnet``: torchvision's resnet18 on 16x16 images (a real layer count, 60 layers, still little compute): hookviz
  ``epsilon-plus-flat``, zennit's with ``ResNetCanonizer`` (`bench_rules.build`), the floor.

With ``--base REV`` the revision's ``hookviz/`` runs beside this checkout's (`bench_attnlrp_ab.extract`) as rows
``base-...``: before and after in one process. Every repeat runs each row once, in alternating order; process time
(`time.process_time`: the time this process computed, not time it waited for a core on a shared machine); per row
the median, and the median of the paired differences against lxt / zennit. Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attnlrp as attn  # noqa: E402
import bench_attnlrp_ab as ab  # noqa: E402
import bench_rules as rules  # noqa: E402

TOKENS = 32


def tiny_llama() -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=1000, hidden_size=48, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=96, max_position_embeddings=64,
    )  # fmt: skip
    return _frozen(tf.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa"))


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return _frozen(
        nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )  # fmt: skip
    )


class _PassOn(TorchFunctionMode):
    """A function mode that passes every call on unchanged: the cost of seeing each call, nothing else."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def interception_floor(model: nn.Module, floor: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    """`floor` with the interception any run-time rule engine needs for one call: a pass-on function mode and a no-op
    forward pre-hook and forward hook on every module, placed before the call and removed after it."""

    def pre(module: nn.Module, args: Any) -> None:
        return None

    def post(module: nn.Module, args: Any, out: Any) -> None:
        return None

    def call(x: torch.Tensor) -> Any:
        handles = []
        for m in model.modules():
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        try:
            with _PassOn():
                return floor(x)
        finally:
            for h in handles:
                h.remove()

    return call


def _frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def llama_rows(packages: dict[str, str]) -> tuple[nn.Module, torch.Tensor, dict[str, Callable[[torch.Tensor], Any]]]:
    model = tiny_llama()
    x = torch.randint(1, 1000, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    fns: dict[str, Callable[[torch.Tensor], Any]] = {"floor": attn.build("floor", "llama", model)}
    fns["interception-floor"] = interception_floor(model, fns["floor"])

    def target(out: Any) -> torch.Tensor:
        return attn._score("llama", out)

    for prefix, package in packages.items():
        hv = importlib.import_module(package)
        composite = importlib.import_module(f"{package}.methods.lrp").composite
        for variant in ("attn-lrp", "cp-lrp"):
            for suffix, comp in (
                ("", variant),
                ("-eps0", composite(variant, epsilon=0.0, stabilizer=0.0)),
                ("-sums", composite(variant, epsilon=0.0, stabilizer=1e-6)),
            ):
                lrp = hv.LRP(model, comp, layer=attn.LAYER["llama"])
                fns[f"{prefix}{variant}{suffix}"] = lambda x, lrp=lrp: lrp.attribute(x, target)
    for variant in ("attn-lrp", "cp-lrp"):
        fns[f"lxt-{variant}"] = attn.lxt_fn("llama", attn.lxt_model("llama", model, variant))
    return model, x, fns


def cnn_rows(
    name: str, packages: dict[str, str]
) -> tuple[nn.Module, torch.Tensor, dict[str, Callable[[torch.Tensor], Any]]]:
    if name == "cnn":
        model, size = tiny_cnn(), 8
    else:
        model, size = rules.make_model("resnet18"), 16
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    fns: dict[str, Callable[[torch.Tensor], Any]] = {"floor": rules.build("floor", name, model)}
    for prefix, package in packages.items():
        lrp = importlib.import_module(package).LRP(model, "epsilon-plus-flat")
        fns[f"{prefix}epsilon-plus-flat"] = lambda x, lrp=lrp: lrp.attribute(x, 3)
    fns["zennit-epsilon-plus-flat"] = rules.build("zennit-lrp", "resnet18" if name == "resnet" else name, model)
    return model, x, fns


def time_rows(fns: dict[str, Callable[[torch.Tensor], Any]], x: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    for fn in fns.values():  # warm-up
        fn(x)
        fn(x)
    times: dict[str, list[float]] = {r: [] for r in fns}
    order = list(fns)
    for i in range(repeats):
        for row in order if i % 2 == 0 else order[::-1]:
            t0 = time.process_time()
            fns[row](x)
            times[row].append((time.process_time() - t0) * 1000)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a git revision whose hookviz runs beside this checkout's (rows base-...)")
    ap.add_argument("--models", nargs="+", default=["llama", "cnn", "resnet"], choices=["llama", "cnn", "resnet"])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results/lrp-host-cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"": "hookviz"}
        if args.base:
            ab.extract(args.base, Path(tmp))
            sys.path.insert(0, tmp)
            packages["base-"] = "hookviz_base"
        for name in args.models:
            _, x, fns = llama_rows(packages) if name == "llama" else cnn_rows(name, packages)
            times = time_rows(fns, x, args.repeats)
            peer = {"llama": "lxt-{}", "cnn": "zennit-{}", "resnet": "zennit-{}"}[name]
            for row, ts in times.items():
                variant = row.removeprefix("base-").removesuffix("-eps0").removesuffix("-sums")
                other = peer.format(variant)
                paired = None
                if row.startswith(("base-", "attn", "cp", "epsilon")) and other in times:
                    paired = statistics.median(u - v for u, v in zip(ts, times[other], strict=True))
                results.append({"model": name, "row": row, "ms": statistics.median(ts), "peer": other,
                                "minus_peer_ms": paired})  # fmt: skip
                extra = "" if paired is None else f"  {paired:+.2f} ms vs {other}"
                print(f"{name:7s} {row:30s} {statistics.median(ts):8.2f} ms{extra}", flush=True)
    meta = {"torch": torch.__version__, "threads": 1, "repeats": args.repeats, "base": args.base, "tokens": TOKENS}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    lines = [
        f"LRP host time per call on tiny models, CPU, one thread, process time, median of {args.repeats} round-robin "
        f"(torch {meta['torch']}; base: {args.base or '-'})",
        "",
        "| model | row | ms | row - peer (paired median) |",
        "|---|---|---:|---:|",
    ]
    for r in results:
        diff = "" if r["minus_peer_ms"] is None else f"{r['minus_peer_ms']:+.2f} ms vs {r['peer']}"
        lines.append(f"| {r['model']} | {r['row']} | {r['ms']:.2f} | {diff} |")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
