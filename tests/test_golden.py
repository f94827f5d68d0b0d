"""Golden images: hand-made explanations (no model) rendered and compared with the PNGs in tests/golden/.

After an intended change to how things look, rewrite them with ``python tests/golden/regenerate.py`` and look at
them. A failing comparison writes the new render next to the test's tmp_path so it can be inspected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from golden import regenerate
from PIL import Image

GOLDEN = Path(__file__).resolve().parent / "golden"
REGENERATE = "python tests/golden/regenerate.py"


def load(name: str) -> np.ndarray:
    path = GOLDEN / f"{name}.png"
    if not path.exists():
        pytest.fail(f"missing golden image {path}; create it with {REGENERATE}")
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def diff(name: str, actual: np.ndarray, tmp_path: Path) -> np.ndarray:
    expected = load(name)
    if actual.shape != expected.shape:
        Image.fromarray(actual).save(tmp_path / f"{name}.png")
        pytest.fail(
            f"{name}: rendered {actual.shape}, golden {expected.shape} (new render in {tmp_path}); if intended, "
            f"run {REGENERATE}"
        )
    return np.abs(actual.astype(np.int16) - expected.astype(np.int16)) / 255.0


@pytest.mark.parametrize("name", ["cam_heatmap", "cam_overlay", "signed_heatmap", "rgb_heatmap", "grid_cells"])
def test_torch_renders_match_golden(name: str, tmp_path: Path) -> None:
    actual = regenerate.grid_cells() if name == "grid_cells" else regenerate.torch_renders()[name]
    d = diff(name, actual, tmp_path)
    if not (d.mean() < 1 / 255 and d.max() < 8 / 255):
        Image.fromarray(actual).save(tmp_path / f"{name}.png")
        pytest.fail(
            f"{name}: mean abs diff {d.mean() * 255:.2f}/255, max {d.max() * 255:.0f}/255 against the golden image "
            f"(allowed < 1/255 and < 8/255); new render in {tmp_path}; if intended, run {REGENERATE}"
        )


def test_grid_matches_golden(tmp_path: Path) -> None:
    # looser: glyph rasterization and antialiasing differ a little across matplotlib/freetype versions; what the
    # cells show is compared tightly in grid_cells, this checks layout, colour bars and text placement
    actual = regenerate.grid_render()
    d = diff("grid", actual, tmp_path).max(axis=-1)
    far = float((d > 64 / 255).mean())
    if not (d.mean() < 3 / 255 and far < 0.02):
        Image.fromarray(actual).save(tmp_path / "grid.png")
        pytest.fail(
            f"grid: mean abs diff {d.mean() * 255:.2f}/255, {far:.1%} of pixels off by more than 64/255 (allowed "
            f"< 3/255 and < 2%); new render in {tmp_path}; if intended, run {REGENERATE}"
        )


def test_golden_images_are_small() -> None:
    for path in GOLDEN.glob("*.png"):
        assert path.stat().st_size < 50_000, path
