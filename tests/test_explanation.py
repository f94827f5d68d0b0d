"""hookviz.explanation.Explanation, built by hand from random tensors (no model needed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from hookviz.display import colormap, normalize, resize
from hookviz.explanation import Explanation

N = 2
LABELS = [f"label{i}" for i in range(10)]


def make(k: int = 1, kind: str = "input", *, seed: int = 0, **kw) -> Explanation:
    """N=2 samples with 32x32 images; ``kind`` "input": (N, [K], 3, 32, 32) maps, "layer": (N, [K], 1, 8, 8)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(N, 3, 32, 32, generator=g)
    multi = k > 1
    shape = (3, 32, 32) if kind == "input" else (1, 8, 8)
    attr = torch.randn(N, *((k,) if multi else ()), *shape, generator=g)
    if kind == "layer":
        attr = attr.relu()  # Grad-CAM maps are non-negative
    fields = dict(
        attribution=attr,
        images=images,
        inputs=(images - 0.45) / 0.225,
        targets=torch.randint(0, 10, (N, k), generator=g),
        scores=torch.randn(N, k, generator=g),
        method="GuidedBackprop" if kind == "input" else "GradCAM",
        multi_target=multi,
    )
    fields.update(kw)
    return Explanation(**fields)


CASES = [(1, "input"), (3, "input"), (1, "layer"), (3, "layer")]


# ---------------------------------------------------------------------------- tensor access


@pytest.mark.parametrize(("k", "kind"), CASES)
def test_indexing_keeps_batch_axis(k, kind):
    e = make(k, kind)
    assert len(e) == N
    for i in (0, 1, -1):
        sub = e[i]
        assert isinstance(sub, Explanation) and len(sub) == 1
        row = slice(i % N, i % N + 1)
        assert torch.equal(sub.attribution, e.attribution[row])
        assert torch.equal(sub.images, e.images[row])
        assert torch.equal(sub.inputs, e.inputs[row])
        assert torch.equal(sub.targets, e.targets[row])
        assert torch.equal(sub.scores, e.scores[row])
        assert (sub.method, sub.multi_target) == (e.method, e.multi_target)
    assert len(e[0:2]) == 2 and len(e[5:]) == 0
    assert torch.equal(e[::-1].attribution, e.attribution.flip(0))


def test_indexing_errors_and_independent_display():
    e = make(display={"cmap": "magma"})
    with pytest.raises(IndexError, match=r"index 2 is out of range for an Explanation of N=2 samples"):
        e[2]
    with pytest.raises(IndexError, match="N=2"):
        e[-3]
    with pytest.raises(TypeError, match="index must be an int or a slice, got float"):
        e[0.5]
    sub = e[0]
    sub.display["cmap"] = "gray"
    assert e.display["cmap"] == "magma"
    assert len(e[np.int64(1)]) == 1  # numpy ints index like ints


def test_numpy_is_raw_attribution():
    e = make(3, "input")
    arr = e.numpy()
    assert isinstance(arr, np.ndarray) and arr.shape == (N, 3, 3, 32, 32)
    np.testing.assert_array_equal(arr, e.attribution.numpy())
    assert make(attribution=torch.randn(N, 3, 32, 32).requires_grad_()).numpy().shape == (N, 3, 32, 32)


def test_targets_none_allowed():
    e = make(targets=None)
    assert e[0].targets is None
    assert "targets=None" in repr(e)


# ---------------------------------------------------------------------------- normalized / heatmap / overlay


@pytest.mark.parametrize(("k", "kind"), CASES)
def test_normalized_shapes_and_ranges(k, kind):
    e = make(k, kind)
    lead = (N, k) if k > 1 else (N,)
    out = e.normalized()
    assert out.shape == e.attribution.shape
    assert ((out >= 0) & (out <= 1)).all()
    # default mode "minmax" per (sample[, target]): each map spans [0, 1]
    flat = out.flatten(len(lead))
    torch.testing.assert_close(flat.amin(-1), torch.zeros(lead))
    torch.testing.assert_close(flat.amax(-1), torch.ones(lead), atol=1e-6, rtol=0)
    assert e.normalized(reduce="l2").shape == (*lead, 1, *e.attribution.shape[-2:])
    torch.testing.assert_close(e.normalized("absmax"), normalize(e.attribution, "absmax", sample_dims=len(lead)))


def test_normalized_uses_display_defaults():
    e = make(3, "input", display={"reduce": "max-abs", "mode": "percentile"})
    expected = normalize(e.attribution.abs().amax(dim=-3, keepdim=True), "percentile", sample_dims=2, percentile=90.0)
    torch.testing.assert_close(e.normalized(percentile=90.0), expected)
    assert e.normalized(reduce=None).shape == (N, 3, 3, 32, 32)  # an explicit None keeps the channels


@pytest.mark.parametrize(("k", "kind"), CASES)
def test_heatmap_and_overlay_shapes(k, kind):
    e = make(k, kind)
    expected = (N, k, 3, 32, 32) if k > 1 else (N, 3, 32, 32)
    for out in (e.heatmap(), e.overlay(), e.overlay(alpha=1.0, cmap="viridis")):
        assert out.shape == expected
        assert out.dtype == torch.float32
        assert ((out >= 0) & (out <= 1)).all()


def test_heatmap_values():
    # 3-channel maps are shown as RGB; layer maps are normalized, upsampled to the image size, then coloured
    e = make(1, "input")
    torch.testing.assert_close(e.heatmap(), e.normalized())
    cam = make(1, "layer", display={"cmap": "magma"})
    torch.testing.assert_close(cam.heatmap(), colormap(resize(cam.normalized(), (32, 32)), "magma"))


def test_overlay_values():
    e = make(3, "layer")
    torch.testing.assert_close(e.overlay(alpha=0.0), e.images.unsqueeze(1).expand(-1, 3, -1, -1, -1))
    g = make(1, "input")  # RGB map: reduced with max-abs before colouring
    heat = normalize(g.attribution.abs().amax(dim=1, keepdim=True), "minmax")
    torch.testing.assert_close(g.overlay(alpha=1.0), colormap(heat))


# ---------------------------------------------------------------------------- figures and files


@pytest.mark.parametrize(
    ("k", "kind", "max_rows", "display", "n_axes"),
    [
        (1, "input", 8, {}, 2 * 3),
        (3, "layer", 8, {}, 6 * 3),
        (3, "input", 4, {}, 4 * 3),
        (1, "layer", 1, {}, 1 * 3),
        (1, "input", 8, {"overlay": False}, 2 * 2),
    ],
)
def test_figure_axes(k, kind, max_rows, display, n_axes):
    from matplotlib.figure import Figure

    fig = make(k, kind, display=display).figure(max_rows=max_rows)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == n_axes
    for ax in fig.axes:
        assert len(ax.get_xticks()) == 0 and len(ax.get_yticks()) == 0


def test_figure_titles():
    e = make(1, "input", targets=torch.tensor([[17], [3]]), scores=torch.tensor([[1.23456], [-0.5]]))
    titles = [ax.get_title() for ax in e.figure().axes]
    assert titles[:3] == ["class 17  score 1.23", "GuidedBackprop", "overlay"]
    assert titles[3] == "class 3  score -0.5"
    named = make(1, "input", targets=torch.tensor([[7], [3]]), labels=LABELS).figure().axes[0].get_title()
    assert named.startswith("label7  score ")
    assert make(targets=None).figure().axes[0].get_title().startswith("custom target")


def test_figure_errors():
    with pytest.raises(ValueError, match="max_rows must be a positive int, got 0"):
        make().figure(max_rows=0)
    with pytest.raises(ValueError, match=r"empty Explanation \(N=0\)"):
        make()[2:].figure()


@pytest.mark.parametrize(
    ("suffix", "magic"),
    [(".png", b"\x89PNG\r\n\x1a\n"), (".pdf", b"%PDF"), (".svg", b"<?xml"), (".jpg", b"\xff\xd8\xff")],
)
def test_save_formats(tmp_path, suffix, magic):
    path = make(3, "layer", labels=LABELS).save(str(tmp_path / f"fig{suffix}"), dpi=50)
    assert path == tmp_path / f"fig{suffix}"
    data = path.read_bytes()
    assert data.startswith(magic)
    if suffix == ".svg":
        assert b"<svg" in data


def test_save_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"path must end with one of \('.png', '.pdf', '.svg'.*got suffix '.gif'"):
        make().save(tmp_path / "fig.gif")
    with pytest.raises(ValueError, match="got suffix ''"):
        make().save(tmp_path / "fig")
    assert list(tmp_path.iterdir()) == []


def test_repr_png_decodes():
    data = make(3, "input")._repr_png_()
    assert isinstance(data, bytes)
    img = Image.open(io.BytesIO(data))
    assert img.format == "PNG" and img.size[0] > 0


def test_repr_one_line():
    r = repr(make(3, "layer", targets=torch.tensor([[1, 2, 3], [4, 5, 6]])))
    assert r == "Explanation(method='GradCAM', N=2, K=3, attribution=(2, 3, 1, 8, 8), targets=[[1, 2, 3], [4, 5, 6]])"
    assert "K=" not in repr(make()) and "\n" not in repr(make())


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"attribution": torch.zeros(2, 3, 3, 32, 32)}, ValueError, r"attribution must have shape \(N, C, H, W\)"),
        ({"multi_target": True}, ValueError, r"attribution must have shape \(N, K, C, H, W\)"),
        ({"images": torch.zeros(3, 3, 32, 32)}, ValueError, r"images must have shape \(N=2, 3, H, W\)"),
        ({"scores": torch.zeros(2)}, ValueError, r"scores must have shape \(N, K\) = \(2, 1\), got \(2,\)"),
        ({"targets": torch.zeros(2, 3, dtype=torch.long)}, ValueError, r"targets must have shape \(N, K\) = \(2, 1\)"),
        ({"targets": torch.zeros(2, 1)}, TypeError, "targets must hold integer class indices"),
        ({"display": {"colour": "jet"}}, ValueError, r"display has unknown key\(s\) \['colour'\]"),
        ({"display": {"mode": "max"}}, ValueError, r"display\['mode'\] must be one of"),
        ({"display": {"reduce": "mean"}}, ValueError, r"display\['reduce'\] must be one of"),
        ({"attribution": np.zeros((2, 3, 32, 32))}, TypeError, "attribution must be a torch.Tensor, got ndarray"),
    ],
)
def test_validation(kw, error, match):
    with pytest.raises(error, match=match):
        make(**kw)


def test_import_does_not_import_matplotlib():
    code = "import sys, hookviz.display, hookviz.explanation; print('matplotlib' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
