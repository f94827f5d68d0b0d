"""hookviz.figures: the grid figure (layout, labels, colour scales, colour bars) and vector output."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import hookviz as hv
from hookviz import display
from hookviz.figures import PAPER_RC, grid, save_figure
from hookviz.zoo import ShapesViT

H = W = 16
LABELS = ["cat", "dog", "bird", "fish", "frog"]
MINMAX = {"reduce": None, "mode": "minmax", "cmap": "viridis", "overlay": False}


def images(n: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 3, H, W, generator=g)


def exp_of(maps: torch.Tensor, method: str = "Saliency", display: dict | None = None, targets=None) -> hv.Explanation:
    """A hand-made Explanation: maps (N, C, H, W) or (N, K, C, H, W) (multi-target)."""
    n = maps.shape[0]
    multi = maps.ndim == 5
    k = maps.shape[1] if multi else 1
    t = torch.as_tensor(targets if targets is not None else [[i % len(LABELS)] * k for i in range(n)]).view(n, k)
    return hv.Explanation(
        attribution=maps,
        images=images(n),
        inputs=images(n),
        targets=t,
        scores=torch.zeros(n, k),
        method=method,
        multi_target=multi,
        labels=LABELS,
        display=dict(MINMAX if display is None else display),
    )


def ramp(scale: float, offset: float = 0.0) -> torch.Tensor:
    """(1, H, W) values offset .. offset + scale, increasing along x."""
    return (offset + scale * torch.linspace(0, 1, W)).expand(1, H, W).clone()


def two_columns() -> list[hv.Explanation]:
    """Column A: row 0 spans 0..1, row 1 spans 0..0.5. Column B: both rows span 0..4."""
    a = exp_of(torch.stack([ramp(1.0), ramp(0.5)]), "Saliency", targets=[[1], [2]])
    b = exp_of(torch.stack([ramp(4.0), ramp(4.0)]), "GradCAM", targets=[[1], [2]])
    return [a, b]


def cell(fig, r: int, c: int, n_cols: int) -> np.ndarray:
    """The data shown in grid cell (r, c): the first n_rows * n_cols axes are the cells, row by row."""
    return np.asarray(fig.axes[r * n_cols + c].images[0].get_array())


# ---------------------------------------------------------------------------------------------------- layout


def test_grid_rows_are_images_columns_are_methods_with_labels() -> None:
    fig = grid(two_columns(), dpi=50)
    assert len(fig.axes) == 2 * 3  # 2 images x (input + 2 methods), no colour bars
    assert [fig.axes[c].get_title() for c in range(3)] == ["Input", "Saliency", "Grad-CAM"]
    assert [fig.axes[r * 3].get_ylabel() for r in range(2)] == ["dog", "bird"]  # target class names
    for ax in fig.axes:
        assert ax.get_xticks().size == 0 and ax.get_yticks().size == 0
        assert not any(s.get_visible() for s in ax.spines.values())
    # the input column shows the images
    np.testing.assert_allclose(cell(fig, 1, 0, 3), images(2)[1].permute(1, 2, 0).numpy(), atol=1e-6)


def test_labels_can_be_given_and_default_to_class_ids() -> None:
    exps = two_columns()
    for e in exps:
        e.labels = None
    fig = grid(exps, dpi=50)
    assert [fig.axes[r * 3].get_ylabel() for r in range(2)] == ["class 1", "class 2"]
    fig = grid(exps, row_labels=["first", "second"], col_labels=["A", "B"], labels=LABELS, dpi=50)
    assert [fig.axes[r * 3].get_ylabel() for r in range(2)] == ["first", "second"]
    assert [fig.axes[c].get_title() for c in range(3)] == ["Input", "A", "B"]
    fig = grid(exps, col_labels=["image", "A", "B"], dpi=50)  # one more: the input column too
    assert [fig.axes[c].get_title() for c in range(3)] == ["image", "A", "B"]
    with pytest.raises(ValueError, match="row_labels must hold 2"):
        grid(exps, row_labels=["only one"])
    with pytest.raises(ValueError, match="col_labels must hold 2 or 3"):
        grid(exps, col_labels=["A"])


def test_one_method_with_k_targets_gives_a_column_per_target() -> None:
    maps = torch.rand(2, 3, 1, H, W)  # N=2 images, K=3 targets
    exp = exp_of(maps, "GradCAM", targets=[[0, 1, 2], [0, 1, 2]])
    fig = grid(exp, dpi=50)
    assert len(fig.axes) == 2 * 4
    assert [fig.axes[c].get_title() for c in range(4)] == ["Input", "cat", "dog", "bird"]
    assert [fig.axes[r * 4].get_ylabel() for r in range(2)] == ["", ""]  # the columns already name the targets
    # per column k, the maps of target k (column scale: min-max over the column's two maps)
    col = maps[:, 1]
    expected = ((col - col.min()) / (col.max() - col.min()))[1, 0].numpy()
    np.testing.assert_allclose(cell(fig, 1, 2, 4), expected, atol=1e-5)


def test_several_methods_with_k_targets_name_method_and_target() -> None:
    a = exp_of(torch.rand(1, 2, 1, H, W), "Saliency", targets=[[3, 4]])
    b = exp_of(torch.rand(1, 2, 1, H, W), "GradCAM", targets=[[3, 4]])
    fig = grid([a, b], dpi=50, show_input=False)
    assert [ax.get_title() for ax in fig.axes] == [
        "Saliency\nfish",
        "Saliency\nfrog",
        "Grad-CAM\nfish",
        "Grad-CAM\nfrog",
    ]


def test_fixed_size_and_dpi_and_paper_fonts() -> None:
    before = dict(matplotlib.rcParams)
    fig = grid(two_columns(), size=(4.0, 2.5), dpi=80, title="A title")
    assert tuple(fig.get_size_inches()) == (4.0, 2.5) and fig.dpi == 80
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"
    title = fig.axes[1].title
    assert title.get_fontsize() == PAPER_RC["axes.titlesize"]
    assert title.get_fontfamily() == ["sans-serif"] and fig.axes[0].yaxis.label.get_fontsize() == 8
    assert fig.get_suptitle() == "A title"
    assert dict(matplotlib.rcParams) == before  # nothing global was changed


# ---------------------------------------------------------------------------------------------------- scales


def test_column_scale_shares_one_normalization_per_column() -> None:
    fig = grid(two_columns(), scale="column", dpi=50)
    a0, a1 = cell(fig, 0, 1, 3), cell(fig, 1, 1, 3)
    assert a0.shape == (H, W)  # scalar maps: the axes hold the normalized values, coloured by the image's cmap
    assert a0.max() == pytest.approx(1.0) and a1.max() == pytest.approx(0.5, abs=1e-5)  # row 1 is half of row 0
    assert a0.min() == pytest.approx(0.0) and a1.min() == pytest.approx(0.0)
    assert fig.axes[1].images[0].get_clim() == (0.0, 1.0)
    assert fig.axes[1].images[0].get_cmap().name == "viridis"


def test_sample_scale_normalizes_each_map() -> None:
    fig = grid(two_columns(), scale="sample", dpi=50)
    for r in range(2):
        for c in (1, 2):
            assert cell(fig, r, c, 3).max() == pytest.approx(1.0)
            assert cell(fig, r, c, 3).min() == pytest.approx(0.0)


def test_shared_scale_is_one_normalization_for_the_figure() -> None:
    fig = grid(two_columns(), scale="shared", dpi=50)
    # every value of the figure on one 0..4 scale: column A reaches 1/4 and 1/8, column B reaches 1
    assert cell(fig, 0, 1, 3).max() == pytest.approx(0.25, abs=1e-5)
    assert cell(fig, 1, 1, 3).max() == pytest.approx(0.125, abs=1e-5)
    assert cell(fig, 0, 2, 3).max() == pytest.approx(1.0) and cell(fig, 1, 2, 3).max() == pytest.approx(1.0)


def test_shared_scale_matches_normalizing_the_concatenated_maps() -> None:
    exps = two_columns()
    fig = grid(exps, scale="shared", mode="minmax", dpi=50)
    stacked = torch.cat([exps[0].attribution, exps[1].attribution], dim=0)  # (4, 1, H, W)
    expected = display.normalize(stacked, "minmax", sample_dims=0)
    np.testing.assert_allclose(cell(fig, 1, 1, 3), expected[1, 0].numpy(), atol=1e-6)
    np.testing.assert_allclose(cell(fig, 0, 2, 3), expected[2, 0].numpy(), atol=1e-6)


def test_layer_maps_are_upsampled_and_rgb_maps_shown_as_rgb() -> None:
    cam = exp_of(torch.rand(2, 1, 4, 4), "GradCAM")
    rgb = exp_of(torch.randn(2, 3, H, W), "GuidedBackprop", {"reduce": None, "mode": "seed", "overlay": False})
    fig = grid([cam, rgb], dpi=50)
    assert cell(fig, 0, 1, 3).shape == (H, W)
    assert cell(fig, 0, 2, 3).shape == (H, W, 3)


def test_overlay_blends_maps_over_the_images() -> None:
    exps = two_columns()
    fig = grid(exps, overlay=True, scale="sample", cmap="jet", dpi=50)
    shown = cell(fig, 0, 1, 3)
    assert shown.shape == (H, W, 3)
    expected = exps[0][0].overlay(cmap="jet")[0].permute(1, 2, 0).numpy()  # Explanation.overlay is per sample
    np.testing.assert_allclose(shown, expected, atol=1e-6)
    # "auto": as each method's display defaults say
    exps[1].display["overlay"] = True
    fig = grid(exps, overlay="auto", dpi=50)
    assert cell(fig, 0, 1, 3).ndim == 2 and cell(fig, 0, 2, 3).ndim == 3


def test_sign_override_and_labels_from_torchvision_weights() -> None:
    signed = exp_of(torch.stack([ramp(2.0, -1.0), ramp(2.0, -1.0)]), "IntegratedGradients",
                    {"reduce": "sum", "mode": "absmax", "cmap": "bwr"})  # fmt: skip
    fig = grid(signed, sign="positive", colorbar=True, dpi=50)
    shown = cell(fig, 0, 1, 2)
    assert shown[:, : W // 2].max() == 0 and shown.max() == pytest.approx(1.0)  # negative half hidden
    assert fig.axes[-1].get_xlim() == pytest.approx((0.0, 1.0))

    class Weights:  # stands for a torchvision weights enum member
        meta = {"categories": LABELS}

    exps = two_columns()
    for e in exps:
        e.labels = None
    fig = grid(exps, labels=Weights(), dpi=50)
    assert [fig.axes[r * 3].get_ylabel() for r in range(2)] == ["dog", "bird"]


# ---------------------------------------------------------------------------------------------------- colour bars


def colorbars(fig, n_cells: int) -> list:
    return fig.axes[n_cells:]


def test_colorbars_under_each_scalar_column_show_the_value_range() -> None:
    fig = grid(two_columns(), colorbar=True, scale="column", dpi=50)
    bars = colorbars(fig, 2 * 3)
    assert len(bars) == 2  # one per map column, none under the input column
    assert bars[0].get_xlim() == pytest.approx((0.0, 1.0))  # column A: raw values 0..1
    assert bars[1].get_xlim() == pytest.approx((0.0, 4.0))  # column B: raw values 0..4
    assert [t.get_text() for t in bars[1].get_xticklabels()] == ["0", "4"]
    # the bar sits below its column
    assert bars[1].get_position().x0 == pytest.approx(fig.axes[5].get_position().x0, abs=0.05)
    assert bars[1].get_position().y1 < fig.axes[5].get_position().y0


def test_colorbars_shared_and_sample_scales() -> None:
    fig = grid(two_columns(), colorbar=True, scale="shared", dpi=50)
    assert [b.get_xlim() for b in colorbars(fig, 6)] == [pytest.approx((0.0, 4.0))] * 2
    fig = grid(two_columns(), colorbar=True, scale="sample", dpi=50)
    assert [b.get_xlim() for b in colorbars(fig, 6)] == [pytest.approx((0.0, 1.0))] * 2


def test_no_colorbar_under_rgb_maps() -> None:
    rgb = exp_of(torch.randn(2, 3, H, W), "GuidedBackprop", {"reduce": None, "mode": "seed", "overlay": False})
    fig = grid([rgb, two_columns()[1]], colorbar=True, dpi=50)
    assert len(colorbars(fig, 6)) == 1


def test_signed_colorbar_is_symmetric_with_zero() -> None:
    signed = exp_of(torch.stack([ramp(2.0, -1.0), ramp(1.0, -0.5)]), "IntegratedGradients",
                    {"reduce": "sum", "mode": "absmax", "cmap": "bwr"})  # fmt: skip
    fig = grid(signed, colorbar=True, dpi=50)
    (bar,) = colorbars(fig, 4)
    assert bar.get_xlim() == pytest.approx((-1.0, 1.0))
    assert [t.get_text() for t in bar.get_xticklabels()] == ["-1", "0", "1"]
    assert cell(fig, 1, 1, 2).min() == pytest.approx(0.25) and cell(fig, 1, 1, 2).max() == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------------- output


def test_save_figure_writes_pdf_with_truetype_fonts_svg_and_png(tmp_path) -> None:
    fig = grid(two_columns(), colorbar=True, size=(3.0, 2.2), dpi=100, title="fonts")
    pdf = save_figure(fig, tmp_path / "fig.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"/FontFile2" in pdf and b"/FontFile3" not in pdf
    assert b"CreationDate" not in pdf
    again = grid(two_columns(), colorbar=True, size=(3.0, 2.2), dpi=100, title="fonts")
    assert save_figure(again, tmp_path / "again.pdf").read_bytes() == pdf  # same figure, same bytes: no dates
    svg = save_figure(fig, tmp_path / "fig.svg").read_bytes()
    assert b"<svg" in svg[:1000] and b"<text" not in svg  # text as paths
    png = save_figure(fig, tmp_path / "fig.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as im:
        assert im.size == (300, 220)  # the fixed size at the figure's dpi, no tight bounding box
    with pytest.raises(ValueError, match="suffix|end with"):
        save_figure(fig, tmp_path / "fig.gif")


def test_grid_out_writes_the_file(tmp_path) -> None:
    out = tmp_path / "sub" / "grid.pdf"
    grid(two_columns(), out=out, dpi=50)
    assert out.read_bytes().startswith(b"%PDF")


# ---------------------------------------------------------------------------------------------------- explaining images


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5),
    )  # fmt: skip


def test_grid_explains_images_with_registry_names_and_instances() -> None:
    model = small_cnn()
    x = torch.randn(3, 3, H, W)
    fig = grid(x, ["saliency", hv.GradCAM(model), hv.GuidedBackprop], model=model, targets=[0, 1, 2], labels=LABELS)
    assert len(fig.axes) == 3 * 4
    assert [fig.axes[c].get_title() for c in range(4)] == ["Input", "Saliency", "Grad-CAM", "Guided Backprop"]
    assert [fig.axes[r * 4].get_ylabel() for r in range(3)] == ["cat", "dog", "bird"]
    # the saliency column is what Saliency computes, min-max normalized over the column after max-abs reduction
    attr = hv.Saliency(model).attribute(x, target=[0, 1, 2]).abs().amax(1, keepdim=True)
    expected = display.normalize(attr, "minmax", sample_dims=0)
    np.testing.assert_allclose(cell(fig, 2, 1, 4), expected[2, 0].numpy(), atol=1e-5)


def test_two_lrp_composites_are_told_apart_in_titles() -> None:
    """Every LRP composite is the class LRP: the column titles name the composite (they all read "LRP" before)."""
    model = small_cnn()
    x = torch.randn(2, 3, H, W)
    fig = grid(x, ["lrp-epsilon", hv.LRP(model, "epsilon-plus")], model=model, targets=[0, 1], labels=LABELS)
    assert [fig.axes[c].get_title() for c in range(3)] == ["Input", "LRP (epsilon)", "LRP (epsilon-plus)"]
    assert hv.LRP(model, "epsilon").visualize(x, target=0).method == "LRP (epsilon)"
    torch.manual_seed(0)
    vit = ShapesViT(dim=16, depth=1, heads=2).eval()  # random weights: the titles, not the maps, are tested
    fig = grid(torch.rand(1, 3, 64, 64), ["lrp-attn-lrp", "lrp-cp-lrp", "attention-rollout"], model=vit, targets=[0])
    assert [fig.axes[c].get_title() for c in range(4)] == ["Input", "AttnLRP", "CP-LRP", "Attention Rollout"]


def test_grid_explains_k_targets_per_image_as_columns() -> None:
    model = small_cnn()
    fig = grid(torch.randn(2, 3, H, W), "gradcam", model=model, targets=torch.tensor([[1, 3], [1, 3]]), labels=LABELS)
    assert [ax.get_title() for ax in fig.axes[:3]] == ["Input", "dog", "fish"]


def test_grid_errors() -> None:
    model = small_cnn()
    x = torch.randn(2, 3, H, W)
    with pytest.raises(ValueError, match="no methods"):
        grid(x, model=model)
    with pytest.raises(ValueError, match="unknown method 'nope'; available: .*gradcam"):
        grid(x, ["nope"], model=model)
    with pytest.raises(ValueError, match="needs model="):
        grid(x, ["saliency"])
    with pytest.raises(ValueError, match="scale must be one of"):
        grid(two_columns(), scale="global")
    with pytest.raises(ValueError, match="size must be"):
        grid(two_columns(), size=(3, 0))
    with pytest.raises(ValueError, match="is not a matplotlib colour map"):
        grid(two_columns(), cmap="jett")
    with pytest.raises(ValueError, match="methods= and targets= are for explaining images"):
        grid(two_columns(), ["saliency"])
    with pytest.raises(ValueError, match="same images"):
        grid([exp_of(torch.rand(2, 1, H, W)), exp_of(torch.rand(3, 1, H, W))])
