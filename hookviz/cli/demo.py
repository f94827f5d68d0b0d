"""``hookviz demo``: fresh shapes images explained with an embedded trained model (``--model shapes``: the CNN, the
default; ``--model vit``: the ViT), and each method's pointing game."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from .common import UsageError, _check_images

# Per embedded model (`hookviz.cli.models.ZOO_MODELS`): the methods shown, by registry name, with column titles
# (None: Grad-CAM, titled with its layer). Guided Backprop and Guided Grad-CAM need ReLUs, which the ViT does not
# have (GELU): it shows gradient methods and Grad-CAM on its patch grid.
DEMO_COLUMNS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "shapes": (("guided-backprop", "Guided Backprop"), ("gradcam", None), ("guided-gradcam", "Guided Grad-CAM")),
    # the transformer methods that lead on the ViT's metrics (docs/evaluation.md), and Grad-CAM, which comes last
    "vit": (("lrp-attn-lrp", "AttnLRP"), ("gradient-rollout", "Gradient Rollout"), ("gradcam", None)),
}


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
    from .._formats import SAVE_FORMATS
    from ..figures import grid, save_figure
    from ..images import Preset
    from ..methods import get_method
    from ..metrics import pointing_game
    from ..zoo import shapes
    from .models import zoo_model

    if Path(args.out).suffix.lower() not in SAVE_FORMATS:  # checked before the work, not after it
        raise UsageError(f"--out: the suffix chooses the format, one of {', '.join(SAVE_FORMATS)}; got {args.out!r}")
    if args.dpi <= 0:
        raise UsageError(f"--dpi: expected a positive number, got {args.dpi}")
    if args.pointing_images < 1:
        raise UsageError(f"--pointing-images: expected at least 1 image, got {args.pointing_images}")
    if args.image is not None:
        _check_images([args.image])
    model, described = zoo_model(args.model)  # type: ignore[misc]  # argparse's choices are ZOO_MODELS' names
    columns = DEMO_COLUMNS[args.model]
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
    methods = [get_method(name)(model) for name, _ in columns]
    exps = [m.visualize(images, preprocess=preprocess, labels=classes) for m in methods]
    titles = [
        title if title is not None else f"Grad-CAM ({m.layer})" for (_, title), m in zip(columns, methods, strict=True)
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
        col_labels=["input", *titles],
        row_labels=row_labels,
        title=f"trained {described.removeprefix('the embedded ')} on {source}; rows: predicted class, probability",
        size=(7.2, 1.75 * len(row_labels) + 0.45),  # screen-sized cells and fonts: the demo is looked at, not printed
        rc={"axes.titlesize": 10, "axes.labelsize": 10, "figure.titlesize": 10},
        dpi=args.dpi,
    )
    out = save_figure(fig, args.out)
    shown = [t.split(" (")[0] for t in titles]
    print(
        f"hookviz demo: explained {'your image (resized to 64x64)' if args.image else 'four fresh shapes images'} "
        f"with {', '.join(shown[:-1])} and {shown[-1]} on {described} (trained on synthetic shapes, 8 classes; "
        "nothing is downloaded)"
    )
    print(f"wrote {out.resolve()}")
    # how often each method's maximum lies on the object, for the images' true classes (Zhang et al. 2018)
    n = args.pointing_images
    x, y, masks = data.images[:n], data.labels[:n], data.masks[:n]
    for name, _ in columns:
        hits = pointing_game(get_method(name)(model).attribute(x, y), masks)
        print(f"pointing game ({n} images): {name} {hits.nanmean().item():.2f}")
    return 0


def add_parser(sub: Any) -> None:
    """Add this command to the ``hookviz`` subcommands `sub` (its options, help, and the function that runs it)."""
    demo = sub.add_parser(
        "demo",
        help="explain fresh shapes images with an embedded trained model, write a PNG figure and print how often "
        "each method points at the object",
        description="Explain four fresh images of hookviz's synthetic shapes data set with Guided Backprop, Grad-CAM "
        "and Guided Grad-CAM on the embedded shapes CNN (trained on that data set, 8 classes; nothing is downloaded), "
        "or with AttnLRP, Gradient Rollout and Grad-CAM on the embedded shapes ViT (--model vit), write the "
        "figure and print each method's pointing game (how often the map's maximum lies on the object).",
    )
    demo.add_argument(
        "--model",
        choices=tuple(DEMO_COLUMNS),
        default="shapes",
        help="the embedded model: shapes, the CNN (Guided Backprop, Grad-CAM, Guided Grad-CAM), or vit, the vision "
        "transformer (AttnLRP, Gradient Rollout, Grad-CAM on its 8x8 patch grid) (default: %(default)s)",
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
    demo.set_defaults(run=_demo)
