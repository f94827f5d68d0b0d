"""Thread safety: explainers on a model that another thread trains, and concurrent explain calls on one model.

The rule (hookviz.methods.scope): hooks act only for their own call's thread; calls on one model run one at a time
(a per-model lock); parameters are never frozen, so a training step elsewhere keeps its weight gradients.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

import hookviz as hv


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * 8 * 8, 4),
    )  # fmt: skip


class Gate(nn.Module):
    """Blocks the forward pass of the explaining thread until the training thread has finished its step: the
    training step then runs while the explainer's hooks are in place (the worst case)."""

    def __init__(self) -> None:
        super().__init__()
        self.explaining = threading.Event()
        self.trained = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "explainer" and not self.trained.is_set():
            self.explaining.set()
            assert self.trained.wait(30), "the training thread never finished its step"
        return x


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_training_step_in_another_thread_keeps_its_gradients() -> None:
    for method in (hv.GuidedBackprop, hv.GradCAM):
        model = net()
        gate = Gate()
        gated = nn.Sequential(gate, model).train()
        x, y = torch.rand(2, 3, 8, 8), torch.tensor([1, 3])
        expected = train_step(model, x, y)  # alone, before anything runs
        explained = {}

        def explain(gated=gated, method=method, explained=explained) -> None:
            layer = {"layer": gated[1][2]} if method is hv.GradCAM else {}
            explained["map"] = method(gated, **layer).attribute(torch.rand(1, 3, 8, 8), target=0)

        thread = threading.Thread(target=explain, name="explainer")
        thread.start()
        assert gate.explaining.wait(30)
        got = train_step(model, x, y)  # the explainer's hooks are on the model now, its call in flight
        gate.trained.set()
        thread.join(30)
        assert not thread.is_alive() and "map" in explained
        assert set(got) == set(expected)
        for name in expected:  # no weight gradient lost, and no rule rewrote this thread's backward pass
            torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=f"{method.__name__}: {name}")
        assert gated.training and all(p.requires_grad for p in model.parameters())
        assert all(v == 0 for v in hv.hook_counts(gated).values())


def test_concurrent_explain_calls_on_one_model_agree_with_sequential_ones() -> None:
    model = net().eval()
    xs = [torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    methods = [hv.GuidedBackprop(model), hv.GradCAM(model, layer=model[2]), hv.Saliency(model)]
    expected = [[m.attribute(x, target=1) for x in xs] for m in methods]
    coverage = methods[0].visualize(xs[0], target=1).coverage
    results: dict[tuple[int, int], torch.Tensor] = {}
    errors: list[BaseException] = []
    coverages = []

    def work(i: int) -> None:
        try:
            for j, m in enumerate(methods):
                results[i, j] = m.attribute(xs[i], target=1)
            coverages.append(methods[0].visualize(xs[i], target=1).coverage)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for i in range(len(xs)):
        for j in range(len(methods)):
            torch.testing.assert_close(results[i, j], expected[j][i], rtol=0, atol=0)
    # the per-call result rides with the result: every Explanation's coverage is its own call's (2 ReLU calls)
    assert len(coverages) == len(xs) and all(c == coverage for c in coverages) and coverage.calls == 2
    assert all(v == 0 for v in hv.hook_counts(model).values())
