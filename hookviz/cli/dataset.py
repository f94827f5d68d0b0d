"""``hookviz explain-dataset``: every image of a folder or of the shapes data set explained into resumable shards."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from .common import MODEL_METAVAR, UsageError, _parse_device, _parse_methods
from .models import ZOO_MODELS, _load_model, zoo_model

EXPLAIN_DATASET_DESCRIPTION = """\
Explain every image of a data set with one method and store the maps as resumable shards (safetensors) plus a
manifest.json; read them back with hookviz.load_explanations(OUT).

data:
  DIR                         a folder of images, one class per sub-folder (torchvision ImageFolder); labels are the
                              sub-folder indices in sorted order; images are preprocessed as the model's own rule says
                              (as in Python), or resized and center-cropped to --size
  shapes:N                    N images of the embedded shapes data set (hookviz.zoo.ShapesDataset(N, seed=--seed));
                              --model defaults to the embedded shapes model (hookviz.zoo.shapes_model()); --model
                              vit is the embedded shapes ViT (hookviz.zoo.shapes_vit())

--model takes the same forms as in 'hookviz explain', and shapes or vit (the embedded models) with shapes:N. A
killed run continues where it stopped when run again with the same options; under torchrun every rank computes its
own shards.

example:
  hookviz explain-dataset --data shapes:1000 --method gradcam --target label --out runs/gradcam
"""


class _FolderTransform:
    """PIL image -> float (3, H, W) tensor through the model's preprocessing (picklable, for DataLoader workers)."""

    def __init__(self, preprocess: Any) -> None:
        self.preprocess = preprocess

    def __call__(self, image: Any) -> torch.Tensor:
        from torchvision.transforms.functional import to_tensor

        from ..images import Preset

        if isinstance(self.preprocess, Preset):
            return self.preprocess.normalize(self.preprocess.geometry(to_tensor(image.convert("RGB"))))
        return self.preprocess(image.convert("RGB"))


def _shapes_zoo(what: str) -> Any:
    from .. import zoo

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

    from ..dataset import explain_dataset
    from ..methods import METHODS

    if "," in args.method:
        raise UsageError(f"--method: explain-dataset takes one method, got {args.method!r}")
    (name,) = _parse_methods(args.method)
    target = _dataset_target(args.target)
    device = _parse_device(args.device)
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
        elif args.model in ZOO_MODELS:
            model, note = zoo_model(args.model)  # type: ignore[misc]
        else:
            model, _, _, note = _load_model(args)
    else:
        from torchvision.datasets import ImageFolder

        if not os.path.isdir(args.data):
            raise UsageError(f"--data: {args.data!r} is not a directory (or shapes:N)")
        if args.model is None:
            raise UsageError("--model is required with a folder of images (it defaults only for --data shapes:N)")
        if args.model in ZOO_MODELS:
            raise UsageError(
                f"--model {args.model} (an embedded model of 64x64 shapes images) takes --data shapes:N, not a folder"
            )
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


def add_parser(sub: Any) -> None:
    """Add this command to the ``hookviz`` subcommands `sub` (its options, help, and the function that runs it)."""
    ds = sub.add_parser(
        "explain-dataset",
        help="explain a whole data set (a folder of images or shapes:N) into resumable shards",
        description=EXPLAIN_DATASET_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ds.add_argument("--data", required=True, metavar="DIR | shapes:N", help="the images (see 'data' above)")
    ds.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and manifest.json")
    ds.add_argument("--method", required=True, metavar="M", help="one attribution method, e.g. gradcam")
    ds.add_argument(
        "--model",
        default=None,
        metavar=MODEL_METAVAR,
        help="as in explain; shapes, vit: the embedded models",
    )
    ds.add_argument("--weights", default=None, metavar="PATH_OR_ENUM_NAME", help="as in explain")
    ds.add_argument("--trust-pickle", action="store_true", help="as in explain: full unpickling of --model PATH.pt")
    ds.add_argument("--target", default=None, metavar="T", help="a class index, 'label' or 'top' (default: top)")
    ds.add_argument("--size", type=int, default=None, metavar="S", help="folder image size (default: the model's own)")
    ds.add_argument("--batch-size", type=int, default=64, metavar="B", help="(default: %(default)s)")
    ds.add_argument("--num-workers", type=int, default=0, metavar="W", help="DataLoader workers (default: 0)")
    ds.add_argument("--shard-size", type=int, default=1024, metavar="S", help="items per shard (default: 1024)")
    ds.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16", help="of the maps")
    ds.add_argument("--seed", type=int, default=0, help="seed of the shapes data set (default: 0)")
    ds.add_argument("--overwrite", action="store_true", help="delete a run found in --out and start again")
    ds.add_argument("--no-progress", action="store_true", help="no progress bar")
    ds.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    ds.set_defaults(run=_explain_dataset)
