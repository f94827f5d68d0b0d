"""The README's Python blocks run as written, so the tour cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "chelsea.png").write_bytes((README.parent / "assets" / "chelsea.png").read_bytes())
    monkeypatch.chdir(tmp_path)  # the tour saves files
    exec(compile("\n".join(blocks), str(README), "exec"), {})
    assert (tmp_path / "guided.png").stat().st_size > 0
    assert (tmp_path / "figure.pdf").read_bytes().startswith(b"%PDF")
