"""Issue 35's GPU tables in one process: hookviz against the hand-written floor and against its peers (captum,
pytorch-grad-cam, zennit, lxt), with host synchronisations per call and peak memory; writes gpu-<device>.md / .json.

Usage::

    PYTHONPATH=. python3 benchmarks/bench_gpu.py --device cuda [--budget-s 210] [--out-dir DIR] [--tables ...]
    python benchmarks/bench_gpu.py --device cpu --smoke     # every table on tiny models: checks the script, no GPU

Tables, in this order (random weights, seed 0, eval mode; torchvision's resnet50 at 224x224 for the CNN rows):

- ``large``: batch 256, float32 with TF32 off (matmul and cuDNN): the floor, the CAM floor, hookviz Saliency,
  Guided Backprop, Input x Gradient and Grad-CAM (``layer4``), captum's four (on a copy without in-place ReLUs, as in
  ``bench_attribution.py``; ``LayerGradCam(relu_attributions=True)``), pytorch-grad-cam's ``GradCAM``;
- ``bf16``: the same hookviz rows and floors under ``torch.autocast(dtype=torch.bfloat16)``;
- ``batch1``: batch 1 with TF32 on and ``cudnn.benchmark`` (the notebook call): the floors, the z+ floor (one more
  convolution with the positive weights per convolution, ``bench_rules.py``), Saliency, Guided Backprop, Grad-CAM,
  LRP ``epsilon-plus-flat`` and zennit's ``EpsilonPlusFlat`` with its ``ResNetCanonizer``;
- ``lrp64``: the LRP rows of ``batch1`` at batch 64;
- ``llama``: AttnLRP and CP-LRP on a LLaMA (8 layers, hidden 1024, 16 heads, 8 KV heads, vocabulary 32,000, the
  other fields LlamaConfig's defaults: intermediate 11,008, ``--llama-intermediate``; sdpa; float32, TF32 off), at the
  token embeddings for the last position's logit 1, at 1,024 tokens x batch 1 and 256 x 8: the floor, lxt 2.1
  and hookviz with its default stabilizers and with lxt's rules (epsilon 0: ``-eps0``), rows built by
  ``bench_attnlrp.build``;
- ``vit``: timm ``vit_base_patch16_224`` at batch 64 (float32, TF32 off): the floor, AttnLRP, CP-LRP, GradientRollout;
- ``syncs``: host synchronisations of one call, counted as the warnings of ``torch.cuda.set_sync_debug_mode("warn")``
  (CUDA only), after a warm-up call: the floors and Saliency, Guided Backprop, Input x Gradient, Grad-CAM, LRP and
  zennit at batch 1, AttnLRP / CP-LRP / lxt on the LLaMA (256 tokens), AttnLRP and GradientRollout on the ViT (batch
  1), ``explain_generation`` with Input x Gradient and AttnLRP (a 2-layer GPT-2 of width 256, 2 prompts of 64 + 16
  forced tokens);
- ``ktargets``: K = 10 targets per input at N = 1, 8, 64, 128 (float32, TF32 off): the K floor (one forward, K
  backward passes over the retained graph), Saliency and Guided Backprop with ``backward="vmap"``, ``"loop"`` and
  ``"auto"``;
- ``gb-batch``: Guided Backprop against the floor at batch 32, 128 and 512 (float32, TF32 off);
- ``generation``: ``explain_generation`` (Input x Gradient, AttnLRP) on a GPT-2-small-sized model (12 x 768,
  vocabulary 50,257, ``bench_generation_floor.build``), 8 prompts of 256 + 64 forced tokens, against the floor by hand
  (one forward, one backward per forced token over the retained graph).

The floor is the hand-written forward and backward pass, no hooks: the input gradient of the summed target scores;
for Grad-CAM (the CAM floor) the backward stops at the layer. In each group (a table at one size) every row is called
``--warmup`` times (a row that raises is reported with its error and left out), the outputs of hookviz and of the peer
computing the same thing are compared (max |hookviz - peer| / max |peer|), then the rows are timed round-robin with
``time.perf_counter``, the device synchronized before each clock read; the median is reported with min and max, and
the peak memory of one more call (``torch.cuda.max_memory_allocated`` above the allocation before it; CUDA only).
Repeats: as many as the group's share of ``--budget-s`` allows, 3 to ``--repeats`` (fewer only once the whole budget
is spent; n in the table). A table that would start with too little of the budget left is skipped with a note, and
one that raises is stopped with a note; the results files are rewritten after every table, so a run cut short keeps
what it measured. Writes ``gpu-<device>.md`` and ``.json`` under ``--out-dir`` (default ``$OUT`` when set, else
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

START = time.perf_counter()  # the budget counts from here: imports and model builds included

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch import Tensor, nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attnlrp  # noqa: E402
import bench_generation_floor  # noqa: E402
import bench_rules  # noqa: E402
from bench_attribution import class_targets, cpu_name, floor_fn, git_state, loadavg, peak_mib, timed  # noqa: E402

import hookviz as hv  # noqa: E402

PEERS = {"captum": "captum", "zennit": "zennit", "lxt": "lxt", "pytorch-grad-cam": "grad-cam"}
CAM_LAYER = "layer4"
LRP_TARGET = 3  # bench_rules.build's target
MIN_REPEATS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class Sizes:
    """What the tables run on: the issue's sizes, or tiny ones for ``--smoke``."""

    cnn: str
    image: int
    large_batch: int
    lrp_batch: int
    k: int
    k_batches: tuple[int, ...]
    gb_batches: tuple[int, ...]
    llama: dict[str, int]
    llama_shapes: tuple[tuple[int, int], ...]  # (tokens, batch)
    vit: dict[str, int]
    vit_batch: int
    gen: dict[str, int]  # bench_generation_floor.build's arguments
    gen_prompts: int
    sync_gen: dict[str, int]
    sync_gen_prompts: int


FULL = Sizes(
    cnn="resnet50", image=224, large_batch=256, lrp_batch=64, k=10, k_batches=(1, 8, 64, 128),
    gb_batches=(32, 128, 512),
    llama=dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
               intermediate_size=11008, max_position_embeddings=2048),
    llama_shapes=((1024, 1), (256, 8)), vit={}, vit_batch=64,
    gen=dict(layers=12, width=768, heads=12, prompt=256, generated=64), gen_prompts=8,
    sync_gen=dict(layers=2, width=256, heads=4, prompt=64, generated=16), sync_gen_prompts=2,
)  # fmt: skip
SMOKE = Sizes(
    cnn="resnet18", image=32, large_batch=8, lrp_batch=4, k=3, k_batches=(1, 2), gb_batches=(2, 4),
    llama=dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, max_position_embeddings=64),
    llama_shapes=((32, 1), (16, 2)), vit=dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2),
    vit_batch=2, gen=dict(layers=2, width=64, heads=2, prompt=16, generated=4), gen_prompts=2,
    sync_gen=dict(layers=2, width=64, heads=2, prompt=8, generated=2), sync_gen_prompts=2,
)  # fmt: skip


# -- the run: settings, budget, results -----------------------------------------------------------------------------
@dataclass
class Row:
    """One contender of a group: `fn` makes one call; `floor` names the row its × floor is against, `peer` the row
    its × peer is against and whose output it is compared with (None: not compared)."""

    name: str
    fn: Callable[[], Any]
    floor: str | None = None
    peer: str | None = None


@dataclass
class Run:
    device: torch.device
    sizes: Sizes
    smoke: bool
    budget_s: float
    warmup: int
    repeats: int
    out: Path
    meta: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    syncs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    headings: dict[str, str] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    start: float = START  # the budget's clock: the process's start when run as a script

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def model(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    def release(self, *keep: str) -> None:
        """Drop the cached models but `keep` (their memory goes back to the allocator's cache)."""
        for key in [k for k in self.cache if k not in keep]:
            del self.cache[key]
        free(self.device)


def free(device: torch.device) -> None:
    gc.collect()  # the peers' model copies hold hooks that refer back to them
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


@contextlib.contextmanager
def precision(tf32: bool, benchmark: bool = False) -> Iterator[None]:
    """TF32 for float32 matmuls and convolutions, and cuDNN's autotuner, for the block (restored after)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark
    matmul.allow_tf32 = cudnn.allow_tf32 = tf32
    cudnn.benchmark = benchmark
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = saved


def bf16(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    def run() -> Any:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return fn()

    return run


def as_tensor(out: Any) -> Tensor | None:
    """The map of a call, for the comparison of hookviz with its peer (None when it is not a tensor)."""
    if isinstance(out, Tensor):
        return out.detach().float()
    if isinstance(out, list | tuple) and out and all(isinstance(t, Tensor) for t in out):
        return torch.stack([t.detach().float() for t in out])
    return None


def rel_diff(a: Tensor, b: Tensor) -> float | None:
    """max |a - b| / max |b|; None where the two are not maps of the same shape (nothing to compare)."""
    if a.numel() != b.numel() or a.device != b.device:
        return None
    return float((a.reshape(b.shape) - b).abs().max() / b.abs().max().clamp_min(1e-30))


def warm_up(run: Run, rows: list[Row], warmup: int) -> tuple[dict[str, Row], dict[str, float], dict[str, str]]:
    """Call every row `warmup` times: the rows that ran, the agreement of each with its peer (max |row - peer| /
    max |peer|, from the first calls' outputs) and the error of each row that raised."""
    compared = {r.peer for r in rows if r.peer} | {r.name for r in rows if r.peer}
    outputs: dict[str, Tensor | None] = {}
    live: dict[str, Row] = {}
    errors: dict[str, str] = {}
    for row in rows:
        try:
            for i in range(warmup):
                out = row.fn()
                if i == 0 and row.name in compared:
                    outputs[row.name] = as_tensor(out)
                del out
            live[row.name] = row
        except Exception as exc:  # noqa: BLE001 - a row that cannot run says why in the table
            errors[row.name] = describe(exc)
            free(run.device)
    diffs = {}
    for row in rows:
        a, b = outputs.get(row.name), outputs.get(row.peer or "")
        d = rel_diff(a, b) if a is not None and b is not None else None
        if d is not None:
            diffs[row.name] = d
    return live, diffs, errors


def measure(run: Run, table: str, group: str, rows: list[Row], allot_s: float, warmup: int | None = None) -> None:
    """Warm up, compare, time round-robin and take the peak memory of the rows of one group; appends to run.rows.

    Repeats: as many rounds as `allot_s` leaves after the warm-up, at least MIN_REPEATS and at most ``--repeats``,
    and never more than what is left of the run's budget (one at least)."""
    start = time.perf_counter()
    live, diffs, errors = warm_up(run, rows, run.warmup if warmup is None else warmup)
    times: dict[str, list[float]] = {name: [] for name in live}

    def one_round() -> float:
        t = time.perf_counter()
        for name, row in list(live.items()):
            try:
                times[name].append(timed(row.fn, run.device))
            except Exception as exc:  # noqa: BLE001
                errors[name] = describe(exc)
                del live[name]
                free(run.device)
        return max(time.perf_counter() - t, 1e-6)

    per_round = one_round()
    fits = int((allot_s - (time.perf_counter() - start)) / per_round) - 1  # less one round for the peak memory
    in_budget = int(run.left() / per_round) - 1
    repeats = max(1, min(max(min(MIN_REPEATS, run.repeats), 1 + fits), run.repeats, 1 + in_budget))
    for _ in range(repeats - 1):
        one_round()
    peaks: dict[str, float | None] = {}
    for name, row in live.items():
        try:
            peaks[name] = peak_mib(row.fn, run.device)
        except Exception as exc:  # noqa: BLE001
            errors.setdefault(name, f"peak memory call: {describe(exc)}")
    medians = {name: statistics.median(v) for name, v in times.items() if v and name in live}
    for row in rows:
        rec: dict[str, Any] = {"table": table, "group": group, "row": row.name, "floor": row.floor, "peer": row.peer}
        if row.name in medians:
            v = times[row.name]
            rec.update(median_ms=medians[row.name], min_ms=min(v), max_ms=max(v), repeats=len(v),
                       times_ms=[round(x, 3) for x in v], peak_mib=peaks.get(row.name))  # fmt: skip
            for key, other in (("x_floor", row.floor), ("x_peer", row.peer)):
                if other in medians:
                    rec[key] = medians[row.name] / medians[other]
        if row.name in diffs:
            rec["rel_diff_vs_peer"] = diffs[row.name]
        if row.name in errors:
            rec["error"] = errors[row.name]
        run.rows.append(rec)
    cells = [
        f"{r['row']} {r['median_ms']:.2f}" if "median_ms" in r else f"{r['row']} FAILED" for r in run.rows[-len(rows) :]
    ]
    took = time.perf_counter() - start
    print(f"  [{table}] {group}: {', '.join(cells)} ms ({repeats} repeats, {took:.1f} s)", flush=True)


def group_allots(allot: float, groups: Sequence[T]) -> Iterator[tuple[T, float]]:
    """Each group with its share of what is left of the table's `allot` seconds when it starts."""
    end = time.perf_counter() + allot
    for i, group in enumerate(groups):
        yield group, (end - time.perf_counter()) / (len(groups) - i)


def count_syncs(fn: Callable[[], Any], device: torch.device) -> tuple[int, list[str]]:
    """Host synchronisations of one call of `fn` (after a warm-up call) and where the first ones came from."""
    fn()
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)
    hits = [w for w in caught if "synchroniz" in str(w.message)]
    sites = Counter(f"{_short(w.filename)}:{w.lineno}" for w in hits)
    return len(hits), [f"{site} x{n}" for site, n in sites.most_common(4)]


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("hookviz", "benchmarks", "captum", "zennit", "lxt", "transformers", "torch"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor) :])
    return Path(path).name


# -- models and inputs ----------------------------------------------------------------------------------------------
def cnn(run: Run) -> nn.Module:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return torchvision.models.get_model(run.sizes.cnn, weights=None).eval().to(run.device)

    return run.model("cnn", build)


def images(n: int, run: Run, size: int | None = None) -> Tensor:
    size = size or run.sizes.image
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0)).to(run.device)


def frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def llama(run: Run) -> nn.Module:
    def build() -> nn.Module:
        import transformers as tf

        torch.manual_seed(0)
        cfg = tf.LlamaConfig(**run.sizes.llama)
        with torch.device(run.device):
            return frozen(tf.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa"))

    return run.model("llama", build)


def token_ids(batch: int, tokens: int, vocab: int, run: Run) -> Tensor:
    return torch.randint(1, vocab, (batch, tokens), generator=torch.Generator().manual_seed(0)).to(run.device)


def vit(run: Run) -> nn.Module:
    def build() -> nn.Module:
        import timm

        torch.manual_seed(0)
        return frozen(timm.create_model("vit_base_patch16_224", pretrained=False, **run.sizes.vit)).to(run.device)

    return run.model("vit", build)


def gpt2(run: Run, key: str, sizes: dict[str, int]) -> tuple[Any, Any, str, str]:
    def build() -> tuple[Any, Any, str, str]:
        model, tok, prompt, target = bench_generation_floor.build(argparse.Namespace(**sizes))
        return model.to(run.device), tok, prompt, target

    return run.model(key, build)


# -- floors and peers -----------------------------------------------------------------------------------------------
def cam_floor(model: nn.Module, x: Tensor, target: Tensor | int) -> Callable[[], Tensor]:
    """Grad-CAM by hand: the forward pass with the layer's output made a leaf, so the backward stops there."""
    layer = dict(model.named_modules())[CAM_LAYER]

    def fn() -> Tensor:
        taken: list[Tensor] = []

        def leaf(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
            taken.append(out.detach().requires_grad_(True))
            return taken[0]

        handle = layer.register_forward_hook(leaf)
        try:
            out = model(x)
        finally:
            handle.remove()
        rows = torch.arange(len(x), device=x.device)
        (grad,) = torch.autograd.grad(out[rows, target].sum(), taken[0])
        return torch.relu((grad.mean((2, 3), keepdim=True) * taken[0]).sum(1, keepdim=True))

    return fn


def k_floor(model: nn.Module, x: Tensor, target: Tensor) -> Callable[[], list[Tensor]]:
    """One forward, then one input gradient per target column over the retained graph."""

    def fn() -> list[Tensor]:
        inp = x.detach().requires_grad_(True)
        scores = model(inp).gather(1, target)
        k = target.shape[1]
        return [torch.autograd.grad(scores[:, j].sum(), inp, retain_graph=j < k - 1)[0] for j in range(k)]

    return fn


def zennit_lrp(model: nn.Module, x: Tensor, target: int) -> Callable[[], Tensor]:
    """zennit's EpsilonPlusFlat with its ResNet canonizer, seeded with the target's score (hookviz's convention; the
    same cost as a one-hot seed, so the maps compare)."""
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import ResNetCanonizer

    composite = EpsilonPlusFlat(canonizers=[ResNetCanonizer()])

    def seed(out: Tensor) -> Tensor:
        return out * (torch.arange(out.shape[1], device=out.device) == target)

    def fn() -> Tensor:
        with Gradient(model=model, composite=composite) as attributor:
            return attributor(x, seed)[1]

    return fn


def grad_cam_peer(model: nn.Module, x: Tensor, target: Tensor) -> Callable[[], Any]:
    """pytorch-grad-cam's GradCAM on its own copy of the model (it keeps hooks on it), one target per image."""
    import pytorch_grad_cam as pgc
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    own = copy.deepcopy(model)
    cam = pgc.GradCAM(model=own, target_layers=[dict(own.named_modules())[CAM_LAYER]])
    targets = [ClassifierOutputTarget(int(c)) for c in target.tolist()]
    return lambda: cam(input_tensor=x, targets=targets)


def gradient_rows(model: nn.Module, x: Tensor, t: Tensor, peers: bool) -> list[Row]:
    """The floors and hookviz's Saliency, Guided Backprop, Input x Gradient, Grad-CAM; with `peers`, captum's four and
    pytorch-grad-cam's Grad-CAM (each a row that fails alone when its library is missing)."""
    rows = [
        Row("floor", floor_fn(model, x, t), floor="floor"),
        Row("CAM floor", cam_floor(model, x, t), floor="CAM floor"),
    ]
    hv_rows = {
        "Saliency": lambda: hv.Saliency(model),
        "Guided Backprop": lambda: hv.GuidedBackprop(model),
        "Input x Gradient": lambda: hv.InputXGradient(model),
        "Grad-CAM": lambda: hv.GradCAM(model, layer=CAM_LAYER),
    }
    captum_rows: dict[str, Callable[[], Any]] = {}
    if peers:
        try:
            from bench_attribution import captum_pairs, without_inplace
            from captum.attr import InputXGradient as CaptumInputXGradient

            cmodel = without_inplace(model)
            pairs = captum_pairs(model, cmodel, CAM_LAYER, x, t)
            ixg = CaptumInputXGradient(cmodel)
            captum_rows = {
                "Saliency": pairs["Saliency"][1],
                "Guided Backprop": pairs["GuidedBackprop"][1],
                "Input x Gradient": lambda: ixg.attribute(x, target=t),
                "Grad-CAM": pairs["GradCAM"][1],
            }
        except Exception as exc:  # noqa: BLE001
            captum_rows = {name: failing(exc) for name in hv_rows}
    for name, make in hv_rows.items():
        method = make()
        peer = f"captum {name}" if peers else None
        floor = "CAM floor" if name == "Grad-CAM" else "floor"
        rows.append(Row(f"hookviz {name}", partial(method.attribute, x, t), floor=floor, peer=peer))
    for name, fn in captum_rows.items():
        rows.append(Row(f"captum {name}", fn, floor="CAM floor" if name == "Grad-CAM" else "floor"))
    if peers:
        rows.append(Row("pytorch-grad-cam Grad-CAM", guarded(partial(grad_cam_peer, model, x, t)), floor="CAM floor"))
    return rows


def failing(exc: BaseException) -> Callable[..., Any]:
    """A row's function that raises `exc` when called: a peer that could not be set up fails in its own row."""

    def fn(*args: Any) -> Any:
        raise exc

    return fn


def guarded(build: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - reported where the row is called
        return failing(exc)


def lrp_rows(model: nn.Module, x: Tensor) -> list[Row]:
    """The floor, the z+ floor, hookviz LRP epsilon-plus-flat (``bench_rules.build``) and zennit's EpsilonPlusFlat."""
    keys = {"floor": "floor", "z+ floor": "zplus-floor", "hookviz LRP": "hookviz-lrp"}
    rows = [Row(name, partial(bench_rules.build(key, "resnet", model), x), floor="floor") for name, key in keys.items()]
    rows[-1].peer = "zennit EpsilonPlusFlat"
    rows.append(Row("zennit EpsilonPlusFlat", guarded(partial(zennit_lrp, model, x, LRP_TARGET)), floor="floor"))
    return rows


# -- the tables -----------------------------------------------------------------------------------------------------
def table_large(run: Run, allot: float, autocast: bool = False) -> None:
    """The ``large`` table, or with `autocast` the ``bf16`` one (hookviz and the floors only)."""
    n, table = run.sizes.large_batch, "bf16" if autocast else "large"
    run.headings[table] = (
        f"**bf16 autocast** ({run.sizes.cnn}, batch {n}; every row, floors included, under "
        "`torch.autocast(dtype=torch.bfloat16)`)."
        if autocast
        else f"**Large batch** ({run.sizes.cnn}, {run.sizes.image}x{run.sizes.image}, batch {n}, float32 with TF32 "
        "off). × floor: against the floor (Grad-CAM: the CAM floor, whose backward stops at layer4); × peer: hookviz "
        "against captum's same method; agreement: max |hookviz - captum| / max |captum|."
    )
    x, t = images(n, run), class_targets(n, 1, run.device)[:, 0]
    rows = gradient_rows(cnn(run), x, t, peers=not autocast)
    for row in rows if autocast else ():
        row.fn = bf16(row.fn, run.device)
    with precision(tf32=False):
        measure(run, table, f"batch {n}{' bf16' if autocast else ''}", rows, allot)


def table_batch1(run: Run, allot: float) -> None:
    run.headings["batch1"] = (
        f"**Batch 1** ({run.sizes.cnn}, TF32 on, `cudnn.benchmark`), the notebook call; target class {LRP_TARGET}. "
        "The z+ floor: the floor plus one convolution with the positive weights per convolution (the least an exact "
        "z+ rule costs). Agreement: max |hookviz - zennit| / max |zennit| (zennit seeded with the target's score)."
    )
    model = cnn(run)
    x = images(1, run)
    t = torch.tensor([LRP_TARGET], device=run.device)
    rows = lrp_rows(model, x)  # floor, z+ floor, hookviz LRP, zennit
    rows[2:2] = [
        Row("CAM floor", cam_floor(model, x, t), floor="CAM floor"),
        Row("hookviz Saliency", partial(hv.Saliency(model).attribute, x, t), floor="floor"),
        Row("hookviz Guided Backprop", partial(hv.GuidedBackprop(model).attribute, x, t), floor="floor"),
        Row("hookviz Grad-CAM", partial(hv.GradCAM(model, layer=CAM_LAYER).attribute, x, t), floor="CAM floor"),
    ]
    with precision(tf32=True, benchmark=True):
        measure(run, "batch1", "batch 1", rows, allot)


def table_lrp64(run: Run, allot: float) -> None:
    n = run.sizes.lrp_batch
    run.headings["lrp64"] = f"**LRP at batch {n}** ({run.sizes.cnn}, TF32 on, `cudnn.benchmark`)."
    with precision(tf32=True, benchmark=True):
        measure(run, "lrp64", f"batch {n}", lrp_rows(cnn(run), images(n, run)), allot)


LLAMA_ROWS = {  # table row: bench_attnlrp.build's row
    "floor": "floor",
    "lxt AttnLRP": "lxt-attn-lrp",
    "hookviz AttnLRP (default stabilizers)": "hookviz-attn-lrp",
    "hookviz AttnLRP, lxt's rules (epsilon 0)": "hookviz-attn-lrp-eps0",
    "lxt CP-LRP": "lxt-cp-lrp",
    "hookviz CP-LRP (default)": "hookviz-cp-lrp",
    "hookviz CP-LRP, lxt's rules": "hookviz-cp-lrp-eps0",
}


def llama_fns(run: Run) -> dict[str, Callable[[Tensor], Any]]:
    """The LLaMA rows as functions of the token ids, built once (lxt's rows on their own copies of the model)."""

    def build() -> dict[str, Callable[[Tensor], Any]]:
        return {
            name: guarded(partial(bench_attnlrp.build, key, "llama", llama(run))) for name, key in LLAMA_ROWS.items()
        }

    return run.model("llama-rows", build)


def table_llama(run: Run, allot: float) -> None:
    cfg = run.sizes.llama
    run.headings["llama"] = (
        f"**AttnLRP / CP-LRP on a LLaMA** ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} KV heads, intermediate "
        f"{cfg['intermediate_size']}, vocabulary {cfg['vocab_size']}, sdpa, float32 with TF32 off), relevance at the "
        "token embeddings of the last position's logit 1. × peer: against lxt's same method; agreement: max |hookviz - "
        "lxt| / max |lxt| (the rows with lxt's rules compute lxt's maps; the default rows differ by their stabilizers)."
    )
    fns = llama_fns(run)
    peers = {"hookviz AttnLRP (default stabilizers)": "lxt AttnLRP", "hookviz CP-LRP (default)": "lxt CP-LRP"}
    peers |= {"hookviz AttnLRP, lxt's rules (epsilon 0)": "lxt AttnLRP", "hookviz CP-LRP, lxt's rules": "lxt CP-LRP"}
    with precision(tf32=False):
        for (tokens, batch), share in group_allots(allot, run.sizes.llama_shapes):
            ids = token_ids(batch, tokens, cfg["vocab_size"], run)
            rows = [Row(name, partial(fn, ids), floor="floor", peer=peers.get(name)) for name, fn in fns.items()]
            measure(run, "llama", f"{tokens} tokens x batch {batch}", rows, share)


def table_vit(run: Run, allot: float) -> None:
    n = run.sizes.vit_batch
    run.headings["vit"] = (
        f"**timm ViT-B/16** (`vit_base_patch16_224`{' at tiny sizes' if run.smoke else ''}, batch {n}, float32 with "
        "TF32 off), target class 1."
    )
    model = vit(run)
    x = images(n, run, run.sizes.vit.get("img_size", 224))
    keys = {"floor": "floor", "hookviz AttnLRP": "hookviz-attn-lrp", "hookviz CP-LRP": "hookviz-cp-lrp"}
    rows = [
        Row(name, partial(bench_attnlrp.build(key, "timm_vit", model), x), floor="floor") for name, key in keys.items()
    ]
    rows.append(Row("hookviz GradientRollout", partial(hv.GradientRollout(model).attribute, x, 1), floor="floor"))
    with precision(tf32=False):
        measure(run, "vit", f"batch {n}", rows, allot)


def sync_cases(run: Run) -> list[tuple[str, str, Callable[[], Any]]]:
    """(method, what it runs on, one call) for the synchronisation count."""
    cases: list[tuple[str, str, Callable[[], Any]]] = []
    model = cnn(run)
    x, t = images(1, run), torch.tensor([LRP_TARGET], device=run.device)
    on = f"{run.sizes.cnn} batch 1"
    cases += [
        ("floor", on, floor_fn(model, x, t)),
        ("CAM floor", on, cam_floor(model, x, t)),
        ("Saliency", on, partial(hv.Saliency(model).attribute, x, t)),
        ("Guided Backprop", on, partial(hv.GuidedBackprop(model).attribute, x, t)),
        ("Input x Gradient", on, partial(hv.InputXGradient(model).attribute, x, t)),
        ("Grad-CAM", on, partial(hv.GradCAM(model, layer=CAM_LAYER).attribute, x, t)),
        ("LRP epsilon-plus-flat", on, partial(hv.LRP(model).attribute, x, t)),
        ("zennit EpsilonPlusFlat", on, zennit_lrp(model, x, LRP_TARGET)),
    ]
    tokens = run.sizes.llama_shapes[-1][0]
    ids = token_ids(1, tokens, run.sizes.llama["vocab_size"], run)
    fns = llama_fns(run)
    on = f"LLaMA, {tokens} tokens"
    for name in ("floor", "hookviz AttnLRP (default stabilizers)", "hookviz CP-LRP (default)", "lxt AttnLRP"):
        cases.append(
            (name.replace(" (default stabilizers)", "").replace(" (default)", ""), on, partial(fns[name], ids))
        )
    v = vit(run)
    xv = images(1, run, run.sizes.vit.get("img_size", 224))
    on = "ViT-B/16 batch 1"
    cases += [
        ("AttnLRP", on, partial(hv.LRP(v, "attn-lrp").attribute, xv, 1)),
        ("GradientRollout", on, partial(hv.GradientRollout(v).attribute, xv, 1)),
    ]
    g = run.sizes.sync_gen
    model_g, tok, prompt, target = gpt2(run, "gpt2-sync", g)
    n = run.sizes.sync_gen_prompts
    on = f"GPT-2 {g['layers']}x{g['width']}, {n} prompts of {g['prompt']} + {g['generated']} tokens"
    for label, method in (("Input x Gradient", "input-x-gradient"), ("AttnLRP", "attn-lrp")):
        call = partial(hv.explain_generation, model_g, tok, [prompt] * n, target=[target] * n, method=method)
        cases.append((f"explain_generation, {label}", on, call))
    return cases


def table_syncs(run: Run, allot: float) -> None:
    run.headings["syncs"] = (
        '**Host synchronisations per call** (`torch.cuda.set_sync_debug_mode("warn")`, its warnings counted during '
        "one call after a warm-up call; TF32 on, `cudnn.benchmark`), with the lines that raised the most of them."
    )
    cuda = run.device.type == "cuda"
    with precision(tf32=True, benchmark=True):
        for method, on, fn in sync_cases(run):
            rec: dict[str, Any] = {"method": method, "on": on}
            try:
                if cuda:
                    rec["syncs"], rec["sites"] = count_syncs(fn, run.device)
                else:
                    fn()  # the call is checked; there is nothing to count without CUDA
                    rec["syncs"], rec["sites"] = None, []
            except Exception as exc:  # noqa: BLE001
                rec["error"] = describe(exc)
            run.syncs.append(rec)
            print(f"  [syncs] {method} ({on}): {rec.get('syncs', rec.get('error'))}", flush=True)


def table_ktargets(run: Run, allot: float) -> None:
    k = run.sizes.k
    run.headings["ktargets"] = (
        f"**K targets per input** ({run.sizes.cnn} {run.sizes.image}, K = {k} distinct classes per input, float32 "
        "with TF32 off). The K floor: one forward and K backward passes over the retained graph. × peer: against the "
        "same method's loop; agreement: max |row - loop| / max |loop|."
    )
    run.release("cnn")
    model = cnn(run)
    with precision(tf32=False):
        for n, share in group_allots(allot, run.sizes.k_batches):
            x, t = images(n, run), class_targets(n, k, run.device)
            rows = [Row("K floor", k_floor(model, x, t), floor="K floor")]
            for name, cls in (("Saliency", hv.Saliency), ("Guided Backprop", hv.GuidedBackprop)):
                for how in ("vmap", "loop", "auto"):
                    peer = None if how == "loop" else f"{name} loop"
                    fn = partial(cls(model, backward=how).attribute, x, t)
                    rows.append(Row(f"{name} {how}", fn, floor="K floor", peer=peer))
            measure(run, "ktargets", f"N = {n}", rows, share)
            free(run.device)


def table_gb_batch(run: Run, allot: float) -> None:
    run.headings["gb-batch"] = (
        f"**Guided Backprop against batch size** ({run.sizes.cnn} {run.sizes.image}, float32 with TF32 off)."
    )
    run.release("cnn")
    model = cnn(run)
    with precision(tf32=False):
        for n, share in group_allots(allot, run.sizes.gb_batches):
            x, t = images(n, run), class_targets(n, 1, run.device)[:, 0]
            gb = partial(hv.GuidedBackprop(model).attribute, x, t)
            rows = [
                Row("floor", floor_fn(model, x, t), floor="floor"),
                Row("hookviz Guided Backprop", gb, floor="floor"),
            ]
            measure(run, "gb-batch", f"batch {n}", rows, share)
            del x
            free(run.device)


def generation_floor(model: nn.Module, seq: Tensor, t_ids: Tensor) -> Callable[[], Tensor]:
    """One forward over prompt + forced tokens (the output layer on the forced positions only, as explain_generation
    runs it), then one backward pass to the token embeddings per forced token over the retained graph."""
    emb = model.get_input_embeddings()
    n, g = t_ids.shape
    rows, cols = torch.arange(n, device=seq.device)[:, None], torch.arange(g, device=seq.device)

    def fn() -> Tensor:
        e = emb(seq).detach().requires_grad_(True)
        logits = model(inputs_embeds=e, use_cache=False, logits_to_keep=g + 1).logits
        scores = logits[rows, cols, t_ids]  # (N, g): forced token k scored at the position before it
        grads = [torch.autograd.grad(scores[:, k].sum(), e, retain_graph=k < g - 1)[0] for k in range(g)]
        return torch.stack(grads, 1)

    return fn


def table_generation(run: Run, allot: float) -> None:
    g, n = run.sizes.gen, run.sizes.gen_prompts
    run.headings["generation"] = (
        f"**Generation** (GPT-2 {g['layers']} x {g['width']}, vocabulary 50,257, random weights; {n} prompts of "
        f"{g['prompt']} + {g['generated']} forced tokens, float32 with TF32 off). The floor: one forward, one "
        "backward per forced token to the token embeddings."
    )
    run.release("cnn")
    model, tok, prompt, target = gpt2(run, "gpt2", g)
    p_ids, t_ids = tok.encode(prompt), tok.encode(target, add_special_tokens=False)
    seq = torch.tensor([p_ids + t_ids] * n, device=run.device)
    forced = torch.tensor([t_ids] * n, device=run.device)
    rows = [Row("floor", generation_floor(model, seq, forced), floor="floor")]
    for label, method in (("Input x Gradient", "input-x-gradient"), ("AttnLRP", "attn-lrp")):
        call = partial(hv.explain_generation, model, tok, [prompt] * n, target=[target] * n, method=method)
        rows.append(Row(f"explain_generation {label}", partial(call, batch_size=n), floor="floor"))
    with precision(tf32=False):  # one warm-up call: each row takes seconds
        measure(run, "generation", f"{n} x ({g['prompt']} + {g['generated']})", rows, allot, warmup=1)


TABLES: dict[str, tuple[Callable[[Run, float], None], float]] = {  # name: (function, share of the budget)
    "large": (table_large, 20),
    "bf16": (partial(table_large, autocast=True), 4),
    "batch1": (table_batch1, 6),
    "lrp64": (table_lrp64, 5),
    "llama": (table_llama, 15),
    "vit": (table_vit, 6),
    "syncs": (table_syncs, 6),
    "ktargets": (table_ktargets, 25),
    "gb-batch": (table_gb_batch, 8),
    "generation": (table_generation, 25),
}


# -- report ---------------------------------------------------------------------------------------------------------
def _num(v: float | None, fmt: str = ".2f") -> str:
    return "" if v is None else format(v, fmt)


def markdown(run: Run) -> str:
    m = run.meta
    commit = m["commit"] or "a commit unknown here (no git checkout)"
    dirty = m["hookviz_uncommitted"]
    lines = [
        f"# bench_gpu: {m['device_name']}{' (smoke run: tiny models, not a measurement)' if run.smoke else ''}",
        "",
        f"Written by `{m['command']}` on {m['date']} in {m.get('total_s', '?')} s (budget {run.budget_s:.0f} s). "
        f"Device {m['device']} ({m['device_name']}); {m['versions']}; hookviz at {commit}"
        f"{' with uncommitted changes to ' + ', '.join(dirty) if dirty else ''}; {m['cpu_count']} CPUs, load average "
        f"{m['loadavg_start']} at the start. Random weights, seed 0. Times in ms: the median of the repeats (n) after "
        f"{run.warmup} warm-up call(s) per row (generation: 1), rows of a group timed round-robin; peak MiB: "
        "`torch.cuda.max_memory_allocated` during one call above the allocation before it (CUDA only).",
        "",
    ]
    for table in TABLES:
        recs = [r for r in run.rows if r["table"] == table]
        if table == "syncs" and run.syncs:
            lines += [run.headings["syncs"], "", "| method | on | synchronisations | where (most first) |",
                      "|---|---|---:|---|"]  # fmt: skip
            for s in run.syncs:
                if "error" in s:
                    cell = f"failed: {s['error']}"
                elif s["syncs"] is None:
                    cell = "CUDA only (ran once on the CPU, not counted)"
                else:
                    cell = str(s["syncs"])
                lines.append(f"| {s['method']} | {s['on']} | {cell} | {'; '.join(s.get('sites', []))} |")
            lines.append("")
        if not recs:
            continue
        lines += [run.headings.get(table, f"**{table}**"), ""]
        for group in dict.fromkeys(r["group"] for r in recs):
            lines += [f"*{group}*", "", "| row | ms | min–max | n | × floor | × peer | agreement | peak MiB |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
            for r in (r for r in recs if r["group"] == group):
                if "median_ms" not in r:
                    lines.append(f"| {r['row']} | failed: {r.get('error', '?')} | | | | | | |")
                    continue
                peer = f"{r['x_peer']:.2f} ({_peer_label(r['peer'])})" if "x_peer" in r else ""
                agree = _num(r.get("rel_diff_vs_peer"), ".1e")
                mem = "–" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f}"
                lines.append(
                    f"| {r['row']} | {r['median_ms']:.2f} | {r['min_ms']:.2f}–{r['max_ms']:.2f} | {r['repeats']} | "
                    f"{_num(r.get('x_floor'))} | {peer} | {agree} | {mem} |"
                )
                if "error" in r:
                    lines[-1] += f" {r['error']}"
            lines.append("")
    if run.notes:
        lines += ["**Notes**", ""] + [f"- {n}" for n in run.notes] + [""]
    return "\n".join(lines)


def _peer_label(peer: str) -> str:
    """ "captum Saliency" -> "captum", "Saliency loop" -> "loop": the word that tells the peer apart."""
    words = peer.split()
    return words[0] if words[0] in PEERS else words[-1]


def summary(run: Run) -> str:
    """The short table printed last."""
    out = [f"{'table':10s} {'group':24s} {'row':42s} {'ms':>9s} {'x floor':>8s} {'x peer':>7s}"]
    for r in run.rows:
        if "median_ms" in r:
            cells = f"{r['median_ms']:9.2f} {_num(r.get('x_floor')):>8s} {_num(r.get('x_peer')):>7s}"
        else:
            cells = f"failed: {r.get('error', '?')[:60]}"
        out.append(f"{r['table']:10s} {r['group'][:24]:24s} {r['row'][:42]:42s} {cells}")
    for s in run.syncs:
        cell = s.get("error") or ("CUDA only" if s["syncs"] is None else f"{s['syncs']} syncs")
        out.append(f"{'syncs':10s} {s['on'][:24]:24s} {s['method'][:42]:42s} {cell}")
    return "\n".join(out + [f"note: {n}" for n in run.notes])


def write(run: Run) -> tuple[Path, Path]:
    run.meta["total_s"] = round(time.perf_counter() - run.start, 1)
    run.out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", run.meta["device_name"].lower()).strip("-")
    stem = f"gpu-{'smoke-' if run.smoke else ''}{slug if run.device.type == 'cuda' else 'cpu'}"
    md, js = run.out / f"{stem}.md", run.out / f"{stem}.json"
    payload = {"meta": run.meta, "rows": run.rows, "syncs": run.syncs, "notes": run.notes}
    js.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    md.write_text(markdown(run))
    return md, js


def versions() -> str:
    parts = [f"torch {torch.__version__}", f"torchvision {torchvision.__version__}"]
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    for name, pkg in {"timm": "timm", "transformers": "transformers", **PEERS}.items():
        try:
            parts.append(f"{name} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    parser.add_argument("--smoke", action="store_true", help="tiny models and sizes: checks every table quickly")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the whole run from the start (default 210, 600 with --smoke)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per row at most (default 10, 1 smoke)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per row first (default 2, 1 smoke)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: 1 for a CPU smoke run)"
    )
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    what = "the LLaMA's MLP width (default 11008, LlamaConfig's: the issue does not name it)"
    parser.add_argument("--llama-intermediate", type=int, default=None, help=what)
    parser.add_argument("--out-dir", type=Path, default=None, help="default $OUT when set, else benchmarks/results")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    repeats = args.repeats or (1 if args.smoke else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 2)
    if repeats < 1 or warmup < 1:
        parser.error("--repeats and --warmup must be >= 1 (the first warm-up output is compared with the peer's)")
    out = args.out_dir or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).parent / "results")
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else f"main({argv})",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions(),
        **git_state(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": loadavg(),
        "table_s": {},
    }
    budget = args.budget_s if args.budget_s is not None else (600.0 if args.smoke else 210.0)
    sizes = SMOKE if args.smoke else FULL
    if args.llama_intermediate:
        sizes = dataclasses.replace(sizes, llama={**sizes.llama, "intermediate_size": args.llama_intermediate})
    run = Run(device, sizes, args.smoke, budget, warmup, repeats, out, meta)
    if argv is not None:  # called, not run as a script: the budget counts from now
        run.start = time.perf_counter()
    print(f"bench_gpu on {meta['device_name']} ({device}); {meta['versions']}; budget {budget:.0f} s", flush=True)
    threads = torch.get_num_threads()
    if args.threads or (args.smoke and device.type == "cpu"):
        torch.set_num_threads(args.threads or 1)  # the smoke run checks the script; one thread waits least for others
    meta["torch_threads"] = torch.get_num_threads()
    try:
        md, js = run_tables(run, [name for name in TABLES if name in args.tables])
    finally:
        torch.set_num_threads(threads)
    print()
    print(summary(run))
    print(f"wrote {md} and {js} ({run.meta['total_s']} s)")
    return 0


def run_tables(run: Run, chosen: list[str]) -> tuple[Path, Path]:
    """Each table in turn, with its share of what is left of the budget; the files rewritten after each."""
    for i, name in enumerate(chosen):
        fn, share = TABLES[name]
        left = run.left()
        need = 0.0 if run.smoke else 0.5 * share  # a table started with less than this would not finish in budget
        if left < need:
            run.notes.append(f"table {name} skipped: {max(left, 0):.0f} s of the {run.budget_s:.0f} s budget left")
            print(f"[{name}] skipped: budget", flush=True)
            continue
        allot = left * share / sum(TABLES[n][1] for n in chosen[i:])
        print(f"[{name}] ({left:.0f} s left, {allot:.0f} s for this table)", flush=True)
        t = time.perf_counter()
        try:
            fn(run, allot)
        except Exception as exc:  # noqa: BLE001 - the results file is still written, with the reason
            run.notes.append(f"table {name} stopped: {describe(exc)}")
            traceback.print_exc()
        run.meta["table_s"][name] = round(time.perf_counter() - t, 1)
        free(run.device)
        write(run)
    run.meta["loadavg_end"] = loadavg()
    return write(run)


if __name__ == "__main__":
    raise SystemExit(main())
