"""Gradient-flow alarms that carry their message (issue 27, point 7): one summary per step and kind that names and
counts the layers and says the likely cause (saturating activations, a learning rate whose update/weight ratio is
large, exploding norms); the report's status filled for every layer an alarm names while its condition holds; the
first NaN marked on the norms plot and the heatmap."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from matplotlib.lines import Line2D
from torch import nn

from hookviz.flow import Alarm, Alarms, GradientFlow, GradientFlowWarning


def sigmoid_stack(depth: int = 20, width: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, x: torch.Tensor, scale=lambda step: 1.0) -> None:
    for step in range(steps):
        opt.zero_grad()
        (model(x).pow(2).mean() * scale(step)).backward()
        opt.step()


def test_a_sigmoid_stack_gives_one_summary_per_step_naming_the_layers_and_the_cause() -> None:
    """On today's main: 14 warnings here, one per layer, each "vanishing gradient at step 4: '0' (Linear) ..."."""
    model = sigmoid_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradientFlow(model, optimizer=opt) as flow:
            train(model, opt, 8, x)
            stats = flow.read()
    shown = [w for w in caught if issubclass(w.category, GradientFlowWarning)]
    alarms = flow.alarms
    assert len(shown) == len(alarms) and len({a.step for a in alarms}) == len(alarms)  # one per step
    named = [m for a in alarms for m in a.modules]
    assert len(named) == len(set(named)) >= 10  # many layers, each named once
    first = alarms[0]
    assert len(first.modules) > 1 and first.name == first.modules[0] == "0"  # model order: the input's layer first
    assert f"vanishing gradient at step {first.step} in {len(first.modules)} of 21 layers with parameters: '0', " in (
        first.message
    )
    assert first.cause is not None and first.cause.startswith("saturating activations: the model has 20 Sigmoid")
    assert "likely cause: saturating activations" in str(shown[0].message)
    # the summary's value is the smallest norm among its layers (rows are steps here: every step recorded)
    assert first.value == pytest.approx(min(stats.module(m)[first.step] for m in first.modules), rel=1e-6, abs=0)
    # the report's status names every layer an alarm named, at the last step too (their norms stay below 1e-7)
    rows = {r["module"]: r["status"] for r in stats.report().rows}
    assert all(rows[m] == "vanishing" for m in named)
    assert all(rows[m] == "" for m in rows if m not in named)


def test_vanishing_without_saturating_activations_says_so() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    found: list[Alarm] = []
    config = Alarms(vanishing=1e-6, vanishing_steps=2, exploding=None, jump=None)
    with GradientFlow(model, optimizer=opt, alarms=config, on_alarm=found.append):
        train(model, opt, 3, torch.ones(2, 4), scale=lambda step: 1e-12)
    assert [a.modules for a in found] == [("0", "2")]
    assert found[0].cause is not None and found[0].cause.startswith("no saturating activation module in the model")


def _exploding(lr: float, update_ratio: bool) -> Alarm:
    """One layer, y = w x with w = 1 and x = 1: the gradient of y^2 / 2 is w x^2 = 1, scaled by 10 at step 1."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    found: list[Alarm] = []
    config = Alarms(vanishing=None, exploding=5.0, jump=None)
    flow = GradientFlow(model, optimizer=opt, alarms=config, on_alarm=found.append, update_ratio=update_ratio)
    with flow:
        for step in range(2):
            opt.zero_grad()
            (model(torch.ones(1, 1)).pow(2).sum() * (5.0 if step else 0.5)).backward()  # gradients 1, then 10
            opt.step()
    assert [(a.kind, a.step) for a in found] == [("exploding", 1)]
    return found[0]


def test_exploding_names_a_learning_rate_whose_update_ratio_is_large() -> None:
    # step 1: w = 1 - lr * 1 before the step, gradient 10 (2 * 5 * w * x^2 with w = 1 - lr), update lr * 10 |w|
    alarm = _exploding(lr=0.05, update_ratio=True)
    w = 1 - 0.05
    ratio = 0.05 * 10 * w / w  # ||lr * g|| / ||w||, g = 10 w
    assert alarm.cause is not None and f"the update/weight ratio reached {ratio:.2g} in ''" in alarm.cause
    assert alarm.cause.startswith("a learning rate that is too large")
    small = _exploding(lr=1e-5, update_ratio=True)
    assert small.cause is not None and small.cause.startswith("exploding norms with small updates")
    unknown = _exploding(lr=0.05, update_ratio=False)
    assert unknown.cause is not None and "update_ratio=True) tells whether the learning rate is too large" in (
        unknown.cause
    )


def test_status_holds_until_the_condition_stops() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    config = Alarms(vanishing=1e-6, vanishing_steps=2, exploding=None, jump=None)
    scales = [1e-12, 1e-12, 1e-12, 1e-12, 1.0, 1.0]  # vanishing over steps 0-3, fired at step 1, over at step 4
    with GradientFlow(model, optimizer=opt, alarms=config, on_alarm=lambda a: None) as flow:
        train(model, opt, len(scales), torch.ones(2, 4), scale=lambda step: scales[step])
        stats = flow.read()
    assert [(a.step, a.modules) for a in flow.alarms] == [(1, ("0", "2"))]
    status = {s: {r["module"]: r["status"] for r in stats.report(s).rows} for s in range(6)}
    assert status[0]["0"] == "" and status[1]["0"] == status[3]["0"] == status[3]["2"] == "vanishing"
    assert status[4]["0"] == status[5]["2"] == ""
    assert "Tanh" in flow.alarms[0].message  # the likely cause


@pytest.fixture(scope="module")
def nan_stats():
    """A ReLU net whose input holds an Inf at step 3: every gradient is NaN from there on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with GradientFlow(model, optimizer=opt, on_alarm=lambda a: None) as flow:
        for step in range(6):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
            if step == 3:
                x[0, 0] = float("inf")
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    return flow.read()


def test_norms_plot_marks_the_first_nan(nan_stats, tmp_path) -> None:
    """On today's main the lines just end at step 2: no line, marker or note at step 3."""
    assert np.isnan(nan_stats.module("0")[3]) and np.isfinite(nan_stats.module("0")[2])
    fig = nan_stats.plot_norms()
    ax = fig.axes[0]
    vertical = [ln for ln in ax.lines if list(ln.get_xdata()) == [3, 3]]
    assert len(vertical) == 1 and vertical[0].get_color() == "red"
    ends = [ln for ln in ax.lines if ln.get_marker() == "X"]
    assert sorted(float(ln.get_xdata()[0]) for ln in ends) == [2.0, 2.0]  # each line's last finite value
    notes = [t.get_text() for t in ax.texts]
    assert len(notes) == 1 and notes[0].startswith("first ") and "at step 3\nin '" in notes[0]
    assert ax.get_xlim()[1] >= 5  # every recorded step on the axis, also those after the NaN
    fig.savefig(tmp_path / "norms.png")
    heat = nan_stats.plot_heatmap().axes[0]
    assert [list(ln.get_xdata()) for ln in heat.lines if isinstance(ln, Line2D)] == [[2.5, 2.5]]  # the cell's edge


def test_plots_without_nan_are_unmarked() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with GradientFlow(model, optimizer=opt) as flow:
        train(model, opt, 3, torch.randn(2, 4))
        stats = flow.read()
    ax = stats.plot_norms().axes[0]
    assert not ax.texts and not [ln for ln in ax.lines if ln.get_marker() == "X"]


def test_exact_zeros_are_marked_on_the_log_axis() -> None:
    """A gradient that underflows to exactly 0 has no place on a log axis: a triangle on the bottom edge says so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with torch.no_grad():
        model[2].weight.zero_()  # nothing reaches the first layer: its gradient is exactly 0
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with GradientFlow(model, optimizer=opt, alarms=False) as flow:
        train(model, opt, 3, torch.randn(2, 4))
        stats = flow.read()
    assert (stats.module("0") == 0).all()
    ax = stats.plot_norms(["0", "2"]).axes[0]
    zeros = [ln for ln in ax.lines if ln.get_marker() == "v"]
    assert len(zeros) == 1 and list(zeros[0].get_xdata()) == [0, 1, 2]
    assert [t.get_text() for t in ax.texts] == ["\u25bc exactly 0"]
