"""``hookviz evaluate``: a methods x metrics table on fresh shapes images, with an optional sanity-check figure."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .common import MODEL_METAVAR, UsageError, _parse_device, _parse_methods
from .models import IMAGENET_MEAN, IMAGENET_STD, ZOO_MODELS, _load_model, zoo_model
from .report import add_evaluate_option, sanity_figure_for_report, write_evaluate_report

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
  vit                         the embedded shapes ViT (hookviz.zoo.shapes_vit()), trained on the same data
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
    import warnings

    from ..metrics import evaluate
    from ..zoo import shapes

    names = _parse_methods(args.methods, "--methods")
    n = _parse_data(args.data)
    _check_args(args)
    device = _parse_device(args.device)
    sanity_tmp = sanity_figure_for_report(args)
    data = shapes(n, seed=args.seed)
    model, described = _model(args, data.images.shape[-1])
    model = model.to(device).eval()
    torch.manual_seed(args.seed)  # SmoothGrad's noise: the same table from the same command
    methods = _methods(names, model, args.batch_size)
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
            keep_maps=args.report is not None,  # the report shows the maps that were scored: computed once
        )
        if args.sanity_n > 0:
            result = _with_sanity(result, args, names, methods, model, data, device, described)
    if caught:
        print(f"note: {len(caught)} warning(s) during the evaluation; the first: {caught[0].message}", file=sys.stderr)
    _print_table(result, args, n, described)
    if args.report is not None:
        write_evaluate_report(args, methods, model, data, result, sanity_tmp)
    return 0


def _check_args(args: argparse.Namespace) -> None:
    """The numeric options and --sanity-figure checked before any work."""
    from .._formats import SAVE_FORMATS

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


def _model(args: argparse.Namespace, size: int) -> tuple[nn.Module, str]:
    """The model --model names (normalising [0, 1] images as --normalize says), and how the caption names it."""
    if args.model in ZOO_MODELS:
        if args.weights is not None:
            raise UsageError(
                f"--weights applies to --model torchvision:NAME; --model {args.model} carries its own weights"
            )
        model, described = zoo_model(args.model)  # type: ignore[misc]
        mean = std = None
        if args.normalize == "imagenet":
            mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        args.size = size
        model, preprocess, _, note = _load_model(args)
        if note.startswith("note:"):
            print(note, file=sys.stderr)
        mean, std = getattr(preprocess, "mean", None), getattr(preprocess, "std", None)
        if args.normalize == "none":
            mean = std = None
        described = args.model
    if mean is not None and std is not None:
        model = _Normalized(model, mean, std)
    return model, described


def _methods(names: list[str], model: nn.Module, batch_size: int) -> list[Any]:
    """The methods built on `model`; those that multiply the batch run in chunks of `batch_size` rows."""
    import inspect

    from ..methods import get_method

    methods = []
    for name in names:
        cls = get_method(name)
        # methods that multiply the batch (IG's steps, SmoothGrad's noisy copies, Score-CAM's masks) run in chunks of
        # --batch-size rows too: 64 images x 50 steps in one backward pass would need several GB
        takes_batch = "batch_size" in inspect.signature(cls).parameters
        methods.append(cls(model, batch_size=batch_size) if takes_batch else cls(model))
    return methods


def _with_sanity(
    result: Any,
    args: argparse.Namespace,
    names: list[str],
    methods: list[Any],
    model: nn.Module,
    data: Any,
    device: torch.device,
    described: str,
) -> Any:
    """`result` with the sanity-check column (and its figure when --sanity-figure): as `evaluate` computes it, the
    same method instances, the first --sanity-n images and the same targets."""
    import dataclasses

    from ..metrics import Evaluation, sanity_check

    k = min(args.sanity_n, len(data))
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
    if args.sanity_figure is not None:
        _sanity_figure(reports, args.sanity_figure, f"{described}, {k} shapes images")
    return Evaluation(
        result.methods,
        [*result.metrics, "sanity ρ"],
        torch.cat([result.table, final[:, None]], dim=1),
        {name: {**result.scores[name], "sanity ρ": r.final} for name, r in zip(result.methods, reports, strict=True)},
        n=result.n,
        steps=result.steps,
        maps=result.maps,
    )


def _sanity_figure(reports: list[Any], out: str, what: str) -> None:
    """The sanity-check curves of every method in one figure, written to `out`."""
    import matplotlib as mpl
    from cycler import cycler
    from matplotlib.figure import Figure

    from ..figures import save_figure
    from ..metrics import SanityReport

    ax = Figure(figsize=(9.0, 4.4)).subplots()
    # up to 20 methods with their own colour; line styles keep coinciding curves apart
    colours = mpl.colormaps["tab20"].colors
    styles = ["-", "--", "-.", ":"]
    ax.set_prop_cycle(
        cycler(color=[colours[(2 * i) % 20 + (2 * i) // 20 % 2] for i in range(len(reports))])
        + cycler(linestyle=[styles[i % 4] for i in range(len(reports))])
    )
    fig = SanityReport.plot_many(reports, ax, band=False)
    ax.set_title(f"sanity check (model randomisation): {what}", fontsize=10)
    ax.set_ylim(min(-0.3, float(torch.stack([r.mean for r in reports]).nan_to_num(0).min()) - 0.05), 1.05)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path = save_figure(fig, out)
    print(f"wrote {path.resolve()}", file=sys.stderr)


def _print_table(result: Any, args: argparse.Namespace, n: int, described: str) -> None:
    """The markdown table and its caption on stdout (and in --out)."""
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


def add_parser(sub: Any) -> None:
    """Add this command to the ``hookviz`` subcommands `sub` (its options, help, and the function that runs it)."""
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
        metavar=MODEL_METAVAR,
        help="the model (default: %(default)s, the embedded trained CNN; vit: the embedded ViT); PATH.pt is "
        "unpickled: only load files you trust",
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
        help="normalise the [0, 1] images before the model (default: none for shapes and vit, else as hookviz explain)",
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
    add_evaluate_option(ev)
    ev.set_defaults(run=_evaluate)
