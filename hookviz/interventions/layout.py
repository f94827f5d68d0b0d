"""Which axes of a layer output an edit addresses: channels, tokens, spatial cells (NCHW, NHWC, tokens).

One function, `edit_axes`, so that a single place decides how a layout name maps to axes (and can later defer to
``hookviz.layouts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

Layout: TypeAlias = Literal["nchw", "nhwc", "tokens"]
LAYOUTS: tuple[str, ...] = ("nchw", "nhwc", "tokens")


@dataclass(frozen=True)
class Axes:
    """The axes of one activation: `channel` (features), `token` (sequence position) and `spatial` ((h, w) axes)."""

    layout: str
    channel: int
    token: int | None
    spatial: tuple[int, int] | None


def check_layout(layout: object, where: str = "layout") -> None:
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"{where} must be None (inferred) or one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")


def edit_axes(ndim: int, layout: str | None = None, *, where: str = "layout") -> Axes:
    """The axes of an activation with `ndim` dimensions (batch first) under `layout`.

    ``"nchw"``: (N, C, h, w); ``"nhwc"``: (N, h, w, C) (timm / Swin-style feature maps); ``"tokens"``: (N, T, D),
    the token axis 1 and the feature (channel) axis 2. ``None`` infers: 4-D is NCHW, 3-D is tokens, 2-D is (N, C)
    features (channels only). An NHWC output must be named, since its shape cannot tell it from NCHW.
    """
    check_layout(layout, where)
    if layout is None:
        layout = {4: "nchw", 3: "tokens", 2: "features"}.get(ndim)
        if layout is None:
            raise ValueError(
                f"cannot infer the layout of a {ndim}-D activation; only 2-D (N, C), 3-D tokens (N, T, D) and 4-D "
                f"NCHW are inferred; pass {where}='nchw', 'nhwc' or 'tokens'"
            )
    expected = {"nchw": 4, "nhwc": 4, "tokens": 3, "features": 2}[layout]
    if ndim != expected:
        raise ValueError(f"{where}={layout!r} needs a {expected}-D activation, got a {ndim}-D one")
    if layout == "nchw":
        return Axes(layout, 1, None, (2, 3))
    if layout == "nhwc":
        return Axes(layout, 3, None, (1, 2))
    if layout == "tokens":
        return Axes(layout, 2, 1, None)
    return Axes(layout, 1, None, None)
