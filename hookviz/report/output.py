"""The report's output folder: created, or reused when it holds a previous report, or refused unless overwrite."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

#: the file that marks a folder as a hookviz report (so a rebuild may replace it)
MARKER = ".hookviz-report.json"
#: the report's format: 2 draws the method thumbnails from deflated map files (1, unnumbered, stored them as PNG);
#: a rebuild removes every file of either (`OWN`), so no folder mixes the two
VERSION = 2
#: everything a report writes, replaced on a rebuild; nothing else in the folder is touched
OWN = (
    "index.html", "summary.html", "report.css", "site.js", "report.js", "generation.js", "data", "img", "full", "maps",
    "m", "sanity.png", "concept", "tcav.png", "latent",
)  # fmt: skip


def prepare_out(out: str | os.PathLike[str], overwrite: bool) -> Path:
    """The output folder, empty of a previous report's files; checked before anything is written."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a directory path (str or os.PathLike), got {type(out).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(path)!r} is a file; pass a directory (it is created if missing)")
    if path.is_dir() and any(path.iterdir()) and not (path / MARKER).is_file() and not overwrite:
        raise ValueError(
            f"out={str(path)!r} exists, is not empty and is not a hookviz report; pass overwrite=True (--overwrite) "
            "to write the report into it anyway, or choose another folder"
        )
    path.mkdir(parents=True, exist_ok=True)
    for name in OWN:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    # marked first, so that a build killed halfway leaves a folder the next build recognises and replaces
    mark(path, {"format": "hookviz-report", "version": VERSION, "complete": False})
    return path


def mark(path: Path, info: dict) -> None:
    """The marker: written when the build starts (``complete`` false) and again when it ends."""
    (path / MARKER).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
