"""The README's Python blocks run as written, and so do those of the long forms in docs/ (after the README's, whose
names they use), so neither the guide nor the docs can rot."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_readme_and_docs_python_blocks_run(tmp_path, monkeypatch) -> None:
    blocks = python_blocks(README)
    assert len(blocks) >= 2
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "chelsea.png").write_bytes((ROOT / "assets" / "chelsea.png").read_bytes())
    monkeypatch.chdir(tmp_path)  # the tour saves files
    names: dict = {}
    exec(compile("\n".join(blocks), str(README), "exec"), names)
    assert (tmp_path / "guided.png").stat().st_size > 0
    assert (tmp_path / "figure.pdf").read_bytes().startswith(b"%PDF")
    for doc in DOCS:
        if python_blocks(doc):
            exec(compile("\n".join(python_blocks(doc)), str(doc), "exec"), names)


def links(text: str) -> list[str]:
    """Markdown link targets outside fenced code blocks (``hv.METHODS[m](model)`` in code is no link)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"\]\(([^)#]+)\)", prose)


def test_readme_is_a_short_guide_whose_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) < 20_000, "the README is a guide: long forms go to docs/"
    for target in links(text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    for doc in DOCS:
        for target in links(doc.read_text(encoding="utf-8")):
            if not target.startswith("http"):
                assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"
