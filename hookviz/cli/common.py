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


def _parse_methods(spec: str, flag: str = "--method", known: Sequence[str] | None = None) -> list[str]:
    """Comma-separated method names, each one of `known` (default: the image methods, `hookviz.METHODS`)."""
    from ..methods import METHODS, suggest_method

    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise UsageError(f"{flag}: expected a method name or comma-separated names, got {spec!r}")
    for name in names:
        if name not in (METHODS if known is None else known):
            # the rule of hookviz.get_method: "Grad-CAM" -> gradcam
            close = suggest_method(name) if known is None else None
            hint = f"did you mean {close!r}? " if close is not None else ""
            choices = sorted(METHODS) if known is None else list(known)
            raise UsageError(f"unknown method {name!r}; {hint}available: {', '.join(choices)}")
    return names


def _check_images(paths: Sequence[str]) -> None:
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise UsageError(f"{p!r} is a directory; pass image files")
        if not path.exists():
            raise UsageError(f"no such image file {p!r}")


# `--model`'s metavar in every command that loads a model (its forms in prose: `models.MODEL_FORMS`)
MODEL_METAVAR = "shapes | vit | torchvision:NAME[:WEIGHTS] | timm:NAME[:pretrained] | PATH.pt"
