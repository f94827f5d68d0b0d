"""hookviz against the floor and against its peers (captum, pytorch-grad-cam, torch-cam, zennit); writes RESULTS.md.

Usage::

    python benchmarks/bench_peers.py [--device cpu|cuda] [--models resnet18 vgg11 densenet121] [--batches 1 8 32]
        [--methods saliency guided-backprop gradcam] [--k 10] [--size 224] [--repeats 5] [--no-memory]
        [--out benchmarks/RESULTS.md]

Every call explains K targets per input (classes 0..K-1 for every image) of a batch of N images at size x size, for
torchvision models with ``weights=None`` (seed 0) in eval mode. What each library is asked to do:

- Saliency (plain input gradient, no abs): hookviz ``Saliency`` with an (N, K) target (one forward, K batched
  backward passes); captum ``Saliency(abs=False)``, one call per target column; zennit ``Gradient`` with one-hot
  output gradients, one call per column; pytorch-grad-cam and torch-cam have no saliency (``–``).
- Guided Backprop: hookviz ``GuidedBackprop``; captum ``GuidedBackprop`` (on a copy with every in-place ReLU
  switched off: its module backward hooks need that); zennit ``Gradient`` with the ``GuidedBackprop`` composite;
  pytorch-grad-cam ``GuidedBackpropReLUModel``, which explains only image 0 of a batch, so it is called per image
  and per target (N*K calls); torch-cam has none.
- Grad-CAM (resnet18 ``layer4``, vgg11 ``features.19``, densenet121 ``features``): hookviz ``GradCAM``; captum
  ``LayerGradCam(relu_attributions=True)``; pytorch-grad-cam ``GradCAM`` with ``ClassifierOutputTarget``, one call
  per column (it also upsamples to the input and min-max normalizes on the CPU in numpy); torch-cam ``GradCAM``, one
  forward then one extractor call per column (``retain_graph``); zennit has none.
- floor: a plain forward and K ``torch.autograd.grad`` calls of the target scores w.r.t. the input over the retained
  graph, no hooks: what any gradient method must at least do.

Every library gets its own deep copy of the model (pytorch-grad-cam's Guided Backprop replaces the ReLU modules of
the model it is given; torch-cam keeps hooks on it while the extractor lives). Times: one warm-up call per row, then
the rows of a group (model, method, N) timed round-robin, ``--repeats`` times, median in ms. Peak memory of one call
is measured in a fresh process per row: on the CPU the peak RSS (``VmHWM``, reset just before the call) above the
resident memory just before it, on a GPU ``torch.cuda.max_memory_allocated`` above the allocation before the call.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import torchvision
from bench_attribution import cpu_name  # the same CPU label in both reports
from torch import nn

import hookviz as hv

warnings.filterwarnings("ignore")  # captum and pytorch-grad-cam warn on every call

LIBS = ["floor", "hookviz", "captum", "pytorch-grad-cam", "torch-cam", "zennit"]
PACKAGES = {"captum": "captum", "pytorch-grad-cam": "grad-cam", "torch-cam": "torchcam", "zennit": "zennit"}
CAM_LAYERS = {"resnet18": "layer4", "vgg11": "features.19", "densenet121": "features"}
METHOD_NAMES = {"saliency": "Saliency", "guided-backprop": "Guided Backprop", "gradcam": "Grad-CAM"}


def make_model(name: str, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.get_model(name, weights=None).eval().to(device)


def no_inplace(model: nn.Module) -> nn.Module:
    model = copy.deepcopy(model)
    for m in model.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    return model


def module(model: nn.Module, name: str) -> nn.Module:
    return dict(model.named_modules())[name]


def build(lib: str, method: str, model_name: str, model: nn.Module, k: int) -> Callable[[torch.Tensor], Any] | None:
    """A function x -> maps for K targets (classes 0..K-1) per image, or None where the library has no such method."""
    layer = CAM_LAYERS[model_name]
    cols = list(range(k))
    if lib == "floor":
        model = copy.deepcopy(model)  # frozen: no weight gradients, and the peers' copies keep theirs
        for p in model.parameters():
            p.requires_grad_(False)

        def floor(x: torch.Tensor) -> Any:
            x = x.detach().requires_grad_(True)
            out = model(x)
            return [torch.autograd.grad(out[:, c].sum(), x, retain_graph=c < k - 1)[0] for c in cols]

        return floor
    if lib == "hookviz":
        cls = {"saliency": hv.Saliency, "guided-backprop": hv.GuidedBackprop}.get(method)
        explainer = cls(model) if cls else hv.GradCAM(model, layer=layer)
        return lambda x: explainer.attribute(x, torch.tensor(cols, device=x.device).repeat(x.shape[0], 1))
    if lib == "captum":
        from captum import attr

        if method == "saliency":
            sal = attr.Saliency(model)
            return lambda x: [sal.attribute(x, target=c, abs=False) for c in cols]
        if method == "guided-backprop":
            gb = attr.GuidedBackprop(no_inplace(model))
            return lambda x: [gb.attribute(x, target=c) for c in cols]
        gc = attr.LayerGradCam(model, module(model, layer))
        return lambda x: [gc.attribute(x, target=c, relu_attributions=True) for c in cols]
    if lib == "pytorch-grad-cam":
        import pytorch_grad_cam as pgc
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        own = copy.deepcopy(model)
        device = next(own.parameters()).device
        if method == "gradcam":
            cam = pgc.GradCAM(model=own, target_layers=[module(own, layer)])
            return lambda x: [cam(input_tensor=x, targets=[ClassifierOutputTarget(c)] * x.shape[0]) for c in cols]
        if method == "guided-backprop":
            gbm = pgc.GuidedBackpropReLUModel(model=own, device=device)
            return lambda x: [gbm(x[i : i + 1].clone(), target_category=c) for i in range(x.shape[0]) for c in cols]
        return None
    if lib == "torch-cam":
        if method != "gradcam":
            return None
        from torchcam.methods import GradCAM as TorchCamGradCAM

        own = copy.deepcopy(model)
        extractor = TorchCamGradCAM(own, target_layer=layer)

        def torchcam(x: torch.Tensor) -> Any:
            out = own(x)
            return [extractor(class_idx=c, scores=out, retain_graph=c < k - 1) for c in cols]

        return torchcam
    if lib == "zennit":
        if method == "gradcam":
            return None
        from zennit.attribution import Gradient
        from zennit.composites import GuidedBackprop as ZennitGuidedBackprop

        composite = ZennitGuidedBackprop() if method == "guided-backprop" else None
        own = copy.deepcopy(model)
        eye = torch.eye(1000, device=next(own.parameters()).device)

        def zennit(x: torch.Tensor) -> Any:
            with Gradient(model=own, composite=composite) as attributor:
                return [attributor(x, eye[[c] * x.shape[0]])[1] for c in cols]

        return zennit
    raise ValueError(lib)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def inputs(n: int, size: int, device: torch.device) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)


def child(args: argparse.Namespace) -> None:
    """One call in this fresh process; prints its peak memory growth in MiB as JSON."""
    device = torch.device(args.device)
    model = make_model(args.models[0], device)
    fn = build(args.child, args.methods[0], args.models[0], model, args.k)
    x = inputs(args.batches[0], args.size, device)
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn(x)
        sync(device)
        peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    else:
        # the peak RSS of this process during the call above its resident memory just before it; not ru_maxrss,
        # which Linux carries over exec from the parent (the benchmark's own, large, process)
        before = _reset_peak_kib()
        fn(x)
        peak = max(0.0, (_status_kib("VmHWM") - before) / 1024)
    print(json.dumps({"peak_mib": peak}))


def _status_kib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_kib() -> float:
    """Reset the peak RSS (VmHWM) to the resident memory now (Linux >= 4.0) and return that, in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def peak_in_fresh_process(lib: str, method: str, model: str, n: int, args: argparse.Namespace) -> float | None:
    cmd = [sys.executable, __file__, "--child", lib, "--methods", method, "--models", model, "--batches", str(n),
           "--k", str(args.k), "--size", str(args.size), "--device", args.device]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        print(f"memory run failed for {lib} {method} {model} N={n}: {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"]


def versions() -> str:
    parts = [f"torch {torch.__version__}", f"torchvision {torchvision.__version__}", f"hookviz {hv.__version__}"]
    for lib, pkg in PACKAGES.items():
        try:
            parts.append(f"{lib} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{lib} not installed")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=["resnet18", "vgg11", "densenet121"])
    parser.add_argument("--methods", nargs="+", default=list(METHOD_NAMES), choices=list(METHOD_NAMES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory runs")
    parser.add_argument("--libs", nargs="+", default=LIBS, choices=LIBS)
    parser.add_argument("--note", default="", help="a line for RESULTS.md (e.g. whether the machine was loaded)")
    parser.add_argument("--out", default=str(Path(__file__).with_name("RESULTS.md")))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    device = torch.device(args.device)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    rows = []
    for model_name in args.models:
        model = make_model(model_name, device)
        for method in args.methods:
            for n in args.batches:
                x = inputs(n, args.size, device)
                fns = {lib: build(lib, method, model_name, model, args.k) for lib in args.libs}
                fns = {lib: fn for lib, fn in fns.items() if fn is not None}
                times: dict[str, list[float]] = {lib: [] for lib in fns}
                for fn in fns.values():
                    fn(x)  # warm-up
                for _ in range(args.repeats):
                    for lib, fn in fns.items():
                        sync(device)
                        t = time.perf_counter()
                        fn(x)
                        sync(device)
                        times[lib].append(1e3 * (time.perf_counter() - t))
                row = {"model": model_name, "method": method, "n": n,
                       "ms": {lib: statistics.median(v) for lib, v in times.items()}, "peak_mib": {}}  # fmt: skip
                if not args.no_memory:
                    for lib in fns:
                        row["peak_mib"][lib] = peak_in_fresh_process(lib, method, model_name, n, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_results(args, rows, device, load_start, time.perf_counter() - started)


def write_results(args: argparse.Namespace, rows: list[dict], device: torch.device, load: float, secs: float) -> None:
    libs = [lib for lib in args.libs if any(lib in r["ms"] for r in rows)]
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()}, {os.cpu_count()} CPUs"
    lines = [
        "# hookviz against the floor and its peers",
        "",
        f"Written by `python benchmarks/bench_peers.py {' '.join(sys.argv[1:])}` on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC in {secs:.0f} s.",
        "",
        f"Device: {device} ({what}), {torch.get_num_threads()} torch threads; {versions()}. Load average "
        f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
        "",
        f"Each call explains K = {args.k} targets per input for a batch of N images at {args.size}x{args.size} "
        f"(torchvision models, weights=None, seed 0, eval). Times: median of {args.repeats} calls after one warm-up, "
        "rows of a group timed round-robin, in ms, with the ratio to the floor (a plain forward and K input-gradient "
        "passes over the retained graph, no hooks). `–`: the library has no such method. See the docstring of "
        "`bench_peers.py` for exactly what each library is asked to do.",
    ]
    if args.note:
        lines += ["", f"**Note:** {args.note}"]
    head = "| model | method | N | " + " | ".join(libs) + " |"
    sep = "|---|---|---:|" + "---:|" * len(libs)
    lines += ["", "## Time per call (ms, × floor)", "", head, sep]
    for r in rows:
        floor = r["ms"].get("floor")
        cells = []
        for lib in libs:
            ms = r["ms"].get(lib)
            if ms is None:
                cells.append("–")
            elif floor and lib != "floor":
                cells.append(f"{ms:.0f} ({ms / floor:.2f}×)")
            else:
                cells.append(f"{ms:.0f}")
        lines.append(f"| {r['model']} | {METHOD_NAMES[r['method']]} | {r['n']} | " + " | ".join(cells) + " |")
    if any(r["peak_mib"] for r in rows):
        kind = "torch.cuda.max_memory_allocated above the allocation before" if device.type == "cuda" else "RSS growth"
        lines += ["", f"## Peak memory of one call in a fresh process (MiB, {kind})", "", head, sep]
        for r in rows:
            cells = []
            for lib in libs:
                v = r["peak_mib"].get(lib)
                cells.append("–" if v is None else f"{v:.0f}")
            lines.append(f"| {r['model']} | {METHOD_NAMES[r['method']]} | {r['n']} | " + " | ".join(cells) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
