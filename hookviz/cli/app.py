"""The ``hookviz`` parser and ``main``: the subcommands, their options and help, and the one-line error handling.

Mistakes on the command line (an unknown method or model, a missing file, a bad target) end with exit code 2 and
one line on stderr, ``hookviz explain: error: ...``, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .common import UsageError
from .dataset import EXPLAIN_DATASET_DESCRIPTION, _explain_dataset
from .demo import _demo
from .evaluate import EVALUATE_DESCRIPTION, EVALUATE_METHODS, _evaluate
from .explain import EXPLAIN_DESCRIPTION, _explain
from .report import _report, add_evaluate_option, add_parser


class _Parser(argparse.ArgumentParser):
    """argparse with its errors (a bad ``--size``, a missing ``--model``) as one line, like hookviz's own."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    add_evaluate_option(ev)
    add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookviz`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    commands = {"demo": _demo, "explain": _explain, "explain-dataset": _explain_dataset, "evaluate": _evaluate}
    commands["report"] = _report
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
