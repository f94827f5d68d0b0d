"""hookviz.display: normalization modes, channel reductions, colour maps, resize, overlay, pixel conversions."""

from __future__ import annotations

import math
import warnings

import matplotlib
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hookviz import display
from hookviz.display import (
    DEFAULT_PERCENTILE,
    NORMALIZATIONS,
    REDUCTIONS,
    SCALES,
    SIGNS,
    EmptyMapWarning,
    apply_sign,
    colormap,
    magnitude,
    normalize,
    normalize_bounds,
    overlay,
    reduce_channels,
    resize,
    to_pil,
    to_uint8,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _row(*values: float) -> torch.Tensor:
    """One sample, one channel, one row of pixels: (1, 1, 1, W)."""
    return torch.tensor(values, dtype=torch.float32).view(1, 1, 1, -1)


# ---------------------------------------------------------------------------- normalize: hand-computed values


def test_minmax_hand_values():
    out = normalize(_row(1.0, 2.0, 3.0), "minmax")
    torch.testing.assert_close(out, _row(0.0, 0.5, 1.0))


def test_seed_hand_values():
    # population std of [1, 2, 3] is sqrt(2/3); z-scores are -sqrt(1.5), 0, sqrt(1.5)
    out = normalize(_row(1.0, 2.0, 3.0), "seed")
    z = 0.1 * math.sqrt(1.5)
    torch.testing.assert_close(out, _row(0.5 - z, 0.5, 0.5 + z))


def test_seed_clips_outliers():
    # 99 zeros and one 100: mean 1, std sqrt(99); the outlier's z-score is ~9.95 -> 1.49 before clipping
    x = torch.zeros(1, 1, 10, 10)
    x[0, 0, 0, 0] = 100.0
    out = normalize(x, "seed")
    assert out[0, 0, 0, 0] == 1.0
    torch.testing.assert_close(out[0, 0, 5, 5], torch.tensor(0.5 - 0.1 / math.sqrt(99)))


def test_absmax_hand_values():
    out = normalize(_row(-2.0, 0.0, 1.0), "absmax")
    torch.testing.assert_close(out, _row(0.0, 0.5, 0.75))


def test_percentile_hand_values():
    # p=100: q = max|a| = 2, so the map is a / 2 mapped to [0, 1]
    torch.testing.assert_close(normalize(_row(-2.0, 0.0, 1.0), "percentile", percentile=100.0), _row(0.0, 0.5, 0.75))
    # p=50 of |[1, 2, 3, 4]| is 2.5 (linear interpolation): [0.4, 0.8, 1.2, 1.6] -> clip to 1 -> * 0.5 + 0.5
    out = normalize(_row(1.0, 2.0, 3.0, 4.0), "percentile", percentile=50.0)
    torch.testing.assert_close(out, _row(0.7, 0.9, 1.0, 1.0))
    # p=99 of |[1, 2, 3]|: 2 + 0.98 * (3 - 2) = 2.98; 3 / 2.98 > 1 is clipped
    out = normalize(_row(1.0, 2.0, 3.0), "percentile")
    torch.testing.assert_close(out, _row(1 / 2.98 * 0.5 + 0.5, 2 / 2.98 * 0.5 + 0.5, 1.0))


def test_statistics_span_channels_and_pixels():
    # one sample of shape (2, 1, 2): min 0 and max 4 are in different channels
    x = torch.tensor([[[[0.0, 1.0]], [[3.0, 4.0]]]])
    torch.testing.assert_close(normalize(x, "minmax"), x / 4.0)


@pytest.mark.parametrize("mode", NORMALIZATIONS)
def test_per_sample_independence(mode):
    a = torch.randn(1, 3, 5, 5, generator=_gen(1))
    # absmax and percentile keep 0 at 0.5 on purpose, so only the other modes are shift invariant
    shift = 7.0 if mode in ("seed", "minmax") else 0.0
    x = torch.cat([a, 1000.0 * a + shift])
    out = normalize(x, mode)
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[:1], normalize(a, mode))


def test_every_mode_sign_and_scale_is_tested():
    assert NORMALIZATIONS == ("seed", "minmax", "absmax", "percentile", "mass")
    assert SIGNS == ("all", "positive", "negative", "absolute")
    assert SCALES == ("sample", "shared")
    assert DEFAULT_PERCENTILE == {"percentile": 99.0, "mass": 98.0}  # mass 98 = captum's outlier_perc=2


@pytest.mark.parametrize("mode", NORMALIZATIONS)
@pytest.mark.parametrize("sign", SIGNS)
@pytest.mark.parametrize("value", [0.0, 3.5, -2.0, 1e-12, 0.1])
def test_constant_map_gives_constant_image(mode, sign, value):
    x = torch.full((2, 3, 4, 4), value)
    for scale in SCALES:
        with pytest.warns(EmptyMapWarning, match=r"empty attribution map: sample\(s\) \[0, 1\] of 2 are "):
            out = normalize(x, mode, sign=sign, scale=scale)
        assert torch.isfinite(out).all()
        assert (out == out.flatten()[0]).all()
        assert ((out >= 0) & (out <= 1)).all()


@pytest.mark.parametrize("mode", NORMALIZATIONS)
@pytest.mark.parametrize("sign", SIGNS)
def test_all_zero_map(mode, sign):
    # signed data keeps 0 at 0.5 in the symmetric modes; non-negative data (every other sign) starts at 0
    expected = {"seed": 0.5, "minmax": 0.0}.get(mode, 0.5 if sign == "all" else 0.0)
    with pytest.warns(EmptyMapWarning, match=r"sample\(s\) \[0, 1\] of 2 are all zero( after sign='\w+')?, so"):
        out = normalize(torch.zeros(2, 1, 3, 3), mode, sign=sign)
    assert (out == expected).all()


def test_empty_map_warning_names_the_samples():
    x = torch.randn(3, 1, 4, 4, generator=_gen(20))
    x[1] = 0.0
    x[2] = -x[2].abs()  # no positive value: empty after sign="positive"
    with pytest.warns(EmptyMapWarning, match=r"sample\(s\) \[1\] of 3 are all zero, so") as record:
        out = normalize(x, "minmax")
    assert len(record) == 1 and record[0].filename == __file__  # points at the caller, not at hookviz
    assert (out[1] == 0).all() and torch.isfinite(out).all()
    with pytest.warns(EmptyMapWarning, match=r"sample\(s\) \[1, 2\] of 3 are all zero after sign='positive'"):
        normalize(x, "mass", sign="positive")
    # (N, K) maps are named by (n, k); a constant non-zero map is "constant"
    y = torch.randn(2, 2, 1, 3, 3, generator=_gen(21))
    y[1, 0] = 4.0
    with pytest.warns(EmptyMapWarning, match=r"sample\(s\) \[\(1, 0\)\] of 4 are constant, so"):
        normalize(y, "absmax", sample_dims=2)
    with pytest.warns(EmptyMapWarning, match="empty attribution map: the map is all zero"):
        normalize(torch.zeros(1, 2, 2), sample_dims=0)
    assert issubclass(EmptyMapWarning, UserWarning)


@pytest.mark.parametrize("mode", NORMALIZATIONS)
def test_no_warning_for_informative_maps(mode):
    x = torch.randn(2, 3, 5, 5, generator=_gen(22))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for sign in SIGNS:
            for scale in SCALES:
                normalize(x, mode, sign=sign, scale=scale)


@pytest.mark.parametrize("mode", NORMALIZATIONS)
@pytest.mark.parametrize("sign", SIGNS)
def test_nan_and_inf_still_raise(mode, sign):
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.zeros(2, 1, 3, 3)
        x[1, 0, 1, 1] = bad
        with pytest.raises(ValueError, match=r"attr contains 1 non-finite value\(s\) \(NaN or Inf\) out of 18"):
            normalize(x, mode, sign=sign, scale="shared")


@pytest.mark.parametrize("mode", NORMALIZATIONS)
@pytest.mark.parametrize("sign", SIGNS)
def test_normalize_bounds_are_what_normalize_maps_to_0_and_1(mode, sign):
    x = torch.randn(2, 2, 3, 5, 5, generator=_gen(28), dtype=torch.float64) * torch.tensor([1.0, 30.0]).view(
        2, 1, 1, 1, 1
    )
    for scale, shape in (("sample", (2, 2, 1, 1, 1)), ("shared", (1, 1, 1, 1, 1))):
        kw = {"sample_dims": 2, "sign": sign, "scale": scale}
        lo, hi = normalize_bounds(x, mode, **kw)
        assert lo.shape == hi.shape == shape and (hi > lo).all()
        expected = ((apply_sign(x, sign) - lo) / (hi - lo)).clamp(0, 1)
        torch.testing.assert_close(normalize(x, mode, **kw), expected)


def test_normalize_bounds_hand_values():
    x = _two_scales()  # [0, 1, 2] and [0, 10, 20]
    lo, hi = normalize_bounds(x, "minmax", eps=1e-3)
    assert lo.flatten().tolist() == [0.0, 0.0] and torch.allclose(hi.flatten(), torch.tensor([2.001, 20.001]))
    lo, hi = normalize_bounds(x, "mass", percentile=30.0, scale="shared")
    assert (lo.item(), hi.item()) == (-10.0, 10.0)
    lo, hi = normalize_bounds(-x, "mass", percentile=30.0, sign="negative")
    assert lo.flatten().tolist() == [0.0, 0.0] and hi.flatten().tolist() == [1.0, 10.0]
    assert normalize_bounds(torch.zeros(1, 1, 2, 2), "mass")[1].item() == 1.0  # all zero: any divisor gives 0
    with pytest.raises(ValueError, match=r"attr is empty \(0 elements\)"):
        normalize_bounds(torch.zeros(0, 1, 2, 2))
    with pytest.raises(ValueError, match="sign must be one of"):
        normalize_bounds(x, sign="pos")


# ---------------------------------------------------------------------------- mass (captum's outlier_perc)


def test_mass_hand_values():
    # |a| = [1, 2, 3, 4], total 10, running sums [1, 3, 6, 10]
    x = _row(1.0, 2.0, 3.0, 4.0)
    # 98% of 10 = 9.8 is first reached at the 4th value: t = 4, nothing is clipped
    torch.testing.assert_close(normalize(x, "mass", sign="absolute"), _row(0.25, 0.5, 0.75, 1.0))
    # 50% of 10 = 5 is first reached at the 3rd value (running sum 6): t = 3, so 4 saturates
    torch.testing.assert_close(normalize(x, "mass", percentile=50.0, sign="absolute"), _row(1 / 3, 2 / 3, 1.0, 1.0))
    # signed data: a / t clipped to [-1, 1], then 0 -> 0.5
    out = normalize(_row(-4.0, 1.0, 0.0, 3.0, 2.0), "mass", percentile=50.0)
    torch.testing.assert_close(out, _row(0.0, 0.5 + 0.5 / 3, 0.5, 1.0, 0.5 + 1 / 3))
    # exactly reaching the target counts (captum's >=): 60% of 10 = 6 is reached at the 3rd value
    torch.testing.assert_close(normalize(x, "mass", percentile=60.0, sign="absolute"), _row(1 / 3, 2 / 3, 1.0, 1.0))


def _captum_sign(sign: str) -> str:
    return "absolute_value" if sign == "absolute" else sign


@pytest.mark.parametrize("sign", SIGNS)
@pytest.mark.parametrize("outlier_perc", [2, 0.5, 10, 50])
def test_mass_matches_captum(sign, outlier_perc):
    from captum.attr._utils.visualization import _normalize_attr

    # heavy tails, as real attributions have; captum's visualize_image_attr sums the channels, then normalizes
    x = torch.randn(3, 3, 12, 10, generator=_gen(23), dtype=torch.float64) ** 3
    ours = normalize(reduce_channels(x, "sum"), "mass", percentile=100.0 - outlier_perc, sign=sign)[:, 0]
    if sign == "all":
        ours = ours * 2 - 1  # captum draws signed maps on [-1, 1]
    for i in range(len(x)):
        ref = _normalize_attr(x[i].sum(0).numpy(), _captum_sign(sign), outlier_perc)
        np.testing.assert_allclose(ours[i].numpy(), ref, rtol=0, atol=1e-12)


def test_mass_threshold_matches_captum_float32():
    from captum.attr._utils.visualization import _cumulative_sum_threshold

    x = torch.randn(4, 1, 16, 16, generator=_gen(24)).abs() ** 2
    flat = x.flatten(1)
    for p in (98.0, 90.0, 99.9, 100.0):
        ours = display._mass_threshold(flat, p)[:, 0]
        expected = [_cumulative_sum_threshold(row.numpy(), p) for row in flat]
        np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-6)


# ---------------------------------------------------------------------------- percentile (by count)


@pytest.mark.parametrize("p", [1.0, 50.0, 90.0, 99.0, 100.0])
def test_percentile_is_a_true_percentile(p):
    x = torch.randn(2, 1, 9, 11, generator=_gen(25), dtype=torch.float64)
    out = normalize(x, "percentile", percentile=p, sign="absolute")
    for i in range(2):
        q = np.percentile(x[i].abs().numpy(), p)  # numpy's default "linear" percentile
        np.testing.assert_allclose(out[i].numpy(), np.clip(x[i].abs().numpy() / (q + 1e-8), 0, 1), atol=1e-12)


# ---------------------------------------------------------------------------- sign


def test_apply_sign_hand_values():
    x = _row(-2.0, -1.0, 0.0, 1.0, 3.0)
    torch.testing.assert_close(apply_sign(x, "all"), x)
    torch.testing.assert_close(apply_sign(x, "positive"), _row(0.0, 0.0, 0.0, 1.0, 3.0))
    torch.testing.assert_close(apply_sign(x, "negative"), _row(2.0, 1.0, 0.0, 0.0, 0.0))
    torch.testing.assert_close(apply_sign(x, "absolute"), _row(2.0, 1.0, 0.0, 1.0, 3.0))
    assert apply_sign(torch.tensor([1, -2]), "negative").dtype == torch.get_default_dtype()
    with pytest.raises(
        ValueError, match=r"sign must be one of \('all', 'positive', 'negative', 'absolute'\), got '\+'"
    ):
        apply_sign(x, "+")


@pytest.mark.parametrize(
    ("sign", "expected"),
    [
        ("all", [1 / 6, 1 / 3, 0.5, 2 / 3, 1.0]),  # a / (2 * 3) + 0.5
        ("positive", [0.0, 0.0, 0.0, 1 / 3, 1.0]),  # max(a, 0) / 3
        ("negative", [1.0, 0.5, 0.0, 0.0, 0.0]),  # max(-a, 0) / 2
        ("absolute", [2 / 3, 1 / 3, 0.0, 1 / 3, 1.0]),  # |a| / 3
    ],
)
def test_sign_hand_values_absmax(sign, expected):
    torch.testing.assert_close(normalize(_row(-2.0, -1.0, 0.0, 1.0, 3.0), "absmax", sign=sign), _row(*expected))


@pytest.mark.parametrize("mode", NORMALIZATIONS)
@pytest.mark.parametrize("sign", SIGNS)
def test_sign_is_applied_before_normalization(mode, sign):
    x = torch.randn(2, 1, 6, 6, generator=_gen(26))
    out = normalize(x, mode, sign=sign)
    if sign == "all":
        torch.testing.assert_close(out, normalize(x, mode))
    else:
        # non-negative data: minmax on apply_sign(x); the symmetric modes map 0 to 0, not 0.5
        if mode == "minmax":
            torch.testing.assert_close(out, normalize(apply_sign(x, sign), mode))
        if mode in ("absmax", "percentile", "mass"):
            assert (out[apply_sign(x, sign) == 0] == 0).all()
            torch.testing.assert_close(out.flatten(1).amax(-1), torch.ones(2))
        # within a sample, the pixels the sign leaves out all get the same value
        if sign != "absolute":
            for i in range(2):
                dropped = out[i][x[i] <= 0] if sign == "positive" else out[i][x[i] >= 0]
                assert dropped.numel() > 0 and (dropped == dropped[0]).all()


# ---------------------------------------------------------------------------- scale: per sample or shared


def _two_scales() -> torch.Tensor:
    """Sample 0 is [0, 1, 2], sample 1 is ten times larger: [0, 10, 20]."""
    return torch.tensor([[0.0, 1.0, 2.0], [0.0, 10.0, 20.0]]).view(2, 1, 1, 3)


@pytest.mark.parametrize(
    ("mode", "kw", "sample", "shared"),
    [
        # per sample both maps span [0, 1]; shared, sample 0 uses a tenth of the range (statistics over all six)
        ("minmax", {}, [[0.0, 0.5, 1.0], [0.0, 0.5, 1.0]], [[0.0, 0.05, 0.1], [0.0, 0.5, 1.0]]),
        ("absmax", {}, [[0.5, 0.75, 1.0], [0.5, 0.75, 1.0]], [[0.5, 0.525, 0.55], [0.5, 0.75, 1.0]]),
        ("absmax", {"sign": "positive"}, [[0.0, 0.5, 1.0], [0.0, 0.5, 1.0]], [[0.0, 0.05, 0.1], [0.0, 0.5, 1.0]]),
        # p=100: q = max|a|, 2 per sample, 20 shared
        ("percentile", {"percentile": 100.0}, [[0.5, 0.75, 1.0]] * 2, [[0.5, 0.525, 0.55], [0.5, 0.75, 1.0]]),
        # shared |a| sorted [0, 0, 1, 2, 10, 20], running sums [0, 0, 1, 3, 13, 33]; 30% of 33 = 9.9 -> t = 10;
        # per sample: 30% of 3 = 0.9 -> t = 1, 30% of 30 = 9 -> t = 10
        ("mass", {"percentile": 30.0}, [[0.5, 1.0, 1.0]] * 2, [[0.5, 0.55, 0.6], [0.5, 1.0, 1.0]]),
    ],
)
def test_scale_sample_vs_shared_hand_values(mode, kw, sample, shared):
    x = _two_scales()
    torch.testing.assert_close(normalize(x, mode, scale="sample", **kw), torch.tensor(sample).view(2, 1, 1, 3))
    torch.testing.assert_close(normalize(x, mode, scale="shared", **kw), torch.tensor(shared).view(2, 1, 1, 3))


def test_scale_shared_seed_hand_values():
    # all six values: mean 33 / 6 = 5.5, population variance (0 + 1 + 4 + 0 + 100 + 400) / 6 - 5.5^2
    x = _two_scales()
    std = math.sqrt(505 / 6 - 5.5**2)
    expected = ((x - 5.5) / std * 0.1 + 0.5).clamp(0, 1)
    torch.testing.assert_close(normalize(x, "seed", scale="shared"), expected)
    # per sample the two are the same picture: z-scores do not depend on the scale
    out = normalize(x, "seed")
    torch.testing.assert_close(out[0], out[1])


@pytest.mark.parametrize("mode", NORMALIZATIONS)
def test_scale_shared_is_one_statistic_over_the_batch(mode):
    x = torch.randn(2, 3, 2, 5, 5, generator=_gen(27)) * torch.tensor([1.0, 100.0]).view(2, 1, 1, 1, 1)
    for sample_dims in (1, 2):
        out = normalize(x, mode, sample_dims=sample_dims, scale="shared")
        torch.testing.assert_close(out, normalize(x, mode, sample_dims=0))
    # a sample's shared picture depends on the other samples, its per-sample picture does not
    assert not torch.allclose(normalize(x, mode, scale="shared")[:1], normalize(x[:1], mode, scale="shared"))
    torch.testing.assert_close(normalize(x, mode)[:1], normalize(x[:1], mode))


@pytest.mark.parametrize("mode", NORMALIZATIONS)
def test_range_and_dtype(mode):
    x = torch.randn(3, 3, 7, 7, generator=_gen(2)) * torch.tensor([1e-6, 1.0, 1e6]).view(3, 1, 1, 1)
    out = normalize(x, mode)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert ((out >= 0) & (out <= 1)).all()
    assert normalize(x.double(), mode).dtype == torch.float64
    assert normalize(torch.arange(8).view(1, 2, 2, 2), mode).dtype == torch.get_default_dtype()


@pytest.mark.parametrize("mode", NORMALIZATIONS)
def test_sample_dims_two(mode):
    # (N, K, C, H, W): every (n, k) map is normalized on its own
    scale = torch.tensor([1.0, 10.0, 100.0, 0.5, 5.0, 50.0]).view(2, 3, 1, 1, 1)
    x = torch.randn(2, 3, 3, 4, 4, generator=_gen(3)) * scale
    out = normalize(x, mode, sample_dims=2)
    expected = normalize(x.flatten(0, 1), mode).view_as(x)
    torch.testing.assert_close(out, expected)
    # sample_dims=1 would share statistics across the K maps of a sample: the small map would be squashed
    assert not torch.allclose(normalize(x, mode, sample_dims=1), out)


def test_sample_dims_zero_uses_whole_tensor():
    x = torch.tensor([[[[1.0]]], [[[3.0]]]])
    torch.testing.assert_close(normalize(x, "minmax", sample_dims=0), torch.tensor([[[[0.0]]], [[[1.0]]]]))


def test_eps_is_explicit():
    # a tiny but non-constant range is dominated by a large eps
    out = normalize(_row(0.0, 1e-3), "minmax", eps=1.0)
    torch.testing.assert_close(out, _row(0.0, 1e-3 / (1e-3 + 1.0)))


@pytest.mark.parametrize("p", [1.0, 37.5, 50.0, 99.0, 100.0])
def test_percentile_kthvalue_path_matches_quantile(monkeypatch, p):
    x = torch.randn(3, 2, 5, 7, generator=_gen(4))
    expected = normalize(x, "percentile", percentile=p)
    monkeypatch.setattr(display, "_QUANTILE_MAX_NUMEL", 10)  # force the large-tensor path
    torch.testing.assert_close(normalize(x, "percentile", percentile=p), expected)


def test_normalize_errors():
    x = torch.rand(2, 1, 3, 3, generator=_gen(5))
    with pytest.raises(
        ValueError, match=r"mode must be one of \('seed', 'minmax', 'absmax', 'percentile', 'mass'\), got 'z'"
    ):
        normalize(x, "z")
    with pytest.raises(
        ValueError, match=r"sign must be one of \('all', 'positive', 'negative', 'absolute'\), got 'pos'"
    ):
        normalize(x, sign="pos")
    with pytest.raises(ValueError, match=r"scale must be one of \('sample', 'shared'\), got 'batch'"):
        normalize(x, scale="batch")
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    bad[1, 0, 1, 1] = float("inf")
    with pytest.raises(ValueError, match=r"attr contains 2 non-finite value\(s\)"):
        normalize(bad, "minmax")
    for mode in ("percentile", "mass"):
        for p in (0.0, -5.0, 100.5, True, "99"):
            with pytest.raises(ValueError, match=r"percentile must be a number in \(0, 100\]"):
                normalize(x, mode, percentile=p)
    with pytest.raises(ValueError, match=r"sample_dims must be an int in \[0, attr.ndim\) = \[0, 4\)"):
        normalize(x, sample_dims=4)
    with pytest.raises(ValueError, match="eps must be a positive number, got 0"):
        normalize(x, eps=0)
    with pytest.raises(TypeError, match="attr must be a torch.Tensor, got ndarray"):
        normalize(np.zeros((1, 1, 2, 2)))


# ---------------------------------------------------------------------------- reduce_channels


def _channels() -> torch.Tensor:
    # (1, 3, 1, 2): pixel 0 has channels [1, -2, 2], pixel 1 has [0, 3, -4]
    return torch.tensor([[1.0, 0.0], [-2.0, 3.0], [2.0, -4.0]]).view(1, 3, 1, 2)


@pytest.mark.parametrize(
    ("how", "expected"),
    [("sum", [1.0, -1.0]), ("abs-sum", [5.0, 7.0]), ("max-abs", [2.0, 4.0]), ("l2", [3.0, 5.0])],
)
def test_reductions_hand_values(how, expected):
    out = reduce_channels(_channels(), how)
    torch.testing.assert_close(out, torch.tensor(expected).view(1, 1, 1, 2))


def test_every_reduction_is_tested():
    assert set(REDUCTIONS) == {"sum", "abs-sum", "max-abs", "l2"}


def test_reduce_none_and_leading_dims():
    x = torch.randn(2, 4, 3, 5, 5, generator=_gen(6))
    assert reduce_channels(x, None) is x
    for how in REDUCTIONS:
        assert reduce_channels(x, how).shape == (2, 4, 1, 5, 5)


def test_reduce_errors():
    with pytest.raises(
        ValueError, match=r"reduce must be one of \('sum', 'abs-sum', 'max-abs', 'l2'\) or None, got 'mean'"
    ):
        reduce_channels(_channels(), "mean")
    with pytest.raises(ValueError, match=r"attr must have shape \(\.\.\., C, H, W\).*got shape \(3, 4\)"):
        reduce_channels(torch.zeros(3, 4), "sum")


# ---------------------------------------------------------------------------- colormap


@pytest.mark.parametrize("name", ["jet", "viridis", "gray", "RdBu_r"])
def test_colormap_matches_matplotlib(name):
    values = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.77, 0.999, 1.0])
    out = colormap(values.view(1, 1, 1, -1), name)  # (1, 3, 1, 7)
    expected = matplotlib.colormaps[name](values.numpy())[:, :3]  # (7, 3)
    np.testing.assert_allclose(out[0, :, 0].T.numpy(), expected, atol=1 / 255)


def test_colormap_shape_range_and_clipping():
    x = torch.rand(2, 4, 1, 5, 6, generator=_gen(7))
    out = colormap(x)
    assert out.shape == (2, 4, 3, 5, 6) and out.dtype == torch.float32
    assert ((out >= 0) & (out <= 1)).all()
    clipped = colormap(torch.tensor([-1.0, 0.0, 1.0, 2.0]).view(1, 1, 4))
    torch.testing.assert_close(clipped[:, :, 0], clipped[:, :, 1])
    torch.testing.assert_close(clipped[:, :, 2], clipped[:, :, 3])


def test_colormap_lut_is_cached():
    display._lut.cache_clear()
    colormap(torch.rand(1, 1, 2, 2, generator=_gen(8)), "magma")
    colormap(torch.rand(3, 1, 4, 4, generator=_gen(9)), "magma")
    info = display._lut.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert display._lut("magma", torch.device("cpu")) is display._lut("magma", torch.device("cpu"))


def test_colormap_errors():
    with pytest.raises(ValueError, match=r"cmap 'viridsi' is not a matplotlib colour map; did you mean 'viridis'"):
        colormap(torch.zeros(1, 2, 2), "viridsi")
    with pytest.raises(ValueError, match=r"x must have 1 channel\(s\) at dim -3.*got shape \(3, 2, 2\)"):
        colormap(torch.zeros(3, 2, 2))
    with pytest.raises(TypeError, match="cmap must be the name of a matplotlib colour map"):
        colormap(torch.zeros(1, 2, 2), 3)


# ---------------------------------------------------------------------------- resize and overlay


def test_resize_shapes_and_values():
    x = torch.rand(2, 3, 1, 4, 4, generator=_gen(10))
    out = resize(x, (8, 6))
    assert out.shape == (2, 3, 1, 8, 6)
    expected = F.interpolate(x.flatten(0, 1), size=(8, 6), mode="bilinear", align_corners=False).view(2, 3, 1, 8, 6)
    torch.testing.assert_close(out, expected)
    assert resize(torch.rand(3, 5, 5, generator=_gen(11)), (10, 10)).shape == (3, 10, 10)
    torch.testing.assert_close(resize(torch.full((1, 1, 2, 2), 0.3), (7, 9)), torch.full((1, 1, 7, 9), 0.3))
    with pytest.raises(ValueError, match=r"size must be a pair of positive ints \(H, W\), got \(8, 0\)"):
        resize(x, (8, 0))


def test_overlay_formula():
    image = torch.rand(2, 3, 8, 8, generator=_gen(12))
    heat = torch.rand(2, 1, 4, 4, generator=_gen(13))
    alpha = 0.3
    expected = (1 - alpha) * image + alpha * colormap(resize(heat, (8, 8)), "viridis")
    torch.testing.assert_close(overlay(image, heat, alpha=alpha, cmap="viridis"), expected)
    torch.testing.assert_close(overlay(image, heat, alpha=0.0), image)


def test_overlay_alpha_by_map_formula():
    image = torch.rand(2, 3, 8, 8, generator=_gen(30))
    heat = torch.rand(2, 1, 8, 8, generator=_gen(31))
    heat[0, 0, :2] = 0.0
    heat[1, 0, :2] = 1.0
    alpha = 0.6
    w = alpha * heat  # per-pixel opacity
    expected = (1 - w) * image + w * colormap(heat, "magma")
    out = overlay(image, heat, alpha, "magma", alpha_by_map=True)
    torch.testing.assert_close(out, expected)
    # zero attribution: fully transparent; full attribution: the plain alpha blend
    torch.testing.assert_close(out[0, :, :2], image[0, :, :2])
    torch.testing.assert_close(out[1, :, :2], overlay(image, heat, alpha=alpha, cmap="magma")[1, :, :2])
    # a low-resolution map is upsampled first, and the opacity comes from the upsampled map
    small = torch.rand(2, 1, 4, 4, generator=_gen(32))
    big = resize(small, (8, 8))
    expected = (1 - alpha * big) * image + alpha * big * colormap(big)
    torch.testing.assert_close(overlay(image, small, alpha=alpha, alpha_by_map=True), expected)
    with pytest.raises(TypeError, match="alpha_by_map must be a bool, got str"):
        overlay(image, heat, alpha_by_map="yes")


def test_overlay_weight_and_magnitude():
    image = torch.rand(2, 3, 8, 8, generator=_gen(40))
    heat = torch.full((2, 1, 8, 8), 0.5)  # a signed map's 0, drawn at the middle of the colour map
    attr = torch.randn(2, 1, 8, 8, generator=_gen(41))
    attr[..., :4] = 0
    w = magnitude(attr, "seed")  # seed places 0 near the mean: the opacity falls back to |a| over its 99th percentile
    q = torch.quantile(attr.abs().flatten(1), 0.99, dim=1).view(-1, 1, 1, 1)
    torch.testing.assert_close(w, (attr.abs() / (q + 1e-8)).clamp(0, 1))
    out = overlay(image, heat, 0.8, alpha_by_map=True, weight=w)
    torch.testing.assert_close(out[..., :4], image[..., :4], rtol=0, atol=0)  # transparent where the map is 0
    torch.testing.assert_close(out, (1 - 0.8 * w) * image + 0.8 * w * colormap(heat))
    # a mode whose scale starts at 0 keeps its own scale: absmax is |a| / max|a|
    m = attr.abs().flatten(1).amax(1).view(-1, 1, 1, 1)
    torch.testing.assert_close(magnitude(attr, "absmax"), attr.abs() / (m + 1e-8))
    torch.testing.assert_close(
        magnitude(attr, "absmax", sign="positive"), attr.clamp_min(0) / (attr.amax((1, 2, 3), keepdim=True) + 1e-8)
    )
    with pytest.raises(ValueError, match=r"weight must have the shape of heat \(2, 1, 8, 8\), got \(2, 1, 4, 4\)"):
        overlay(image, heat, alpha_by_map=True, weight=torch.zeros(2, 1, 4, 4))


def test_overlay_hand_values():
    # jet(1.0) is (0.5, 0, 0); over a white image with alpha 0.25: 0.75 + 0.25 * (0.5, 0, 0)
    out = overlay(torch.ones(1, 3, 4, 4), torch.ones(1, 1, 2, 2), alpha=0.25)
    torch.testing.assert_close(out[0, :, 0, 0], torch.tensor([0.875, 0.75, 0.75]), atol=1 / 255, rtol=0)


def test_overlay_broadcasts_over_targets():
    image = torch.rand(2, 1, 3, 8, 8, generator=_gen(14))
    heat = torch.rand(2, 3, 1, 4, 4, generator=_gen(15))
    assert overlay(image, heat).shape == (2, 3, 3, 8, 8)


def test_overlay_errors():
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\], got 1.5"):
        overlay(torch.rand(1, 3, 4, 4), torch.rand(1, 1, 4, 4), alpha=1.5)
    with pytest.raises(ValueError, match=r"image must have 3 channel\(s\)"):
        overlay(torch.rand(1, 1, 4, 4), torch.rand(1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"heat must have 1 channel\(s\)"):
        overlay(torch.rand(1, 3, 4, 4), torch.rand(1, 3, 4, 4))


# ---------------------------------------------------------------------------- pixels


def test_to_uint8_rounding_and_clamping():
    x = torch.tensor([0.0, 0.2, 0.49 / 255, 0.51 / 255, 1.0, 1.2, -0.1, 254.6 / 255])
    out = to_uint8(x)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert out.tolist() == [0, 51, 0, 1, 255, 255, 0, 255]
    u = torch.tensor([1, 2], dtype=torch.uint8)
    assert to_uint8(u) is u


def test_to_uint8_errors():
    with pytest.raises(ValueError, match=r"x contains 1 NaN value\(s\)"):
        to_uint8(torch.tensor([0.5, float("nan")]))
    with pytest.raises(TypeError, match="x must be a floating point tensor.*got dtype torch.int64"):
        to_uint8(torch.tensor([1, 2]))


def test_to_pil_modes_and_sizes():
    rgb = torch.rand(3, 4, 5, generator=_gen(16))
    img = to_pil(rgb)
    assert (img.mode, img.size) == ("RGB", (5, 4))
    assert np.array_equal(np.asarray(img), to_uint8(rgb).permute(1, 2, 0).numpy())
    grey = to_pil(torch.full((1, 4, 5), 0.5))
    assert (grey.mode, grey.size) == ("L", (5, 4))
    assert np.asarray(grey)[0, 0] == 128
    assert to_pil(torch.zeros(6, 7)).mode == "L"
    assert to_pil(torch.zeros(6, 7, requires_grad=True)).size == (7, 6)
    with pytest.raises(ValueError, match=r"x must have shape \(3, H, W\), \(1, H, W\) or \(H, W\), got \(2, 4, 5\)"):
        to_pil(torch.zeros(2, 4, 5))
