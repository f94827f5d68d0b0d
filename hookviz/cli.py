"""Command line: ``hookviz demo`` explains a sample image end to end and writes a PNG."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch


def _demo(args: argparse.Namespace) -> int:
    from torchvision import models

    from . import GradCAM, GuidedBackprop, Saliency, display
    from .inputs import Preset
    from .zoo import shapes_image

    torch.manual_seed(args.seed)
    # Placeholder until the embedded shapes model ships: an untrained network shows how hookviz works, not what a
    # trained network has learned.
    model = models.resnet18(weights=None).eval()
    image = args.image if args.image else shapes_image(args.size, seed=args.seed)
    preset = Preset("demo", args.size, args.size, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    target = 0
    gb = GuidedBackprop(model).visualize(image, target=target, preprocess=preset)
    sal = Saliency(model).visualize(image, target=target, preprocess=preset)
    gradcam = GradCAM(model)
    cam = gradcam.visualize(image, target=target, preprocess=preset)

    from matplotlib.figure import Figure

    panels = [
        ("input", gb.images[0]),
        ("Guided Backprop", gb.heatmap()[0]),
        ("Saliency |grad|", sal.heatmap()[0]),
        (f"Grad-CAM ({gradcam.layer})", cam.overlay()[0]),
    ]
    fig = Figure(figsize=(3 * len(panels), 3.3), dpi=args.dpi)
    for i, (title, img) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        ax.imshow(display.to_pil(img))
        ax.set_title(title, fontsize=10)
        ax.set_axis_off()
    fig.suptitle(
        f"hookviz demo: resnet18 (untrained, weights=None, seed {args.seed}), target class {target}", fontsize=10
    )
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(
        f"hookviz demo: explained a {args.size}x{args.size} sample image with Guided Backprop, Saliency and Grad-CAM "
        f"on an UNTRAINED resnet18 (weights=None, seed {args.seed}; no weights are downloaded), so the maps show the "
        "mechanics, not learned evidence."
    )
    print(f"wrote {out.resolve()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookviz`` console script."""
    parser = argparse.ArgumentParser(prog="hookviz", description="Interpretability for PyTorch, built on hooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="explain a sample image end to end and write a PNG figure")
    demo.add_argument("--out", default="hookviz-demo.png", help="where to write the figure (default: %(default)s)")
    demo.add_argument("--image", default=None, help="an image file to explain instead of the built-in shapes image")
    demo.add_argument("--size", type=int, default=128, help="input size in pixels (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the untrained model and sample image")
    demo.add_argument("--dpi", type=int, default=120)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
