"""The committed notebooks are the source people edit in Jupyter: they carry no outputs, execution counts or editor
metadata (tools/strip_notebooks.py removes them), so git diffs show only the edits. CI executes them (nbmake)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def strip_tool():
    spec = importlib.util.spec_from_file_location("strip_notebooks", ROOT / "tools" / "strip_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebooks_are_found() -> None:
    assert [p.name for p in NOTEBOOKS][:2] == ["01_quickstart.ipynb", "02_gradient_flow.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_stripped(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert [i for i, c in enumerate(code) if c.outputs] == [], "outputs committed: run python tools/strip_notebooks.py"
    assert [c.execution_count for c in code] == [None] * len(code)
    text, clean = strip_tool().stripped_text(path)
    assert text == clean, f"{path.name} is not stripped: run python tools/strip_notebooks.py"


def test_strip_notebooks_cleans_an_executed_notebook(tmp_path: Path) -> None:
    nb = new_notebook(
        cells=[new_markdown_cell("# title"), new_code_cell("1 + 1")],
        metadata={"kernelspec": KERNEL, "language_info": {"name": "python", "version": "3.12.1"}},
    )
    cell = nb.cells[1]
    cell.execution_count = 3
    cell.outputs = [new_output("execute_result", data={"text/plain": "2"}, execution_count=3)]
    cell.metadata = {"tags": ["raises-exception"], "scrolled": True, "execution": {"iopub.status.busy": "2026"}}
    path = tmp_path / "run.ipynb"
    nbformat.write(nb, path)
    before = path.read_text()
    tool = strip_tool()

    assert tool.main(["--check", str(path)]) == 1
    assert path.read_text() == before  # --check changes nothing
    assert tool.main([str(path)]) == 0
    out = nbformat.read(path, as_version=4)
    assert [c.source for c in out.cells] == ["# title", "1 + 1"]
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None
    assert dict(out.cells[1].metadata) == {"tags": ["raises-exception"]}
    assert dict(out.metadata) == {"kernelspec": KERNEL}
    assert tool.main(["--check", str(path)]) == 0
    stripped = path.read_text()
    assert tool.main([str(path)]) == 0 and path.read_text() == stripped  # idempotent
