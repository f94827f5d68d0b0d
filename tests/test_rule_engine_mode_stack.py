"""The rule engine takes its function mode off the stack while a watched module runs (issue 35, part 3): the mode
stack comes back as it was after every pass, also when a module raises, and functional calls are still seen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

import hookviz as hv


class _Boom(nn.ReLU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")


class _Nested(nn.Module):
    """A watched module (ReLU subclass) whose forward runs another ReLU module and a functional ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.inner = nn.ReLU()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(self.c(x))
        y = F.relu(y - 0.1)
        return self.fc(y.mean((2, 3)))


class _Outer(nn.ReLU):
    def __init__(self) -> None:
        super().__init__()
        self.body = _Nested()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # a ReLU module that contains ReLU modules
        return self.body(x)


class _Recording(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_stack_restored_when_a_watched_module_raises() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _Boom(), nn.Flatten(), nn.LazyLinear(2))
    before = torch._C._len_torch_function_stack()
    with pytest.raises(RuntimeError, match="boom"):
        hv.GuidedBackprop(model).attribute(torch.randn(1, 3, 6, 6), 0)
    assert torch._C._len_torch_function_stack() == before


def test_nested_watched_modules_and_functional_calls() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Outer()).eval()
    gb = hv.GuidedBackprop(model)
    x = torch.randn(2, 3, 5, 5)
    gb.attribute(x, 1)
    assert torch._C._len_torch_function_stack() == 0
    # the outer module's rule; inside it, calls pass untouched as before (depth above zero)
    assert gb.coverage is not None and gb.coverage.by_kind["module"] >= 1


def test_user_mode_below_stays_active() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 2)).eval()
    x = torch.randn(1, 3, 6, 6)
    with _Recording() as user:
        out = hv.GuidedBackprop(model).attribute(x, 0)
        assert torch._C._len_torch_function_stack() == 1
    assert user.calls > 0 and out.shape == x.shape
    # the same map as without the user's mode
    torch.testing.assert_close(out, hv.GuidedBackprop(model).attribute(x, 0), rtol=0, atol=0)


def test_functional_relu_still_rewritten() -> None:
    class Func(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.r = nn.ReLU()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(F.relu(self.r(self.c(x)) - 0.2).mean((2, 3)))

    gb = hv.GuidedBackprop(Func().eval())
    gb.attribute(torch.randn(1, 3, 5, 5), 0)
    assert gb.coverage is not None
    assert gb.coverage.by_kind == {"module": 1, "functional": 1}
