"""RelMax / ActMax reference examples of the shapes CNN's last conv layer (issue 36, part 3): the figures in
docs/concepts.md.

Usage::

    python benchmarks/crp_relmax_shapes.py [--n 2000] [--k 6] [--out-dir docs] [--state /tmp/crp-relmax]

The zoo's shapes CNN (shipped weights), composite epsilon-plus-flat. For the classes ring, star and cross, the two
channels of ``features.3`` (96) with the largest mean relevance R_c over the first 400 items of that class's own
label (`CRP.concept_relevance`); then `relmax` over ``--n`` shapes items (seed 7) for those six channels with
``target="label"``: the k most relevant items (RelMax) and the k most activating (ActMax), cropped. Prints the labels
of the found items (how many are of the class the channel was picked for) and writes ``concepts-crp-relmax.png`` and
``concepts-crp-actmax.png``.
"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path
from typing import Any

import matplotlib
import torch

import hookviz as hv
from hookviz.zoo import shapes_model
from hookviz.zoo.data import CLASSES, ShapesDataset

matplotlib.use("Agg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--out-dir", default="docs")
    parser.add_argument("--state", default="/tmp/crp-relmax")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = shapes_model()
    data = ShapesDataset(args.n, seed=7)
    crp = hv.CRP(model, "epsilon-plus-flat")
    images, labels = data.shapes.images[:400], data.shapes.labels[:400]
    shares = crp.concept_relevance(images, labels, "features.3")
    picked, wanted = [], []
    for name in ("ring", "star", "cross"):
        c = CLASSES.index(name)
        top = shares[labels == c].mean(0).topk(2)
        print(f"{name}: channels {top.indices.tolist()}, mean R_c {[round(v, 3) for v in top.values.tolist()]}")
        picked += top.indices.tolist()
        wanted += [c, c]
    shutil.rmtree(args.state, ignore_errors=True)
    res = crp.relmax(data, "features.3", args.state, k=args.k, channels=picked, target="label", batch_size=100,
                     shard_size=500)  # fmt: skip
    all_labels = data.shapes.labels
    for kind, top in (("RelMax", res.relevance), ("ActMax", res.activation)):
        for row, (ch, c) in enumerate(zip(picked, wanted, strict=True)):
            found = [CLASSES[int(all_labels[i])] for i in top.indices[row]]
            hits = sum(f == CLASSES[c] for f in found)
            print(f"{kind} channel {ch} (picked for {CLASSES[c]}): {hits}/{args.k} of that class: {found}")
    out = Path(args.out_dir)
    title = f"RelMax: features.3, channels {picked} (two per class ring, star, cross); item index, R_c"
    _save(res.figure("relevance", title=title), out / "concepts-crp-relmax.png")
    title = "ActMax: features.3, the same channels; item index, largest activation (crop: receptive field)"
    _save(res.figure("activation", title=title), out / "concepts-crp-actmax.png")


def _save(fig: Any, path: Path) -> None:
    """The figure as a 256-colour PNG (a third of the size; the crops' colours survive)."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=80)
    Image.open(buf).convert("RGB").quantize(256).save(path, optimize=True)


if __name__ == "__main__":
    main()
