"""Command line: ``hookviz demo`` explains a sample image end to end; ``hookviz explain`` writes a grid figure.

Mistakes on the command line (an unknown method or model, a missing file, a bad target) end with exit code 2 and
one line on stderr, ``hookviz explain: error: ...``, never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import os
import pickle
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
STATE_DICT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")

EXPLAIN_DESCRIPTION = """\
Explain images with one or more attribution methods and write one figure: a row per image, a column per method
(or, with one method and several targets, a column per target), the inputs first.

models:
  torchvision:NAME            a torchvision classification model with RANDOM weights (weights=None, seed 0): the
                              maps show the mechanics, not learned evidence
  torchvision:NAME:WEIGHTS    with a torchvision weights enum member (e.g. torchvision:resnet18:IMAGENET1K_V1 or
                              :DEFAULT), downloaded by torchvision on first use; preprocessing and class names then
                              come from the weights (transforms(), meta["categories"])
  torchvision:NAME --weights FILE.pt
                              a local state_dict loaded into the torchvision architecture (a different number of
                              classes in the final layer is taken from the file)
  PATH.pt                     a whole model saved with torch.save(model), loaded safely with
                              torch.load(weights_only=True): no code from the file runs, so only models built from
                              torch.nn and torchvision classes load (any torchvision model, nn.Sequential of nn
                              layers); for a state_dict use --weights. A model of your own classes needs
                              --trust-pickle: full unpickling, which can execute arbitrary code from the file, so only
                              for files you trust (the classes must be importable). A TorchScript file
                              (torch.jit.save) is loaded with torch.jit.load; TorchScript modules take no hooks, so
                              only the gradient methods work (saliency, input-x-gradient, integrated-gradients,
                              smoothgrad).
  Without weights' own transforms, images are resized (shorter side) and center-cropped to --size and normalized
  with the ImageNet mean and std.

example:
  hookviz explain cat.jpg dog.jpg --model torchvision:resnet18:DEFAULT --method guided-backprop,gradcam --out fig.pdf
"""


class UsageError(Exception):
    """A mistake on the command line: reported as one line, exit code 2."""


# ---------------------------------------------------------------------------------------------------- demo


def _demo(args: argparse.Namespace) -> int:
    from torchvision import models

    from . import GradCAM, GuidedBackprop, Saliency
    from .figures import grid, save_figure
    from .inputs import Preset
    from .zoo import shapes_image

    torch.manual_seed(args.seed)
    # Placeholder until the embedded shapes model ships: an untrained network shows how hookviz works, not what a
    # trained network has learned.
    model = models.resnet18(weights=None).eval()
    image = args.image if args.image else shapes_image(args.size, seed=args.seed)
    preset = Preset("demo", args.size, args.size, IMAGENET_MEAN, IMAGENET_STD)

    target = 0
    gradcam = GradCAM(model)
    exps = [
        GuidedBackprop(model).visualize(image, target=target, preprocess=preset),
        Saliency(model).visualize(image, target=target, preprocess=preset),
        gradcam.visualize(image, target=target, preprocess=preset),
    ]
    fig = grid(
        exps,
        overlay="auto",
        col_labels=["input", "Guided Backprop", "Saliency |grad|", f"Grad-CAM ({gradcam.layer})"],
        row_labels=[f"target class {target}"],
        title=f"hookviz demo: resnet18 (untrained, weights=None, seed {args.seed})",
        size=(8.3, 2.7),  # screen-sized cells and fonts: the demo is looked at, not printed
        rc={"axes.titlesize": 10, "axes.labelsize": 10, "figure.titlesize": 11},
        dpi=args.dpi,
    )
    out = save_figure(fig, args.out)
    print(
        f"hookviz demo: explained a {args.size}x{args.size} sample image with Guided Backprop, Saliency and Grad-CAM "
        f"on an UNTRAINED resnet18 (weights=None, seed {args.seed}; no weights are downloaded), so the maps show the "
        "mechanics, not learned evidence."
    )
    print(f"wrote {out.resolve()}")
    return 0


# ---------------------------------------------------------------------------------------------------- explain


def _parse_methods(spec: str) -> list[str]:
    from .methods import METHODS

    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise UsageError(f"--method: expected a method name or comma-separated names, got {spec!r}")
    for name in names:
        if name not in METHODS:
            close = difflib.get_close_matches(name, list(METHODS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"unknown method {name!r}; {hint}available: {', '.join(sorted(METHODS))}")
    return names


def _parse_target(spec: str | None) -> list[int] | None:
    if spec is None:
        return None
    parts = [p.strip() for p in spec.split(",")]
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise UsageError(
            f"--target: expected a class index or comma-separated class indices such as 3 or 3,7, got {spec!r}"
        ) from None
    negative = [i for i in ids if i < 0]
    if negative:
        raise UsageError(f"--target: class indices are >= 0, got {negative[0]}")
    return ids


def _check_images(paths: Sequence[str]) -> None:
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise UsageError(f"{p!r} is a directory; pass image files")
        if not path.exists():
            raise UsageError(f"no such image file {p!r}")


def _read_labels(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"--labels: no such file {path!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--labels: cannot read {path!r} as UTF-8 text ({exc})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"--labels: {path!r} is empty; expected one class name per line")
    return [line.strip() for line in lines]


def _preset(size: int) -> Any:
    from .inputs import Preset

    return Preset(f"cli-{size}", size, size, IMAGENET_MEAN, IMAGENET_STD)


def _load_state_dict(path: str) -> dict[str, torch.Tensor]:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read the file is the user's to fix
        raise UsageError(f"--weights: cannot load {path!r} as a state_dict ({type(exc).__name__}: {exc})") from None
    for key in ("state_dict", "model_state_dict", "model"):  # common checkpoint wrappers
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UsageError(f"--weights: {path!r} does not hold a state_dict (a dict of tensors)")
    if sd and all(k.startswith("module.") for k in sd):  # saved from DataParallel
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def _torchvision_model(name: str, weights: str | None, size: int | None) -> tuple[nn.Module, Any, Any, str]:
    """(model, preprocess, labels, note) for ``torchvision:NAME[:WEIGHTS]`` or ``--weights``."""
    import torchvision
    from torchvision import models

    available = models.list_models(module=torchvision.models)
    if name not in available:
        close = difflib.get_close_matches(name, available, n=5, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else "see torchvision.models.list_models()"
        raise UsageError(f"unknown torchvision classification model {name!r}; {hint}")

    if weights is not None and (
        os.path.exists(weights) or weights.lower().endswith(STATE_DICT_SUFFIXES) or os.sep in weights
    ):
        if not os.path.isfile(weights):
            raise UsageError(f"--weights: no such file {weights!r}")
        sd = _load_state_dict(weights)
        torch.manual_seed(0)
        model = models.get_model(name, weights=None)
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        head = f"{linears[-1]}.weight" if linears else None
        if head in sd and sd[head].ndim == 2 and sd[head].shape[0] != model.state_dict()[head].shape[0]:
            model = models.get_model(name, weights=None, num_classes=int(sd[head].shape[0]))
        try:
            result = model.load_state_dict(sd, strict=False)
        except RuntimeError as exc:  # shapes that differ
            lines = [line.strip() for line in str(exc).strip().splitlines()]
            detail = next((line for line in lines if line.startswith("size mismatch")), lines[-1])
            raise UsageError(f"--weights: {weights!r} does not fit torchvision {name}: {detail}") from None
        if result.missing_keys or result.unexpected_keys:
            missing, unexpected = result.missing_keys, result.unexpected_keys
            raise UsageError(
                f"--weights: {weights!r} does not fit torchvision {name}: {len(missing)} missing key(s)"
                + (f" (first {missing[0]!r})" if missing else "")
                + f", {len(unexpected)} unexpected key(s)"
                + (f" (first {unexpected[0]!r})" if unexpected else "")
            )
        return model, _preset(size or 224), None, f"weights from {weights}"

    if weights is not None:
        enum = models.get_model_weights(name)
        if weights not in enum.__members__:
            raise UsageError(
                f"torchvision {name} has no weights {weights!r}; available: {', '.join(enum.__members__)} "
                f"(or --weights FILE.pt for a local state_dict)"
            )
        w = enum[weights]
        model = models.get_model(name, weights=w)  # torchvision downloads and caches the file on first use
        preprocess = w.transforms() if size is None else w.transforms(crop_size=size, resize_size=size)
        return model, preprocess, w.meta.get("categories"), f"weights {w}"

    torch.manual_seed(0)
    model = models.get_model(name, weights=None)
    note = (
        f"note: torchvision:{name} has RANDOM weights (weights=None, seed 0), so the maps show the mechanics, not "
        f"learned evidence; use torchvision:{name}:DEFAULT for pretrained weights"
    )
    return model, _preset(size or 224), None, note


def _is_torchscript(path: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in zf.namelist())


def _safe_model_globals() -> list[Any]:
    """What a whole pickled model may name under ``weights_only=True``: the module classes of torch.nn, torchvision
    models and torchvision ops, and ``functools.partial`` (torchvision stores ``norm_layer=partial(nn.LayerNorm, ...)``;
    unpickling a partial calls nothing, and its function must itself be allowed)."""
    import functools
    import importlib
    import pkgutil

    import torchvision

    found: set[type] = set()
    for package in (torch.nn.modules, torchvision.models, torchvision.ops):
        names = [package.__name__] + [i.name for i in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
        for name in names:
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - an optional submodule that cannot import names nothing to allow
                continue
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, nn.Module)
                    and value.__module__.startswith(("torch.nn.", "torchvision."))
                ):
                    found.add(value)
    return [functools.partial, *sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")]


def _file_model(path: str, device: str, trust_pickle: bool = False) -> nn.Module:
    if not os.path.isfile(path):
        raise UsageError(
            f"--model: no such model file {path!r}; pass torchvision:NAME[:WEIGHTS] or the path of a .pt file"
        )
    try:
        if _is_torchscript(path):
            model = torch.jit.load(path, map_location=device)
        elif trust_pickle:
            print(
                f"hookviz explain: warning: --trust-pickle: unpickling {path!r} with torch.load(weights_only=False), "
                "which runs any code the file contains",
                file=sys.stderr,
            )
            model = torch.load(path, map_location=device, weights_only=False)
        else:
            with torch.serialization.safe_globals(_safe_model_globals()):
                model = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        if trust_pickle:
            raise UsageError(f"--model: cannot unpickle {path!r} ({exc})") from None
        # torch's message spans many lines; the reason is on the line naming the global that is not allowed
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
        reason = next((line for line in lines if "Unsupported global" in line), lines[0] if lines else "")
        reason = reason.split(". Please use")[0].removeprefix("WeightsUnpickler error: ")
        raise UsageError(
            f"--model: {path!r} is not a model made of torch.nn / torchvision classes, so it cannot be loaded safely "
            f"with torch.load(weights_only=True) ({reason}); if you trust the file, pass --trust-pickle (unpickling "
            "can run any code in it)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure to read the file is the user's to fix
        raise UsageError(
            f"--model: cannot load {path!r} ({type(exc).__name__}: {exc}); a pickled model's class must be importable"
        ) from None
    if isinstance(model, dict):
        raise UsageError(
            f"--model: {path!r} holds a state_dict, not a model; pass --model torchvision:NAME --weights {path}"
        )
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model: {path!r} holds a {type(model).__name__}, not a torch.nn.Module")
    return model


def _load_model(args: argparse.Namespace) -> tuple[nn.Module, Any, Any, str]:
    spec = args.model
    if args.trust_pickle and spec.startswith("torchvision:"):
        raise UsageError("--trust-pickle applies to --model PATH.pt; torchvision models and --weights load safely")
    if spec.startswith("torchvision:"):
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise UsageError(f"--model: expected torchvision:NAME or torchvision:NAME:WEIGHTS, got {spec!r}")
        name, weights = parts[1], parts[2] if len(parts) == 3 else None
        if weights is not None and args.weights is not None:
            raise UsageError(f"--model {spec} already names weights; leave out --weights {args.weights}")
        return _torchvision_model(name, weights or args.weights, args.size)
    if args.weights is not None:
        raise UsageError("--weights applies to --model torchvision:NAME; a PATH.pt model carries its own weights")
    model = _file_model(spec, args.device, args.trust_pickle)
    return model, _preset(args.size or 224), None, ""


def _explain(args: argparse.Namespace) -> int:
    from .figures import SAVE_FORMATS, grid, save_figure

    methods = _parse_methods(args.method)
    target_ids = _parse_target(args.target)
    _check_images(args.images)
    out = Path(args.out)
    if out.suffix.lower() not in SAVE_FORMATS:
        raise UsageError(f"--out: the suffix chooses the format, one of {', '.join(SAVE_FORMATS)}; got {str(out)!r}")
    if args.size is not None and args.size < 16:
        raise UsageError(f"--size: expected at least 16 pixels, got {args.size}")
    if args.dpi <= 0:
        raise UsageError(f"--dpi: expected a positive number, got {args.dpi}")
    labels = _read_labels(args.labels) if args.labels else None
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device: {args.device!r} is not a device; use cpu, cuda or cuda:0") from None

    model, preprocess, weight_labels, note = _load_model(args)
    model = model.to(device).eval()
    if note.startswith("note:"):
        print(note)
    n = len(args.images)
    if target_ids is None or len(target_ids) == 1:
        targets: Any = None if target_ids is None else target_ids[0]
    else:  # K targets for every image: one forward pass, K columns per method
        targets = torch.tensor([target_ids] * n)
    try:
        fig = grid(
            list(args.images),
            methods,
            model=model,
            targets=targets,
            labels=labels if labels is not None else weight_labels,
            preprocess=preprocess,
            scale=args.scale,
            colorbar=args.colorbar,
            overlay={"auto": "auto", "on": True, "off": False}[args.overlay],
            dpi=args.dpi,
            title=args.title,
        )
    except RuntimeError as exc:
        if "not supported on ScriptModules" in str(exc):
            raise UsageError(
                f"{', '.join(methods)}: a TorchScript model takes no hooks; use saliency, input-x-gradient, "
                "integrated-gradients or smoothgrad, or a pickled model (torch.save(model))"
            ) from None
        raise
    path = save_figure(fig, out)
    print(f"wrote {path.resolve()}")
    return 0


# ---------------------------------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hookviz", description="Interpretability for PyTorch, built on hooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="explain a sample image end to end and write a PNG figure")
    demo.add_argument("--out", default="hookviz-demo.png", help="where to write the figure (default: %(default)s)")
    demo.add_argument("--image", default=None, help="an image file to explain instead of the built-in shapes image")
    demo.add_argument("--size", type=int, default=128, help="input size in pixels (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the untrained model and sample image")
    demo.add_argument("--dpi", type=int, default=120)

    ex = sub.add_parser(
        "explain",
        help="explain image files with one or more methods and write a grid figure (.pdf, .svg, .png)",
        description=EXPLAIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.add_argument("images", nargs="+", metavar="IMAGE", help="image files, one row each")
    ex.add_argument(
        "--model",
        required=True,
        metavar="torchvision:NAME[:WEIGHTS] | PATH.pt",
        help="the model (see 'models' above); PATH.pt loads with torch.load(weights_only=True) unless --trust-pickle",
    )
    ex.add_argument(
        "--trust-pickle",
        action="store_true",
        help="unpickle --model PATH.pt fully (weights_only=False) for models of your own classes: this can execute "
        "arbitrary code from the file, so only for files you trust",
    )
    ex.add_argument(
        "--method",
        required=True,
        metavar="M[,M...]",
        help="attribution methods, comma-separated, one column each (e.g. guided-backprop,gradcam)",
    )
    ex.add_argument(
        "--target",
        default=None,
        metavar="T[,T...]",
        help="class index for every image, or comma-separated indices (with one method: a column per target); "
        "default: each image's top class",
    )
    ex.add_argument("--out", default="hookviz-explain.png", metavar="FIG", help="figure file (default: %(default)s)")
    ex.add_argument(
        "--weights",
        default=None,
        metavar="PATH_OR_ENUM_NAME",
        help="for torchvision:NAME: a local state_dict file, or a weights enum member such as IMAGENET1K_V1",
    )
    ex.add_argument(
        "--size", type=int, default=None, metavar="S", help="input size in pixels (default: 224, or the weights')"
    )
    ex.add_argument("--labels", default=None, metavar="FILE", help="class names, one per line (row/column labels)")
    ex.add_argument("--dpi", type=float, default=300, metavar="D", help="figure resolution (default: %(default)s)")
    ex.add_argument(
        "--scale",
        choices=("column", "sample", "shared"),
        default="column",
        help="one colour scale per column across images (default), per map, or for the whole figure",
    )
    ex.add_argument("--colorbar", action="store_true", help="a colour bar under each column")
    ex.add_argument(
        "--overlay",
        choices=("auto", "on", "off"),
        default="auto",
        help="draw maps over the images: auto = as each method shows best (Grad-CAM family over the image)",
    )
    ex.add_argument("--title", default=None, help="a figure title")
    ex.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookviz`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    if args.command == "explain":
        try:
            return _explain(args)
        except UsageError as exc:
            message = str(exc)
        except (ValueError, FileNotFoundError, IsADirectoryError) as exc:
            # hookviz's own checks (an out-of-range target, an unreadable image) already say what to fix
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        parser.exit(2, f"hookviz explain: error: {message}\n")
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
