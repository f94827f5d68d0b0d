"""Attribution timings: how to batch K targets per input, and hookviz against captum, all in one run.

Usage::

    python benchmarks/bench_attribution.py [--device cpu|cuda] [--repeats R] [--warmup W] [--out PATH]

Section 1 (K targets per input; torchvision resnet18, weights=None, seed 0, eval, N=4, 64x64, K in {1, 4, 16}),
for GuidedBackprop and GradCAM(layer="layer4"):

- ``vmap``: one forward, one vectorized backward over the K seeds (``backward="vmap"``, an (N, K) target);
- ``loop``: one forward, K backward passes over the retained graph (``backward="loop"``, an (N, K) target);
- ``K calls``: K hookviz calls, one per target column (K forwards and K backwards of N);
- ``repeat batch``: ``x.repeat_interleave(K, 0)`` with a 1-D target of N*K (one forward and backward of N*K).

Section 2 (hookviz against captum; resnet18 and vgg11, N=8, 64x64, K=1): GuidedBackprop, GradCAM /
LayerGradCam(relu_attributions=True), Saliency / Saliency(abs=False). captum gets a deep copy of the model with
every in-place ReLU switched off (its module backward hooks need that); hookviz and the floor use the model as built.

The floor is a plain ``model(x)`` forward plus ``torch.autograd.grad`` of the summed target scores w.r.t. the input,
with no hooks, timed in every comparison group. Every row is warmed up, then the rows of one group are timed
round-robin (so drift hits them alike) with ``time.perf_counter``, synchronizing the device before each clock read;
the median of the repeats is reported with min and max. Peak memory (``torch.cuda.max_memory_allocated`` above the
allocation before the call) is measured on cuda only. Before timing, the outputs compared are checked against each
other.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import Tensor, nn

import hookviz as hv

try:
    import captum
    from captum.attr import GuidedBackprop as CaptumGuidedBackprop
    from captum.attr import LayerGradCam as CaptumLayerGradCam
    from captum.attr import Saliency as CaptumSaliency
except ImportError:  # section 2 is skipped without captum
    captum = None

# captum warns on every call that it set requires_grad on the input and placed ReLU backward hooks
warnings.filterwarnings("ignore", category=UserWarning, module=r"captum\.")

SEED = 0
SIZE = 64
K_VALUES = (1, 4, 16)
N_TARGETS = 4
N_CAPTUM = 8
FLOOR = "floor (K=1)"
CAM_LAYERS = {"resnet18": "layer4", "vgg11": "features.19"}  # features.19: the last ReLU of vgg11.features


# -- timing ---------------------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call of `fn`, the device synchronized before both clock reads."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - start) * 1e3


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak memory allocated during one call above what was allocated before it (cuda only; None elsewhere)."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return peak / 2**20


def run_group(rows: dict[str, Callable[[], Any]], device: torch.device, warmup: int, repeats: int) -> dict[str, dict]:
    """Warm up every row, then time the rows round-robin `repeats` times; median/min/max ms per row."""
    for fn in rows.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeats):
        for name, fn in rows.items():
            times[name].append(timed(fn, device))
    out = {}
    for name, fn in rows.items():
        t = times[name]
        out[name] = {
            "median_ms": statistics.median(t),
            "min_ms": min(t),
            "max_ms": max(t),
            "times_ms": [round(v, 3) for v in t],
            "peak_mib": peak_mib(fn, device),
        }
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def git_state() -> dict[str, Any]:
    """Commit of the checkout and the hookviz files changed since (the package is measured as it is on disk)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = [line.split(maxsplit=1)[-1] for line in git("status", "--porcelain", "--", "hookviz").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "hookviz_uncommitted": changed}


def loadavg() -> str:
    """The 1-minute load average: above the torch thread count, other processes share the cores and timings swell."""
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


# -- models and inputs ----------------------------------------------------------------------------------------------
def build(name: str, device: torch.device) -> nn.Module:
    torch.manual_seed(SEED)
    return getattr(torchvision.models, name)(weights=None).eval().to(device)


def without_inplace(model: nn.Module) -> nn.Module:
    clone = copy.deepcopy(model)
    for m in clone.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    return clone


def inputs(n: int, device: torch.device) -> Tensor:
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(n, 3, SIZE, SIZE, generator=g).to(device)


def class_targets(n: int, k: int, device: torch.device) -> Tensor:
    """(n, k) distinct classes per row."""
    g = torch.Generator().manual_seed(SEED + 1)
    return torch.stack([torch.randperm(1000, generator=g)[:k] for _ in range(n)]).to(device)


def floor_fn(model: nn.Module, x: Tensor, target: Tensor) -> Callable[[], Tensor]:
    """Plain forward + input gradient of the summed target scores; no hooks, no hookviz."""

    def fn() -> Tensor:
        inp = x.detach().requires_grad_(True)
        scores = model(inp).gather(1, target.view(-1, 1))
        (grad,) = torch.autograd.grad(scores.sum(), inp)
        return grad

    return fn


# -- section 1: K targets per input ---------------------------------------------------------------------------------
def k_schemes(make: Callable[..., hv.Attribution], x: Tensor, t: Tensor) -> dict[str, Callable[[], Tensor]]:
    n, k = t.shape
    vmap, loop, plain = make(backward="vmap"), make(backward="loop"), make()

    def separate() -> Tensor:
        return torch.stack([plain.attribute(x, target=t[:, j]) for j in range(k)], dim=1)

    def repeat() -> Tensor:
        out = plain.attribute(x.repeat_interleave(k, dim=0), target=t.reshape(-1))
        return out.reshape(n, k, *out.shape[1:])

    return {
        "vmap": lambda: vmap.attribute(x, target=t),
        "loop": lambda: loop.attribute(x, target=t),
        "K calls": separate,
        "repeat batch": repeat,
    }


def section_k(device: torch.device, warmup: int, repeats: int, ks: tuple[int, ...]) -> list[dict]:
    model = build("resnet18", device)
    x = inputs(N_TARGETS, device)
    makers: dict[str, Callable[..., hv.Attribution]] = {
        "GuidedBackprop": lambda **kw: hv.GuidedBackprop(model, **kw),
        "GradCAM": lambda **kw: hv.GradCAM(model, layer="layer4", **kw),
    }
    rows: list[dict] = []
    floor = floor_fn(model, x, class_targets(N_TARGETS, 1, device)[:, 0])
    for method, make in makers.items():
        for k in ks:
            t = class_targets(N_TARGETS, k, device)
            schemes = k_schemes(make, x, t)
            ref = schemes["loop"]()
            checks = {name: max_diff(fn(), ref) for name, fn in schemes.items()}
            # the floor is timed in every group, round-robin with the schemes, so ratios share the machine's state
            res = run_group({FLOOR: floor, **schemes}, device, warmup, repeats)
            floor_ms = res[FLOOR]["median_ms"]
            best = min(r["median_ms"] for name, r in res.items() if name != FLOOR)
            for name, r in res.items():
                row = {
                    "section": "k_targets",
                    "model": "resnet18",
                    "method": method,
                    "scheme": name,
                    "K": k,
                    "N": N_TARGETS,
                    **r,
                    "x_floor": r["median_ms"] / floor_ms,
                }
                if name != FLOOR:
                    row.update(x_best=r["median_ms"] / best, max_abs_diff_vs_loop=checks[name])
                rows.append(row)
            summary = ", ".join(f"{name} {r['median_ms']:.1f}" for name, r in res.items())
            print(f"  {method} K={k}: {summary} ms", flush=True)
    return rows


# -- section 2: against captum --------------------------------------------------------------------------------------
def captum_pairs(model: nn.Module, cmodel: nn.Module, layer: str, x: Tensor, t: Tensor) -> dict[str, tuple]:
    """method -> (hookviz call, captum call), on the same inputs and targets."""
    clayer = dict(cmodel.named_modules())[layer]
    hgb, cgb = hv.GuidedBackprop(model), CaptumGuidedBackprop(cmodel)
    hcam, ccam = hv.GradCAM(model, layer=layer), CaptumLayerGradCam(cmodel, clayer)
    hsal, csal = hv.Saliency(model), CaptumSaliency(cmodel)
    return {
        "GuidedBackprop": (lambda: hgb.attribute(x, target=t), lambda: cgb.attribute(x, target=t)),
        "GradCAM": (
            lambda: hcam.attribute(x, target=t),
            lambda: ccam.attribute(x, target=t, relu_attributions=True),
        ),
        "Saliency": (lambda: hsal.attribute(x, target=t), lambda: csal.attribute(x, target=t, abs=False)),
    }


def section_captum(device: torch.device, warmup: int, repeats: int) -> list[dict]:
    rows: list[dict] = []
    x = inputs(N_CAPTUM, device)
    t = class_targets(N_CAPTUM, 1, device)[:, 0]
    for model_name, layer in CAM_LAYERS.items():
        model = build(model_name, device)
        cmodel = without_inplace(model)
        pairs = captum_pairs(model, cmodel, layer, x, t)
        group: dict[str, Callable[[], Any]] = {
            "floor": floor_fn(model, x, t),
            "floor (no in-place ReLU copy)": floor_fn(cmodel, x, t),
        }
        checks = {}
        for method, (h, c) in pairs.items():
            group[f"hookviz {method}"] = h
            group[f"captum {method}"] = c
            checks[method] = max_diff(h(), c())
        res = run_group(group, device, warmup, repeats)
        floor_ms = res["floor"]["median_ms"]
        for name, r in res.items():
            row = {
                "section": "captum",
                "model": model_name,
                "library": "torch",
                "method": name,
                "K": 1,
                "N": N_CAPTUM,
                **r,
                "x_floor": r["median_ms"] / floor_ms,
            }
            lib, _, method = name.partition(" ")
            if lib in ("hookviz", "captum"):
                row.update(library=lib, method=method, max_abs_diff_hookviz_vs_captum=checks[method])
                if lib == "hookviz":
                    row["x_captum"] = r["median_ms"] / res[f"captum {method}"]["median_ms"]
            rows.append(row)
        summary = ", ".join(f"{name} {r['median_ms']:.1f}" for name, r in res.items())
        print(f"  {model_name}: {summary} ms", flush=True)
    return rows


# -- report ---------------------------------------------------------------------------------------------------------
def fmt_mem(r: dict) -> str:
    return "–" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f}"


def markdown(meta: dict, rows: list[dict]) -> str:
    dirty = meta["hookviz_uncommitted"]
    lines = [
        f"Device: {meta['device_name']}; torch {meta['torch']}, torchvision {meta['torchvision']}, "
        f"captum {meta['captum']}; {meta['cpu_count']} CPUs, {meta['torch_threads']} torch threads; "
        f"median of {meta['repeats']} repeats after {meta['warmup']} warm-up calls per row; times in ms; "
        f"load average {meta['loadavg_start']} at the start, {meta['loadavg_end']} at the end; hookviz at "
        f"{meta['commit']}{' with uncommitted changes to ' + ', '.join(dirty) if dirty else ''}.",
        "",
    ]
    k_rows = [r for r in rows if r["section"] == "k_targets"]
    if k_rows:
        lines += [
            f"**K targets per input** (resnet18, N={k_rows[0]['N']}, {SIZE}x{SIZE}). The floor (a plain forward + "
            "input gradient of one score per input, K=1, no hooks) is timed in every group, round-robin with the "
            "schemes; × floor is against that group's floor.",
            "",
            "| method | K | scheme | median | min | max | × floor | ms / target | × fastest at this K | peak MiB |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in k_rows:
            fastest = "" if r["scheme"] == FLOOR else f"{r['x_best']:.2f}"
            per_target = "" if r["scheme"] == FLOOR else f"{r['median_ms'] / r['K']:.1f}"
            lines.append(
                f"| {r['method']} | {r['K']} | {r['scheme']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | "
                f"{r['max_ms']:.1f} | {r['x_floor']:.2f} | {per_target} | {fastest} | {fmt_mem(r)} |"
            )
        lines.append("")
    c_rows = [r for r in rows if r["section"] == "captum"]
    if c_rows:
        n = c_rows[0]["N"]
        lines += [
            f"**hookviz vs captum** (N={n}, {SIZE}x{SIZE}, K=1; captum on a copy without in-place ReLUs). "
            "Cells: median (min–max) ms; × floor is against the plain forward + input gradient of the same model.",
            "",
            "| model | method | hookviz | captum | hookviz / captum | hookviz × floor | captum × floor | MiB h / c |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for model in dict.fromkeys(r["model"] for r in c_rows):
            mr = [r for r in c_rows if r["model"] == model]
            for r in mr:
                if r["library"] not in ("hookviz", "captum"):
                    lines.append(
                        f"| {model} | {r['method']} | {r['median_ms']:.1f} ({r['min_ms']:.1f}–{r['max_ms']:.1f}) "
                        f"| | | {r['x_floor']:.2f} | | {fmt_mem(r)} |"
                    )
            for h in (r for r in mr if r["library"] == "hookviz"):
                c = next(r for r in mr if r["library"] == "captum" and r["method"] == h["method"])
                lines.append(
                    f"| {model} | {h['method']} | {h['median_ms']:.1f} ({h['min_ms']:.1f}–{h['max_ms']:.1f}) | "
                    f"{c['median_ms']:.1f} ({c['min_ms']:.1f}–{c['max_ms']:.1f}) | {h['x_captum']:.2f} | "
                    f"{h['x_floor']:.2f} | {c['x_floor']:.2f} | {fmt_mem(h)} / {fmt_mem(c)} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per row (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per row first (default 2)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(K_VALUES), help="K values of section 1")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--skip-captum", action="store_true", help="skip section 2")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/DEVICE.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = args.out or Path(__file__).parent / "results" / f"{device.type}.json"

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "captum": getattr(captum, "__version__", None),
        "hookviz": hv.__version__,
        **git_state(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "warmup": args.warmup,
        "image_size": SIZE,
        "seed": SEED,
    }
    meta["loadavg_start"] = loadavg()
    start = time.perf_counter()
    print(f"section 1: K targets per input (device {device})", flush=True)
    rows = section_k(device, args.warmup, args.repeats, tuple(args.ks))
    if captum is not None and not args.skip_captum:
        print("section 2: hookviz vs captum", flush=True)
        rows += section_captum(device, args.warmup, args.repeats)
    elif not args.skip_captum:
        print("section 2 skipped: captum is not installed", flush=True)
    meta["loadavg_end"] = loadavg()
    meta["total_s"] = round(time.perf_counter() - start, 1)

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    table = markdown(meta, rows)
    out.with_suffix(".md").write_text(table)
    print()
    print(table)
    noisy = [r for r in rows if r["max_ms"] > 2 * r["min_ms"]]
    if noisy:
        print(
            f"warning: {len(noisy)} row(s) have max > 2 x min (another process shared the cores?); the medians may "
            "be off, rerun on a quiet machine or with --threads 1",
            file=sys.stderr,
        )
    print(f"wrote {out} and {out.with_suffix('.md')} ({meta['total_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
