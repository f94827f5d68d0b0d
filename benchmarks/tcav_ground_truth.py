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

import torch

import hookviz as hv
from hookviz.zoo import CLASSES, shapes, shapes_concepts, shapes_model, shapes_vit


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
    concepts = shapes_concepts(k, seed=21)  # hookviz.zoo.concepts: the sets described above
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
