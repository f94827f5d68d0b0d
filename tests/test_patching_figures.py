"""`hv.patching_figure` and `hv.feature_grid`: what they draw (panels, values, symmetric colour limits) and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookviz as hv


def _result() -> hv.interventions.PatchingResult:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 2))
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randn(2, 3, 5, 5, generator=g), torch.randn(2, 3, 5, 5, generator=g)
    return hv.patching(model, clean, corrupt, lambda out: out[:, 0], {"1": "spatial", "0": "channel", "2": "layer"})


def test_patching_figure_draws_one_symmetric_heat_map_per_layer(tmp_path) -> None:
    result = _result()
    fig = hv.patching_figure(result, out=tmp_path / "patching.png")
    maps = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in maps] == ["1 (spatial)", "0 (channel)", "2 (layer)"]
    spatial = maps[0].images[0]
    expected = result.normalized()["1"].mean(0)
    assert spatial.get_array().shape == (5, 5)
    assert torch.allclose(torch.as_tensor(spatial.get_array().data), expected.float(), atol=1e-6)
    lo, hi = spatial.get_clim()
    assert lo == -hi and hi == pytest.approx(float(expected.abs().max()))
    assert maps[1].images[0].get_array().shape == (1, 4) and maps[2].images[0].get_array().shape == (1, 1)
    assert (tmp_path / "patching.png").stat().st_size > 1000
    one = hv.patching_figure(result, normalized=False, sample=1)
    assert torch.allclose(torch.as_tensor([a for a in one.axes if a.images][1].images[0].get_array().data)[0],
                          result["0"][1].float())  # fmt: skip
    with pytest.raises(ValueError, match="sample must be None"):
        hv.patching_figure(result, sample=2)
    with pytest.raises(TypeError, match="result must be a PatchingResult"):
        hv.patching_figure({"a": torch.zeros(2)})


def test_feature_grid_rows_of_rendered_and_dataset_examples(tmp_path) -> None:
    images = torch.rand(2, 3, 8, 8)
    examples = torch.rand(2, 3, 3, 8, 8)
    fig = hv.feature_grid(
        images, titles=["a", "b"], examples=examples, values=torch.tensor([5.0, 6.0]),
        example_values=torch.arange(6.0).reshape(2, 3), out=tmp_path / "grid.png",
    )  # fmt: skip
    axes = [ax for ax in fig.axes if ax.images]
    assert len(axes) == 8 and axes[0].get_ylabel() == "a" and axes[4].get_ylabel() == "b"
    assert axes[0].get_xlabel() == "5.0" and axes[7].get_xlabel() == "5.0"  # row 1, example 3: value 5
    assert torch.allclose(torch.as_tensor(axes[5].images[0].get_array()), examples[1, 0].permute(1, 2, 0))
    with pytest.raises(ValueError, match="titles must have one entry per image"):
        hv.feature_grid(images, titles=["a"])
    with pytest.raises(ValueError, match=r"images must be a \(K, 3, h, w\) tensor"):
        hv.feature_grid(torch.rand(3, 8, 8))


def test_cli_features_writes_a_grid(tmp_path, capsys) -> None:
    from hookviz.cli import main

    out = tmp_path / "features.png"
    assert main(["features", "--model", "shapes", "--layer", "head", "--units", "0,2", "--steps", "2", "--out",
                 str(out)]) == 0  # fmt: skip
    assert out.stat().st_size > 1000 and "2 units of head, 2 steps" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["features", "--model", "shapes", "--layer", "head", "--units", "0,x"])
    assert "--units must be comma-separated" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["features", "--model", "shapes", "--layer", "head", "--units", "12", "--steps", "2"])
    assert "channel 12 is out of range; 'head' has 8 channels" in capsys.readouterr().err
