"""hookviz.explanation.Explanation, built by hand from random tensors (no model needed)."""

from __future__ import annotations

import base64
import enum
import io
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image

from hookviz import display as hv_display
from hookviz.display import EmptyMapWarning, colormap, normalize, resize, to_uint8
from hookviz.explanation import DISPLAY_KEYS, Explanation, resolve_labels

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


def test_normalized_options_override_display():
    e = make(3, "input", display={"mode": "absmax", "sign": "positive", "scale": "shared", "percentile": 90.0})
    a = e.attribution
    torch.testing.assert_close(e.normalized(), normalize(a, "absmax", sample_dims=2, sign="positive", scale="shared"))
    torch.testing.assert_close(
        e.normalized("mass", sign="negative", scale="sample"),
        normalize(a, "mass", sample_dims=2, sign="negative", percentile=90.0),
    )
    torch.testing.assert_close(
        e.normalized("percentile", percentile=50.0, scale="sample"),
        normalize(a, "percentile", sample_dims=2, sign="positive", percentile=50.0),
    )
    with pytest.raises(
        ValueError, match=r"sign must be one of \('all', 'positive', 'negative', 'absolute'\), got 'neg'"
    ):
        e.normalized(sign="neg")
    with pytest.raises(ValueError, match=r"scale must be one of \('sample', 'shared'\), got 'figure'"):
        e.heatmap(scale="figure")


def test_heatmap_and_overlay_options():
    e = make(1, "layer")
    heat = normalize(e.attribution, "mass", sign="absolute", scale="shared")
    torch.testing.assert_close(
        e.heatmap("magma", mode="mass", sign="absolute", scale="shared"), colormap(resize(heat, (32, 32)), "magma")
    )
    out = e.overlay(0.7, "magma", alpha_by_map=True, mode="mass", sign="absolute", scale="shared")
    torch.testing.assert_close(out, hv_display.overlay(e.images, heat, 0.7, "magma", alpha_by_map=True))
    # alpha and alpha_by_map can be display defaults too
    d = make(1, "layer", display={"alpha": 0.7, "alpha_by_map": True, "cmap": "magma"})
    # minmax places 0 at the minimum, so the opacity is |a| over its 99th percentile per sample (display.magnitude)
    a = d.attribution.abs()
    q = torch.quantile(a.flatten(1), 0.99, dim=1).view(-1, 1, 1, 1)
    weight = (a / (q + 1e-8)).clamp(0, 1)
    torch.testing.assert_close(
        d.overlay(), hv_display.overlay(d.images, d.normalized(), 0.7, "magma", alpha_by_map=True, weight=weight)
    )
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\], got 2"):
        e.overlay(alpha=2)


def test_empty_map_warns_through_explanation():
    e = make(1, "layer", attribution=torch.zeros(N, 1, 8, 8))
    with pytest.warns(EmptyMapWarning, match=r"sample\(s\) \[0, 1\] of 2 are all zero") as record:
        out = e.heatmap()
    assert torch.isfinite(out).all()
    assert record[0].filename == __file__  # the warning points at the user's line, not inside hookviz
    with pytest.warns(EmptyMapWarning, match=r"sample\(s\) \[0, 1\] of 2 are all zero after sign='negative'"):
        make(1, "layer").figure(sign="negative")  # Grad-CAM maps have no negative part


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
    # a class target's score is the model's output for that class: labelled a logit (issue 27)
    # the method panel is titled as the grid titles its column
    assert titles[:3] == ["class 17  logit 1.23", "Guided Backprop", "overlay"]
    assert titles[3] == "class 3  logit -0.5"
    named = make(1, "input", targets=torch.tensor([[7], [3]]), labels=LABELS).figure().axes[0].get_title()
    assert named.startswith("label7  logit ")
    custom = make(targets=None, scores=torch.tensor([[10.0], [2.0]])).figure().axes[0].get_title()
    assert custom == "custom target  score 10.0"  # a callable's value is a score, written 10.0 rather than 10


def test_figure_errors():
    with pytest.raises(ValueError, match="max_rows must be a positive int, got 0"):
        make().figure(max_rows=0)
    with pytest.raises(ValueError, match=r"empty Explanation \(N=0\)"):
        make()[2:].figure()
    with pytest.raises(TypeError, match=r"figure\(\) got unknown display option\(s\) \['colour'\]"):
        make().figure(colour="red")
    with pytest.raises(ValueError, match=r"mode must be one of .*'mass'\), got 'max'"):
        make().figure(mode="max")


def _panel(fig, row: int, col: int, n_cols: int = 3) -> np.ndarray:
    """The (H, W, 3) uint8 pixels drawn at (row, col)."""
    return np.asarray(fig.axes[row * n_cols + col].get_images()[0].get_array())


def _hwc(t: torch.Tensor) -> np.ndarray:
    return to_uint8(t).permute(1, 2, 0).numpy()


def test_figure_shows_images_and_options_override_display():
    e = make(1, "layer", display={"mode": "minmax", "cmap": "jet"})
    fig = e.figure()
    np.testing.assert_array_equal(_panel(fig, 0, 0), _hwc(e.images[0]))  # the image column shows `images`
    np.testing.assert_array_equal(_panel(fig, 1, 1), _hwc(e.heatmap()[1]))
    opts = {"mode": "mass", "sign": "positive", "cmap": "magma", "percentile": 90.0}
    fig = e.figure(**opts, alpha=0.8, alpha_by_map=True)
    np.testing.assert_array_equal(_panel(fig, 1, 1), _hwc(e.heatmap(**opts)[1]))
    np.testing.assert_array_equal(_panel(fig, 1, 2), _hwc(e.overlay(0.8, alpha_by_map=True, **opts)[1]))
    assert len(e.figure(overlay=False).axes) == 2 * 2
    assert len(make(display={"overlay": False}).figure(overlay=True).axes) == 2 * 3
    assert e.display == {"mode": "minmax", "cmap": "jet"}  # overrides do not stick


def test_figure_shared_scale_uses_the_whole_batch():
    # sample 1 is ten times stronger: with a shared scale, sample 0 looks weak even when drawn alone
    e = make(1, "layer")
    e.attribution[1] = e.attribution[0] * 10
    fig = e.figure(max_rows=1, scale="shared", cmap="gray")
    np.testing.assert_array_equal(_panel(fig, 0, 1), _hwc(e.heatmap("gray", scale="shared")[0]))
    alone = _panel(e.figure(max_rows=1, cmap="gray"), 0, 1)
    assert _panel(fig, 0, 1).max() <= alone.max() / 10 + 1  # a tenth of the range it gets on its own


def test_with_display():
    e = make(display={"cmap": "magma"})
    f = e.with_display(sign="positive", max_rows=1)
    assert f.display == {"cmap": "magma", "sign": "positive", "max_rows": 1}
    assert e.display == {"cmap": "magma"} and f.attribution is e.attribution
    assert len(f.figure().axes) == 3
    with pytest.raises(TypeError, match=r"with_display\(\) got unknown display option\(s\) \['colour'\]"):
        e.with_display(colour="red")


# ---------------------------------------------------------------------------- labels


def test_labels_from_torchvision_weights():
    from torchvision.models import ResNet18_Weights

    e = make(1, "input", targets=torch.tensor([[0], [1]]), labels=ResNet18_Weights.IMAGENET1K_V1)
    assert len(e.labels) == 1000 and e.labels[:2] == ("tench", "goldfish")
    assert e.figure().axes[0].get_title().startswith("tench  logit ")
    assert "<b>tench (class 0)</b>" in e._repr_html_()
    assert e[1].labels is e.labels


class _FakeWeights(enum.Enum):
    FLOW = "flow"

    @property
    def meta(self) -> dict:
        return {"min_size": (128, 128)}


def test_resolve_labels():
    assert resolve_labels(None) is None
    assert resolve_labels(["a", "b"]) == ("a", "b")
    assert make(labels=LABELS).labels == tuple(LABELS)
    with pytest.raises(
        ValueError, match=r"the weights _FakeWeights.FLOW have no 'categories' in their meta \(keys: \['min_size'\]\)"
    ):
        resolve_labels(_FakeWeights.FLOW)
    with pytest.raises(
        TypeError, match="labels got the enum class _FakeWeights; pass one of its members, e.g. _FakeWeights.FLOW"
    ):
        resolve_labels(_FakeWeights)
    with pytest.raises(TypeError, match="labels must be a sequence of class names, a torchvision weights enum member"):
        resolve_labels("tench")
    with pytest.raises(TypeError, match=r"labels must hold class names \(str\); item 1 is int: 7"):
        resolve_labels(["a", 7])
    with pytest.raises(TypeError, match="labels must be a sequence of class names"):
        make(labels={0: "a"})


# ---------------------------------------------------------------------------- HTML and show()

_IMG = '<img src="data:image/png;base64,'


@pytest.mark.parametrize(
    ("k", "kind", "display", "n_img"), [(1, "layer", {}, 2 * 3), (3, "input", {"overlay": False}, 6 * 2)]
)
def test_repr_html(k, kind, display, n_img):
    e = make(
        k, kind, targets=torch.arange(N * k).view(N, k), labels=[f"<label{i}>" for i in range(10)], display=display
    )
    out = e._repr_html_()
    assert out.count(_IMG) == n_img
    assert "&lt;label1&gt; (class 1)" in out and "<label1>" not in out  # names are escaped
    assert f"logit {e.scores[0, 0].item():.4g}" in out
    assert "sample 1, target 2" in out if k > 1 else "sample 1<br>" in out
    uri = re.search(r'src="data:image/png;base64,([^"]+)"', out).group(1)
    img = Image.open(io.BytesIO(base64.b64decode(uri)))
    assert img.format == "PNG" and img.size == (32, 32)
    np.testing.assert_array_equal(np.asarray(img), _hwc(e.images[0]))  # the first panel is the image


def test_to_html_options_and_truncation():
    e = make(3, "layer", targets=None)
    out = e.to_html(max_rows=4, overlay=False)
    assert out.count(_IMG) == 4 * 2 and "showing 4 of 6 rows" in out and "custom target" in out
    assert e.with_display(max_rows=1)._repr_html_().count(_IMG) == 3


def test_show_without_ipython_uses_pyplot(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setitem(sys.modules, "IPython", None)  # "import IPython" raises ImportError
    monkeypatch.setattr(plt, "show", lambda *a, **kw: shown.append(plt.gcf()))
    try:
        assert make().show(max_rows=1, overlay=False) is None
        assert len(shown) == 1 and len(shown[0].axes) == 2
    finally:
        plt.close("all")


def _fake_ipython(monkeypatch, shell):
    calls = []
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell
    ipython_display = types.ModuleType("IPython.display")
    ipython_display.display = calls.append
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython_display)
    return calls


def test_show_in_jupyter_uses_ipython_display(monkeypatch):
    calls = _fake_ipython(monkeypatch, shell=object())
    e = make()
    assert e.show() is None
    assert calls == [e]
    e.show(cmap="magma")
    assert isinstance(calls[1], Explanation) and calls[1].display == {"cmap": "magma"}


def test_show_ipython_installed_but_no_kernel_uses_pyplot(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = _fake_ipython(monkeypatch, shell=None)  # plain python with IPython installed
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **kw: shown.append(1))
    try:
        make().show()
    finally:
        plt.close("all")
    assert calls == [] and shown == [1]


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
    with pytest.raises(
        ValueError, match=r"path must end with one of \('.pdf', '.svg', '.png', '.eps'.*got suffix '.gif'"
    ):
        make().save(tmp_path / "fig.gif")
    with pytest.raises(ValueError, match="got suffix ''"):
        make().save(tmp_path / "fig")
    assert list(tmp_path.iterdir()) == []


def png_view(e):
    """The PNG a front end that cannot show HTML gets."""
    bundle = e._repr_mimebundle_(include={"image/png", "text/plain"})
    assert set(bundle) == {"image/png", "text/plain"}
    return bundle["image/png"]


def test_png_view_decodes_for_front_ends_without_html():
    data = png_view(make(3, "input"))
    assert isinstance(data, bytes)
    img = Image.open(io.BytesIO(data))
    # 2 samples x 3 targets = 6 rows of (image | map | overlay), 2.6 inches a panel at 100 dpi
    assert img.format == "PNG" and img.size == (3 * 260, 6 * 260)
    assert Image.open(io.BytesIO(png_view(make(3, "input")[:1]))).size == (3 * 260, 3 * 260)
    assert set(make(3, "input")._repr_mimebundle_(exclude={"text/html"})) == {"image/png", "text/plain"}


def test_one_notebook_display_draws_once(monkeypatch):
    # Jupyter asks every formatter; with _repr_html_ and _repr_png_ both present it drew the panels twice (HTML and
    # a matplotlib figure) and stored both. The bundle gives HTML and text only, and the panels are built once.
    from IPython.core.formatters import DisplayFormatter  # ipykernel (the dev extra) brings IPython

    from hookviz.explanation import Explanation

    built = []
    original = Explanation._panels
    monkeypatch.setattr(Explanation, "_panels", lambda self, *a, **k: built.append(a) or original(self, *a, **k))
    monkeypatch.setattr(Explanation, "figure", lambda *a, **k: pytest.fail("a notebook display drew a figure"))
    data, _ = DisplayFormatter().format(make(1, "input"))
    assert "text/html" in data and "image/png" not in data and data["text/plain"].startswith("Explanation(")
    assert len(built) == 1


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
        ({"display": {"sign": "+"}}, ValueError, r"display\['sign'\] must be one of \('all', 'positive'"),
        ({"display": {"scale": "all"}}, ValueError, r"display\['scale'\] must be one of \('sample', 'shared'\)"),
        ({"display": {"alpha": 1.5}}, ValueError, r"display\['alpha'\] must be a number in \[0, 1\], got 1.5"),
        ({"display": {"alpha_by_map": 1}}, TypeError, r"display\['alpha_by_map'\] must be a bool, got int"),
        ({"display": {"overlay": "no"}}, TypeError, r"display\['overlay'\] must be a bool, got str"),
        ({"display": {"percentile": 0}}, ValueError, r"display\['percentile'\] must be a number in \(0, 100\]"),
        ({"display": {"max_rows": 0}}, ValueError, r"display\['max_rows'\] must be a positive int, got 0"),
        ({"display": {"cmap": 3}}, TypeError, r"display\['cmap'\] must be the name of a matplotlib colour map"),
        ({"labels": "tench"}, TypeError, "labels must be a sequence of class names"),
        ({"attribution": np.zeros((2, 3, 32, 32))}, TypeError, "attribution must be a torch.Tensor, got ndarray"),
    ],
)
def test_validation(kw, error, match):
    with pytest.raises(error, match=match):
        make(**kw)


def test_display_keys():
    assert DISPLAY_KEYS == (
        "reduce",
        "mode",
        "cmap",
        "overlay",
        "sign",
        "scale",
        "alpha",
        "alpha_by_map",
        "percentile",
        "max_rows",
    )


def test_import_does_not_import_matplotlib():
    code = "import sys, hookviz.display, hookviz.explanation; print('matplotlib' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
