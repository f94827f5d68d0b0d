"""What every ``hookviz`` command shares: the one-line usage error and the checks of method names and image files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


class UsageError(Exception):
    """A mistake on the command line: reported as one line, exit code 2."""


def _parse_device(spec: str) -> torch.device:
    """``--device`` as a torch device, or a `UsageError`."""
    try:
        return torch.device(spec)
    except RuntimeError:
        raise UsageError(f"--device: {spec!r} is not a device; use cpu, cuda or cuda:0") from None


def _parse_methods(spec: str, flag: str = "--method") -> list[str]:
    from ..methods import METHODS, suggest_method

    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise UsageError(f"{flag}: expected a method name or comma-separated names, got {spec!r}")
    for name in names:
        if name not in METHODS:
            close = suggest_method(name)  # the rule of hookviz.get_method: "Grad-CAM" -> gradcam
            hint = f"did you mean {close!r}? " if close is not None else ""
            raise UsageError(f"unknown method {name!r}; {hint}available: {', '.join(sorted(METHODS))}")
    return names


def _check_images(paths: Sequence[str]) -> None:
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise UsageError(f"{p!r} is a directory; pass image files")
        if not path.exists():
            raise UsageError(f"no such image file {p!r}")
