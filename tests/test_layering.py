"""Imports point down the layer order and never up: no cycles, no reaching into a layer above.

Every module of the package is read with `ast` (imports at the top, inside functions and under ``TYPE_CHECKING``,
and ``importlib.import_module("hookviz....")`` calls) and each import of a hookviz module is checked against
`LAYERS`: a module may import only modules placed before itself. A module that is not placed fails the test, so a
new module or package is placed on purpose. `LAYERS` is mirrored in docs/architecture.md (checked below).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hookviz"

# Bottom first. An entry is a module (``hookviz.flow`` is the package's __init__) or, ending in ``.*``, a whole
# package whose modules share one place (they may import each other; the package is placed as a unit). Entries of
# packages that do not exist yet are slots for work under way.
LAYERS: list[str] = [
    # foundation: private helpers that import nothing of hookviz
    "hookviz._checks",
    "hookviz._progress",
    "hookviz._calls",
    "hookviz._formats",
    "hookviz._present",
    "hookviz._modes",
    "hookviz._device",
    # core: hooks, targets, inputs
    "hookviz.hooks",
    "hookviz.targets",
    "hookviz.inputs",
    "hookviz.images",
    "hookviz.classes",
    "hookviz.layouts",
    # the shapes data set, its models and weights, the retrieval task and its language model (they use only the
    # foundation and images)
    "hookviz.zoo.data",
    "hookviz.zoo.concepts",
    "hookviz.zoo.model",
    "hookviz.zoo.vit",
    "hookviz.zoo.retrieval",
    "hookviz.zoo.tokenizer",
    "hookviz.zoo.lm",
    "hookviz.zoo.train",
    "hookviz.zoo",
    # attribution methods (never import presentation: `visualize` reaches it through hookviz._present)
    "hookviz.methods.scope",
    "hookviz.methods.rules.*",
    "hookviz.methods.forward",
    "hookviz.methods.base",
    "hookviz.methods.layer",
    "hookviz.methods.baseline",
    "hookviz.methods.batch",
    "hookviz.methods.gradient",
    "hookviz.methods.noise",
    "hookviz.methods.guided",
    "hookviz.methods.cam_layer",
    "hookviz.methods.cam",
    "hookviz.methods.attention.*",
    "hookviz.methods.perturbation",
    "hookviz.methods.lrp.*",
    "hookviz.methods.deeplift.*",
    "hookviz.methods.shap",
    "hookviz.methods.shapley.*",  # the coalition engine and the model-agnostic methods on it (issue 38)
    "hookviz.methods",
    # recorders and the gradient-flow monitor
    "hookviz.record",
    "hookviz.interventions.*",
    # sparse autoencoders on any layer: training through hooks, splicing, attribution to latents (issue 37)
    "hookviz.features.*",
    "hookviz.zoo.sae",  # the zoo's shipped SAE of the retrieval LM, a hookviz.features.SAE (issue 37)
    "hookviz.flow.kernels",
    "hookviz.flow.layout",
    "hookviz.flow.watch",
    "hookviz.flow.locate",
    "hookviz.flow.alarms",
    "hookviz.flow.amp",
    "hookviz.flow.distributed",
    "hookviz.flow.observe",
    "hookviz.flow.data",
    "hookviz.flow.plots",
    "hookviz.flow.export",
    "hookviz.flow.stats",
    "hookviz.flow.monitor",
    "hookviz.flow",
    # presentation of results
    "hookviz.display",
    "hookviz.display_options",
    "hookviz.panels",
    "hookviz.explanation",
    "hookviz.text",
    "hookviz.figures",
    "hookviz.intervention_figures",
    # a language model's generation explained (methods at the embedding) and its result object
    "hookviz.generation.*",
    # evaluation, data sets, reports
    "hookviz.metrics._checks",
    "hookviz.metrics.localisation",
    "hookviz.metrics.faithfulness",
    "hookviz.metrics.sanity",
    "hookviz.metrics.evaluate",
    "hookviz.metrics",
    "hookviz.dataset.distributed",
    "hookviz.dataset.store",
    "hookviz.dataset.files",
    "hookviz.dataset.source",
    "hookviz.dataset.run",
    "hookviz.dataset",
    "hookviz.concepts.*",
    "hookviz.report.*",
    # adapters to training frameworks
    "hookviz.integrations.*",
    # the public API, then the command line on top of it
    "hookviz",
    # the zoo's faithfulness evaluation calls the public API (hookviz.zoo does not import it)
    "hookviz.zoo.retrieval_eval",
    "hookviz.cli.common",
    "hookviz.cli.models",
    "hookviz.cli.demo",
    "hookviz.cli.explain",
    "hookviz.cli.dataset",
    "hookviz.cli.report",
    "hookviz.cli.evaluate",
    "hookviz.cli.features",
    "hookviz.cli.generation",
    "hookviz.cli.concepts",
    "hookviz.cli.app",
    "hookviz.cli",
    "hookviz.cli.__main__",
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def rank(module: str) -> tuple[int, str] | None:
    """(place in LAYERS, the entry) of `module`: its own entry, else the longest ``.*`` package entry holding it."""
    if module in LAYERS:
        return LAYERS.index(module), module
    best = None
    for i, entry in enumerate(LAYERS):
        if entry.endswith(".*") and (module + ".").startswith(entry[:-1]):
            if best is None or len(entry) > len(best[1]):
                best = (i, entry)
    return best


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported hookviz module) for every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "hookviz"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hookviz":
                continue
            # `from . import export` imports the submodule hookviz.flow.export; `from . import x` of a name, the package
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found += [(node.lineno, s) for s in subs] or [(node.lineno, target)]
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                value = node.args[0].value
                if isinstance(value, str) and value.startswith("hookviz"):
                    found.append((node.lineno, value))
    return found


def test_every_module_is_placed_in_the_layer_order() -> None:
    unplaced = [m for m in MODULES if rank(m) is None]
    assert not unplaced, (
        f"modules not placed in the layer order: {unplaced}; add each to LAYERS in tests/test_layering.py (and to "
        "docs/architecture.md) above everything it imports and below everything that imports it"
    )


def test_layer_entries_are_unique() -> None:
    assert len(LAYERS) == len(set(LAYERS))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    own = rank(module)
    assert own is not None, f"{module} is not placed in LAYERS"
    upward = []
    for line, target in imports_of(module, MODULES[module]):
        other = rank(target)
        assert other is not None, f"{module}:{line} imports {target}, which is not placed in LAYERS"
        same_package = other[1] == own[1] and own[1].endswith(".*")
        if other[0] >= own[0] and not same_package and target != module:
            upward.append(f"line {line}: {target} (layer {other[1]!r} is not below {own[1]!r})")
    assert not upward, f"{module} imports modules at or above its layer: " + "; ".join(upward)


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    # the test above is only as good as the parser: lazy, TYPE_CHECKING, relative and import_module imports
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..explanation import Explanation\n"
        "def f():\n    from .. import panels\n    import hookviz.figures\n"
        "    importlib.import_module('hookviz.text')\n"
        "from . import gradient\n"
    )
    path = tmp_path / "base.py"
    path.write_text(src)
    got = sorted(t for _, t in imports_of("hookviz.methods.base", path))
    assert got == sorted(
        ["hookviz.explanation", "hookviz.panels", "hookviz.figures", "hookviz.text", "hookviz.methods.gradient"]
    )


def test_docs_mirror_the_layer_order() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- layer order: begin -->(.*?)<!-- layer order: end -->", text, re.S)
    assert block, "docs/architecture.md lost its layer-order block"
    listed = re.findall(r"^\s*(hookviz[\w.*]*)", block.group(1), re.M)
    assert listed == LAYERS, "docs/architecture.md's layer order differs from tests/test_layering.py's LAYERS"


def private_imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, ``module.name``) for every private name (``_x``) imported from a module of another package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
            home = source if MODULES.get(source, Path()).name == "__init__.py" else source.rpartition(".")[0]
            for a in node.names:
                if a.name.startswith("_") and home != package:
                    found.append((node.lineno, f"{source}.{a.name}"))
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_across_packages(module: str) -> None:
    # a helper another package needs is public in its own module (the private foundation modules hookviz._x hold
    # shared helpers under public names), not borrowed from another package's internals
    found = private_imports(module, MODULES[module])
    assert not found, f"{module} imports private names of another package: {found}"


def test_no_import_cycles_inside_packages() -> None:
    """The layer order allows a package's own modules (``hookviz.generation.*``) to import one another; none may
    import back, directly or around a circle, not even for type hints (a module that only needs another's type
    names a Protocol of what it uses)."""
    graph = {m: {t for _, t in imports_of(m, p) if t != m and t in MODULES} for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)
