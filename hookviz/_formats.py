"""The figure file formats every save path accepts (`Explanation.save`, `TokenExplanation.save`, `save_figure`, the
CLI's ``--out``): the suffix chooses the format, one table for all of them."""

from __future__ import annotations

from pathlib import Path

SAVE_FORMATS = {".pdf": "pdf", ".svg": "svg", ".png": "png", ".eps": "eps", ".jpg": "jpg", ".jpeg": "jpg"}


def save_format(path: Path, name: str = "path", *, also: str = "") -> str:
    """matplotlib's format name for `path`'s suffix, or a ValueError naming `name` and the suffixes it accepts
    (`also`: other choices the caller handles itself, e.g. ``".html or "``)."""
    fmt = SAVE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"{name} must end with {also}one of {tuple(SAVE_FORMATS)} to choose the format, got suffix "
            f"{path.suffix!r} in {str(path)!r}"
        )
    return fmt
