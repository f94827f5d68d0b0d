"""The console script and the embedded sample image."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from hookviz.cli import main
from hookviz.zoo import shapes_image


def test_demo_writes_png_and_says_where(tmp_path, capsys) -> None:
    out = tmp_path / "sub" / "demo.png"
    assert main(["demo", "--out", str(out), "--size", "64", "--dpi", "50"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out.resolve()}" in printed
    assert "UNTRAINED resnet18" in printed
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > im.size[1] > 0


def test_demo_on_an_image_file(tmp_path, capsys) -> None:
    src = tmp_path / "img.png"
    shapes_image(80, seed=3).save(src)
    out = tmp_path / "demo.png"
    assert main(["demo", "--image", str(src), "--out", str(out), "--size", "64", "--dpi", "50"]) == 0
    assert out.stat().st_size > 0


def test_cli_requires_a_command(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err


def test_shapes_image_is_deterministic_and_drawn() -> None:
    a = np.asarray(shapes_image(64, seed=1))
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, np.asarray(shapes_image(64, seed=1)))
    assert not np.array_equal(a, np.asarray(shapes_image(64, seed=2)))
    # the red circle is there: some pixels are strongly red
    assert ((a[..., 0] > 200) & (a[..., 1] < 60)).sum() > 50
    with pytest.raises(ValueError, match="at least 16 pixels"):
        shapes_image(8)
