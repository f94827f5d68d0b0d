"""Every method on the architectures users bring: timm families, torchvision's classifiers, Hugging Face BERT and ViT.

    python benchmarks/arch_sweep.py [--only NAME ...] [--subset] [--out benchmarks/results/architectures.md]
    python benchmarks/arch_sweep.py --column METHOD [--only NAME ...]   # one column of the table run again

Random weights (nothing is downloaded: timm ``pretrained=False``, torchvision ``weights=None``, transformers from a
config), one small variant per family, seed 0, one input per architecture (small sizes where the family takes
them). Classifiers that their libraries zero-initialise (timm's Mixer / Hiera heads, torchvision's ViT head) get
normal weights, so gradients reach the features. For each architecture:

- every registered method runs ``attribute(x, target=0)``: a cell is "ok" when the result is finite and has the
  expected shape (an all-zero map says so), else the error's first words;
- the automatic CAM (Grad-CAM with ``layer=None``) is checked against a float64 reference Grad-CAM computed here from
  the chosen layer's output, folded by what the model declares about itself (timm's ``output_fmt`` and
  ``num_prefix_tokens``, the torchvision and Hugging Face layouts written out below), not by hookviz's inference;
- the model is checked to be left exactly as it was after every method (parameters and buffers bit for bit,
  ``training`` and ``requires_grad`` flags, no hook left, no ``.grad``).

Writes ``benchmarks/results/architectures.md`` (method x architecture). Not a test: a record for the README; a
fast subset runs in ``tests/test_arch_sweep.py``.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import hookviz as hv

# keep the sampling and perturbation methods cheap: the table is about whether they run, not about convergence
OPTIONS: dict[str, Callable[[int], dict[str, Any]]] = {
    "smoothgrad": lambda size: {"n": 4},
    "vargrad": lambda size: {"n": 4},
    "integrated-gradients": lambda size: {"steps": 8},
    "scorecam": lambda size: {"batch_size": 128},
    "occlusion": lambda size: {"window": (size // 4, size // 4)},
    "rise": lambda size: {"n_masks": 16, "cell": 4},
}


@dataclass
class Arch:
    """One architecture: how to build it, its input, and the layout of its layers as the model itself declares."""

    name: str
    source: str  # "timm", "torchvision" or "transformers"
    build: Callable[[], nn.Module]
    size: int = 64
    channels_last: bool = False  # its CAM layer's 4-D output is (N, h, w, C)
    prefix: int | None = None  # prefix tokens before the patches (None: the model's num_prefix_tokens, else 0)
    tokens: Tensor | None = None  # text models: token ids, with forward_kwargs
    forward_kwargs: dict[str, Tensor] = field(default_factory=dict)
    layer: str | None = None  # text models: the layer the gradient methods attribute to


def _timm(name: str, size: int = 64, **kwargs: Any) -> Arch:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)

    return Arch(name, "timm", build, size, channels_last=False)


# one small variant per family; (name, input size, constructor overrides)
TIMM: list[tuple[str, int, dict[str, Any]]] = [
    ("resnet10t", 64, {}),
    ("efficientnet_lite0", 64, {}),
    ("mobilenetv3_small_050", 64, {}),
    ("regnetx_002", 64, {}),
    ("regnety_002", 64, {}),
    ("convnext_atto", 64, {}),
    ("dla46_c", 64, {}),
    ("hrnet_w18_small", 64, {}),
    ("nf_regnet_b0", 64, {}),
    ("halonet26t", 256, {}),
    ("fastvit_t8", 64, {}),
    ("efficientformer_l1", 224, {}),
    ("ghostnet_050", 64, {}),
    ("densenet121", 64, {}),
    ("repvgg_a0", 64, {}),
    ("cs3darknet_focus_s", 64, {}),
    ("rexnet_100", 64, {}),
    ("dpn68", 64, {}),
    ("inception_v3", 96, {}),
    ("res2net50_14w_8s", 64, {}),
    ("resnest14d", 64, {}),
    ("skresnet18", 64, {}),
    ("selecsls42b", 64, {}),
    ("lcnet_050", 64, {}),
    ("mobileone_s0", 64, {}),
    ("ese_vovnet19b_slim", 64, {}),
    ("repvit_m0_9", 64, {}),
    ("inception_next_atto", 96, {}),
    ("mobilevit_xxs", 128, {}),
    ("edgenext_xx_small", 128, {}),
    ("coatnet_nano_rw_224", 128, {"img_size": 128}),
    ("maxvit_nano_rw_256", 128, {"img_size": 128}),
    ("efficientvit_b0", 128, {}),
    ("levit_128s", 128, {"img_size": 128}),
    ("pvt_v2_b0", 128, {}),
    ("twins_svt_small", 224, {}),
    ("poolformer_s12", 64, {}),
    ("convformer_s18", 64, {}),
    ("focalnet_tiny_srf", 128, {}),
    ("tiny_vit_5m_224", 224, {}),
    ("vit_tiny_patch16_224", 96, {"img_size": 96}),
    ("deit_tiny_distilled_patch16_224", 96, {"img_size": 96}),
    ("vit_small_patch14_reg4_dinov2", 98, {"img_size": 98}),
    ("eva02_tiny_patch14_224", 98, {"img_size": 98}),
    ("cait_xxs24_224", 96, {"img_size": 96}),
    ("xcit_nano_12_p16_224", 96, {"img_size": 96}),
    ("crossvit_tiny_240", 240, {}),
    ("swin_tiny_patch4_window7_224", 128, {"img_size": 128, "window_size": 4}),
    ("swinv2_tiny_window8_256", 128, {"img_size": 128, "window_size": 4}),
    ("swinv2_cr_tiny_ns_224", 128, {"img_size": 128, "window_size": 4}),
    ("hiera_tiny_224", 128, {"img_size": (128, 128)}),
    ("mixer_s16_224", 96, {"img_size": 96}),
    ("resmlp_12_224", 96, {"img_size": 96}),
    ("gmlp_ti16_224", 96, {"img_size": 96}),
    ("davit_tiny", 128, {}),
    ("mvitv2_tiny", 224, {}),
]

# the smallest classifier of each torchvision family; which layers of them are channels-last
TORCHVISION: list[tuple[str, int]] = [
    ("alexnet", 64),
    ("convnext_tiny", 64),
    ("densenet121", 64),
    ("efficientnet_b0", 64),
    ("efficientnet_v2_s", 64),
    ("googlenet", 64),
    ("inception_v3", 96),
    ("maxvit_t", 224),
    ("mnasnet0_5", 64),
    ("mobilenet_v2", 64),
    ("mobilenet_v3_small", 64),
    ("regnet_x_400mf", 64),
    ("resnet18", 64),
    ("resnext50_32x4d", 64),
    ("shufflenet_v2_x0_5", 64),
    ("squeezenet1_0", 64),
    ("swin_t", 64),
    ("swin_v2_t", 64),
    ("vgg11", 64),
    ("vit_b_16", 64),
    ("wide_resnet50_2", 64),
]


def _torchvision(name: str, size: int) -> Arch:
    def build() -> nn.Module:
        from torchvision import models

        extra: dict[str, Any] = (
            {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
        )
        if name.startswith("vit_"):
            extra["image_size"] = size  # torchvision's ViT is built for one size
        return getattr(models, name)(weights=None, num_classes=10, **extra)

    return Arch(f"tv/{name}", "torchvision", build, size)


def _hf_vit() -> Arch:
    def build() -> nn.Module:
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(
            image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, num_labels=10,
        )  # fmt: skip
        return ViTForImageClassification(config)

    return Arch("hf/vit", "transformers", build, 64, prefix=1)  # the class token


def _hf_bert() -> Arch:
    def build() -> nn.Module:
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            num_labels=10,
        )  # fmt: skip
        return BertForSequenceClassification(config)

    ids = torch.tensor([[2, 17, 33, 9, 41, 3, 0, 0]])
    return Arch(
        "hf/bert", "transformers", build, 0, tokens=ids, forward_kwargs={"attention_mask": (ids != 0).long()},
        layer="bert.embeddings",
    )  # fmt: skip


def all_archs() -> list[Arch]:
    archs = [_timm(name, size, **kw) for name, size, kw in TIMM]
    archs += [_hf_vit(), _hf_bert()]
    return archs + [_torchvision(name, size) for name, size in TORCHVISION]


def _mlp_mixer(resmlp: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

        extra = {"block_layer": ResBlock, "norm_layer": Affine, "mlp_ratio": 4} if resmlp else {}
        return MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=32, **extra)

    return build


def subset_archs() -> list[Arch]:
    """What `tests/test_arch_sweep.py` runs: twelve families at toy widths and small inputs (about a second each)."""
    archs = [
        _timm("resnet10t", 64),
        _timm("convnext_atto", 64),
        _timm("regnetx_002", 64),
        _timm("mobilenetv3_small_050", 64),
        _timm("vit_tiny_patch16_224", 32, img_size=32, patch_size=8, depth=2),
        _timm("deit_tiny_distilled_patch16_224", 32, img_size=32, patch_size=8, depth=2),
        _timm("vit_small_patch14_reg4_dinov2", 28, img_size=28, patch_size=7, depth=2, embed_dim=64, num_heads=2),
        _timm(
            "swin_tiny_patch4_window7_224",
            32,
            img_size=32,
            window_size=4,
            embed_dim=16,
            depths=(1, 1),
            num_heads=(1, 1),
        ),  # fmt: skip
        Arch("mixer_s16_224", "timm", _mlp_mixer(False), 32),
        Arch("resmlp_12_224", "timm", _mlp_mixer(True), 32),
        _timm("hiera_tiny_224", 64, img_size=(64, 64), embed_dim=8, num_heads=1, stages=(1, 1, 1, 1)),
        _torchvision("resnet18", 64),
        _hf_vit(),
    ]
    return archs


def live_head(model: nn.Module) -> None:
    """Normal weights for a zero-initialised classifier (timm's Mixer / Hiera, torchvision's ViT), in place."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.out_features == 10 and not module.weight.any():
                module.weight.normal_(std=0.02)


# -- the model left as it was ------------------------------------------------------------------------------------
def snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
        "grads": [p.grad is None for p in model.parameters()],
    }


def changed(model: nn.Module, snap: dict[str, Any]) -> str | None:
    """What differs from `snap` (None: nothing)."""
    now = snapshot(model)
    for key, value in snap["state"].items():
        if not torch.equal(now["state"][key], value):
            return f"{key} changed"
    for what in ("training", "requires_grad", "hooks", "grads"):
        if now[what] != snap[what]:
            return f"{what} changed"
    return None


# -- the reference CAM -----------------------------------------------------------------------------------------------
def declared_fold(arch: Arch, model: nn.Module, out: Tensor) -> Tensor:
    """(N, C, h, w) from a layer output, by what the model declares (not by hookviz's shape inference)."""
    if out.dim() == 4:
        timm_fmt = str(getattr(model, "output_fmt", "NCHW"))
        nhwc = arch.channels_last or ("NHWC" in timm_fmt and out.shape[-1] == getattr(model, "num_features", -1))
        return out.permute(0, 3, 1, 2) if nhwc else out
    prefix = arch.prefix if arch.prefix is not None else getattr(model, "num_prefix_tokens", 0)
    if getattr(model, "reroll", None) is not None:  # timm Hiera: tokens in mask-unit order, its reroll undoes it
        schedule = model.reroll.schedule
        block = next(b for b, (_, s) in schedule.items() if s[0] * s[1] == out.shape[1])
        return model.reroll(out, block).permute(0, 3, 1, 2)
    side = math.isqrt(out.shape[1] - prefix)
    assert side * side == out.shape[1] - prefix, f"{out.shape[1]} tokens with {prefix} prefix are no square grid"
    return out[:, prefix:].transpose(1, 2).reshape(out.shape[0], out.shape[2], side, side)


def reference_gradcam(arch: Arch, model: nn.Module, layer: str, x: Tensor) -> tuple[int, Tensor]:
    """Grad-CAM in float64 from the layer's output: alpha_k = mean of dy/dA^k over the grid, ReLU(sum_k alpha_k A^k),
    for the first class whose map is not all zero (random weights can make a class's map negative everywhere);
    returns (class, map)."""
    m = deepcopy(model).double().eval()
    store: dict[str, Tensor] = {}

    def keep(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
        # the model goes on with a copy: an in-place op after the layer (torchvision densenet's
        # F.relu(features, inplace=True)) would otherwise overwrite the layer's output kept here
        store["a"] = out
        return out.clone()

    handle = m.get_submodule(layer).register_forward_hook(keep)
    try:
        out = m(x.double())
    finally:
        handle.remove()
    logits = out.logits if hasattr(out, "logits") else out
    a = declared_fold(arch, m, store["a"].detach())
    for target in range(logits.shape[1]):
        (g,) = torch.autograd.grad(logits[:, target].sum(), store["a"], retain_graph=True)
        cam = torch.relu((declared_fold(arch, m, g).mean((2, 3), keepdim=True) * a).sum(1, keepdim=True))
        if cam.any():
            break
    return target, cam


# -- one architecture ------------------------------------------------------------------------------------------------
def run_cell(method: hv.Attribution, x: Tensor, arch: Arch) -> str:
    kwargs = {"forward_kwargs": arch.forward_kwargs} if arch.forward_kwargs else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = method.attribute(x, target=0, **kwargs)
        except Exception as exc:  # the table records failures, it does not stop on them
            if "no ReLU ran" in str(exc):
                return "✗ no ReLU (use activations='all')"
            return f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:70]}…"
    if not torch.isfinite(out).all():
        return "✗ non-finite"
    return "ok" if out.abs().sum() > 0 else "ok (all-zero map)"


def run_arch(arch: Arch, methods: list[str], log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every method on `arch`; returns the cells, the automatic CAM check and the model check."""
    torch.manual_seed(0)
    model = arch.build().eval()
    live_head(model)
    if arch.tokens is not None:
        x = arch.tokens
    else:
        x = torch.randn(1, 3, arch.size, arch.size, generator=torch.Generator().manual_seed(1))
    snap = snapshot(model)
    cells: dict[str, str] = {}
    untouched = "ok"
    for name in methods:
        start = time.perf_counter()
        cls = hv.METHODS[name]
        options = OPTIONS.get(name, lambda size: {})(arch.size)
        if arch.layer is not None and name in ("saliency", "input-x-gradient", "integrated-gradients"):
            options["layer"] = arch.layer  # token ids are explained at the embedding
        try:
            method = cls(model, **options)
        except Exception as exc:
            cells[name] = f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:70]}…"
        else:
            cells[name] = run_cell(method, x, arch)
        diff = changed(model, snap)
        if diff is not None and untouched == "ok":
            untouched = f"✗ {name}: {diff}"
        log(f"{arch.name:34s} {name:22s} {cells[name][:60]:60s} {time.perf_counter() - start:6.1f} s")
    cam_check, layer, layout = "–", "–", "–"
    if arch.tokens is None:
        cam = hv.GradCAM(model)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cam.attribute(x, target=0)  # chooses the layer
                target, expected = reference_gradcam(arch, model, cam.layer, x)  # type: ignore[arg-type]
                got = cam.attribute(x, target=target)
            layer, layout = str(cam.layer), str(cam.layout_used)
            err = ((got.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()
            if expected.abs().sum() == 0:
                cam_check = "✗ reference is all zero"
            elif got.shape != expected.shape:
                cam_check = f"✗ shape {tuple(got.shape)} vs {tuple(expected.shape)}"
            else:
                cam_check = "ok" if err < 1e-3 else f"✗ rel. error {err:.2g}"
        except Exception as exc:
            cam_check = f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:70]}…"
    return {"cells": cells, "cam": cam_check, "layer": layer, "layout": layout, "untouched": untouched}


def table(results: dict[str, dict[str, Any]], methods: list[str], archs: dict[str, Arch]) -> str:
    lines = [
        f"torch {torch.__version__}, random weights (seed 0), one input per architecture at the size shown, target 0; "
        "written by `python benchmarks/arch_sweep.py`.",
        "",
        "\"auto CAM\": hookviz's automatic Grad-CAM against a float64 reference from the chosen layer's output "
        "(folded by what the model declares: timm's output_fmt / num_prefix_tokens, Hiera's reroll); \"model "
        'untouched": parameters, buffers, flags, hooks and .grad after every method as before.',
        "",
        "| architecture | size | auto CAM | layer | layout | model untouched | " + " | ".join(methods) + " |",
        "|---" * (len(methods) + 6) + "|",
    ]
    for name, r in results.items():
        arch = archs[name]
        size = "tokens" if arch.tokens is not None else str(arch.size)
        cells = " | ".join(r["cells"][m] for m in methods)
        lines.append(f"| {name} | {size} | {r['cam']} | `{r['layer']}` | {r['layout']} | {r['untouched']} | {cells} |")
    left_out = sorted(set(hv.METHODS) - set(methods))
    if left_out:
        lines += ["", f"Left out of this run (``--skip``, for time): {', '.join(left_out)}."]
    ok = sum(r["cam"] == "ok" for r in results.values())
    timm_n = sum(archs[n].source == "timm" for n in results)
    lines += ["", f"{len(results)} architectures ({timm_n} timm); automatic CAM equal to the reference on {ok}."]
    return "\n".join(lines) + "\n"


def rerun_column(path: Path, method: str, archs: dict[str, Arch], only: list[str] | None = None) -> str:
    """Run `method` alone again on every architecture row of the table at `path` (or the rows in `only`) and return
    the table with that column's cells replaced (and a row's "model untouched" cell, should the method now change
    the model); the other columns are kept as they were written."""
    lines = path.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| architecture |"))
    names = [c.strip() for c in lines[header].strip("|").split("|")]
    col, untouched_col = names.index(method), names.index("model untouched")
    for i in range(header + 2, len(lines)):
        if not lines[i].startswith("| "):
            break
        cells = [c.strip() for c in lines[i].strip("|").split("|")]
        arch = archs.get(cells[0])
        if arch is None or (only and cells[0] not in only):
            continue
        start = time.perf_counter()
        torch.manual_seed(0)
        model = arch.build().eval()
        live_head(model)
        x = (
            arch.tokens
            if arch.tokens is not None
            else torch.randn(1, 3, arch.size, arch.size, generator=torch.Generator().manual_seed(1))
        )
        snap = snapshot(model)
        try:
            cells[col] = run_cell(hv.METHODS[method](model, **OPTIONS.get(method, lambda size: {})(arch.size)), x, arch)
        except Exception as exc:  # the table records failures, it does not stop on them
            cells[col] = f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:70]}…"
        diff = changed(model, snap)
        if diff is not None:
            cells[untouched_col] = f"✗ {method}: {diff}"
        lines[i] = "| " + " | ".join(cells) + " |"
        print(f"{arch.name:34s} {method:22s} {cells[col][:60]:60s} {time.perf_counter() - start:6.1f} s", flush=True)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="architecture names to run (default: all)")
    parser.add_argument("--subset", action="store_true", help="the fast subset the tests run")
    parser.add_argument("--out", default="benchmarks/results/architectures.md")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--skip", nargs="*", default=[], help="methods left out (e.g. scorecam: one masked forward per channel)"
    )
    parser.add_argument(
        "--column",
        default=None,
        metavar="METHOD",
        help="run only METHOD again on the rows of the table already in --out and replace that column's cells",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    archs = {a.name: a for a in (subset_archs() if args.subset else all_archs())}
    if args.column is not None:
        if args.column not in hv.METHODS:
            parser.error(f"--column: unknown method {args.column!r}; available: {sorted(hv.METHODS)}")
        Path(args.out).write_text(rerun_column(Path(args.out), args.column, archs, args.only))
        return
    names = args.only or list(archs)
    unknown = set(args.skip) - set(hv.METHODS)
    if unknown:
        parser.error(f"--skip: unknown methods {sorted(unknown)}; available: {sorted(hv.METHODS)}")
    methods = [m for m in sorted(hv.METHODS) if m not in args.skip]
    results = {}
    for name in names:
        start = time.perf_counter()
        try:
            results[name] = run_arch(archs[name], methods)
        except Exception as exc:  # a model that cannot be built or run at all still gets its row
            reason = f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:70]}…"
            results[name] = {"cells": dict.fromkeys(methods, reason), "cam": reason, "layer": "–", "layout": "–",
                             "untouched": "–"}  # fmt: skip
        # written after every architecture, so a long run leaves a record of what it finished
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table(results, methods, archs))
        r = results[name]
        print(f"== {name}: auto CAM {r['cam']} ({r['layer']}, {r['layout']}), model {r['untouched']}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    text = table(results, methods, archs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
