"""One preprocessing rule for every entry point that takes images (issue 27, point 1): the model's own
(`hookviz.images.auto_preprocess`), so that image files give the same maps as the correctly preprocessed tensors in
`visualize`, `grid`, `explain_dataset`, the report and the command line.

The shapes model (64x64 inputs in [0, 1]) is the case that broke: `grid` defaulted to ImageNet's 224 px preset, and
four files of four classes all came out "triangle".
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from PIL import Image

import hookviz as hv
from hookviz.zoo import CLASSES, shapes, shapes_model


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return shapes_model()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], torch.Tensor, list[int]]:
    """Four shapes images of four classes written as PNG files, the tensors read back from them (uint8 / 255: the
    model's own preprocessing, 64x64 in [0, 1], keeps them as they are), and their classes."""
    data = shapes(8, seed=123)
    rows = [0, 1, 2, 3]  # classes 6, 3, 1, 5: four different ones
    folder = tmp_path_factory.mktemp("shapes_png")
    paths = []
    for i in rows:
        pixels = (data.images[i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        path = folder / f"image{i}.png"
        Image.fromarray(pixels).save(path)
        paths.append(str(path))
    tensors = torch.stack([torch.from_numpy(np.array(Image.open(p))).permute(2, 0, 1).float() / 255 for p in paths])
    return paths, tensors, data.labels[rows].tolist()


def test_the_files_are_classified_right_from_tensors(model, files):
    # the premise of the tests below: the model gets these four right when it is fed correctly
    _, x, labels = files
    with torch.no_grad():
        assert model(x).argmax(1).tolist() == labels
    assert len(set(labels)) == 4


def _cells(fig) -> list[np.ndarray]:
    return [np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images]


def test_grid_from_paths_equals_grid_from_tensors(model, files):
    paths, x, labels = files
    from_paths = hv.grid(paths, ["gradcam", "saliency"], model=model)
    from_tensors = hv.grid(x, ["gradcam", "saliency"], model=model)
    rows = [ax.get_ylabel() for ax in from_paths.axes[::3]]
    # on main the paths were resized to 224 with ImageNet's statistics: every row said "class 2" (triangle)
    assert rows == [CLASSES[c] for c in labels]
    assert rows == [ax.get_ylabel() for ax in from_tensors.axes[::3]]
    a, b = _cells(from_paths), _cells(from_tensors)
    assert len(a) == len(b) == 12
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        assert u.shape[:2] == v.shape[:2] == (64, 64)
        if i % 3 == 0:  # the input column: the files' own pixels (a float tensor's display copy is min-max scaled)
            np.testing.assert_allclose(u, x[i // 3].permute(1, 2, 0).numpy(), rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(u, v)  # the same inputs, so the same maps bit for bit


def test_grid_preprocess_still_given_wins(model, files):
    paths, _, _ = files
    fig = hv.grid(paths[:1], ["saliency"], model=model, preprocess="imagenet", show_input=False)
    assert _cells(fig)[0].shape[:2] == (224, 224)


def test_visualize_from_paths_equals_tensors(model, files):
    paths, x, labels = files
    e = hv.GradCAM(model).visualize(paths)
    ref = hv.GradCAM(model).attribute(x)
    assert e.targets.flatten().tolist() == labels
    torch.testing.assert_close(e.attribution, ref, rtol=0, atol=0)
    assert "the model's own preset" in e.preprocess


def test_explain_dataset_from_paths_equals_tensors(model, files, tmp_path):
    paths, x, labels = files
    store = hv.explain_dataset(hv.GradCAM(model), paths, tmp_path / "paths", progress=False, dtype="float32")
    ref = hv.explain_dataset(hv.GradCAM(model), list(x), tmp_path / "tensors", progress=False, dtype="float32")
    assert store.targets.flatten().tolist() == labels
    torch.testing.assert_close(store[:], ref[:], rtol=0, atol=0)
    record = store.manifest["data"]
    assert record["kind"] == "files" and record["preprocess"] == "auto" and len(record["files"]) == 4


def test_image_files_dataset_checks_first(model):
    with pytest.raises(TypeError, match=r"images: expected a non-empty list of image paths.*got list \(empty\)"):
        hv.dataset.ImageFiles([], model)
    with pytest.raises(ValueError, match=r"labels: expected one per image \(1\), got 2"):
        hv.dataset.ImageFiles(["a.png"], model, labels=[0, 1])


def test_report_feeds_files_by_the_models_own_rule(model, files, tmp_path):
    from hookviz.report.sources import resolve_items

    paths, x, _ = files
    # a list of paths passed as data, and the "files" record explain_dataset keeps: both give the model's inputs
    items = resolve_items(paths, None, 4, (3, 64, 64), model)
    torch.testing.assert_close(items.inputs(0, 4), x, rtol=0, atol=0)
    store = hv.explain_dataset(hv.Saliency(model), paths, tmp_path / "run", progress=False)
    items = resolve_items(None, store.manifest["data"], 4, (3, 64, 64), model)
    torch.testing.assert_close(items.inputs(1, 3), x[1:3], rtol=0, atol=0)
    assert items.names == [p.rsplit("/", 1)[-1] for p in paths]
    index = hv.report(tmp_path / "run", tmp_path / "report", model=model)
    assert index.is_file()


def test_cli_model_file_uses_the_models_own_rule(model, tmp_path):
    from hookviz.cli.models import _load_model

    path = tmp_path / "shapes.pt"
    torch.save(model, path)
    args = argparse.Namespace(model=str(path), weights=None, size=None, device="cpu", trust_pickle=True)
    _, preprocess, _, _ = _load_model(args)
    assert preprocess == model.hookviz_preset  # on main: a 224 px ImageNet preset
    args.size = 96  # --size still asks for another input size
    assert _load_model(args)[1].crop == 96
    # a torchvision model without weights: ImageNet's preset, as visualize and grid give it (main: resize 224)
    args = argparse.Namespace(model="torchvision:resnet18", weights=None, size=None, device="cpu", trust_pickle=False)
    model, preprocess, _, _ = _load_model(args)
    assert preprocess == hv.auto_preprocess(model)[0] == hv.IMAGENET
