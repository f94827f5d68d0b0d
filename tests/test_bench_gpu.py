"""``benchmarks/bench_gpu.py`` on the CPU: the smoke mode writes its tables, and a spent budget still writes the file.

CI has no GPU, so these check the script the lent GPU machine runs, not its numbers."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from refs import require

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def _bench() -> ModuleType:
    """The script as a module, imported inside the test (its benchmark imports change the warning filters, which
    pytest restores after each test)."""
    for name in ("timm", "transformers", "zennit", "lxt", "captum.attr"):
        require(name)
    if "bench_gpu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_gpu", _PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_gpu"] = module  # its dataclasses look their module up while being defined
        spec.loader.exec_module(module)
    return sys.modules["bench_gpu"]


def test_smoke_tables_are_written(tmp_path: Path) -> None:
    bench = _bench()
    argv = ["--device", "cpu", "--smoke", "--tables", "bf16", "lrp64", "syncs", "--out-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    md = (tmp_path / "gpu-smoke-cpu.md").read_text()
    data = json.loads((tmp_path / "gpu-smoke-cpu.json").read_text())
    assert "**bf16 autocast**" in md and "**LRP at batch 4**" in md and "**Host synchronisations per call**" in md
    assert "failed" not in md, md
    rows = {(r["table"], r["row"]): r for r in data["rows"]}
    assert rows[("bf16", "hookviz Grad-CAM")]["x_floor"] > 0
    assert rows[("bf16", "hookviz Grad-CAM")]["floor"] == "CAM floor"
    # hookviz's LRP computes zennit's map (tests/test_lrp.py holds them to 1e-3)
    assert rows[("lrp64", "hookviz LRP")]["rel_diff_vs_peer"] < 1e-3
    # without CUDA nothing is counted, and the cell says so; every call still ran once
    assert all(s["syncs"] is None and "error" not in s for s in data["syncs"])
    assert md.count("CUDA only (ran once on the CPU") == len(data["syncs"])


def test_spent_budget_skips_tables_and_still_writes(tmp_path: Path) -> None:
    bench = _bench()
    argv = ["--device", "cpu", "--smoke", "--budget-s", "0", "--tables", "large", "vit", "--out-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "gpu-smoke-cpu.json").read_text())
    assert data["rows"] == []
    assert [n.split(" skipped")[0] for n in data["notes"]] == ["table large", "table vit"]


def test_cuda_without_a_gpu_is_refused() -> None:
    bench = _bench()
    if bench.torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        bench.main(["--device", "cuda"])
