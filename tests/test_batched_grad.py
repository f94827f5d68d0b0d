"""batched_grad: K targets per input by a loop, by chunked vmap, and what "auto" picks per device."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import hookviz.targets as targets_module
from hookviz.targets import auto_strategy, batched_grad


def _scores(seed: int = 0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5)).double()
    x = torch.randn(3, 6, dtype=torch.double, requires_grad=True)
    return net, x, net(x)


def _jacobian_rows(net, x, cols):
    # independent reference: the full Jacobian of every sample's output, rows picked per target
    jac = torch.stack([torch.autograd.functional.jacobian(net, x[i]) for i in range(x.shape[0])])  # (N, 5, 6)
    return torch.stack([jac[:, c] for c in cols], dim=1)


@pytest.mark.parametrize(("strategy", "chunk"), [("loop", 16), ("vmap", 16), ("vmap", 2), ("vmap", 1), ("auto", 3)])
def test_k_gradients_equal_the_jacobian_rows(strategy, chunk):
    net, x, out = _scores()
    cols = [4, 0, 2, 2, 1]
    (grad,) = batched_grad(out[:, cols], [x], strategy=strategy, chunk=chunk)
    assert grad.shape == (3, 5, 6)
    torch.testing.assert_close(grad, _jacobian_rows(net, x.detach(), cols), rtol=1e-12, atol=1e-12)


def test_auto_chooses_by_the_work_not_the_device(monkeypatch):
    """vmap for passes of at most VMAP_WORK elements, on every device; the loop above (issue 35: the measured
    crossovers in auto_strategy's docstring); the device decides only where the work is not given."""
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        assert auto_strategy(device, 150_528) == "vmap"  # one 224x224 image
        assert auto_strategy(device, targets_module.VMAP_WORK) == "vmap"
        assert auto_strategy(device, 8 * 150_528) == "loop"
    assert auto_strategy(torch.device("cpu")) == "loop"
    assert auto_strategy(torch.device("cuda", 0)) == "vmap"
    _, x, out = _scores()  # 3 x 6 elements: vmap, the same gradients as the loop
    (auto,) = batched_grad(out[:, [1, 3]], [x], strategy="auto")
    _, x2, out2 = _scores()
    (vmap,) = batched_grad(out2[:, [1, 3]], [x2], strategy="vmap")
    assert torch.equal(auto, vmap)
    seen = []
    real = targets_module.auto_strategy

    def spy(device: torch.device, work: int | None = None) -> str:
        seen.append(work)
        return real(device, work)

    monkeypatch.setattr(targets_module, "auto_strategy", spy)
    _, x3, out3 = _scores()
    batched_grad(out3[:, [0, 2]], [x3], strategy="auto")
    assert seen == [x3.numel()]  # the elements of the tensors differentiated, all rows


def test_chunk_must_be_positive():
    _, x, out = _scores()
    with pytest.raises(ValueError, match="chunk must be an int >= 1 .*got 0"):
        batched_grad(out[:, [0, 1]], [x], chunk=0)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (RuntimeError("vmap: It looks like you're calling .item() on a Tensor"), "vmap cannot batch an operation"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB"), "ran out of memory"),
    ],
)
def test_auto_falls_back_to_the_loop_with_one_warning_that_says_why(monkeypatch, error, said):
    # where auto picks vmap (GPUs) and vmap fails, the loop gives the same gradients; the fallback is said once
    monkeypatch.setattr(targets_module, "auto_strategy", lambda device, work=None: "vmap")
    monkeypatch.setattr(targets_module, "_FALLBACKS_WARNED", set())

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(targets_module, "_vmap_grad", failing)
    net, x, out = _scores()
    (loop,) = batched_grad(out[:, [1, 3]], [x], strategy="loop")
    with pytest.warns(RuntimeWarning, match=rf"backward='auto': .*{said}.* \({type(error).__name__}: .*fell back"):
        (auto,) = batched_grad(net(x)[:, [1, 3]], [x], strategy="auto")
    torch.testing.assert_close(auto, loop)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: no second warning
        batched_grad(net(x)[:, [0, 2]], [x], strategy="auto")
    with pytest.raises(type(error)):
        batched_grad(net(x)[:, [0, 2]], [x], strategy="vmap")  # asked for vmap: the error is the user's
