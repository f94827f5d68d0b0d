"""A Hugging Face image model's own preprocessing and class names (issue 27, point 6): ``config.image_size``,
``config.num_channels`` and ``config.id2label`` are read, so an image path reaches a ViT built for 64 px at 64 px
(on main it was resized to ImageNet's 224 and failed inside transformers)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import hookviz as hv
from hookviz.zoo import shapes_image

transformers = pytest.importorskip("transformers")


def _vit(image_size: int = 64, channels: int = 3, **config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(
        image_size=image_size,
        patch_size=16,
        num_channels=channels,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        **config,
    )
    return transformers.ViTForImageClassification._from_config(cfg).eval()


@pytest.fixture(scope="module")
def image_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hf") / "shapes.png"
    shapes_image(96, seed=1).save(path)  # 96 px: the preprocessing has to resize it to the model's 64
    return str(path)


def test_auto_preprocess_reads_the_config():
    preset, how = hv.auto_preprocess(_vit(64))
    assert (preset.resize, preset.crop) == (64, 64)
    # ViTImageProcessor's defaults: transformers' IMAGENET_STANDARD_MEAN / _STD
    assert preset.mean == (0.5, 0.5, 0.5) and preset.std == (0.5, 0.5, 0.5)
    assert "image_size 64" in how and "ViTImageProcessor" in how


def test_visualize_from_a_path_matches_the_image_processor(image_path):
    model = _vit(64, id2label={0: "cat", 1: "dog", 2: "fox"})
    e = hv.Saliency(model).visualize(image_path)
    assert e.attribution.shape == (1, 3, 64, 64)
    assert e.labels == ("cat", "dog", "fox")
    processor = transformers.ViTImageProcessor(size={"height": 64, "width": 64})
    ref = processor(images=Image.open(image_path), return_tensors="pt")["pixel_values"]
    # the processor resizes whole grey levels and hookviz floats: the resized pixels differ by up to one grey level
    # (1/255 in [0, 1]), 2/255 after its (x - 0.5) / 0.5
    torch.testing.assert_close(e.inputs, ref, rtol=0, atol=2 / 255)
    with torch.no_grad():
        top = model(pixel_values=ref).logits.argmax(1)
    assert e.targets.flatten().tolist() == top.tolist()


def test_grid_from_paths_on_a_vit_of_64_px(image_path):
    model = _vit(64, id2label={0: "cat", 1: "dog", 2: "fox"})
    fig = hv.grid([image_path, image_path], ["saliency", "gradcam"], model=model)
    cells = [ax.images[0].get_array() for ax in fig.axes if ax.images]
    assert [c.shape[:2] for c in cells] == [(64, 64)] * 6
    with torch.no_grad():
        x = hv.load_images(image_path, preprocess=hv.auto_preprocess(model)[0]).tensor
        name = ("cat", "dog", "fox")[int(model(pixel_values=x).logits.argmax())]
    assert [fig.axes[0].get_ylabel(), fig.axes[3].get_ylabel()] == [name, name]


def test_one_channel_config(image_path):
    model = _vit(32, channels=1)
    preset, _ = hv.auto_preprocess(model)
    assert (preset.crop, preset.mean, preset.std) == (32, (0.5,), (0.5,))  # one value for the single channel
    e = hv.Saliency(model).visualize(image_path)
    assert e.inputs.shape == (1, 1, 32, 32)


def test_id2label_placeholders_name_nothing():
    from hookviz.classes import class_names

    assert class_names(_vit(64, num_labels=3)) is None  # transformers' LABEL_0, LABEL_1, LABEL_2
    assert class_names(_vit(64, id2label={0: "a", 1: "b"})) == ("a", "b")
    assert class_names(torch.nn.Linear(2, 2)) is None


def test_a_non_square_config_is_refused_before_any_work():
    model = _vit(64)
    model.config.image_size = (64, 32)
    with pytest.raises(ValueError, match=r"model.config.image_size is \(64, 32\); .* pass preprocess= yourself"):
        hv.Saliency(model).visualize(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
