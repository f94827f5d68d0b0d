"""``hookviz explain``: image files explained with one or more methods, written as one grid figure."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from .common import MODEL_METAVAR, UsageError, _check_images, _parse_device, _parse_methods
from .models import _load_model

EXPLAIN_DESCRIPTION = """\
Explain images with one or more attribution methods and write one figure: a row per image, a column per method
(or, with one method and several targets, a column per target), the inputs first.

models (the same forms in every command that takes --model):
  shapes, vit                 the embedded shapes CNN / ViT (trained, 64x64 images, 8 classes, nothing downloaded);
                              their own preprocessing and class names are used
  timm:NAME[:pretrained]      a timm model, RANDOM weights (pretrained=False, seed 0) unless :pretrained is asked
                              (downloaded by timm on first use); preprocessing from the model's data config
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
  Images are preprocessed by the model's own rule, as in Python (visualize, grid): the weights' transforms(), a
  preset the model carries, a timm or Hugging Face config, else ImageNet's (resize 256, center crop 224); with
  --size they are resized (shorter side) and center-cropped to --size and normalized with the ImageNet mean and std.
  A download that fails (no network) ends in one line that says what to do.

example:
  hookviz explain cat.jpg dog.jpg --model torchvision:resnet18:DEFAULT --method guided-backprop,gradcam --out fig.pdf
"""


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


def _explain(args: argparse.Namespace) -> int:
    from .._formats import SAVE_FORMATS
    from ..figures import grid, save_figure

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
    device = _parse_device(args.device)

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


def add_parser(sub: Any) -> None:
    """Add this command to the ``hookviz`` subcommands `sub` (its options, help, and the function that runs it)."""
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
        metavar=MODEL_METAVAR,
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
        help="for torchvision:NAME: a local state_dict file, or a weights enum member such as IMAGENET1K_V1; for "
        "timm:NAME: a local state_dict file",
    )
    ex.add_argument(
        "--size", type=int, default=None, metavar="S", help="input size in pixels (default: the model's own)"
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
    ex.set_defaults(run=_explain)
