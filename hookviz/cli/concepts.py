"""``hookviz concepts``: which human concepts a model uses. ``hookviz concepts tcav``: TCAV scores with p-values,
written as a table (Markdown), a figure (PNG) and a JSON of `TCAVResult.to_dict`, and optionally an HTML report.
``hookviz concepts crp``: CRP's conditional heat maps of some channels of a layer, their concept relevance (table
and JSON) and, over a data set, their RelMax / ActMax reference examples; optionally an HTML report.

Each concept method is one subcommand of ``concepts`` (`CONCEPT_COMMANDS`: a new one plugs in with one line)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from .common import MODEL_METAVAR, UsageError, _parse_device
from .models import ZOO_MODELS, _load_model

TCAV_DESCRIPTION = """\
TCAV (Kim et al., 2018): how much the classes of some inputs depend on human concepts at some layers. A concept is
a folder of example images; its concept activation vector (CAV) at a layer separates their activations from those
of random images; a class's TCAV score is the fraction of its inputs whose logit grows along the CAV. Each score is
tested against random-vs-random CAVs (two-sided t-test over --n-random random sets, corrected over every class,
concept and layer asked).

Writes into --out: tcav.md (the tables with p-values), tcav.png (bars per class, non-significant ones hatched and
marked n.s.) and tcav.json (every score and statistic); with --report DIR also an HTML page per concept.

--model takes the same forms as in 'hookviz explain'. --demo runs offline on an embedded model (--model shapes, the
default, or vit): concepts drawn by the shapes generator (round outline, straight edges, circle shape, background,
random images; hookviz.zoo.shapes_concepts), a random pool and inputs of four classes from the shapes data, each
input's true class as its target; any of --concept, --random and --inputs given replaces its part.

examples:
  hookviz concepts tcav --demo --out runs/tcav
  hookviz concepts tcav --model torchvision:resnet18:DEFAULT --layer layer3 --layer layer4 \\
      --concept striped=concepts/striped --concept dotted=concepts/dotted --random concepts/random \\
      --inputs images/zebra --target 340 --out runs/zebra
"""

# --demo's layers and pooling per embedded model: an early and a late layer (the CNN flattened, the ViT's class token)
DEMO_LAYERS: dict[str, tuple[tuple[str, ...], str]] = {
    "shapes": (("conv3", "features.4"), "flatten"),
    "vit": (("blocks.1", "blocks.3"), "cls"),
}
DEMO_CLASSES = ("ring", "circle", "square", "triangle")


def add_parser(sub: Any) -> None:
    """The ``concepts`` command and its subcommands."""
    p = sub.add_parser(
        "concepts",
        help="which human concepts a model uses (concepts tcav: TCAV scores with p-values; concepts crp: CRP)",
        description="Concept-based explanations: 'hookviz concepts tcav --help', 'hookviz concepts crp --help'.",
    )
    methods = p.add_subparsers(dest="concept_command", required=True, metavar="METHOD")
    for add in CONCEPT_COMMANDS:
        add(methods)


def _add_tcav(sub: Any) -> None:
    p = sub.add_parser(
        "tcav",
        help="TCAV scores of classes for concepts (folders of examples) at layers, with p-values",
        description=TCAV_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, metavar=MODEL_METAVAR)
    p.add_argument("--layer", action="append", default=None, metavar="L", help="a layer (module name); repeatable")
    p.add_argument(
        "--concept", action="append", default=None, metavar="NAME=DIR", help="a concept's example folder; repeatable"
    )
    p.add_argument("--random", default=None, metavar="DIR", help="a folder of random images (the counter-examples)")
    p.add_argument(
        "--inputs", action="append", default=None, metavar="PATH", help="image folder or file to score; repeatable"
    )
    p.add_argument(
        "--target", default=None, metavar="CLASS", help="class index or name for every input (default: top class)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder for tcav.md, tcav.png and tcav.json")
    p.add_argument("--report", default=None, metavar="DIR", help="also write an HTML report (a page per concept)")
    p.add_argument("--demo", action="store_true", help="concepts, random pool and inputs from the shapes generator")
    p.add_argument("--per-set", type=int, default=40, metavar="N", help="--demo: examples per set (default: 40)")
    p.add_argument("--cav", choices=("logistic", "mean"), default="logistic", help="CAV classifier (default: logistic)")
    p.add_argument("--pool", choices=("flatten", "mean", "cls"), default=None, help="pooling of a layer's output")
    p.add_argument("--n-random", type=int, default=10, metavar="R", help="random sets (default: %(default)s)")
    p.add_argument("--null", choices=("independent", "fixed"), default="independent", help="the null's random CAVs")
    p.add_argument("--test", choices=("student", "welch"), default="student", help="t-test (default: student)")
    p.add_argument(
        "--correction", choices=("bonferroni", "holm", "bh", "none"), default="bonferroni", help="p-value correction"
    )
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the random sets' draw (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, metavar="B", help="examples per forward pass")
    p.add_argument("--weights", default=None, help="torchvision / timm weights (as in 'hookviz explain')")
    p.add_argument("--size", type=int, default=None, help="input size (default: the model's own)")
    p.add_argument("--trust-pickle", action="store_true", help="unpickle --model PATH.pt fully (trusted files only)")
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    p.set_defaults(run=_tcav)


CRP_DESCRIPTION = """\
CRP (Achtibat et al., 2023): LRP relevance conditioned on channels of a layer. For each input and each channel of
--channels, the heat map of the relevance that flows through that channel (crp_maps.png: a row per input), and each
channel's relevance R_c at the layer (concept_relevance.md / .json: the asked channels' R_c and share of the layer's
total, and the input's top channels). With --relmax-data, the data set's items most relevant (RelMax) and most
activating (ActMax) per channel, cropped to where the channel acts (relmax.png, actmax.png, relmax.json; the run's
state in --out/relmax, resumed when run again with the same settings). With --report DIR an HTML page per channel.

--model takes the same forms as in 'hookviz explain'. --relmax-data: shapes:N (N items of the shapes data with their
labels as targets) or an image folder (each item's top class, or --target). --demo runs offline on the shapes CNN
(or --model vit): layer features.3 (vit: blocks.3.mlp.act), channels picked for ring, star and cross, two inputs of
each of those classes with their true class as target, RelMax over shapes:200; any option given replaces its part.

examples:
  hookviz concepts crp --demo --out runs/crp --report runs/crp-report
  hookviz concepts crp --model torchvision:resnet18:DEFAULT --layer layer4 --channels 3,7 --inputs images/ \\
      --target 340 --out runs/crp --relmax-data images/pool --k 8
"""

# --demo per embedded model: the layer and a channel for each of ring, star and cross: the CNN's from docs/concepts.md,
# the ViT's (MLP neurons) among the three per class whose mean share of the layer's relevance on 400 shapes (seed 40,
# their labels as targets) exceeds that on the other classes the most: not shared with another class's three, and the
# most relevant on both of the demo's inputs of its class (cross: 43, third; 97 is also star's, 59 negative on one)
CRP_DEMO: dict[str, tuple[str, tuple[int, ...]]] = {
    "shapes": ("features.3", (25, 8, 89)),
    "vit": ("blocks.3.mlp.act", (29, 35, 43)),
}
CRP_DEMO_CLASSES = ("ring", "star", "cross")


def _add_crp(sub: Any) -> None:
    p = sub.add_parser(
        "crp",
        help="CRP: heat maps conditioned on channels of a layer, their relevance, RelMax / ActMax examples",
        description=CRP_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, metavar=MODEL_METAVAR)
    p.add_argument("--layer", default=None, metavar="L", help="the layer whose channels condition (module name)")
    p.add_argument("--channels", default=None, metavar="C,C,...", help="channel indices of --layer, e.g. 3,7")
    p.add_argument(
        "--inputs", action="append", default=None, metavar="PATH", help="image folder or file to explain; repeatable"
    )
    p.add_argument(
        "--target", default=None, metavar="CLASS", help="class index or name for every input (default: top class)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the maps, tables and figures")
    p.add_argument("--relmax-data", default=None, metavar="shapes:N | DIR", help="data set for RelMax / ActMax")
    p.add_argument("--k", type=int, default=8, help="reference examples per channel (default: %(default)s)")
    p.add_argument("--report", default=None, metavar="DIR", help="also write an HTML report (a page per channel)")
    p.add_argument("--demo", action="store_true", help="offline on an embedded model: shapes inputs and data")
    p.add_argument("--composite", default=None, help="LRP composite (default: the one LRP picks for the model)")
    p.add_argument("--batch-size", type=int, default=64, metavar="B", help="RelMax items per pass")
    p.add_argument("--weights", default=None, help="torchvision / timm weights (as in 'hookviz explain')")
    p.add_argument("--size", type=int, default=None, help="input size (default: the model's own)")
    p.add_argument("--trust-pickle", action="store_true", help="unpickle --model PATH.pt fully (trusted files only)")
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    p.set_defaults(run=_crp)


# one entry per concept method: its function adds the subcommand
CONCEPT_COMMANDS = (_add_tcav, _add_crp)


def _parse_concepts(specs: list[str]) -> dict[str, str]:
    concepts: dict[str, str] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        name = name.strip()
        if not sep or not name or not folder:
            raise UsageError(f"--concept: expected NAME=DIR (e.g. striped=concepts/striped), got {spec!r}")
        if name in concepts:
            raise UsageError(f"--concept: {name!r} is given twice")
        if not Path(folder).exists():
            raise UsageError(f"--concept {name}: no such folder {folder!r}")
        concepts[name] = folder
    return concepts


def _inputs(paths: list[str]) -> list[str]:
    """The image files of --inputs (folders expanded, sorted by name)."""
    from ..concepts.examples import image_files

    files: list[str] = []
    for p in paths:
        if not Path(p).exists():
            raise UsageError(f"--inputs: no such folder or file {p!r}")
        files += [str(f) for f in image_files(Path(p), "--inputs")]
    return files


def _target(spec: str | None, labels: Any) -> int | None:
    if spec is None:
        return None
    try:
        value = int(spec)
    except ValueError:
        names = [str(n) for n in labels] if labels is not None else []
        if spec not in names:
            known = (
                f"; the model's classes: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}" if names else ""
            )
            raise UsageError(f"--target: expected a class index or name, got {spec!r}{known}") from None
        return names.index(spec)
    if value < 0:
        raise UsageError(f"--target: class indices are >= 0, got {value}")
    return value


def _demo_sets(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any, Any]:
    """--demo's concepts, random pool, inputs and targets (the inputs' true classes), drawn by the shapes generator
    with seeds that training never draws."""
    import torch

    from ..zoo import CLASSES, shapes, shapes_concepts

    k = args.per_set
    concepts = shapes_concepts(k, seed=21)
    pool = shapes(2 * args.n_random * k, seed=26).images
    test = shapes(60 * k, seed=27)
    classes = [CLASSES.index(c) for c in DEMO_CLASSES]
    inputs = torch.cat([test.images[test.labels == c][:k] for c in classes])
    target = torch.cat([torch.full((min(k, int((test.labels == c).sum())),), c) for c in classes])
    return concepts, pool, inputs, target


def _check(args: argparse.Namespace) -> None:
    if args.n_random < 2:
        raise UsageError(
            f"--n-random: expected at least 2 random sets (the t-test needs two scores), got {args.n_random}"
        )
    if args.per_set < 2:
        raise UsageError(f"--per-set: expected at least 2 examples per set, got {args.per_set}")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha: expected a number in (0, 1), got {args.alpha}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size: expected at least 1, got {args.batch_size}")
    if args.demo and args.model is not None and args.model not in ZOO_MODELS:
        raise UsageError(f"--demo runs on an embedded model: --model {' or '.join(ZOO_MODELS)}, got {args.model!r}")
    if not args.demo:
        missing = [f for f, v in (("--model", args.model), ("--layer", args.layer), ("--concept", args.concept),
                                  ("--random", args.random), ("--inputs", args.inputs)) if v is None]  # fmt: skip
        if missing:
            raise UsageError(f"{', '.join(missing)} needed (or --demo for concepts drawn from the shapes data)")
    if args.random is not None and not Path(args.random).exists():
        raise UsageError(f"--random: no such folder {args.random!r}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {args.out!r} is a file; pass a folder (created if missing)")


def _tcav(args: argparse.Namespace) -> int:
    from ..concepts import TCAV

    _check(args)
    device = _parse_device(args.device)
    if args.demo and args.model is None:
        args.model = "shapes"
    concepts: dict[str, Any] = _parse_concepts(args.concept) if args.concept else {}
    inputs: Any = _inputs(args.inputs) if args.inputs else None
    model, preprocess, labels, note = _load_model(args)
    model = model.to(device).eval()
    if note.startswith("note:"):
        print(note)
    target: Any = _target(args.target, labels)
    random: Any = args.random
    layers, pool = args.layer, args.pool
    if args.demo:
        demo_concepts, demo_pool, demo_inputs, demo_target = _demo_sets(args)
        concepts = concepts or demo_concepts
        random = random if random is not None else demo_pool
        if inputs is None:
            inputs, target = demo_inputs, demo_target if target is None else target
        demo_layers, demo_rule = DEMO_LAYERS[args.model]
        layers = layers or list(demo_layers)
        pool = pool or demo_rule
    tcav = TCAV(model, list(layers), cav=args.cav, pool=pool or "flatten", batch_size=args.batch_size,
                preprocess=preprocess)  # fmt: skip
    start = time.perf_counter()
    result = tcav.interpret(
        inputs, concepts, random, target=target, n_random=args.n_random, null=args.null, test=args.test,
        correction=args.correction, alpha=args.alpha, seed=args.seed,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = "\n\n".join(f"## TCAV {s.replace('_', ' ')}\n\n{result.table(s)}" for s in ("sign_count", "magnitude"))
    (out / "tcav.md").write_text(tables + "\n", encoding="utf-8")
    (out / "tcav.json").write_text(json.dumps(result.to_dict(), indent=1) + "\n", encoding="utf-8")
    result.figure().savefig(out / "tcav.png", dpi=110)
    print(result.table())
    print(f"wrote {out.resolve()}: tcav.md, tcav.png, tcav.json ({seconds:.1f} s)")
    if args.report is not None:
        from ..report import report_concepts

        examples = {name: _examples(ex, name) for name, ex in concepts.items()}
        index = report_concepts(result, args.report, examples=examples)
        print(f"wrote {index.resolve()}")
    return 0


def _examples(examples: Any, name: str) -> Any:
    """A concept's examples as images for the report's strips: the tensors given, or the folder's first files."""
    from ..concepts.examples import image_files

    if isinstance(examples, str):
        return [str(f) for f in image_files(Path(examples), f"--concept {name}")]
    return examples


# -------------------------------------------------------------------------------------------------------------- crp
def _channels(spec: str) -> list[int]:
    try:
        channels = [int(c) for c in spec.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--channels: expected comma-separated channel indices (e.g. 3,7), got {spec!r}") from None
    if not channels or min(channels) < 0:
        raise UsageError(f"--channels: expected channel indices >= 0 (e.g. 3,7), got {spec!r}")
    if len(set(channels)) != len(channels):
        raise UsageError(f"--channels: a channel is given twice in {spec!r}")
    return channels


def _check_crp(args: argparse.Namespace) -> None:
    if args.k < 1:
        raise UsageError(f"--k: expected at least 1 reference example, got {args.k}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size: expected at least 1, got {args.batch_size}")
    if args.demo and args.model is not None and args.model not in ZOO_MODELS:
        raise UsageError(f"--demo runs on an embedded model: --model {' or '.join(ZOO_MODELS)}, got {args.model!r}")
    if not args.demo:
        missing = [f for f, v in (("--model", args.model), ("--layer", args.layer), ("--channels", args.channels),
                                  ("--inputs", args.inputs)) if v is None]  # fmt: skip
        if missing:
            raise UsageError(f"{', '.join(missing)} needed (or --demo for the shapes CNN and data)")
    spec = args.relmax_data
    if spec is not None and not spec.startswith("shapes:") and not Path(spec).is_dir():
        raise UsageError(f"--relmax-data: expected shapes:N or an image folder, got {spec!r}")
    if spec is not None and spec.startswith("shapes:"):
        n = spec.partition(":")[2]
        if not n.isdigit() or int(n) < 1:
            raise UsageError(f"--relmax-data: expected shapes:N with N >= 1 items, got {spec!r}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {args.out!r} is a file; pass a folder (created if missing)")


def _crp_demo_inputs() -> tuple[Any, Any]:
    """--demo's inputs: two shapes of each of `CRP_DEMO_CLASSES` (a seed training never draws) and their classes."""
    import torch

    from ..zoo import CLASSES, shapes

    test = shapes(120, seed=27)
    idx = torch.cat([(test.labels == CLASSES.index(c)).nonzero()[:2, 0] for c in CRP_DEMO_CLASSES])
    return test.images[idx], test.labels[idx]


def _relmax_data(spec: str, model: Any, preprocess: Any) -> tuple[Any, str | None]:
    """The data set of --relmax-data and RelMax's target for it ("label" for the shapes data)."""
    if spec.startswith("shapes:"):
        from ..zoo import ShapesDataset

        return ShapesDataset(int(spec.partition(":")[2]), seed=31), "label"
    from ..concepts.examples import load_examples

    return load_examples(model, spec, "--relmax-data", preprocess=preprocess, minimum=1).cpu(), None


def _crp(args: argparse.Namespace) -> int:

    from ..concepts import CRP
    from ..concepts.crp import concept_relevance_figure, conditional_figure
    from ..concepts.examples import load_examples

    _check_crp(args)
    device = _parse_device(args.device)
    if args.demo and args.model is None:
        args.model = "shapes"
    channels = _channels(args.channels) if args.channels is not None else None
    files = _inputs(args.inputs) if args.inputs else None
    model, preprocess, labels, note = _load_model(args)
    model = model.to(device).eval()
    if note.startswith("note:"):
        print(note)
    target: Any = _target(args.target, labels)
    layer = args.layer
    names: list[str]
    if files is not None:
        x = load_examples(model, files, "--inputs", preprocess=preprocess, minimum=1)
        names = [Path(f).name for f in files]
    if args.demo:
        demo_layer, demo_channels = CRP_DEMO[args.model]
        layer = layer or demo_layer
        channels = channels or list(demo_channels)
        if files is None:
            x, true = _crp_demo_inputs()
            names = [f"shapes #{i}" for i in range(len(true))]
            target = true if target is None else target
        if args.relmax_data is None:
            args.relmax_data = "shapes:200"
    assert channels is not None and layer is not None
    x = x.to(device)
    crp = CRP(model, args.composite)
    start = time.perf_counter()
    maps = crp.attribute(x, target, conditions=[{layer: [c]} for c in channels])
    shares = crp.concept_relevance(x, target, layer)
    targets = _targets(model, x, target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = [f"{layer}:{c}" for c in channels]
    rows = [f"{n}\n→ {_name(labels, t)}" for n, t in zip(names, targets, strict=True)]
    conditional_figure(x.cpu(), maps.cpu(), label, rows=rows).savefig(out / "crp_maps.png", dpi=110)
    concept_relevance_figure(shares, highlight=channels, title=f"concept relevance at {layer} (mean over inputs)"
                             ).savefig(out / "concept_relevance.png", dpi=110)  # fmt: skip
    table = _relevance_table(layer, channels, shares, names, [_name(labels, t) for t in targets])
    (out / "concept_relevance.md").write_text(table["md"], encoding="utf-8")
    written = ["crp_maps.png", "concept_relevance.png", "concept_relevance.md", "concept_relevance.json"]
    refs = None
    if args.relmax_data is not None:
        data, rtarget = _relmax_data(args.relmax_data, model, preprocess)
        rtarget = target if isinstance(target, int) else rtarget
        refs = crp.relmax(data, layer, str(out / "relmax"), channels=channels, k=args.k, target=rtarget,
                          batch_size=args.batch_size)  # fmt: skip
        refs.figure("relevance").savefig(out / "relmax.png", dpi=110)
        refs.figure("activation").savefig(out / "actmax.png", dpi=110)
        table["json"]["relmax"] = {
            "data": args.relmax_data,
            "target": rtarget,
            **{kind: {str(c): {"items": top.indices[i].tolist(), "scores": top.scores[i].tolist()}
                      for i, c in enumerate(refs.channels.tolist())}
               for kind, top in (("relevance", refs.relevance), ("activation", refs.activation))},
        }  # fmt: skip
        written += ["relmax.png", "actmax.png"]
    (out / "concept_relevance.json").write_text(json.dumps(table["json"], indent=1) + "\n", encoding="utf-8")
    seconds = time.perf_counter() - start
    print(table["md"])
    print(f"wrote {out.resolve()}: {', '.join(written)} ({seconds:.1f} s)")
    if args.report is not None:
        from ..report import CRPConcept, report_concepts

        concepts = {lab: CRPConcept(layer, c, references=refs, inputs=x.cpu(), maps=maps[:, j].cpu(),
                                    relevance=shares[:, c].cpu(), names=[r.replace(chr(10), ' ') for r in rows])
                    for j, (lab, c) in enumerate(zip(label, channels, strict=True))}  # fmt: skip
        index = report_concepts(None, args.report, crp=concepts, title=f"CRP: {len(channels)} channels of {layer}")
        print(f"wrote {index.resolve()}")
    return 0


def _targets(model: Any, x: Any, target: Any) -> list[int]:
    """Each input's class: the given one(s), else the top class."""
    import torch

    if target is None:
        with torch.no_grad():
            return model(x).argmax(1).tolist()
    if isinstance(target, int):
        return [target] * len(x)
    return [int(t) for t in target]


def _name(labels: Any, t: int) -> str:
    return f"{t} ({labels[t]})" if labels is not None and 0 <= t < len(labels) else str(t)


def _relevance_table(layer: str, channels: list[int], shares: Any, names: list[str], targets: list[str]) -> dict:
    """The asked channels' R_c and share of the layer's total per input, and its top 5 channels: Markdown and JSON."""
    total = shares.sum(1)
    head = "| input | target | R at layer | " + " | ".join(f"ch {c}" for c in channels) + " | top 5 channels |"
    lines = [head, "|---|---|---:|" + "---:|" * len(channels) + "---|"]
    items = []
    for i, name in enumerate(names):
        t = float(total[i])
        frac = shares[i] / (t if t else 1.0)
        top = frac.abs().argsort(descending=True)[:5].tolist()
        cells = " | ".join(f"{float(shares[i, c]):.3g} ({float(frac[c]):.0%})" for c in channels)
        tops = ", ".join(f"{c} ({float(frac[c]):.0%})" for c in top)
        lines.append(f"| {name} | {targets[i]} | {t:.3g} | {cells} | {tops} |")
        items.append({"input": name, "target": targets[i], "total": t,
                      "relevance": {str(c): float(shares[i, c]) for c in channels},
                      "top": [[c, float(shares[i, c])] for c in top]})  # fmt: skip
    md = f"## Concept relevance at {layer}\n\nR_c (share of the layer's R) per input\n\n" + "\n".join(lines) + "\n"
    return {"md": md, "json": {"method": "CRP", "layer": layer, "channels": channels, "inputs": items}}
