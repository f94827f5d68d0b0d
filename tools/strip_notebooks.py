"""Strip the notebooks before committing: no outputs, no execution counts, no editor metadata.

The .ipynb files in notebooks/ are the source: edit them in Jupyter, then run

    python tools/strip_notebooks.py            # strip notebooks/*.ipynb in place
    python tools/strip_notebooks.py --check    # exit 1, naming them, if any notebook is not stripped

(or name notebooks as arguments). CI executes the notebooks (nbmake), so outputs in git would only make diffs noisy.
Kept: the cells' sources, ids and ``tags`` (nbmake reads tags such as ``raises-exception``), and the notebook's
``kernelspec``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
KEEP_NOTEBOOK_METADATA = ("kernelspec",)
KEEP_CELL_METADATA = ("tags",)


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Clear outputs, execution counts and metadata noise (in place); returns `nb`."""
    nb.metadata = nbformat.NotebookNode({k: v for k, v in nb.metadata.items() if k in KEEP_NOTEBOOK_METADATA})
    for cell in nb.cells:
        cell.metadata = nbformat.NotebookNode({k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def stripped_text(path: Path) -> tuple[str, str]:
    """(the file's text, the text it has once stripped)."""
    text = path.read_text(encoding="utf-8")
    nb = strip(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
    return text, nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook is not stripped")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb"))
    dirty = []
    for path in paths:
        text, clean = stripped_text(path)
        if text != clean:
            dirty.append(path)
            if not args.check:
                path.write_text(clean, encoding="utf-8")
    verb = "not stripped" if args.check else "stripped"
    for path in dirty:
        print(f"{verb}: {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
