"""Command line: ``hookviz demo`` explains fresh shapes images with the embedded trained model; ``hookviz explain``
writes a grid figure; ``hookviz explain-dataset`` stores the maps of a data set; ``hookviz evaluate`` prints a
methods x metrics table.

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
                              only the gradient and perturbation methods work (saliency, input-x-gradient,
                              integrated-gradients, smoothgrad, occlusion, rise).
  Without weights' own transforms, images are resized (shorter side) and center-cropped to --size and normalized
  with the ImageNet mean and std.

example:
  hookviz explain cat.jpg dog.jpg --model torchvision:resnet18:DEFAULT --method guided-backprop,gradcam --out fig.pdf
"""


class UsageError(Exception):
    """A mistake on the command line: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors (a bad ``--size``, a missing ``--model``) as one line, like hookviz's own."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------------------------------- demo

DEMO_METHODS = ("guided-backprop", "gradcam", "guided-gradcam")


def _demo_rows(labels: torch.Tensor, rows: int) -> list[int]:
    """Indices of the first images of `rows` different classes (in the order they come)."""
    picked: list[int] = []
    seen: set[int] = set()
    for i, label in enumerate(labels.tolist()):
        if label not in seen:
            seen.add(label)
            picked.append(i)
            if len(picked) == rows:
                break
    return picked


def _demo(args: argparse.Namespace) -> int:
    from . import GradCAM, GuidedBackprop, GuidedGradCAM
    from .figures import SAVE_FORMATS, grid, save_figure
    from .inputs import Preset
    from .methods import get_method
    from .metrics import pointing_game
    from .zoo import shapes, shapes_model

    if Path(args.out).suffix.lower() not in SAVE_FORMATS:  # checked before the work, not after it
        raise UsageError(f"--out: the suffix chooses the format, one of {', '.join(SAVE_FORMATS)}; got {args.out!r}")
    if args.dpi <= 0:
        raise UsageError(f"--dpi: expected a positive number, got {args.dpi}")
    if args.pointing_images < 1:
        raise UsageError(f"--pointing-images: expected at least 1 image, got {args.pointing_images}")
    if args.image is not None:
        _check_images([args.image])
    model = shapes_model()
    data = shapes(max(args.pointing_images, 64), seed=args.seed)  # fresh images: training never draws this seed
    classes = list(data.classes)

    if args.image is not None:
        # the user's image, resized (shorter side) and center-cropped to the 64 pixels the model was trained at; the
        # model normalises its [0, 1] input itself
        images: Any = args.image
        preprocess: Any = Preset("shapes", 64, 64, None, None)
        truth: list[int | None] = [None]
    else:
        rows = _demo_rows(data.labels, 4)
        x = data.images[rows]
        images = list(x.permute(0, 2, 3, 1).numpy())  # HxWxC arrays in [0, 1]: shown as they are, not rescaled
        preprocess = None
        truth = data.labels[rows].tolist()
    gradcam = GradCAM(model)
    exps = [
        m.visualize(images, preprocess=preprocess, labels=classes)
        for m in (GuidedBackprop(model), gradcam, GuidedGradCAM(model))
    ]
    with torch.no_grad():
        probs = model(exps[0].inputs).softmax(dim=1)
    row_labels = []
    for i, true in enumerate(truth):
        p, c = probs[i].max(dim=0)
        label = f"{classes[int(c)]} {float(p):.2f}"
        row_labels.append(label if true is None or true == int(c) else f"{label} (is {classes[true]})")
    source = Path(args.image).name if args.image is not None else f"fresh images (seed {args.seed})"
    fig = grid(
        exps,
        overlay="auto",
        col_labels=["input", "Guided Backprop", f"Grad-CAM ({gradcam.layer})", "Guided Grad-CAM"],
        row_labels=row_labels,
        title=f"trained shapes CNN on {source}; rows: predicted class, probability",
        size=(7.2, 1.75 * len(row_labels) + 0.45),  # screen-sized cells and fonts: the demo is looked at, not printed
        rc={"axes.titlesize": 10, "axes.labelsize": 10, "figure.titlesize": 10},
        dpi=args.dpi,
    )
    out = save_figure(fig, args.out)
    print(
        f"hookviz demo: explained {'your image (resized to 64x64)' if args.image else 'four fresh shapes images'} "
        "with Guided Backprop, Grad-CAM and Guided Grad-CAM on the embedded shapes CNN (trained on synthetic "
        "shapes, 8 classes; nothing is downloaded)"
    )
    print(f"wrote {out.resolve()}")
    # how often each method's maximum lies on the object, for the images' true classes (Zhang et al. 2018)
    n = args.pointing_images
    x, y, masks = data.images[:n], data.labels[:n], data.masks[:n]
    for name in DEMO_METHODS:
        hits = pointing_game(get_method(name)(model).attribute(x, y), masks)
        print(f"pointing game ({n} images): {name} {hits.nanmean().item():.2f}")
    return 0


# ---------------------------------------------------------------------------------------------------- explain


def _parse_methods(spec: str, flag: str = "--method") -> list[str]:
    from .methods import METHODS

    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise UsageError(f"{flag}: expected a method name or comma-separated names, got {spec!r}")
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
                f"hookviz: warning: --trust-pickle: unpickling {path!r} with torch.load(weights_only=False), "
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
                "integrated-gradients, smoothgrad, occlusion or rise, or a pickled model (torch.save(model))"
            ) from None
        raise
    path = save_figure(fig, out)
    print(f"wrote {path.resolve()}")
    return 0


# ---------------------------------------------------------------------------------------------------- explain-dataset

EXPLAIN_DATASET_DESCRIPTION = """\
Explain every image of a data set with one method and store the maps as resumable shards (safetensors) plus a
manifest.json; read them back with hookviz.load_explanations(OUT).

data:
  DIR                         a folder of images, one class per sub-folder (torchvision ImageFolder); labels are the
                              sub-folder indices in sorted order; images are resized and center-cropped to --size
  shapes:N                    N images of the embedded shapes data set (hookviz.zoo.ShapesDataset(N, seed=--seed));
                              --model defaults to the embedded shapes model (hookviz.zoo.shapes_model())

--model takes the same forms as in 'hookviz explain'. A killed run continues where it stopped when run again with
the same options; under torchrun every rank computes its own shards.

example:
  hookviz explain-dataset --data shapes:1000 --method gradcam --target label --out runs/gradcam
"""


class _FolderTransform:
    """PIL image -> float (3, H, W) tensor through the model's preprocessing (picklable, for DataLoader workers)."""

    def __init__(self, preprocess: Any) -> None:
        self.preprocess = preprocess

    def __call__(self, image: Any) -> torch.Tensor:
        from torchvision.transforms.functional import to_tensor

        from .inputs import Preset

        if isinstance(self.preprocess, Preset):
            return self.preprocess.normalize(self.preprocess.geometry(to_tensor(image.convert("RGB"))))
        return self.preprocess(image.convert("RGB"))


def _shapes_zoo(what: str) -> Any:
    from . import zoo

    if not hasattr(zoo, what):
        raise UsageError(f"--data shapes:N needs hookviz.zoo.{what}, which this hookviz version does not have")
    return getattr(zoo, what)


def _dataset_target(spec: str | None) -> Any:
    if spec is None or spec == "top":
        return None
    if spec == "label":
        return "label"
    try:
        value = int(spec)
    except ValueError:
        raise UsageError(f"--target: expected a class index, 'label' or 'top', got {spec!r}") from None
    if value < 0:
        raise UsageError(f"--target: class indices are >= 0, got {value}")
    return value


def _explain_dataset(args: argparse.Namespace) -> int:
    import time

    from .dataset import explain_dataset
    from .methods import METHODS

    if "," in args.method:
        raise UsageError(f"--method: explain-dataset takes one method, got {args.method!r}")
    (name,) = _parse_methods(args.method)
    target = _dataset_target(args.target)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device: {args.device!r} is not a device; use cpu, cuda or cuda:0") from None
    if args.data.startswith("shapes:"):
        try:
            n = int(args.data.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise UsageError(f"--data: expected shapes:N with N >= 1 images, got {args.data!r}")
        data = _shapes_zoo("ShapesDataset")(n, seed=args.seed)
        if args.model is None:
            model, note = _shapes_zoo("shapes_model")(), "the embedded shapes model"
        else:
            model, _, _, note = _load_model(args)
    else:
        from torchvision.datasets import ImageFolder

        if not os.path.isdir(args.data):
            raise UsageError(f"--data: {args.data!r} is not a directory (or shapes:N)")
        if args.model is None:
            raise UsageError("--model is required with a folder of images (it defaults only for --data shapes:N)")
        model, preprocess, _, note = _load_model(args)
        try:
            data = ImageFolder(args.data, transform=_FolderTransform(preprocess))
        except (FileNotFoundError, RuntimeError) as exc:
            raise UsageError(f"--data: {exc}") from None
    if note.startswith("note:"):
        print(note)
    model = model.to(device).eval()
    start = time.perf_counter()
    store = explain_dataset(
        METHODS[name](model),
        data,
        args.out,
        target=target,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        dtype=args.dtype,
        shard_size=args.shard_size,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    seconds = time.perf_counter() - start
    shape = "x".join(map(str, store.manifest.get("map_shape", [])))
    print(
        f"hookviz explain-dataset: {len(store)} maps ({shape}, {args.dtype}) by {name} in {seconds:.1f} s "
        f"({len(store) / max(seconds, 1e-9):.1f} img/s, resumed shards included), "
        f"{len(store.manifest['shards'])} shards in {Path(args.out).resolve()}"
    )
    return 0


# ---------------------------------------------------------------------------------------------------- evaluate

EVALUATE_METHODS = (
    "saliency,input-x-gradient,integrated-gradients,smoothgrad,guided-backprop,deconvnet,gradcam,gradcam++,"
    "layercam,xgradcam,hirescam,scorecam,guided-gradcam"
)

EVALUATE_DESCRIPTION = """\
Evaluate attribution methods on fresh images of hookviz's shapes data set, which come with object masks, and print
a markdown table: one row per method; columns: the pointing game and the energy in the mask (localisation), RISE's
deletion and insertion AUC (faithfulness: zeros and a blurred image as baselines) and the Spearman correlation
between the maps of the model and of the model with all its weights randomised (the sanity check of Adebayo et al.;
low is good: maps that survive randomisation do not explain the model). See hookviz.metrics for the conventions.

models:
  shapes                      the embedded shapes CNN (default), trained on the shapes data set
  torchvision:NAME[:WEIGHTS], torchvision:NAME --weights FILE.pt, PATH.pt
                              as for `hookviz explain` (see `hookviz explain --help`): images in [0, 1] are then
                              normalised with the weights' or the ImageNet mean and std (--normalize none: as they
                              are); the labels are classes 0..7 of the shapes data set, so such a model should have
                              been trained on it

example:
  hookviz evaluate --methods gradcam,guided-backprop --data shapes:500 --steps 50 --out table.md
"""


class _Normalized(nn.Module):
    """(x - mean) / std in front of a model, so that the metrics perturb images in [0, 1]."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(list(mean)).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std)).view(1, -1, 1, 1), persistent=False)
        self.model = model

    def forward(self, x: torch.Tensor) -> Any:
        return self.model((x - self.mean) / self.std)


def _parse_data(spec: str) -> int:
    name, _, count = spec.partition(":")
    try:
        n = int(count)
    except ValueError:
        n = -1
    if name != "shapes" or n < 1:
        raise UsageError(f"--data: expected shapes:N with N >= 1 images (e.g. shapes:500), got {spec!r}")
    return n


def _evaluate(args: argparse.Namespace) -> int:
    import dataclasses
    import inspect
    import warnings

    from .figures import SAVE_FORMATS
    from .methods import get_method
    from .metrics import Evaluation, SanityReport, evaluate, sanity_check
    from .zoo import shapes, shapes_model

    names = _parse_methods(args.methods, "--methods")
    n = _parse_data(args.data)
    for flag, value, low in (
        ("--steps", args.steps, 1),
        ("--sanity-n", args.sanity_n, 0),
        ("--batch-size", args.batch_size, 1),
    ):
        if value < low:
            raise UsageError(f"{flag}: expected an integer >= {low}, got {value}")
    if args.seed < 0:
        raise UsageError(f"--seed: expected an integer >= 0, got {args.seed}")
    if not args.tolerance >= 0:
        raise UsageError(f"--tolerance: expected a distance in pixels >= 0, got {args.tolerance}")
    if args.sanity_figure is not None:
        if Path(args.sanity_figure).suffix.lower() not in SAVE_FORMATS:
            raise UsageError(
                f"--sanity-figure: the suffix chooses the format, one of {', '.join(SAVE_FORMATS)}; "
                f"got {args.sanity_figure!r}"
            )
        if args.sanity_n == 0:
            raise UsageError("--sanity-figure needs --sanity-n >= 1 images")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device: {args.device!r} is not a device; use cpu, cuda or cuda:0") from None

    data = shapes(n, seed=args.seed)
    if args.model == "shapes":
        if args.weights is not None:
            raise UsageError("--weights applies to --model torchvision:NAME; the shapes model carries its own weights")
        model: nn.Module = shapes_model()
        mean = std = None
        if args.normalize == "imagenet":
            mean, std = IMAGENET_MEAN, IMAGENET_STD
        described = "the embedded shapes CNN"
    else:
        args.size = data.images.shape[-1]
        model, preprocess, _, note = _load_model(args)
        if note.startswith("note:"):
            print(note, file=sys.stderr)
        mean, std = getattr(preprocess, "mean", None), getattr(preprocess, "std", None)
        if args.normalize == "none":
            mean = std = None
        described = args.model
    if mean is not None and std is not None:
        model = _Normalized(model, mean, std)
    model = model.to(device).eval()

    torch.manual_seed(args.seed)  # SmoothGrad's noise: the same table from the same command
    methods = []
    for name in names:
        cls = get_method(name)
        # methods that multiply the batch (IG's steps, SmoothGrad's noisy copies, Score-CAM's masks) run in chunks of
        # --batch-size rows too: 64 images x 50 steps in one backward pass would need several GB
        takes_batch = "batch_size" in inspect.signature(cls).parameters
        methods.append(cls(model, batch_size=args.batch_size) if takes_batch else cls(model))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate(
            methods,
            model,
            data,
            target=args.target,
            steps=args.steps,
            tolerance=args.tolerance,
            sanity_n=0,  # below, so that the curves can be drawn as well
            seed=args.seed,
            batch_size=args.batch_size,
            progress=sys.stderr.isatty(),
        )
        if args.sanity_n > 0:
            # as evaluate does: the same method instances, the first sanity_n images, the same targets
            k = min(args.sanity_n, n)
            x = data.images[:k].to(device)
            if args.target == "label":
                t = data.labels[:k].to(device)
            else:
                with torch.no_grad():
                    t = model(x).argmax(dim=1)
            reports = [
                dataclasses.replace(sanity_check(m, x, t, seed=args.seed), method=name)
                for name, m in zip(names, methods, strict=True)
            ]
            final = torch.stack([r.final.nanmean() for r in reports])
            result = Evaluation(
                result.methods,
                [*result.metrics, "sanity ρ"],
                torch.cat([result.table, final[:, None]], dim=1),
                {
                    name: {**result.scores[name], "sanity ρ": r.final}
                    for name, r in zip(result.methods, reports, strict=True)
                },
                n=result.n,
                steps=result.steps,
            )
            if args.sanity_figure is not None:
                import matplotlib as mpl
                from cycler import cycler
                from matplotlib.figure import Figure

                from .figures import save_figure

                ax = Figure(figsize=(9.0, 4.4)).subplots()
                # up to 20 methods with their own colour; line styles keep coinciding curves apart
                colours = mpl.colormaps["tab20"].colors
                styles = ["-", "--", "-.", ":"]
                ax.set_prop_cycle(
                    cycler(color=[colours[(2 * i) % 20 + (2 * i) // 20 % 2] for i in range(len(reports))])
                    + cycler(linestyle=[styles[i % 4] for i in range(len(reports))])
                )
                fig = SanityReport.plot_many(reports, ax, band=False)
                ax.set_title(f"sanity check (model randomisation): {described}, {k} shapes images", fontsize=10)
                ax.set_ylim(min(-0.3, float(torch.stack([r.mean for r in reports]).nan_to_num(0).min()) - 0.05), 1.05)
                ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
                fig.tight_layout()
                path = save_figure(fig, args.sanity_figure)
                print(f"wrote {path.resolve()}", file=sys.stderr)
    if caught:
        print(f"note: {len(caught)} warning(s) during the evaluation; the first: {caught[0].message}", file=sys.stderr)

    table = result.to_markdown()
    k = min(args.sanity_n, n)
    sanity = f", sanity check on {k} image{'s' if k > 1 else ''} (cascading randomisation)" if k else ""
    classes = "true" if args.target == "label" else "predicted"
    tolerance = f" (pointing game within {args.tolerance:g} pixels)" if args.tolerance else ""
    caption = (
        f"{described}, {n} fresh shapes images (seed {args.seed}), explaining the {classes} classes{tolerance}; "
        f"deletion (zeros) and insertion (blur) with {args.steps} steps{sanity}."
    )
    print(table)
    print()
    print(caption)
    if args.out is not None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"{table}\n\n{caption}\n", encoding="utf-8")
        print(f"wrote {out.resolve()}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hookviz", description="Interpretability for PyTorch, built on hooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="explain fresh shapes images with the embedded trained model, write a PNG figure and print how often "
        "each method points at the object",
        description="Explain four fresh images of hookviz's synthetic shapes data set with Guided Backprop, Grad-CAM "
        "and Guided Grad-CAM on the embedded shapes CNN (trained on that data set, 8 classes; nothing is downloaded), "
        "write the figure and print each method's pointing game (how often the map's maximum lies on the object).",
    )
    demo.add_argument("--out", default="hookviz-demo.png", help="where to write the figure (default: %(default)s)")
    demo.add_argument(
        "--image", default=None, help="an image file to explain with the shapes model (resized to 64x64) instead"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the shapes images (default: %(default)s)")
    demo.add_argument("--dpi", type=int, default=120, help="figure resolution (default: %(default)s)")
    demo.add_argument(
        "--pointing-images",
        type=int,
        default=200,
        metavar="N",
        help="fresh shapes images the pointing game is played on (default: %(default)s)",
    )

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
    ds = sub.add_parser(
        "explain-dataset",
        help="explain a whole data set (a folder of images or shapes:N) into resumable shards",
        description=EXPLAIN_DATASET_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ds.add_argument("--data", required=True, metavar="DIR | shapes:N", help="the images (see 'data' above)")
    ds.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and manifest.json")
    ds.add_argument("--method", required=True, metavar="M", help="one attribution method, e.g. gradcam")
    ds.add_argument("--model", default=None, metavar="torchvision:NAME[:WEIGHTS] | PATH.pt", help="as in explain")
    ds.add_argument("--weights", default=None, metavar="PATH_OR_ENUM_NAME", help="as in explain")
    ds.add_argument("--trust-pickle", action="store_true", help="as in explain: full unpickling of --model PATH.pt")
    ds.add_argument("--target", default=None, metavar="T", help="a class index, 'label' or 'top' (default: top)")
    ds.add_argument("--size", type=int, default=None, metavar="S", help="image size for a folder (default: 224)")
    ds.add_argument("--batch-size", type=int, default=64, metavar="B", help="(default: %(default)s)")
    ds.add_argument("--num-workers", type=int, default=0, metavar="W", help="DataLoader workers (default: 0)")
    ds.add_argument("--shard-size", type=int, default=1024, metavar="S", help="items per shard (default: 1024)")
    ds.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16", help="of the maps")
    ds.add_argument("--seed", type=int, default=0, help="seed of the shapes data set (default: 0)")
    ds.add_argument("--overwrite", action="store_true", help="delete a run found in --out and start again")
    ds.add_argument("--no-progress", action="store_true", help="no progress bar")
    ds.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    ev = sub.add_parser(
        "evaluate",
        help="a methods x metrics table (pointing game, energy in mask, deletion, insertion, sanity check) on fresh "
        "shapes images",
        description=EVALUATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument(
        "--model",
        default="shapes",
        metavar="shapes | torchvision:NAME[:WEIGHTS] | PATH.pt",
        help="the model (default: %(default)s, the embedded trained CNN); PATH.pt is unpickled: only load files you "
        "trust",
    )
    ev.add_argument("--weights", default=None, metavar="PATH_OR_ENUM_NAME", help="as for hookviz explain")
    ev.add_argument(
        "--methods", default=EVALUATE_METHODS, metavar="M[,M...]", help="attribution methods (default: all)"
    )
    ev.add_argument("--data", default="shapes:500", metavar="shapes:N", help="the images (default: %(default)s)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the images and the randomisation (default: 0)")
    ev.add_argument("--steps", type=int, default=50, help="deletion and insertion steps (default: %(default)s)")
    ev.add_argument(
        "--sanity-n",
        type=int,
        default=8,
        metavar="N",
        help="images for the sanity check, 0 leaves it out (default: %(default)s)",
    )
    ev.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="PX",
        help="pointing game: a hit within this many pixels of the object (default: 0, on the object)",
    )
    ev.add_argument(
        "--target",
        choices=("label", "predicted"),
        default="label",
        help="explain the true class (default) or the model's top class",
    )
    ev.add_argument(
        "--normalize",
        choices=("imagenet", "none"),
        default=None,
        help="normalise the [0, 1] images before the model (default: none for shapes, else as hookviz explain)",
    )
    ev.add_argument(
        "--batch-size",
        type=int,
        default=64,
        metavar="B",
        help="images (or IG steps, SmoothGrad copies, Score-CAM masks) per pass (default: %(default)s)",
    )
    ev.add_argument("--out", default=None, metavar="TABLE.md", help="also write the table there")
    ev.add_argument(
        "--sanity-figure", default=None, metavar="FIG", help="also draw the sanity-check curves there (.png, .pdf)"
    )
    ev.add_argument(
        "--trust-pickle",
        action="store_true",
        help="as for hookviz explain: unpickle a whole-model PATH.pt (runs code from the file: only files you trust)",
    )
    ev.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookviz`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    commands = {"demo": _demo, "explain": _explain, "explain-dataset": _explain_dataset, "evaluate": _evaluate}
    if args.command in commands:
        try:
            return commands[args.command](args)
        except UsageError as exc:
            message = str(exc)
        except (TypeError, ValueError, FileNotFoundError, IsADirectoryError) as exc:
            # hookviz's own checks (an out-of-range target, an unreadable image) already say what to fix
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        parser.exit(2, f"hookviz {args.command}: error: {message}\n")
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
