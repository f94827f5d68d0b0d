"""``hookviz features``: render feature visualisations of units of one layer and write them as a grid figure."""

from __future__ import annotations

import argparse
from typing import Any

from .common import MODEL_METAVAR, UsageError, _parse_device
from .models import ZOO_MODELS, zoo_model

FEATURES_DESCRIPTION = (
    "Render images that maximise units (channels) of one layer (feature visualisation, Olah et al. 2017, with "
    "lucent's defaults: Fourier parameterisation, decorrelated colour, Adam lr 0.05, its random transforms) and write "
    "them as a grid figure. --model shapes is the embedded shapes CNN, --model vit the embedded shapes ViT (64x64 "
    "images in [0, 1]); torchvision models get ImageNet normalisation."
)


def add_parser(sub: Any) -> None:
    """The ``features`` subcommand's arguments."""
    p = sub.add_parser(
        "features",
        help="render feature visualisations of units of a layer and write a grid figure",
        description=FEATURES_DESCRIPTION,
    )
    p.add_argument("--model", required=True, metavar=MODEL_METAVAR)
    p.add_argument("--layer", required=True, help="module name, e.g. head or features.4 (see model.named_modules())")
    p.add_argument("--units", required=True, metavar="U[,U...]", help="channel indices, comma-separated (0,1,2)")
    p.add_argument("--out", default="features.png", help="the figure (.png, .pdf, .svg; default: %(default)s)")
    p.add_argument("--size", type=int, default=None, help="image size (default: 64 for shapes and vit, else 128)")
    p.add_argument("--steps", type=int, default=512, help="optimisation steps (default: %(default)s, lucent's)")
    p.add_argument("--sd", type=float, default=None, help="initial noise (default: 0.1 for shapes and vit, else 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    p.add_argument("--weights", default=None, help="torchvision weights name (for --model torchvision:NAME)")
    p.add_argument("--trust-pickle", action="store_true", help="unpickle --model PATH.pt fully (trusted files only)")
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    p.set_defaults(run=_features)


def _parse_units(spec: str) -> list[int]:
    try:
        units = [int(u) for u in spec.split(",") if u.strip()]
    except ValueError:
        raise UsageError(f"--units must be comma-separated channel indices such as 0,1,2, got {spec!r}") from None
    if not units:
        raise UsageError("--units names no unit")
    return units


def _features(args: argparse.Namespace) -> int:
    import torch

    from .. import FeatureVisualization, feature_grid

    units = _parse_units(args.units)
    device = _parse_device(args.device)
    preprocess = None
    if args.model in ZOO_MODELS:
        from ..zoo import CLASSES

        model = zoo_model(args.model)[0]  # type: ignore[index]
        size, sd = args.size or 64, args.sd or 0.1
        titles = [CLASSES[u] if args.layer == "head" and 0 <= u < len(CLASSES) else f"{args.layer}:{u}" for u in units]
    else:
        from ..images import IMAGENET
        from .models import _load_model

        model = _load_model(argparse.Namespace(**{**vars(args), "size": args.size}))[0]
        size, sd = args.size or 128, args.sd or 0.01
        mean = torch.tensor(IMAGENET.mean, device=device).reshape(1, 3, 1, 1)
        std = torch.tensor(IMAGENET.std, device=device).reshape(1, 3, 1, 1)
        preprocess = lambda x: (x - mean) / std  # noqa: E731
        titles = [f"{args.layer}:{u}" for u in units]
    model = model.to(device)
    fv = FeatureVisualization(model, size=size, steps=args.steps, sd=sd, preprocess=preprocess)
    images = fv.render([f"{args.layer}:{u}" for u in units], seed=args.seed)
    path = feature_grid(images, titles=titles, values=fv.last_values, out=args.out)
    print(f"wrote {args.out}: {len(units)} units of {args.layer}, {args.steps} steps; objective values "
          + ", ".join(f"{v:.2f}" for v in fv.last_values.tolist()))  # fmt: skip
    del path
    return 0
