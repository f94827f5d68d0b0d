"""GradientFlow under DistributedDataParallel with two gloo processes started by ``torch.distributed.run``: the
parameter statistics on every rank equal those of one process on the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
import ddp_flow_worker as worker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_two_ranks_equal_one_process_on_the_global_batch(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, str(Path(worker.__file__)), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]

    model, images, labels = worker.model_and_data()
    single = worker.run(model, images, labels, rank=0, world=1).read()
    assert [p.removeprefix("module.") for p in ranks[0]["params"].tolist()] == single.params
    for stat in ("grad_norm", "grad_mean_abs", "grad_max_abs", "update_ratio"):
        expected = single.param_stats[stat]
        assert np.isfinite(expected).sum() > 0
        for r in range(2):
            np.testing.assert_allclose(ranks[r][stat], expected, rtol=2e-5, atol=1e-9, err_msg=f"{stat}, rank {r}")
    # and not each rank's local gradient: the shard alone gives other norms
    model, images, labels = worker.model_and_data()
    local = worker.run(model, images, labels, rank=0, world=2).read()
    assert not np.allclose(local.param_stats["grad_norm"], single.param_stats["grad_norm"], rtol=1e-3)
