"""Repeated calls hold on to nothing: 200 calls in a loop keep the live tensors and the RSS flat (issue 10, item 8)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookviz as hv


class SmallNet(nn.Module):
    """Conv, BatchNorm, an in-place ReLU module and a functional ReLU: every kind of hook hookviz places."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(self.relu(self.bn(self.conv1(x)))))
        return self.head(x.mean(dim=(2, 3)))


OPTIONS = {"smoothgrad": lambda m: hv.SmoothGrad(hv.GuidedBackprop(m), n=2)}


def live_tensors() -> int:
    gc.collect()
    # type(), not isinstance(): isinstance reads __class__, which some lazy module proxies answer with a warning
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(name: str) -> dict[str, dict[int, int]]:
    """Live tensors and RSS after call 20 and call 200 of the method `name` (run in a fresh process)."""
    torch.manual_seed(0)
    model = SmallNet().train()
    model(torch.randn(4, 3, 12, 12)).sum().backward()  # parameters with .grad, as in a training step
    explainer = OPTIONS[name](model) if name in OPTIONS else hv.METHODS[name](model)
    x = torch.randn(2, 3, 12, 12)
    counts, rss = {}, {}
    for i in range(1, 201):
        explainer.attribute(x, target=[1, 3])
        if i in (20, 200):
            rss[i] = rss_bytes()  # before counting: gc.get_objects() itself allocates
            counts[i] = live_tensors()
    return {"counts": counts, "rss": rss}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS read from /proc (Linux)")
# Guided Grad-CAM: the CAM layer record, the layer probe and a whole Guided Backprop call (ReLU mode, tensor hooks);
# Deconvnet: the shared inplace holds; SmoothGrad: repeated rule passes in one call
@pytest.mark.parametrize("name", ["guided-gradcam", "deconvnet", "smoothgrad"])
def test_200_calls_keep_tensors_and_rss_flat(name: str) -> None:
    # a fresh process: in the test session's own, the heap of earlier tests makes RSS move by itself
    code = f"import json, test_memory; print(json.dumps(test_memory.measure({name!r})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    counts, rss = ({int(k): v for k, v in result[key].items()} for key in ("counts", "rss"))
    # a leak of one tensor per call would add 180; allocator noise stays far below 8 MiB
    assert counts[200] - counts[20] <= 2, counts
    assert rss[200] - rss[20] < 8 * 2**20, rss
