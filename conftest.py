"""Every pytest run (tests and notebooks): pytest-xdist workers share the machine's cores.

Each worker process would otherwise start torch with one thread per core, so ``-n 2`` on 2 cores runs 4 OpenMP
threads on 2 cores; their spin-waiting barriers then make small operations (a densenet121 at 32x32) 10x slower or
worse: the invariant suite took 310 s instead of 27 s that way. A worker gets its share of the cores, and the
processes it starts (notebook kernels, the CLI, torchrun) inherit it through ``OMP_NUM_THREADS``. A value the user
set is kept.
"""

from __future__ import annotations

import os


def _share_cores() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 1 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(share)
    import torch

    torch.set_num_threads(share)


_share_cores()
