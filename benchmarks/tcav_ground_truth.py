"""TCAV against what the shapes data are known to contain (issue 36, ground truth): the table in docs/concepts.md.

Usage::

    python benchmarks/tcav_ground_truth.py [--threads 1] [--per-set 40] [--n-random 10] [--out PATH.md]

Concepts drawn from the shapes generator's own images (`hookviz.zoo.shapes`), never from the classes' test inputs:

- ``round outline``: a thin (2 px) circle outline of random centre, radius and colour on a shapes background;
- ``straight edges``: a thin square outline, randomly rotated, on a shapes background;
- ``circle shape``: images of another class, the filled circle (round, but not an outline);
- ``background``: shapes images with the object's pixels replaced by the image rolled by half its size (the
  background texture and distractors, no object);
- ``random images``: a fresh draw of shapes images, like the random pool: no class should depend on it.

Backgrounds are shapes images with the object removed as above. Classes: ring, circle, square, triangle (40 test
images each, their true class as the target). Models: the shapes CNN at ``conv3`` and ``features.4`` (flattened),
the shapes ViT at ``blocks.1`` and ``blocks.3`` (class token). Logistic CAVs, n_random random sets drawn from a
pool of shapes images, the null of ``--null``, Student t-test, Bonferroni over each model's table.
"""

from __future__ import annotations

import argparse
import math

import torch

import hookviz as hv
from hookviz.zoo import CLASSES, shapes, shapes_model, shapes_vit


def _backgrounds(n: int, seed: int) -> torch.Tensor:
    d = shapes(n, seed=seed)
    size = d.images.shape[-1]
    rolled = d.images.roll((size // 2, size // 2), dims=(2, 3))
    return torch.where(d.masks[:, None], rolled, d.images)


def _outlines(n: int, seed: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    img = _backgrounds(n, seed)
    size = img.shape[-1]
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    radius = 9 + 7 * torch.rand(n, generator=g)
    centre = radius[:, None] + 2 + torch.rand(n, 2, generator=g) * (size - 4 - 2 * radius[:, None])
    dx = coords.view(1, 1, size) - centre[:, 0].view(-1, 1, 1)
    dy = coords.view(1, size, 1) - centre[:, 1].view(-1, 1, 1)
    r = radius.view(-1, 1, 1)
    if kind == "round":
        dist = (torch.sqrt(dx * dx + dy * dy) - r).abs() - 1.0
    else:
        th = (torch.rand(n, generator=g) * math.pi / 2).view(-1, 1, 1)
        u, v = dx * torch.cos(th) + dy * torch.sin(th), dy * torch.cos(th) - dx * torch.sin(th)
        dist = (torch.maximum(u.abs(), v.abs()) - r * 0.8).abs() - 1.0
    alpha = (0.5 - dist).clamp(0, 1).unsqueeze(1)
    mean = img.mean((2, 3), keepdim=True)
    colour = torch.where(mean > 0.5, mean - 0.45, mean + 0.45).clamp(0, 1)
    return img.lerp(colour.expand_as(img), alpha)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--per-set", type=int, default=40)
    parser.add_argument("--n-random", type=int, default=10)
    parser.add_argument("--null", default="independent", choices=["independent", "fixed"])
    parser.add_argument("--figure", default=None, help="save the CNN's figure here (PNG)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    k = args.per_set
    other = shapes(20 * k, seed=21)
    concepts = {
        "round outline": _outlines(k, 22, "round"),
        "straight edges": _outlines(k, 23, "square"),
        "circle shape": other.images[other.labels == CLASSES.index("circle")][:k],
        "background": _backgrounds(k, 24),
        "random images": shapes(k, seed=25).images,
    }
    pool = shapes(2 * args.n_random * k, seed=26).images
    test = shapes(60 * k, seed=27)
    classes = [CLASSES.index(c) for c in ("ring", "circle", "square", "triangle")]
    inputs = torch.cat([test.images[test.labels == c][:k] for c in classes])
    target = torch.cat([torch.full((k,), c) for c in classes])
    out = []
    for name, model, layers, pool_rule in (
        ("shapes CNN", shapes_model(), ["conv3", "features.4"], "flatten"),
        ("shapes ViT", shapes_vit(), ["blocks.1", "blocks.3"], "cls"),
    ):
        tcav = hv.TCAV(model.eval(), layers, pool=pool_rule)
        result = tcav.interpret(inputs, concepts, pool, target=target, n_random=args.n_random, null=args.null)
        out.append(f"### {name}\n\n{result.table()}\n")
        if args.figure and name == "shapes CNN":
            result.figure().savefig(args.figure, dpi=100)
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
