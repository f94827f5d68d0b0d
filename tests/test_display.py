"""hookviz.display: normalization modes, channel reductions, colour maps, resize, overlay, pixel conversions."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hookviz import display
from hookviz.display import (
    NORMALIZATIONS,
    REDUCTIONS,
    colormap,
    normalize,
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


@pytest.mark.parametrize("mode", NORMALIZATIONS)
@pytest.mark.parametrize("value", [0.0, 3.5, -2.0, 1e-12, 0.1])
def test_constant_map_gives_constant_image(mode, value):
    x = torch.full((2, 3, 4, 4), value)
    out = normalize(x, mode)
    assert torch.isfinite(out).all()
    assert (out == out.flatten()[0]).all()
    assert ((out >= 0) & (out <= 1)).all()


@pytest.mark.parametrize(("mode", "expected"), [("seed", 0.5), ("minmax", 0.0), ("absmax", 0.5), ("percentile", 0.5)])
def test_all_zero_map(mode, expected):
    out = normalize(torch.zeros(2, 1, 3, 3), mode)
    assert (out == expected).all()


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
    with pytest.raises(ValueError, match=r"mode must be one of \('seed', 'minmax', 'absmax', 'percentile'\), got 'z'"):
        normalize(x, "z")
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    bad[1, 0, 1, 1] = float("inf")
    with pytest.raises(ValueError, match=r"attr contains 2 non-finite value\(s\)"):
        normalize(bad, "minmax")
    for p in (0.0, -5.0, 100.5):
        with pytest.raises(ValueError, match=r"percentile must be a number in \(0, 100\]"):
            normalize(x, "percentile", percentile=p)
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
