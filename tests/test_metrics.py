"""Metrics: hand-computed toy cases for every function, float64 / RISE-style references, and agreement with Quantus
0.6 (PointingGame, MPRT) where its conventions are the spec's."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cheap import ON_CNNS, cheap_method
from refs import require
from torch import nn

import hookviz as hv
from hookviz import metrics as M

# -- models --------------------------------------------------------------------------------------------------------


def tiny_cnn(seed: int = 0, classes: int = 3, size: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * size * size, classes),
    ).eval()


class WeightedMean(nn.Module):
    """Two classes with softmax probabilities (p, 1 - p), p = sum(W * mean_c(x)): the deletion curve by hand."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = (x.mean(dim=1) * self.w).flatten(1).sum(dim=1).clamp(0, 1)
        return torch.stack([p.log(), (1 - p).log()], dim=1)  # log(0) = -inf: softmax still gives 0 and 1


def weighted_model() -> WeightedMean:
    return WeightedMean((torch.arange(16, dtype=torch.float32) + 1).view(4, 4) / 136)


# -- pointing game ---------------------------------------------------------------------------------------------------


def one_hot_mask(h: int, w: int, *pixels: tuple[int, int]) -> torch.Tensor:
    m = torch.zeros(1, h, w, dtype=torch.bool)
    for r, c in pixels:
        m[0, r, c] = True
    return m


def test_pointing_game_hit_miss_ties_and_empty_mask() -> None:
    a = torch.zeros(4, 1, 4, 4)
    a[:, 0, 1, 2] = 5.0
    a[2, 0, 3, 0] = 5.0  # a tie: two pixels at the maximum, only the second one on the mask
    masks = torch.cat(
        [one_hot_mask(4, 4, (1, 2)), one_hot_mask(4, 4, (0, 0)), one_hot_mask(4, 4, (3, 0)), one_hot_mask(4, 4)]
    )
    out = hv.pointing_game(a, masks)
    assert out.dtype == torch.float32 and out.shape == (4,)
    assert out[:3].tolist() == [1.0, 0.0, 1.0]
    assert math.isnan(out[3])


def test_pointing_game_sums_channels_before_the_maximum() -> None:
    a = torch.zeros(1, 2, 3, 3)
    a[0, 0, 0, 0] = 3.0  # largest single value, cancelled by the other channel
    a[0, 1, 0, 0] = -2.5
    a[0, 0, 2, 2] = 1.0  # largest channel sum
    assert hv.pointing_game(a, one_hot_mask(3, 3, (2, 2))).item() == 1.0
    assert hv.pointing_game(a, one_hot_mask(3, 3, (0, 0))).item() == 0.0


@pytest.mark.parametrize(("tolerance", "hit"), [(0, 0.0), (1, 0.0), (1.41, 0.0), (1.5, 1.0), (4.24, 1.0)])
def test_pointing_game_tolerance_is_euclidean(tolerance: float, hit: float) -> None:
    a = torch.zeros(1, 1, 6, 6)
    a[0, 0, 2, 2] = 1.0
    # the nearest mask pixel is (3, 3), at distance sqrt(2) = 1.414
    assert hv.pointing_game(a, one_hot_mask(6, 6, (3, 3), (5, 5)), tolerance).item() == hit


def test_pointing_game_tolerance_against_brute_force_distances() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 6, (40, 1, 9, 11), generator=g).float()  # ties at the maximum are common
    masks = torch.rand(40, 9, 11, generator=g) < 0.04
    ys, xs = torch.meshgrid(torch.arange(9.0), torch.arange(11.0), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()], dim=1)
    dist = torch.cdist(coords.double(), coords.double())  # pixel -> pixel Euclidean distances
    for tol in (0, 1, 2.5, 4):
        got = hv.pointing_game(a, masks, tolerance=tol)
        for i in range(40):
            flat = a[i, 0].flatten()
            peaks = flat == flat.max()
            m = masks[i].flatten()
            if not m.any():
                assert math.isnan(got[i])
                continue
            want = float((dist[peaks][:, m] <= tol).any())
            assert got[i].item() == want, (tol, i)


def test_pointing_game_upsamples_bilinearly() -> None:
    # a 2x2 map upsampled to 4x4 (align_corners=False): row weights (1, .75, .25, 0) of the top row, column weights
    # (0, .25, .75, 1) of the right column; the single maximum (1.0) is at (0, 3), (1, 3) holds .75.
    a = torch.tensor([[[[0.0, 1.0], [0.0, 0.0]]]])
    up = F.interpolate(a, size=(4, 4), mode="bilinear", align_corners=False)
    assert up[0, 0, 0, 3] == 1.0 and up[0, 0, 1, 3] == 0.75
    assert hv.pointing_game(a, one_hot_mask(4, 4, (0, 3))).item() == 1.0
    assert hv.pointing_game(a, one_hot_mask(4, 4, (1, 3))).item() == 0.0  # nearest upsampling would call it a hit


def test_pointing_game_agrees_with_quantus() -> None:
    quantus = require("quantus")
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 12, (64, 1, 7, 7), generator=g).float()
    s = torch.rand(64, 1, 7, 7, generator=g) < 0.15
    s[s.flatten(1).sum(1) == 0, 0, 0, 0] = True  # Quantus scores an empty mask as a hit (see the next test)
    metric = quantus.PointingGame(abs=False, normalise=False, disable_warnings=True)
    want = metric(
        model=None,
        x_batch=torch.rand(64, 1, 7, 7).numpy(),
        y_batch=np.zeros(64, int),
        a_batch=a.numpy(),
        s_batch=s.numpy(),
    )
    got = hv.pointing_game(a, s)
    assert 0 < got.sum() < 64  # both hits and misses
    assert got.tolist() == [float(w) for w in want]


def test_quantus_pointing_game_gives_empty_masks_a_hit_we_give_nan() -> None:
    quantus = require("quantus")
    a = torch.rand(2, 1, 4, 4)
    s = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    s[0, 0, 0, 0] = True
    metric = quantus.PointingGame(abs=False, normalise=False, disable_warnings=True)
    want = metric(model=None, x_batch=a.numpy(), y_batch=np.zeros(2, int), a_batch=a.numpy(), s_batch=s.numpy())
    assert bool(want[1]) is True  # NaN stored into a bool array becomes True
    assert math.isnan(hv.pointing_game(a, s)[1])


# -- energy in mask --------------------------------------------------------------------------------------------------


def test_energy_in_mask_by_hand() -> None:
    a = torch.tensor([[[1.0, -1.0], [2.0, 0.0]], [[-1.0, -2.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
    masks = torch.tensor([[[True, True], [False, False]]] * 2 + [[[False, False], [False, False]]])
    out = hv.energy_in_mask(a, masks)
    assert out[0].item() == pytest.approx(1 / 3)  # positive energy 1 + 2, of which 1 inside
    assert math.isnan(out[1]) and math.isnan(out[2])  # no positive attribution; empty mask


def test_energy_in_mask_sums_channels_then_takes_the_positive_part_and_upsamples() -> None:
    a = torch.zeros(1, 2, 2, 2)
    a[0, 0, 0, 0], a[0, 1, 0, 0] = 2.0, -3.0  # channel sum -1: no energy
    a[0, 0, 1, 1] = 1.0
    masks = torch.zeros(1, 4, 4, dtype=torch.bool)
    masks[0, :2, :2] = True
    assert hv.energy_in_mask(a, masks).item() == 0.0
    b = torch.rand(3, 1, 3, 3)
    m = torch.rand(3, 6, 6) < 0.5
    m[:, 0, 0] = True
    up = F.interpolate(b, size=(6, 6), mode="bilinear", align_corners=False)[:, 0].double()
    want = (up * m).sum((1, 2)) / up.sum((1, 2))
    torch.testing.assert_close(hv.energy_in_mask(b, m).double(), want, rtol=1e-5, atol=1e-6)


# -- localisation: bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributions", "masks", "kwargs", "error", "match"),
    [
        (torch.rand(2, 1, 4, 4), torch.ones(3, 4, 4, dtype=torch.bool), {}, ValueError, "masks hold 3 masks but the"),
        (torch.rand(2, 1, 8, 8), torch.ones(2, 4, 4, dtype=torch.bool), {}, ValueError, "attributions are 8x8 but"),
        (torch.rand(2, 4, 4), torch.ones(2, 2, 4, 4, dtype=torch.bool), {}, ValueError, r"masks must be \(N, H, W\)"),
        (torch.full((2, 1, 4, 4), math.nan), torch.ones(2, 4, 4, dtype=torch.bool), {}, ValueError, "32 NaN"),
        (torch.rand(2, 1, 4, 4), torch.ones(2, 4, 4, dtype=torch.bool), {"tolerance": -1}, ValueError, "tolerance"),
        (torch.rand(2, 1, 4, 4), torch.full((2, 4, 4), 2), {}, ValueError, "masks must be bool"),
        (torch.rand(2, 5, 1, 4, 4), torch.ones(2, 4, 4, dtype=torch.bool), {}, ValueError, "one target at a time"),
        (np.zeros((2, 4, 4)), torch.ones(2, 4, 4, dtype=torch.bool), {}, TypeError, "attributions must be a tensor"),
    ],
)
def test_localisation_bad_input(attributions, masks, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        hv.pointing_game(attributions, masks, **kwargs)
    if not kwargs:
        with pytest.raises(error, match=match):
            hv.energy_in_mask(attributions, masks)


def test_inf_maps_are_rejected() -> None:
    a = torch.zeros(1, 1, 2, 2)
    a[0, 0, 0, 0] = math.inf
    with pytest.raises(ValueError, match="0 NaN and 1 infinite"):
        hv.pointing_game(a, torch.ones(1, 2, 2, dtype=torch.bool))


# -- deletion / insertion --------------------------------------------------------------------------------------------


def test_deletion_and_insertion_by_hand_with_ties_in_index_order() -> None:
    # Map: zeros with one peak at pixel 15 -> order 15, 0, 1, ..., 14 (ties keep index order). 4 steps of 4 pixels.
    # p = sum of W = (i + 1) / 136 over the pixels still there:
    # deletion: 1, 1 - (16+1+2+3)/136, ... = (136, 114, 92, 54, 0) / 136, AUC = (1/2 + 260/136) / 4 = 41/68;
    # insertion from zeros: (0, 22, 44, 82, 136) / 136, AUC = 27/68.
    model = weighted_model()
    x = torch.ones(1, 3, 4, 4)
    a = torch.zeros(1, 1, 4, 4)
    a[0, 0, 3, 3] = 1.0
    auc, curve = hv.deletion(model, x, a, 0, steps=4, return_curves=True)
    torch.testing.assert_close(curve[0], torch.tensor([136.0, 114, 92, 54, 0]) / 136)
    assert auc.item() == pytest.approx(41 / 68, abs=1e-6)
    auc, curve = hv.insertion(model, x, a, 0, steps=4, baseline="zeros", return_curves=True)
    torch.testing.assert_close(curve[0], torch.tensor([0.0, 22, 44, 82, 136]) / 136)
    assert auc.item() == pytest.approx(27 / 68, abs=1e-6)


def test_deletion_moves_ceil_hw_over_steps_pixels_per_step_in_all_channels() -> None:
    # 16 pixels in 3 steps: 6, 12, then all 16. Ranking by the map (descending) = by W here, largest first.
    model = weighted_model()
    x = torch.ones(1, 2, 4, 4)
    a = model.w.view(1, 1, 4, 4).repeat(1, 2, 1, 1)  # two channels, summed
    _, curve = hv.deletion(model, x, a, 0, steps=3, return_curves=True)
    w = model.w.flatten().sort(descending=True).values
    want = torch.stack([1 - w[:0].sum(), 1 - w[:6].sum(), 1 - w[:12].sum(), torch.tensor(0.0)])
    torch.testing.assert_close(curve[0], want)


def test_deletion_upsamples_small_maps_and_accepts_a_baseline_tensor() -> None:
    model = weighted_model()
    x = torch.ones(2, 1, 4, 4)
    small = torch.tensor([[[1.0, 0.0], [0.0, 2.0]], [[0.0, 1.0], [3.0, 0.0]]])
    up = F.interpolate(small[:, None], size=(4, 4), mode="bilinear", align_corners=False)
    base = torch.full((1, 4, 4), 0.5)
    got = hv.deletion(model, x, small, 0, steps=5, baseline=base)
    want = hv.deletion(model, x, up, 0, steps=5, baseline=torch.full_like(x, 0.5))
    torch.testing.assert_close(got, want)


def rise_style_curves(model, x, sal, cls, steps, start, finish) -> torch.Tensor:
    """A slow reference after RISE's CausalMetric: one image, one step at a time, float64 probabilities."""
    n, c, h, w = x.shape
    hw = h * w
    per = math.ceil(hw / steps)
    out = torch.zeros(n, steps + 1, dtype=torch.float64)
    for i in range(n):
        order = np.argsort(-sal[i].flatten().numpy(), kind="stable")
        cur = start[i].clone()
        for k in range(steps + 1):
            with torch.no_grad():
                out[i, k] = model(cur[None]).double().softmax(1)[0, cls[i]]
            if k < steps:
                idx = torch.as_tensor(order[per * k : per * (k + 1)].copy())
                cur.view(c, hw)[:, idx] = finish[i].reshape(c, hw)[:, idx]
    return out


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_deletion_insertion_match_a_step_by_step_reference_for_any_batch_size(batch_size: int) -> None:
    model = tiny_cnn()
    g = torch.Generator().manual_seed(2)
    x = torch.rand(3, 3, 8, 8, generator=g)
    a = torch.randn(3, 3, 8, 8, generator=g)
    cls = torch.tensor([0, 2, 1])
    sal = a.sum(1)
    base = M.blur(x)
    _, dcurves = hv.deletion(model, x, a, cls, steps=6, batch_size=batch_size, return_curves=True)
    _, icurves = hv.insertion(model, x, a, cls, steps=6, batch_size=batch_size, return_curves=True)
    torch.testing.assert_close(dcurves.double(), rise_style_curves(model, x, sal, cls, 6, x, torch.zeros_like(x)))
    torch.testing.assert_close(icurves.double(), rise_style_curves(model, x, sal, cls, 6, base, x))
    # AUC: trapezoid rule over the curve, divided by steps
    d = hv.deletion(model, x, a, cls, steps=6, batch_size=batch_size)
    c = dcurves.double()
    torch.testing.assert_close(d.double(), (c.sum(1) - (c[:, 0] + c[:, -1]) / 2) / 6)


def test_deletion_default_target_is_the_top_class_and_callable_targets_give_the_curve() -> None:
    model = tiny_cnn()
    x = torch.rand(4, 3, 8, 8)
    a = torch.rand(4, 1, 8, 8)
    top = model(x).argmax(1)
    torch.testing.assert_close(hv.deletion(model, x, a, steps=3), hv.deletion(model, x, a, top, steps=3))
    # a callable target replaces the softmax probability by its own score
    _, curves = hv.deletion(model, x, a, lambda out: out[:, 1], steps=3, return_curves=True)
    torch.testing.assert_close(curves[:, 0], model(x)[:, 1].detach())


def test_rise_kernel_matches_scipy_gaussian_filter_and_blur_uses_reflect_padding() -> None:
    ndimage = require("scipy.ndimage")
    delta = np.zeros((11, 11))
    delta[5, 5] = 1
    torch.testing.assert_close(M.rise_kernel(), torch.from_numpy(ndimage.gaussian_filter(delta, 5)))
    x = torch.rand(1, 2, 16, 13, dtype=torch.float64)
    k = M.rise_kernel().numpy()
    padded = np.pad(x[0].numpy(), ((0, 0), (5, 5), (5, 5)), mode="reflect")  # numpy's reflect = torch's reflect
    want = np.stack([ndimage.correlate(p, k, mode="constant")[5:-5, 5:-5] for p in padded])
    torch.testing.assert_close(M.blur(x)[0], torch.from_numpy(want))
    # away from the border it is RISE's zero-padded conv2d
    rise = F.conv2d(x, torch.from_numpy(k).expand(2, 1, 11, 11), padding=5, groups=2)
    torch.testing.assert_close(M.blur(x)[..., 5:-5, 5:-5], rise[..., 5:-5, 5:-5])


def test_deletion_leaves_the_model_as_it_was() -> None:
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 6 * 6, 3)).train()
    before = copy.deepcopy(model.state_dict())
    hv.deletion(model, torch.rand(2, 3, 8, 8), torch.rand(2, 1, 8, 8), steps=2)
    assert model.training and all(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # eval mode: BatchNorm statistics untouched


class SegModel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :2]


@pytest.mark.parametrize(
    ("model", "kwargs", "error", "match"),
    [
        (tiny_cnn(), {"steps": 0}, ValueError, "steps must be >= 1"),
        (tiny_cnn(), {"steps": 2.5}, TypeError, "steps must be an int"),
        (tiny_cnn(), {"target": 3}, ValueError, r"target class 3 is out of range: the model has 3 classes"),
        (tiny_cnn(), {"target": [0, 1, 2]}, ValueError, r"one class per image \(2,\)"),
        (tiny_cnn(), {"target": -1}, ValueError, "target classes must be >= 0"),
        (tiny_cnn(), {"baseline": "noise"}, ValueError, "baseline must be 'zeros', 'blur' or a tensor"),
        (tiny_cnn(), {"baseline": torch.zeros(5, 5)}, ValueError, "does not broadcast"),
        (tiny_cnn(), {"attributions": torch.rand(3, 1, 8, 8)}, ValueError, "3 maps for 2 images"),
        (tiny_cnn(), {"attributions": torch.rand(2, 1, 16, 16)}, ValueError, "attributions are 16x16 but the images"),
        (tiny_cnn(), {"attributions": torch.full((2, 1, 8, 8), math.nan)}, ValueError, "128 NaN"),
        (tiny_cnn(), {"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        (SegModel(), {}, ValueError, r"model returned a tensor of shape \(1, 2, 8, 8\).*callable target"),
        (SegModel(), {"target": lambda out: out}, ValueError, "one score per image"),
    ],
)
def test_deletion_bad_input(model, kwargs, error, match) -> None:
    args = {"attributions": torch.rand(2, 1, 8, 8), "target": None, **kwargs}
    x = torch.rand(2, 3, 8, 8)
    with pytest.raises(error, match=match):
        hv.deletion(model, x, args.pop("attributions"), args.pop("target"), **args)


def test_blur_baseline_needs_images_larger_than_half_the_kernel() -> None:
    with pytest.raises(ValueError, match=r"baseline='blur' needs images larger than 5 pixels per side, got 4x4"):
        hv.insertion(weighted_model(), torch.ones(1, 1, 4, 4), torch.rand(1, 1, 4, 4), 0)


def test_deletion_with_a_callable_target_on_a_segmentation_model() -> None:
    x = torch.rand(2, 3, 4, 4)
    a = torch.rand(2, 1, 4, 4)
    auc = hv.deletion(SegModel(), x, a, lambda out: out[:, 1].mean((1, 2)), steps=16)
    # deleting to zeros: the mean of channel 1 falls by x / 16 per pixel, in rank order
    order = torch.from_numpy(np.argsort(-a.flatten(1).numpy(), axis=1, kind="stable"))
    vals = x[:, 1].flatten(1).gather(1, order) / 16
    curve = torch.cat([torch.zeros(2, 1), vals.cumsum(1)], 1)
    curve = vals.sum(1, keepdim=True) - curve
    torch.testing.assert_close(auc, torch.trapezoid(curve, dim=1) / 16)


# -- spearman and the sanity check -----------------------------------------------------------------------------------


def test_spearman_by_hand_with_ties() -> None:
    # ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    got = M.spearman(torch.tensor([[1.0, 2.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    assert got.item() == pytest.approx(3 / math.sqrt(10), abs=1e-6)
    assert math.isnan(M.spearman(torch.ones(1, 4), torch.rand(1, 4)).item())


def test_spearman_matches_scipy() -> None:
    stats = require("scipy.stats")
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (6, 30), generator=g).float()
    b = torch.randint(0, 7, (6, 30), generator=g).float()
    want = [stats.spearmanr(a[i].numpy(), b[i].numpy())[0] for i in range(6)]
    torch.testing.assert_close(M.spearman(a, b).double(), torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)


def quantus_mprt(model, x, y, order, method_cls):
    quantus = require("quantus")

    def explain(model, inputs, targets, **kwargs):
        attr = method_cls(model).attribute(torch.as_tensor(inputs), torch.as_tensor(targets))
        return attr.sum(1, keepdim=True).detach().numpy()

    metric = quantus.MPRT(layer_order=order, abs=True, normalise=False, disable_warnings=True)
    return metric(model=model, x_batch=x.numpy(), y_batch=y.numpy(), explain_func=explain)


@pytest.mark.parametrize(("order", "quantus_order"), [("cascade", "top_down"), ("independent", "independent")])
@pytest.mark.parametrize("method_cls", [hv.Saliency, hv.InputXGradient])
def test_sanity_check_agrees_with_quantus_mprt(order, quantus_order, method_cls) -> None:
    model = tiny_cnn()
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    y = torch.tensor([0, 1, 2, 1])
    want = quantus_mprt(model, x, y, quantus_order, method_cls)
    report = hv.sanity_check(method_cls(model), x, y, order=order)
    assert report.layers == ["5", "2", "0"]  # reverse named_modules() order (Quantus: only for "top_down")
    assert report.correlation.shape == (3, 4)
    for name, row in zip(report.layers, report.correlation, strict=True):
        torch.testing.assert_close(row.double(), torch.tensor(want[name], dtype=torch.float64), atol=1e-5, rtol=0)


def test_sanity_check_cams_at_layer_resolution_and_fixed_targets() -> None:
    model = tiny_cnn()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    method = hv.GradCAM(model, layer=model[2])
    report = hv.sanity_check(method, x, order="cascade", seed=7)
    # by hand: randomise a copy the same way and correlate the CAMs with the targets of the original model
    top = model(x).argmax(1)
    ref = method.attribute(x, top).abs().flatten(1)
    twin = copy.deepcopy(model)
    state = torch.get_rng_state()
    rows = []
    for m in [twin[5], twin[2], twin[0]]:
        torch.manual_seed(8)
        m.reset_parameters()
        rows.append(M.spearman(ref, hv.GradCAM(twin, layer=twin[2]).attribute(x, top).abs().flatten(1)))
    torch.set_rng_state(state)
    torch.testing.assert_close(report.correlation, torch.stack(rows))
    assert report.mean.shape == (3,) and report.final.shape == (3,)


def test_sanity_check_leaves_model_and_global_rng_unchanged() -> None:
    model = tiny_cnn()
    model[0].weight.requires_grad_(False)
    before = copy.deepcopy(model.state_dict())
    x = torch.rand(2, 3, 8, 8)
    rng = torch.get_rng_state()
    for method in (hv.Saliency(model), hv.SmoothGrad(hv.Saliency(model), n=3)):  # SmoothGrad draws global noise
        hv.sanity_check(method, x, 0)
        hv.sanity_check(method, x, 0, order="independent")
        assert method.model is model
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not model[0].weight.requires_grad and model[2].weight.requires_grad and not model.training


def test_keyboard_interrupt_inside_the_metrics_restores_model_and_rng() -> None:
    model = tiny_cnn().train()
    before = copy.deepcopy(model.state_dict())
    calls = []

    def boom(module, args, out):  # copied along with the model by deepcopy: fires in the randomised copy too
        calls.append(module)
        if len(calls) == 2:
            raise KeyboardInterrupt

    handle = model[0].register_forward_hook(boom)
    x = torch.rand(2, 3, 8, 8)
    rng = torch.get_rng_state()
    try:
        with pytest.raises(KeyboardInterrupt):
            hv.sanity_check(hv.Saliency(model), x, 0)
        assert calls[1] is not model[0]  # it was the copy's forward that was interrupted
        assert torch.equal(torch.get_rng_state(), rng)
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            hv.deletion(model, x, torch.rand(2, 1, 8, 8), 0, steps=2)
    finally:
        handle.remove()
    assert all(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_sanity_check_bad_input() -> None:
    class NoReset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean((2, 3)) * self.w

    x = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match=r"model \(NoReset\) has no module with reset_parameters"):
        hv.sanity_check(hv.Saliency(NoReset()), x)
    with pytest.raises(ValueError, match="order must be 'cascade' or 'independent', got 'top_down'"):
        hv.sanity_check(hv.Saliency(tiny_cnn(size=4)), x, order="top_down")
    with pytest.raises(TypeError, match="method must be an Attribution instance"):
        hv.sanity_check(tiny_cnn(size=4), x)
    with pytest.raises(ValueError, match=r"one class per input for sanity_check, got an \(N, K\)"):
        hv.sanity_check(hv.Saliency(tiny_cnn(size=4)), x, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="target class 3 is out of range"):
        hv.sanity_check(hv.Saliency(tiny_cnn(size=4)), x, 3)


def test_sanity_report_plot_and_html() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    model = tiny_cnn()
    x = torch.rand(2, 3, 8, 8)
    r1 = hv.sanity_check(hv.Saliency(model), x, 0)
    r2 = hv.sanity_check(hv.GradCAM(model), x, 0)
    fig = hv.SanityReport.plot_many([r1, r2])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["original", "5", "2", "0"]
    assert [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")] == [
        "Saliency",
        "GradCAM",
    ]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [1.0, *r1.mean.tolist()])
    html = r1._repr_html_()
    assert "Saliency" in html and html.count("<tr>") == 4
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.filterwarnings("ignore:IntegratedGradients. attributions")
@pytest.mark.parametrize("name", ON_CNNS)  # the attention methods: test_attention_rollout.py
def test_every_registered_method_survives_deepcopy(name: str) -> None:
    model = tiny_cnn()
    x = torch.rand(2, 3, 8, 8)
    method = cheap_method(name, model)  # SmoothGrad / VarGrad: a seeded generator, deep-copied with its state
    twin = copy.deepcopy(method)
    assert twin.model is not model
    assert all(p is not q for p, q in zip(twin.model.parameters(), model.parameters(), strict=True))
    torch.testing.assert_close(twin.attribute(x, 1), method.attribute(x, 1))
    layer = getattr(twin, "_layer", None)
    if layer is not None:  # a CAM layer chosen on the first call is the copy's module
        assert layer[1] is twin.model.get_submodule(layer[0])


def test_deepcopy_maps_a_cam_layer_given_as_a_module_to_the_copy() -> None:
    model = tiny_cnn()
    twin = copy.deepcopy(hv.GuidedGradCAM(model, layer=model[2]))
    assert twin._layer[1] is twin.model[2] and twin._guided.model is twin.model


# -- evaluate --------------------------------------------------------------------------------------------------------


@dataclass
class FakeShapes:
    """The interface of hookviz.zoo.Shapes that evaluate uses."""

    images: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor


def fake_shapes(n: int = 4, size: int = 12) -> FakeShapes:
    g = torch.Generator().manual_seed(3)
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    for i in range(n):
        masks[i, i : i + 5, 2 : 2 + 5] = True
    return FakeShapes(torch.rand(n, 3, size, size, generator=g), torch.arange(n) % 3, masks)


def test_evaluate_table_matches_the_metric_functions() -> None:
    model = tiny_cnn(size=12)
    data = fake_shapes()
    cam = hv.GradCAM(model)
    ev = hv.evaluate(["saliency", cam], model, data, steps=4, sanity_n=2, progress=False)
    assert ev.methods == ["saliency", "gradcam"]
    assert ev.metrics == ["pointing game", "energy in mask", "deletion AUC", "insertion AUC", "sanity ρ"]
    assert ev.table.shape == (2, 5)
    a = cam.attribute(data.images, data.labels)
    assert ev.value("gradcam", "pointing game") == pytest.approx(hv.pointing_game(a, data.masks).nanmean().item())
    assert ev.value("gradcam", "energy in mask") == pytest.approx(hv.energy_in_mask(a, data.masks).nanmean().item())
    d = hv.deletion(model, data.images, a, data.labels, steps=4)
    i = hv.insertion(model, data.images, a, data.labels, steps=4)
    assert ev.value("gradcam", "deletion AUC") == pytest.approx(d.mean().item())
    assert ev.value("gradcam", "insertion AUC") == pytest.approx(i.mean().item())
    s = hv.sanity_check(cam, data.images[:2], data.labels[:2]).final
    assert ev.value("gradcam", "sanity ρ") == pytest.approx(s.nanmean().item())
    md = ev.to_markdown().splitlines()
    assert md[0] == "| method | pointing game ↑ | energy in mask ↑ | deletion AUC ↓ | insertion AUC ↑ | sanity ρ ↓ |"
    assert md[3].startswith("| gradcam | ") and len(md) == 4
    assert "<table" in ev._repr_html_() and "saliency" in ev._repr_html_()


def test_evaluate_predicted_targets_and_no_sanity_column() -> None:
    model = tiny_cnn(size=12)
    data = fake_shapes()
    ev = hv.evaluate("saliency", model, data, target="predicted", steps=2, sanity_n=0, progress=False)
    assert ev.metrics == ["pointing game", "energy in mask", "deletion AUC", "insertion AUC"]
    a = hv.Saliency(model).attribute(data.images)  # the top class
    d = hv.deletion(model, data.images, a, steps=2)
    assert ev.value("saliency", "deletion AUC") == pytest.approx(d.mean().item())
    assert ev.maps is None  # kept only when asked
    kept = hv.evaluate("saliency", model, data, target="predicted", steps=2, sanity_n=0, progress=False, keep_maps=True)
    assert kept.maps is not None and list(kept.maps) == ["saliency"] and torch.equal(kept.maps["saliency"], a)
    assert torch.equal(kept.table, ev.table)
    with pytest.raises(TypeError, match="keep_maps must be True or False, got 1"):
        hv.evaluate("saliency", model, data, keep_maps=1, progress=False)


def test_evaluate_bad_input() -> None:
    model = tiny_cnn(size=12)
    data = fake_shapes()
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        hv.evaluate(["nope"], model, data)
    with pytest.raises(ValueError, match="explains another model"):
        hv.evaluate([hv.Saliency(tiny_cnn(size=12))], model, data)
    with pytest.raises(TypeError, match="it lacks 'masks'"):
        hv.evaluate(["saliency"], model, type("NoMasks", (), {"images": data.images, "labels": data.labels})())
    with pytest.raises(ValueError, match="target must be 'label' or 'predicted'"):
        hv.evaluate(["saliency"], model, data, target="top")
    bad = FakeShapes(data.images, data.labels + 5, data.masks)
    with pytest.raises(ValueError, match=r"data.labels must be classes of the model, 0..2"):
        hv.evaluate(["saliency"], model, bad)
    with pytest.raises(ValueError, match="data.masks hold 3 masks"):
        hv.evaluate(["saliency"], model, FakeShapes(data.images, data.labels, data.masks[:3]))
    with pytest.raises(ValueError, match="sanity_n must be >= 0"):
        hv.evaluate(["saliency"], model, data, sanity_n=-1)
