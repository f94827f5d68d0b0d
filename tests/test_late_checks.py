"""Checks after the work (`hookviz._device.after_work`, issue 35): on the CPU they warn in their own call; on an
accelerator their values come without a wait and they warn once an event says so. The accelerator's steps are
replaced here by a fake: `_on_host` says no, and `_copy_later` hands back the values with a `FakeEvent` whose
``query()`` answers False until it is told otherwise."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz import _device


class FakeEvent:
    """An event that is not complete for its first `busy` queries (``synchronize`` completes it at once)."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.synchronized = 0

    def query(self) -> bool:
        if self.busy > 0:
            self.busy -= 1
            return False
        return True

    def synchronize(self) -> None:
        self.synchronized += 1
        self.busy = 0


class Accelerator:
    """The fake accelerator's events, in the order `after_work` made them; each new one is busy for `busy` queries
    (default: one, the query at the end of the call)."""

    def __init__(self) -> None:
        self.events: list[FakeEvent] = []
        self.busy = 1

    def copy_later(self, flat: Tensor) -> tuple[Tensor, FakeEvent]:
        self.events.append(FakeEvent(self.busy))
        return flat.clone(), self.events[-1]


@pytest.fixture
def accelerator(monkeypatch: pytest.MonkeyPatch) -> Iterator[Accelerator]:
    """The accelerator path of `after_work` on the CPU, with fake events."""
    fake = Accelerator()
    monkeypatch.setattr(_device, "_on_host", lambda tensors: False)
    monkeypatch.setattr(_device, "_copy_later", fake.copy_later)
    yield fake
    with warnings.catch_warnings():  # a failed test leaves nothing behind for the next
        warnings.simplefilter("ignore")
        hv.flush_checks()


def blank_gradcam() -> tuple[hv.GradCAM, Tensor]:
    """A Grad-CAM whose maps are all zero: the classifier's weights are zero, so no gradient reaches the layer."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    )
    nn.init.zeros_(model[4].weight)
    return hv.GradCAM(model.eval(), layer="1"), torch.randn(2, 3, 8, 8)


TWO = torch.tensor([[0, 2]] * 4)  # two target columns of four inputs: IG at 2 steps misses completeness by > 1%
EMPTY = "GradCAM: every map is zero: the target's gradient at layer '1' is zero for every sample"


def messages(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record]


# -- on the CPU: in the call ---------------------------------------------------------------------------------------
def test_on_the_cpu_each_family_warns_in_its_call_at_the_callers_line() -> None:
    cam, x = blank_gradcam()
    torch.manual_seed(0)
    tanh = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    ig = hv.IntegratedGradients(tanh, steps=2, method="gausslegendre")
    x_ig = 3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    dl = hv.DeepLift(_Cumprod().eval(), 0.0)
    x_dl = torch.randn(3, 4) * 3
    for call, fragment in [
        (lambda: cam.attribute(x, target=0), EMPTY),
        (lambda: ig.attribute(x_ig, target=TWO), "IntegratedGradients: attributions of input"),
        (lambda: dl.attribute(x_dl, 0), "DeepLift: attributions of input"),
    ]:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call()
        ours = [w for w in record if fragment in str(w.message)]
        assert len(ours) == 1, messages(record)
        assert ours[0].filename == __file__  # the user's line, not inside hookviz (nor its caller's)
        assert "from the" not in str(ours[0].message)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hv.flush_checks()
    assert record == []


class _Cumprod(nn.Module):
    """An operation without a DeepLift rule (torch.cumprod): the summation-to-delta warning fires."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.cumprod(self.a(x), dim=1))


def _old_gap_message(method: str, sums: Tensor, expected: Tensor) -> str:
    """The message's figures as the check computed them before it was read after the work (read one by one)."""
    delta = sums - expected
    rel = delta.abs() / (expected.abs() + 1e-8)
    worst = int(rel.flatten().argmax())
    i, k = divmod(worst, rel.shape[1])
    where = f"input {i}" + (f", target column {k}" if rel.shape[1] > 1 else "")
    return (
        f"{method}: attributions of {where} sum to {float(sums[i, k]):.4g} but f(x) - f(baseline) = "
        f"{float(expected[i, k]):.4g} (error {float(rel[i, k]):.1%} > 1%)"
    )


def test_completeness_messages_keep_their_figures() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    x = 3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    ig = hv.IntegratedGradients(model, steps=2, method="gausslegendre")
    with pytest.warns(UserWarning) as record:
        attr = ig.attribute(x, target=TWO)
    with torch.no_grad():
        expected = (model(x) - model(torch.zeros_like(x)))[:, [0, 2]]
    sums = expected + ig.last_delta
    text = _old_gap_message("IntegratedGradients", sums, expected)
    assert str(record[0].message) == f"{text}; increase steps (now 2, method='gausslegendre'); see .last_delta"
    torch.testing.assert_close(sums, attr.sum(-1), rtol=1e-5, atol=1e-6)

    torch.manual_seed(0)
    dl = hv.DeepLift(_Cumprod().eval(), 0.0)
    xd = torch.randn(3, 4) * 3
    with pytest.warns(UserWarning) as record:
        attr = dl.attribute(xd, 0)
    with torch.no_grad():
        expected = (dl.model(xd) - dl.model(torch.zeros_like(xd)))[:, [0]]
    text = _old_gap_message("DeepLift", attr.flatten(1).sum(1, keepdim=True), expected)
    why = "operations without a DeepLift rule ran: torch.cumprod x1; they pass their plain gradient"
    assert str(record[0].message) == f"{text}: {why} (see .rule_coverage, .last_delta)"


# -- on an accelerator (faked): later, once, in order --------------------------------------------------------------
def test_not_ready_at_the_end_of_the_call_it_warns_at_the_next_wait(accelerator: Accelerator) -> None:
    cam, x = blank_gradcam()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cam.attribute(x, target=0)
        assert record == []  # the event was not complete at the end of the call
        line = _device.to_host([torch.ones(2)])  # hookviz's next wait
        assert len(record) == 1
        _device.to_host([torch.ones(2)])
        hv.flush_checks()
    assert len(accelerator.events) == 1 and len(record) == 1
    message = str(record[0].message)
    assert message.startswith(EMPTY)
    assert message.endswith(
        f"(from the last GradCAM call, at test_late_checks.py:{_line_of('cam.attribute(x, target=0)')}: checked "
        "after it, without waiting for the device)"
    )
    assert record[0].filename == __file__
    assert line[0].tolist() == [1.0, 1.0]


def test_not_ready_it_warns_at_the_start_of_the_next_call_before_that_calls_own(accelerator: Accelerator) -> None:
    cam, x = blank_gradcam()
    torch.manual_seed(0)
    tanh = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    ig = hv.IntegratedGradients(tanh, steps=2, method="gausslegendre")
    x_ig = 3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cam.attribute(x, target=0)
        assert record == []
        ig.attribute(x_ig, target=TWO)
        assert len(record) == 1 and "before this one" in str(record[0].message)
        hv.flush_checks()
        hv.flush_checks()
    assert len(record) == 2, messages(record)
    first, second = messages(record)
    assert first.startswith(EMPTY) and "(from the GradCAM call before this one, at test_late_checks.py:" in first
    assert second.startswith("IntegratedGradients: attributions of input")
    assert "(from the last IntegratedGradients call, at test_late_checks.py:" in second
    assert all(w.filename == __file__ for w in record)


def test_ready_at_the_end_of_the_call_it_warns_in_the_call(accelerator: Accelerator) -> None:
    accelerator.busy = 0
    cam, x = blank_gradcam()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cam.attribute(x, target=0)
        assert len(record) == 1
        hv.flush_checks()
    assert len(record) == 1
    assert str(record[0].message).startswith(EMPTY) and "(from the" not in str(record[0].message)
    assert record[0].filename == __file__
    assert accelerator.events[0].synchronized == 1


def test_a_call_that_starts_runs_the_checks_whose_values_have_come(accelerator: Accelerator) -> None:
    seen: list[str] = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _device.after_work([torch.ones(1)], _check("a", seen), "Test")  # busy at the end of its call
        assert seen == []
        _device.call_starts()  # complete now
        assert seen == ["a"] and len(record) == 1
    assert "(from the Test call before this one, at test_late_checks.py:" in str(record[0].message)


def _check(name: str, seen: list[str]) -> Any:
    def check(values: list[Tensor]) -> str | None:
        seen.append(name)
        return f"{name}: " + " ".join(str(v.tolist()) for v in values)

    return check


def test_checks_run_once_in_order_and_flush_checks_waits(accelerator: Accelerator) -> None:
    accelerator.busy = 10**6  # never complete by itself
    seen: list[str] = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for name in ("a", "b", "c"):
            # two tensors of two dtypes, read in one copy, each back in its own dtype and shape
            _device.after_work([torch.tensor([1, 2]), torch.tensor([[0.5]])], _check(name, seen), "Test")
        accelerator.events[1].busy = 0  # the second is complete, the first is not: none may run before it
        _device.call_starts()
        _device.to_host([torch.zeros(1)])
        assert seen == [] and record == []
        hv.flush_checks()
        hv.flush_checks()
        _device.to_host([torch.zeros(1)])
    assert seen == ["a", "b", "c"]
    assert [m.split(" (from")[0] for m in messages(record)] == [f"{n}: [1, 2] [[0.5]]" for n in "abc"]
    late = "(from an earlier Test call (1 hookviz calls since), at test_late_checks.py:"
    assert all(late in m for m in messages(record))
    assert [e.synchronized for e in accelerator.events] == [1, 1, 1]
    assert _device._QUEUES == []  # nothing held once every check has run


def test_a_check_that_raises_is_not_run_again(accelerator: Accelerator) -> None:
    runs: list[int] = []

    def check(values: list[Tensor]) -> str | None:
        runs.append(1)
        raise RuntimeError("check failed")

    _device.after_work([torch.ones(1)], check, "Test")
    with pytest.raises(RuntimeError, match="check failed"):
        hv.flush_checks()
    hv.flush_checks()
    assert runs == [1]


def test_checks_of_a_finished_thread_run_at_exit(accelerator: Accelerator) -> None:
    accelerator.busy = 10**6
    seen: list[str] = []
    thread = threading.Thread(target=lambda: _device.after_work([torch.ones(1)], _check("t", seen), "Test"))
    thread.start()
    thread.join()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hv.flush_checks()  # this thread's queue: not the other's
        assert seen == []
        _device._at_exit()
        _device._at_exit()
    assert seen == ["t"] and len(record) == 1
    assert _device._QUEUES == []
    assert str(record[0].message).startswith("t: [1.0] (") and "(from the last Test call" in str(record[0].message)


def _line_of(fragment: str) -> int:
    """The line of this file holding `fragment` (its first occurrence in a test of the accelerator path)."""
    lines = open(__file__).read().splitlines()
    start = next(i for i, line in enumerate(lines) if "def test_not_ready_at_the_end_of_the_call" in line)
    return next(i for i in range(start, len(lines)) if fragment in lines[i]) + 1


# -- on CUDA (tools/gpu_check.sh; CI has no GPU) -----------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)")
def test_on_cuda_the_values_come_without_a_wait_and_the_warning_once() -> None:
    """The real accelerator path: queued behind a long matrix product, `after_work` copies its flag without a host
    synchronisation (``set_sync_debug_mode("error")`` raises on one) and the check warns exactly once, at the end of
    the call if the copy had already come, else at `flush_checks`."""
    x = torch.randn(4096, 4096, device="cuda")
    flag = torch.stack([(x @ x).isnan().any()])  # False once computed: the check below says so
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("error")
        try:
            _device.after_work([flag], lambda v: f"flag {v[0].tolist()}", "Probe")
        finally:
            torch.cuda.set_sync_debug_mode(0)
        hv.flush_checks()
        hv.flush_checks()  # nothing left: no second warning
    assert [m.split(" (from")[0] for m in messages(record)] == ["flag [False]"]
