"""Embedded sample data: synthetic shapes images drawn on the fly (no downloads)."""

from __future__ import annotations

import random

from PIL import Image, ImageDraw


def shapes_image(size: int = 224, seed: int = 0) -> Image.Image:
    """An RGB image of a few filled shapes (circle, square, triangle) on a soft gradient background.

    Deterministic for a given `seed`; used by `hookviz demo` and the tests as a sample image that needs no file.
    """
    if size < 16:
        raise ValueError(f"size must be at least 16 pixels, got {size}")
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    for y in range(size):  # vertical gradient so the background is not flat
        shade = 40 + int(60 * y / size)
        draw.line([(0, y), (size, y)], fill=(shade, shade + 20, shade + 40))
    s = size / 224
    jitter = lambda: rng.randint(-8, 8) * s  # noqa: E731
    cx, cy, r = 60 * s + jitter(), 70 * s + jitter(), 38 * s
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(220, 40, 40))
    x0, y0 = 125 * s + jitter(), 40 * s + jitter()
    draw.rectangle([x0, y0, x0 + 70 * s, y0 + 70 * s], fill=(40, 90, 220))
    tx, ty = 110 * s + jitter(), 200 * s
    draw.polygon([(tx - 55 * s, ty), (tx + 55 * s, ty), (tx, ty - 80 * s)], fill=(240, 210, 40))
    return img
