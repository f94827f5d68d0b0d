"""Occlusion and RISE: hand-computed values, captum, float64 references, target forms, TorchScript, errors."""

from __future__ import annotations

import pytest
import torch
from reference import perturbation as ref
from refs import reference
from torch import nn

import hookviz as hv
from hookviz import RISE, Occlusion

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it


def tanh_cnn(classes: int = 5, hw: tuple[int, int] = (10, 9)) -> nn.Module:
    """A small CNN without ReLUs: conv -> tanh -> conv -> sigmoid -> linear."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 2, 3, padding=1), nn.Sigmoid(),
        nn.Flatten(), nn.Linear(2 * hw[0] * hw[1], classes),
    ).eval()  # fmt: skip


def batch(n: int = 2, hw: tuple[int, int] = (10, 9), seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, *hw, generator=torch.Generator().manual_seed(seed))


def linear_sum(shape: tuple[int, ...]) -> nn.Module:
    """y_0 = sum(x), y_1 = 2 sum(x) + 1: the score drop of a window is the sum (times 2) of what it occludes."""
    lin = nn.Linear(torch.Size(shape).numel(), 2)
    with torch.no_grad():
        lin.weight.copy_(torch.stack([torch.ones(lin.in_features), 2 * torch.ones(lin.in_features)]))
        lin.bias.copy_(torch.tensor([0.0, 1.0]))
    return nn.Sequential(nn.Flatten(), lin).eval()


# -- Occlusion: hand-computed --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("width", "window", "stride", "columns", "shifted"),
    [
        # x = [[1, 2, 3, 4], [5, 6, 7, 8]]; tiles: cols 0-1 drop 1+2+5+6 = 14, cols 2-3 drop 3+4+7+8 = 22
        (4, (2, 2), (2, 2), [14, 14, 22, 22], [10, 10, 18, 18]),
        # stride 1: windows at cols 0, 1, 2 drop 14, 18, 22; each column averages the windows over it
        (4, (2, 2), (2, 1), [14, (14 + 18) / 2, (18 + 22) / 2, 22], [10, 12, 16, 18]),
        # width 5 does not tile: windows at 0, 2, 4, the last cut off to col 4 alone (5 + 10 = 15)
        (5, (2, 2), (2, 2), [16, 16, 24, 24, 15], [12, 12, 20, 20, 13]),
    ],
)
def test_occlusion_hand_computed_on_a_linear_model(width, window, stride, columns, shifted) -> None:
    x = torch.arange(1.0, 2 * width + 1).view(1, 1, 2, width)
    attr = Occlusion(linear_sum((1, 2, width)), window=window, stride=stride).attribute(x, target=0)
    expected = torch.tensor(columns, dtype=torch.float32).expand(1, 1, 2, width)
    assert attr.shape == x.shape
    torch.testing.assert_close(attr, expected)
    # class 1 = 2 sum + 1: twice the drop (the bias cancels); a baseline of 1 drops x - 1 (`shifted`: on x - 1)
    attr = Occlusion(linear_sum((1, 2, width)), window=window, stride=stride, baseline=1.0).attribute(x, target=1)
    torch.testing.assert_close(attr, 2 * torch.tensor(shifted, dtype=torch.float32).expand(1, 1, 2, width))


def test_occlusion_on_vectors_and_channels_covered_whole() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    attr = Occlusion(linear_sum((5,)), window=2, stride=1).attribute(x, target=0)
    # windows [0,1] [1,2] [2,3] [3,4] drop 3, 5, 7, 9
    torch.testing.assert_close(attr, torch.tensor([[3.0, 4.0, 6.0, 8.0, 9.0]]))
    x = torch.arange(1.0, 9).view(1, 2, 2, 2)  # two channels: a 1x1 window occludes both
    attr = Occlusion(linear_sum((2, 2, 2)), window=1).attribute(x, target=0)
    torch.testing.assert_close(attr, (x[:, :1] + x[:, 1:]).expand(1, 2, 2, 2))


# -- Occlusion: captum -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("window", "stride", "baseline"),
    [
        ((3, 3), (3, 3), 0.0),
        ((4, 3), (2, 2), 0.0),
        ((3, 4), (3, 3), -0.5),
        ((10, 9), (1, 1), 0.0),
        ((5, 2), (4, 1), 0.3),
    ],
    ids=["tiles", "overlap", "uneven", "whole", "mixed"],
)
def test_occlusion_matches_captum(window, stride, baseline) -> None:
    model, x, target = tanh_cnn(), batch(), torch.tensor([1, 3])
    ours = Occlusion(model, window=window, stride=stride, baseline=baseline, batch_size=7).attribute(x, target)
    theirs = captum_attr.Occlusion(model).attribute(
        x, sliding_window_shapes=(3, *window), strides=(3, *stride), baselines=baseline, target=target
    )
    assert ours.shape == theirs.shape == x.shape and theirs.abs().max() > 0.01
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5 * theirs.abs().max().item())


def test_occlusion_tensor_baseline_matches_captum_and_reference() -> None:
    model, x = tanh_cnn(), batch()
    base = torch.randn(3, 10, 9, generator=torch.Generator().manual_seed(5))
    ours = Occlusion(model, window=(4, 4), stride=(3, 2), baseline=base).attribute(x, target=2)
    theirs = captum_attr.Occlusion(model).attribute(
        x, sliding_window_shapes=(3, 4, 4), strides=(3, 3, 2), baselines=base.unsqueeze(0), target=2
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    zero = Occlusion(model, window=(4, 4), stride=(3, 2)).attribute(x, target=torch.tensor([2, 0]))
    expected = ref.occlusion(model, x, torch.tensor([2, 0]), (4, 4), (3, 2))
    torch.testing.assert_close(zero.double(), expected, rtol=1e-5, atol=1e-6)


# -- RISE ------------------------------------------------------------------------------------------------------------
def test_rise_matches_float64_reference() -> None:
    model, x = tanh_cnn(), batch()
    targets = torch.tensor([[1, 4], [0, 0]])
    ours = RISE(model, n_masks=12, cell=3, p=0.4, seed=7, batch_size=5).attribute(x, target=targets)
    expected = ref.rise(model, x, targets, n=12, cell=3, p=0.4, seed=7)
    assert ours.shape == (2, 2, 1, 10, 9) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-7)


def test_float64_models_give_float64_results() -> None:
    model, x = tanh_cnn().double(), batch().double()
    targets = torch.tensor([[2], [3]])
    ours = RISE(model, n_masks=5, cell=3, seed=2).attribute(x, target=targets)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref.rise(model, x, targets, n=5, cell=3, p=0.5, seed=2), rtol=1e-10, atol=1e-12)
    occ = Occlusion(model, window=(3, 4), stride=(2, 3)).attribute(x, target=targets[:, 0])
    expected = ref.occlusion(model, x, targets[:, 0], (3, 4), (2, 3))
    assert occ.dtype == torch.float64
    torch.testing.assert_close(occ, expected, rtol=1e-10, atol=1e-12)


def test_rise_masks_match_reference_and_do_not_depend_on_batch_size() -> None:
    rise = RISE(tanh_cnn(), n_masks=9, cell=4, p=0.5, seed=3)
    masks = rise.masks((10, 9))
    assert masks.shape == (9, 1, 10, 9) and 0 <= masks.min() and masks.max() <= 1 + 1e-6  # float rounding
    expected = torch.stack(ref.rise_masks(9, 4, 0.5, 3, (10, 9))).unsqueeze(1)
    torch.testing.assert_close(masks.double(), expected, rtol=0, atol=1e-6)
    x = batch(n=3)
    results = [RISE(rise.model, n_masks=9, cell=4, seed=3, batch_size=b).attribute(x) for b in (1, 4, 27, None)]
    for r in results[1:]:
        torch.testing.assert_close(r, results[0], rtol=1e-5, atol=1e-7)
    assert not torch.equal(RISE(rise.model, n_masks=9, cell=4, seed=4).attribute(x), results[0])


def test_rise_keep_everything_gives_the_score_everywhere() -> None:
    model, x = tanh_cnn(), batch()
    sal = RISE(model, n_masks=3, p=1.0).attribute(x, target=[1, 2])
    prob = torch.softmax(model(x), dim=1)[[0, 1], [1, 2]].detach()
    torch.testing.assert_close(sal, prob.view(2, 1, 1, 1).expand(2, 1, 10, 9))


def test_rise_raw_scores_and_callable_targets() -> None:
    model, x = tanh_cnn(), batch()
    raw = RISE(model, n_masks=6, cell=2, seed=1, softmax=False).attribute(x, target=3)
    expected = ref.rise(model, x, torch.tensor([[3], [3]]), n=6, cell=2, p=0.5, seed=1, softmax=False)[:, 0]
    torch.testing.assert_close(raw.double(), expected, rtol=1e-5, atol=1e-7)
    # a callable's score is used as it is, without softmax, whatever `softmax` says
    fn = RISE(model, n_masks=6, cell=2, seed=1, batch_size=4).attribute(x, target=lambda out: out[:, 3])
    torch.testing.assert_close(fn, raw, rtol=1e-5, atol=1e-6)


# -- both ------------------------------------------------------------------------------------------------------------
BUILD = {
    "occlusion": lambda m: Occlusion(m, window=(4, 3), stride=(3, 2), batch_size=11),
    "rise": lambda m: RISE(m, n_masks=8, cell=3, batch_size=5),
}


@pytest.mark.parametrize("name", sorted(BUILD))
def test_target_forms(name: str) -> None:
    model, x = tanh_cnn(), batch()
    method = BUILD[name](model)
    top = model(x).argmax(1)
    multi = method.attribute(x, target=torch.tensor([[1, 4, 0], [2, 2, 3]]))
    assert multi.shape[:2] == (2, 3)
    for k, column in enumerate([[1, 2], [4, 2], [0, 3]]):
        torch.testing.assert_close(multi[:, k], method.attribute(x, target=column), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(method.attribute(x), method.attribute(x, target=top))
    torch.testing.assert_close(method.attribute(x, target=4), method.attribute(x, target=[4, 4]))
    # a callable (N, K) score keeps K and is used raw (RISE: like class targets with softmax=False)
    pair = method.attribute(x, target=lambda out: out[:, [1, 4]])
    raw = method if name == "occlusion" else RISE(model, n_masks=8, cell=3, softmax=False)
    torch.testing.assert_close(pair, raw.attribute(x, target=torch.tensor([[1, 4], [1, 4]])), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(BUILD))
@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated in favour of torch.export
@pytest.mark.parametrize("compile_", ["script", "trace"])
def test_torchscript_models(name: str, compile_: str) -> None:
    model, x = tanh_cnn(), batch()
    scripted = torch.jit.script(model) if compile_ == "script" else torch.jit.trace(model, x)
    expected = BUILD[name](model).attribute(x, target=[0, 3])
    scripted.train()  # no hooks are placed (a ScriptModule refuses them); modes and flags come back as they were
    torch.testing.assert_close(BUILD[name](scripted).attribute(x, target=[0, 3]), expected)
    assert all(m.training for m in scripted.modules())
    assert all(p.grad is None and p.requires_grad for p in scripted.parameters())


@pytest.mark.parametrize("name", sorted(BUILD))
def test_registered_and_visualized(name: str) -> None:
    cls = hv.get_method(name)
    assert cls is type(BUILD[name](tanh_cnn())) and cls.key == name
    assert "$$" in cls.__doc__ and "Example::" in cls.__doc__ and "arXiv" in cls.__doc__
    exp = BUILD[name](tanh_cnn()).visualize(batch(n=1), target=2)
    assert exp.targets.tolist() == [[2]] and exp.display == cls.display_defaults


def test_progress_bar(capsys) -> None:
    RISE(tanh_cnn(), n_masks=4, batch_size=1, progress=True).attribute(batch(n=1), target=0)
    assert "RISE (masks)" in capsys.readouterr().err
    Occlusion(tanh_cnn(), window=5, batch_size=1, progress=False).attribute(batch(n=1), target=0)
    RISE(tanh_cnn(), n_masks=4, batch_size=1).attribute(batch(n=1), target=0)  # None: only after 2 s
    assert capsys.readouterr().err == ""


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = tanh_cnn()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


@pytest.mark.parametrize(
    ("build", "x", "exc", "match"),
    [
        (lambda m: Occlusion(m, window=(11, 2)), batch(), ValueError, r"window \(11, 2\) is larger than the input"),
        (lambda m: Occlusion(m, window=(2, 2), stride=(3, 1)), batch(), ValueError, "stride .* is larger than"),
        (lambda m: Occlusion(m, window=(1, 1, 1, 1)), batch(), ValueError, "one size per occluded axis"),
        (lambda m: Occlusion(m, 2, baseline=torch.zeros(2, 5, 5)), batch(), ValueError, "does not broadcast"),
        (lambda m: Occlusion(m, window=2), batch(), ValueError, r"target class 7 is out of range"),
        (lambda m: RISE(m, n_masks=2), torch.randn(2, 3, 10), ValueError, r"\(3-D\) but .* takes 4-D batches"),
    ],
)
def test_call_errors_before_any_perturbed_pass(build, x, exc, match) -> None:
    model = Counting()
    with pytest.raises(exc, match=match):
        build(model).attribute(x, target=7 if "target" in match else 0)
    assert model.calls <= (1 if "target" in match else 0)  # at most the clean pass, which checks the target


@pytest.mark.parametrize(
    ("build", "exc", "match"),
    [
        (lambda m: Occlusion(m, window=(4, 0)), ValueError, r"window must be >= 1 along every axis"),
        (lambda m: Occlusion(m, stride=0), ValueError, r"stride must be >= 1 along every axis .*got 0"),
        (lambda m: Occlusion(m, window=2.5), TypeError, r"window must be an int or a tuple of ints"),
        (lambda m: Occlusion(m, baseline="zero"), TypeError, r"baseline must be a number or a tensor"),
        (lambda m: Occlusion(m, batch_size=0), ValueError, r"batch_size must be None .* got 0"),
        (lambda m: RISE(m, n_masks=0), ValueError, r"n_masks must be >= 1 \(number of random masks\), got 0"),
        (lambda m: RISE(m, cell=0), ValueError, r"cell must be >= 1 \(grid cells per side\), got 0"),
        (lambda m: RISE(m, p=0), ValueError, r"p must be a number in \(0, 1\] .* got 0"),
        (lambda m: RISE(m, p=1.5), ValueError, r"p must be a number in \(0, 1\] .* got 1.5"),
        (lambda m: RISE(m, seed=1.0), TypeError, r"seed must be an int or None, got float"),
        (lambda m: RISE(m, progress="yes"), TypeError, r"progress must be None .*, True or False, got str"),
    ],
)
def test_constructor_errors(build, exc, match) -> None:
    with pytest.raises(exc, match=match):
        build(tanh_cnn())
