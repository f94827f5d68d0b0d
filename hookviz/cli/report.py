"""``hookviz report``: a static HTML report over stores written by ``hookviz explain-dataset``; and the report of
``hookviz evaluate --report DIR``."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .common import UsageError

REPORT_DESCRIPTION = """\
Write a static HTML report (no server, no CDN: open DIR/index.html from the file system or any static host) over
one or more stores of maps of the same images, one column per store: a grid of thumbnails with each image's label,
prediction and per-method metrics, sorting and filtering (state in the URL), a detail view with the display
controls, and a summary page.

The images come from the data set recorded in the stores (shapes:N and image folders are recorded by
explain-dataset); the embedded shapes model gives the predictions when it made the maps.

example:
  hookviz explain-dataset --data shapes:1000 --method gradcam --target label --out runs/gradcam
  hookviz explain-dataset --data shapes:1000 --method guided-backprop --target label --out runs/guided
  hookviz report runs/gradcam runs/guided --out report
"""


def add_parser(sub: Any) -> None:
    """The ``report`` subcommand's options."""
    rep = sub.add_parser(
        "report",
        help="a static HTML report (grid, filters, detail view, summary) over stores of maps of the same images",
        description=REPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("stores", nargs="+", metavar="STORE_DIR", help="directories written by explain-dataset")
    rep.add_argument("--out", required=True, metavar="DIR", help="the report folder")
    rep.add_argument(
        "--overwrite", action="store_true", help="write into DIR even if it holds files that are not a hookviz report"
    )
    rep.add_argument("--title", default=None, help="the report's title")
    rep.add_argument(
        "--workers", type=int, default=None, metavar="W", help="threads writing thumbnails (default: CPUs)"
    )
    rep.set_defaults(run=_report)


def add_evaluate_option(parser: argparse.ArgumentParser) -> None:
    """``hookviz evaluate --report DIR``."""
    parser.add_argument(
        "--report", default=None, metavar="DIR", help="also write a static HTML report of the run's images and maps"
    )


def _report(args: argparse.Namespace) -> int:
    from ..report import report

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: expected an integer >= 1, got {args.workers}")
    start = time.perf_counter()
    index = report(args.stores, args.out, overwrite=args.overwrite, title=args.title, workers=args.workers)
    print(f"hookviz report: wrote {index.resolve()} in {time.perf_counter() - start:.1f} s")
    return 0


def sanity_figure_for_report(args: argparse.Namespace) -> Path | None:
    """With ``--report`` and a sanity check but no ``--sanity-figure``: a temporary path so the figure is drawn."""
    if getattr(args, "report", None) is None or args.sanity_n == 0 or args.sanity_figure is not None:
        return None
    path = Path(tempfile.mkdtemp(prefix="hookviz-sanity-")) / "sanity.png"
    args.sanity_figure = str(path)
    return path


def write_evaluate_report(
    args: argparse.Namespace, methods: list[Any], model: torch.nn.Module, data: Any, result: Any, tmp: Path | None
) -> None:
    """The report of an evaluate run: its maps (those `evaluate` scored, kept in ``result.maps``; computed as evaluate
    does when the result holds none), images, predictions and table."""
    from ..metrics.faithfulness import eval_mode
    from ..report import report

    try:
        maps = dict(result.maps) if result.maps is not None else {}
        if any(name not in maps for name in result.methods):
            x = data.images.to(next(iter(model.parameters()), torch.empty(0)).device)
            if args.target == "label":
                t = data.labels.to(x.device)
            else:
                with eval_mode(model), torch.no_grad():
                    t = torch.cat([model(c).argmax(dim=1) for c in x.split(args.batch_size)])
            for name, method in zip(result.methods, methods, strict=True):
                if name not in maps:
                    chunks = zip(x.split(args.batch_size), t.split(args.batch_size), strict=True)
                    maps[name] = torch.cat([method.attribute(xc, tc).detach().cpu() for xc, tc in chunks])
        index = report(
            maps,
            args.report,
            data=data,
            model=model,
            evaluation=result,
            sanity_figure=args.sanity_figure if args.sanity_n > 0 and args.sanity_figure else None,
            title=f"hookviz evaluate: {', '.join(result.methods)} on {len(data)} shapes images",
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp.parent, ignore_errors=True)
    print(f"wrote {index.resolve()}", file=sys.stderr)
