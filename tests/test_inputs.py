from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.transforms._presets import ImageClassification

from hookviz.images import IMAGENET, PRESETS, Batch, Preset, load_images
from hookviz.inputs import (
    check_channels,
    check_finite,
    expected_channels,
    finite_checks_deferred,
    model_device,
    read_deferred,
)

MEAN = (0.5, 0.25, 0.125)
STD = (0.5, 0.25, 0.5)
SMALL = Preset("t", 36, 32, MEAN, STD)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.fixture
def rgb_array() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(32, 40, 3), dtype=np.uint8)


def _chw(arr: np.ndarray) -> torch.Tensor:
    """Reference conversion of an HxWx3 uint8 array to float (3, H, W) in [0, 1]."""
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255


# --- Preset ----------------------------------------------------------------------------------------------------------


def test_presets_registry() -> None:
    assert PRESETS["imagenet"] is IMAGENET
    assert IMAGENET == Preset("imagenet", 256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert PRESETS["none"] == Preset("none", None, None, None, None)


def test_preset_coerces_lists_to_float_tuples() -> None:
    p = Preset("p", None, None, [0, 0.5, 1], [1, 2, 3])
    assert p.mean == (0.0, 0.5, 1.0) and p.std == (1.0, 2.0, 3.0)
    hash(p)  # frozen and made of tuples, so usable as a dict key


def test_geometry_output_size(gen: torch.Generator) -> None:
    img = torch.rand(3, 40, 50, generator=gen)
    assert SMALL.geometry(img).shape == (3, 32, 32)
    assert SMALL.geometry(img[None].repeat(2, 1, 1, 1)).shape == (2, 3, 32, 32)
    # resize acts on the shorter side and keeps the aspect ratio
    assert Preset("r", 20, None, None, None).geometry(img).shape == (3, 20, 25)
    assert Preset("c", None, 16, None, None).geometry(img).shape == (3, 16, 16)
    assert PRESETS["none"].geometry(img) is img


def test_geometry_center_crop_takes_the_middle() -> None:
    img = torch.zeros(1, 6, 6)
    img[:, 2:4, 2:4] = 1
    out = Preset("c", None, 2, None, None).geometry(img)
    torch.testing.assert_close(out, torch.ones(1, 2, 2))


def test_imagenet_normalize_values_and_round_trip(gen: torch.Generator) -> None:
    mean = torch.tensor(IMAGENET.mean).view(3, 1, 1)
    std = torch.tensor(IMAGENET.std).view(3, 1, 1)
    torch.testing.assert_close(IMAGENET.normalize(mean.expand(3, 4, 5)), torch.zeros(3, 4, 5))
    torch.testing.assert_close(IMAGENET.normalize((mean + std).expand(3, 4, 5)), torch.ones(3, 4, 5))
    img = torch.rand(2, 3, 8, 9, generator=gen)
    x = IMAGENET.normalize(img)
    assert x.shape == img.shape
    torch.testing.assert_close(x, (img - mean) / std)
    torch.testing.assert_close(IMAGENET.denormalize(x), img)
    torch.testing.assert_close(IMAGENET.denormalize(x[0]), img[0])


def test_denormalize_clamps_to_unit_range() -> None:
    x = torch.tensor([-100.0, 0.0, 100.0]).view(1, 1, 3).expand(3, 1, 3)  # three pixels, same in every channel
    out = IMAGENET.denormalize(x)
    assert torch.equal(out[:, 0, 0], torch.zeros(3)) and torch.equal(out[:, 0, 2], torch.ones(3))
    torch.testing.assert_close(out[:, 0, 1], torch.tensor(IMAGENET.mean))
    assert torch.equal(PRESETS["none"].denormalize(x), x.clamp(0, 1))


def test_single_value_mean_std_broadcasts_over_channels() -> None:
    p = Preset("g", None, None, (0.5,), (0.25,))
    torch.testing.assert_close(p.normalize(torch.ones(2, 1, 1)), torch.full((2, 1, 1), 2.0))


def test_preset_call_is_normalize_of_geometry(gen: torch.Generator) -> None:
    img = torch.rand(3, 40, 50, generator=gen)
    torch.testing.assert_close(SMALL(img), SMALL.normalize(SMALL.geometry(img)))
    assert PRESETS["none"](img) is img


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"resize": 0}, ValueError, r"Preset\.resize: expected a positive int .* got 0"),
        ({"crop": "224"}, TypeError, r"Preset\.crop: expected a positive int .* got '224'"),
        ({"resize": True}, TypeError, r"Preset\.resize"),
        ({"resize": 16, "crop": 32}, ValueError, r"crop=32 is larger than resize=16"),
        ({"std": None}, ValueError, r"mean and std must both be set or both be None"),
        ({"std": (1.0, 1.0)}, ValueError, r"mean has 3 values but std has 2"),
        ({"std": (1.0, 0.0, 1.0)}, ValueError, r"Preset\.std: expected positive values"),
        ({"mean": "rgb"}, TypeError, r"Preset\.mean: expected a sequence of floats"),
        ({"mean": (0.0, float("nan"), 0.0)}, ValueError, r"Preset\.mean: expected finite values"),
        ({"mean": (), "std": ()}, ValueError, r"Preset\.mean: expected at least one value"),
        ({"name": 3}, TypeError, r"Preset\.name: expected a str"),
    ],
)
def test_preset_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    args = {"name": "t", "resize": 36, "crop": 32, "mean": MEAN, "std": STD} | kwargs
    with pytest.raises(error, match=match):
        Preset(**args)


def test_preset_methods_reject_bad_tensors() -> None:
    with pytest.raises(ValueError, match=r"preset 'imagenet' has 3 mean/std values but the image has 1 channels"):
        IMAGENET.normalize(torch.zeros(1, 4, 4))
    with pytest.raises(TypeError, match=r"geometry: img: expected a float tensor in \[0, 1\], got dtype torch\.uint8"):
        IMAGENET.geometry(torch.zeros(3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"denormalize: x: expected a tensor \(C, H, W\) or \(N, C, H, W\), got shape"):
        IMAGENET.denormalize(torch.zeros(4, 4))
    with pytest.raises(TypeError, match=r"normalize: img: expected a float tensor .* got ndarray"):
        IMAGENET.normalize(np.zeros((3, 4, 4)))


# --- load_images: numpy ----------------------------------------------------------------------------------------------


def test_uint8_grayscale_array_exact_values() -> None:
    batch = load_images(np.array([[255, 0]], dtype=np.uint8), preprocess=None)
    assert isinstance(batch, Batch)
    expected = torch.tensor([[1.0, 0.0]]).expand(1, 3, 1, 2)
    assert torch.equal(batch.tensor, expected)
    assert torch.equal(batch.images, expected)
    assert batch.tensor.dtype == torch.float32 and batch.images.dtype == torch.float32
    assert batch.tensor.is_contiguous() and batch.images.is_contiguous()


def test_uint8_rgb_array_exact_values() -> None:
    arr = np.array([[[255, 0, 51], [0, 102, 255]]], dtype=np.uint8)
    batch = load_images(arr, preprocess=None)
    assert batch.tensor.shape == (1, 3, 1, 2)
    torch.testing.assert_close(batch.tensor[0, :, 0, 0], torch.tensor([1.0, 0.0, 0.2]))
    torch.testing.assert_close(batch.tensor[0, :, 0, 1], torch.tensor([0.0, 0.4, 1.0]))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_array_keeps_values(dtype: type) -> None:
    arr = np.array([[[0.0, 0.5, 1.0], [0.25, 0.75, 0.125]]], dtype=dtype)
    batch = load_images(arr, preprocess="none")
    assert batch.tensor.dtype == torch.float32
    torch.testing.assert_close(batch.tensor[0], torch.from_numpy(arr.astype(np.float32)).permute(2, 0, 1))


def test_bool_and_single_channel_arrays() -> None:
    batch = load_images(np.array([[True, False]]), preprocess=None)
    assert torch.equal(batch.tensor[0, :, 0], torch.tensor([[1.0, 0.0]] * 3))
    batch = load_images(np.array([[[255], [0]]], dtype=np.uint8), preprocess=None)
    assert torch.equal(batch.tensor[0, :, 0], torch.tensor([[1.0, 0.0]] * 3))


def test_grayscale_gives_three_identical_channels(rgb_array: np.ndarray) -> None:
    batch = load_images(rgb_array[..., 0], preprocess=SMALL)
    assert batch.images.shape == (1, 3, 32, 32)
    assert torch.equal(batch.images[:, 0], batch.images[:, 1]) and torch.equal(batch.images[:, 0], batch.images[:, 2])


def test_rgba_array_alpha_composited_over_white() -> None:
    arr = np.array([[[10, 20, 30, 0], [255, 0, 0, 255], [0, 0, 0, 51]]], dtype=np.uint8)
    batch = load_images(arr, preprocess=None)
    assert torch.equal(batch.tensor[0, :, 0, 0], torch.ones(3))  # fully transparent -> white
    assert torch.equal(batch.tensor[0, :, 0, 1], torch.tensor([1.0, 0.0, 0.0]))  # opaque -> its colour
    torch.testing.assert_close(batch.tensor[0, :, 0, 2], torch.full((3,), 0.8))  # 20% black over white


def test_channels_1_reads_luminance() -> None:
    arr = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]]], dtype=np.uint8)
    batch = load_images(arr, preprocess=None, channels=1)
    assert batch.tensor.shape == (1, 1, 1, 3)
    torch.testing.assert_close(batch.tensor[0, 0, 0], torch.tensor([0.299, 0.587, 0.114]))
    # the display is still 3 channels
    assert batch.images.shape == (1, 3, 1, 3)
    torch.testing.assert_close(batch.images[0, 1], batch.tensor[0, 0])
    gray = load_images(np.array([[255, 0]], dtype=np.uint8), preprocess=None, channels=1)
    assert torch.equal(gray.tensor, torch.tensor([[[[1.0, 0.0]]]]))


def test_channels_1_with_single_value_preset() -> None:
    preset = Preset("g", None, None, (0.5,), (0.5,))
    batch = load_images(np.array([[255, 0]], dtype=np.uint8), preprocess=preset, channels=1)
    assert torch.equal(batch.tensor, torch.tensor([[[[1.0, -1.0]]]]))


def test_numpy_input_is_not_modified(rgb_array: np.ndarray) -> None:
    before = rgb_array.copy()
    batch = load_images(rgb_array, preprocess=None)
    batch.tensor.zero_()
    assert np.array_equal(rgb_array, before)


@pytest.mark.filterwarnings("error")  # torch warns on non-writable numpy buffers
def test_odd_numpy_layouts_are_accepted(rgb_array: np.ndarray) -> None:
    flipped = rgb_array[::-1]  # negative strides, which torch.from_numpy rejects
    assert torch.equal(load_images(flipped, preprocess=None).tensor[0], _chw(flipped.copy()))
    readonly = rgb_array.copy()
    readonly.setflags(write=False)
    assert torch.equal(load_images(readonly, preprocess=None).tensor[0], _chw(rgb_array))
    big_endian = (rgb_array / 255).astype(">f4")
    torch.testing.assert_close(load_images(big_endian, preprocess=None).tensor[0], _chw(rgb_array))


# --- load_images: PIL and paths --------------------------------------------------------------------------------------


def test_pil_rgb_matches_array(rgb_array: np.ndarray) -> None:
    batch = load_images(Image.fromarray(rgb_array), preprocess=None)
    assert torch.equal(batch.tensor[0], _chw(rgb_array))


def test_pil_grayscale_and_bilevel() -> None:
    gray = Image.fromarray(np.array([[255, 0]], dtype=np.uint8))
    assert torch.equal(load_images(gray, preprocess=None).tensor, torch.tensor([[1.0, 0.0]]).expand(1, 3, 1, 2))
    bilevel = gray.convert("1")
    assert torch.equal(load_images(bilevel, preprocess=None).tensor, torch.tensor([[1.0, 0.0]]).expand(1, 3, 1, 2))


def test_pil_rgba_and_la_alpha_zero_is_white() -> None:
    rgba = Image.fromarray(np.array([[[10, 20, 30, 0], [0, 0, 255, 255]]], dtype=np.uint8), mode="RGBA")
    out = load_images(rgba, preprocess=None).tensor[0, :, 0]
    assert torch.equal(out, torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]))
    la = Image.fromarray(np.array([[[0, 0], [0, 255]]], dtype=np.uint8), mode="LA")
    out = load_images(la, preprocess=None, channels=1).tensor
    assert torch.equal(out, torch.tensor([[[[1.0, 0.0]]]]))


def test_pil_palette_with_transparency_is_white() -> None:
    im = Image.new("P", (2, 1))
    im.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    im.putpixel((1, 0), 1)
    im.info["transparency"] = 0  # palette index 0 (black) is transparent
    out = load_images(im, preprocess=None).tensor[0, :, 0]
    assert torch.equal(out, torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]))


def test_pil_16_bit_and_float_modes() -> None:
    im16 = Image.fromarray(np.array([[0, 65535]], dtype=np.uint16))
    assert im16.mode == "I;16"
    assert torch.equal(load_images(im16, preprocess=None).tensor[0, :, 0], torch.tensor([[0.0, 1.0]] * 3))
    im32 = Image.fromarray(np.array([[0, 65535]], dtype=np.int32))
    assert im32.mode == "I"
    assert torch.equal(load_images(im32, preprocess=None).tensor[0, 0, 0], torch.tensor([0.0, 1.0]))
    imf = Image.fromarray(np.array([[0.0, 0.5]], dtype=np.float32))
    assert imf.mode == "F"
    assert torch.equal(load_images(imf, preprocess=None).tensor[0, 0, 0], torch.tensor([0.0, 0.5]))


def test_pil_bad_value_ranges() -> None:
    with pytest.raises(ValueError, match=r"mode 'I' is read as 16-bit .* span \[-5, 3\]"):
        load_images(Image.fromarray(np.array([[-5, 3]], dtype=np.int32)))
    with pytest.raises(ValueError, match=r"PIL image of mode 'F'.*found values in \[0, 2\]"):
        load_images(Image.fromarray(np.array([[0.0, 2.0]], dtype=np.float32)))


def test_path_to_png(tmp_path, rgb_array: np.ndarray) -> None:
    path = tmp_path / "img.png"
    Image.fromarray(rgb_array).save(path)
    for p in (path, str(path)):
        batch = load_images(p, preprocess=None)
        assert torch.equal(batch.tensor[0], _chw(rgb_array))
    batch = load_images(path, preprocess=SMALL)
    assert batch.tensor.shape == (1, 3, 32, 32) and batch.preprocess is SMALL


def test_path_errors(tmp_path) -> None:
    missing = tmp_path / "missing.png"
    with pytest.raises(FileNotFoundError, match=r"images: no such file .*missing\.png"):
        load_images(missing)
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    with pytest.raises(ValueError, match=r"images\[1\]: .*notes\.txt' is not an image file PIL can read"):
        load_images([np.zeros((4, 4), np.uint8), str(text)])
    with pytest.raises(IsADirectoryError, match=r"is a directory; pass the path of an image file"):
        load_images(tmp_path)


def test_truncated_image_file(tmp_path, rgb_array: np.ndarray) -> None:
    path = tmp_path / "cut.png"
    Image.fromarray(rgb_array).save(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"could not decode image file .*cut\.png"):
        load_images(path)


# --- load_images: tensors --------------------------------------------------------------------------------------------


def test_3d_tensor_gets_batch_axis_and_is_unchanged(gen: torch.Generator) -> None:
    x = torch.randn(3, 8, 10, generator=gen) * 5
    batch = load_images(x)  # default preset must NOT be applied to tensors
    assert batch.tensor.shape == (1, 3, 8, 10)
    assert torch.equal(batch.tensor[0], x)
    assert batch.preprocess is None
    batch.tensor.zero_()  # a copy: the caller's tensor is left alone
    assert x.abs().sum() > 0


def test_4d_tensor_and_dtype_conversion(gen: torch.Generator) -> None:
    x = torch.randn(2, 3, 8, 10, generator=gen, dtype=torch.float64)
    batch = load_images(x, preprocess=IMAGENET)
    assert batch.tensor.dtype == torch.float32 and batch.tensor.shape == (2, 3, 8, 10)
    torch.testing.assert_close(batch.tensor, x.float())
    half = load_images(x.half()).tensor
    assert half.dtype == torch.float32


def test_tensor_requiring_grad_is_detached(gen: torch.Generator) -> None:
    x = torch.randn(3, 4, 4, generator=gen, requires_grad=True)
    batch = load_images(x)
    assert not batch.tensor.requires_grad and batch.tensor.grad_fn is None


def test_tensor_display_is_per_image_min_max() -> None:
    x = torch.stack([torch.arange(12.0).view(3, 2, 2), -10 * torch.arange(12.0).view(3, 2, 2)])
    images = load_images(x).images
    assert images.shape == (2, 3, 2, 2)
    torch.testing.assert_close(images[0].flatten(), torch.arange(12.0) / 11)
    torch.testing.assert_close(images[1].flatten(), 1 - torch.arange(12.0) / 11)


def test_constant_tensor_display_is_zeros_not_nan() -> None:
    images = load_images(torch.full((3, 4, 4), 7.0)).images
    assert not images.isnan().any()
    assert torch.equal(images, torch.zeros(1, 3, 4, 4))


def test_tensor_display_channels() -> None:
    one = load_images(torch.arange(4.0).view(1, 1, 2, 2)).images
    assert one.shape == (1, 3, 2, 2)
    torch.testing.assert_close(one[0, 2].flatten(), torch.tensor([0.0, 1 / 3, 2 / 3, 1.0]))
    assert torch.equal(one[:, 0], one[:, 2])
    four = torch.zeros(1, 4, 1, 2)
    four[0, 0, 0, 1] = 4.0  # min-max over all channels first: [[0, 1], 0, 0, 0], then mean over channels
    out = load_images(four).images
    assert out.shape == (1, 3, 1, 2)
    torch.testing.assert_close(out[0, :, 0], torch.tensor([[0.0, 0.25]] * 3))


# --- load_images: presets and callables ------------------------------------------------------------------------------


def test_default_imagenet_preset(rgb_array: np.ndarray) -> None:
    batch = load_images(rgb_array)
    assert batch.preprocess is IMAGENET
    assert batch.tensor.shape == (1, 3, 224, 224) and batch.images.shape == (1, 3, 224, 224)
    torch.testing.assert_close(batch.images[0], IMAGENET.geometry(_chw(rgb_array)).clamp(0, 1))
    torch.testing.assert_close(batch.tensor, IMAGENET.normalize(batch.images))


def test_small_preset_values(rgb_array: np.ndarray) -> None:
    batch = load_images([rgb_array, rgb_array[:, ::-1]], preprocess=SMALL)
    assert batch.tensor.shape == (2, 3, 32, 32)
    assert batch.images.min() >= 0 and batch.images.max() <= 1
    torch.testing.assert_close(batch.images[0], SMALL.geometry(_chw(rgb_array)))
    torch.testing.assert_close(batch.tensor, SMALL.normalize(batch.images))
    torch.testing.assert_close(SMALL.denormalize(batch.tensor), batch.images)


def test_none_preset_keeps_size(rgb_array: np.ndarray) -> None:
    for preprocess in (None, "none"):
        batch = load_images(rgb_array, preprocess=preprocess)
        assert batch.tensor.shape == (1, 3, 32, 40)
        assert torch.equal(batch.tensor, batch.images)
        assert batch.preprocess is PRESETS["none"]


class _Normalizer:
    """A callable preprocess with torchvision-style mean/std attributes (lists)."""

    def __init__(self) -> None:
        self.mean, self.std = list(MEAN), list(STD)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return (img - torch.tensor(self.mean).view(3, 1, 1)) / torch.tensor(self.std).view(3, 1, 1)


def test_callable_with_mean_std_is_denormalized_for_display(rgb_array: np.ndarray) -> None:
    fn = _Normalizer()
    batch = load_images(rgb_array, preprocess=fn)
    assert batch.preprocess is fn
    torch.testing.assert_close(batch.tensor[0], fn(_chw(rgb_array)))
    torch.testing.assert_close(batch.images[0], _chw(rgb_array))


def test_torchvision_image_classification_transform(rgb_array: np.ndarray) -> None:
    tf = ImageClassification(crop_size=32, resize_size=36, mean=MEAN, std=STD)
    batch = load_images(rgb_array, preprocess=tf)
    torch.testing.assert_close(batch.tensor, SMALL(_chw(rgb_array))[None])
    torch.testing.assert_close(batch.images, SMALL.geometry(_chw(rgb_array))[None].clamp(0, 1))


def test_callable_without_mean_std_is_min_max_for_display() -> None:
    arr = np.array([[0, 255]], dtype=np.uint8)
    batch = load_images(arr, preprocess=lambda img: img * 10 - 3)
    torch.testing.assert_close(batch.tensor[0, :, 0], torch.tensor([[-3.0, 7.0]] * 3))
    torch.testing.assert_close(batch.images[0, :, 0], torch.tensor([[0.0, 1.0]] * 3))


def test_callable_errors(rgb_array: np.ndarray) -> None:
    def boom(img: torch.Tensor) -> torch.Tensor:
        raise KeyError("boom")

    with pytest.raises(RuntimeError, match=r"images: preprocess function failed on a float \(C, H, W\) tensor"):
        load_images(rgb_array, preprocess=boom)
    with pytest.raises(TypeError, match=r"must return a float \(C, H, W\) tensor, got ndarray"):
        load_images(rgb_array, preprocess=lambda img: img.numpy())
    with pytest.raises(TypeError, match=r"got shape \(1, 3, 32, 40\) dtype torch\.float32"):
        load_images(rgb_array, preprocess=lambda img: img[None])

    class BadStats(_Normalizer):
        def __init__(self) -> None:
            self.mean, self.std = "abc", [1.0, 1.0, 1.0]

    with pytest.raises(ValueError, match=r"preprocess: BadStats has mean='abc' .* cannot be used to undo"):
        load_images(rgb_array, preprocess=BadStats())


# --- load_images: lists, devices and argument errors -----------------------------------------------------------------


def test_mixed_list(tmp_path, rgb_array: np.ndarray) -> None:
    path = tmp_path / "a.png"
    Image.fromarray(rgb_array).save(path)
    tensor = torch.rand(2, 3, 32, 40, generator=torch.Generator().manual_seed(1))
    batch = load_images(
        (path, Image.fromarray(rgb_array), rgb_array, rgb_array[..., 0], tensor, tensor[0]), preprocess=None
    )
    assert batch.tensor.shape == (7, 3, 32, 40) and batch.images.shape == (7, 3, 32, 40)
    for i in range(3):
        assert torch.equal(batch.tensor[i], _chw(rgb_array))
    assert torch.equal(batch.tensor[3, 1], _chw(rgb_array)[0])
    assert torch.equal(batch.tensor[4:6], tensor) and torch.equal(batch.tensor[6], tensor[0])
    assert batch.preprocess is PRESETS["none"]


def test_sizes_must_agree(rgb_array: np.ndarray) -> None:
    small = np.zeros((20, 20), np.uint8)
    with pytest.raises(ValueError, match=r"32x40 at images\[0\], images\[2\]; 20x20 at images\[1\]; .*crops"):
        load_images([rgb_array, small, rgb_array], preprocess=None)
    # a cropping preset makes them agree
    assert load_images([rgb_array, small], preprocess=SMALL).tensor.shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"32x32 at images\[0\]; 8x8 at images\[1\]"):
        load_images([rgb_array, torch.zeros(3, 8, 8)], preprocess=SMALL)


def test_channel_counts_must_agree(rgb_array: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"same number of channels, got 3 at images\[0\]; 1 at images\[1\] channels"):
        load_images([rgb_array, torch.zeros(1, 32, 40)], preprocess=None)


def test_device_argument(rgb_array: np.ndarray) -> None:
    for device in ("cpu", torch.device("cpu"), None):
        batch = load_images(rgb_array, device=device, preprocess=None)
        assert batch.tensor.device.type == "cpu" and batch.images.device.type == "cpu"
    with pytest.raises(ValueError, match=r"device: 'gpu7' is not a valid device"):
        load_images(rgb_array, device="gpu7")
    with pytest.raises(TypeError, match=r"device: expected a torch\.device, a str"):
        load_images(rgb_array, device=0)


class _Where(_Normalizer):
    """_Normalizer with its constants on the image's device, recording the device of each image it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: list[torch.device] = []

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        self.devices.append(img.device)
        mean, std = (torch.tensor(v).view(3, 1, 1).to(img.device) for v in (self.mean, self.std))
        return (img - mean) / std


def test_callable_runs_where_the_pixels_are(rgb_array: np.ndarray) -> None:
    # no GPU here: the meta device stands in for it (a CPU constant meeting a meta tensor fails like one meeting a
    # CUDA tensor). Decoded pixels go to the callable on the CPU, and its output moves to `device`.
    fn = _Where()
    batch = load_images([rgb_array, torch.from_numpy(rgb_array.copy()).permute(2, 0, 1)], device="meta", preprocess=fn)
    assert fn.devices == [torch.device("cpu")] * 2
    assert batch.tensor.device.type == batch.images.device.type == "meta" and batch.tensor.shape == (2, 3, 32, 40)
    # a uint8 tensor that already lives on the device keeps running there
    fn = _Where()
    load_images(torch.zeros(3, 32, 40, dtype=torch.uint8, device="meta"), device="meta", preprocess=fn)
    assert fn.devices == [torch.device("meta")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device(rgb_array: np.ndarray) -> None:
    batch = load_images([rgb_array, torch.rand(3, 32, 32)], device="cuda", preprocess=SMALL)
    assert batch.tensor.is_cuda and batch.images.is_cuda
    torch.testing.assert_close(batch.tensor[0].cpu(), SMALL(_chw(rgb_array)))
    # a callable written for CPU images (CPU constants) runs on the CPU, where the pixels were decoded
    batch = load_images(rgb_array, device="cuda", preprocess=_Normalizer())
    assert batch.tensor.is_cuda and batch.images.is_cuda
    torch.testing.assert_close(batch.tensor[0].cpu(), _Normalizer()(_chw(rgb_array)))
    torch.testing.assert_close(batch.images[0].cpu(), _chw(rgb_array))
    # a uint8 tensor already on the GPU keeps running there; a preset runs on the GPU
    fn = _Where()
    on_gpu = torch.from_numpy(rgb_array.copy()).permute(2, 0, 1).cuda()
    batch = load_images(on_gpu, device="cuda", preprocess=fn)
    assert [d.type for d in fn.devices] == ["cuda"] and batch.tensor.is_cuda
    torch.testing.assert_close(batch.tensor[0].cpu(), _Normalizer()(_chw(rgb_array)))


@pytest.mark.parametrize(
    ("images", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, r"images: got an empty list"),
        ((), {}, ValueError, r"images: got an empty list"),
        (np.zeros((4, 4), np.uint8), {"preprocess": "resnet"}, ValueError, r"valid names are \['imagenet', 'none'\]"),
        (np.zeros((4, 4), np.uint8), {"preprocess": 3}, TypeError, r"preprocess: expected a preset name"),
        (np.zeros((4, 4), np.uint8), {"channels": 2}, ValueError, r"channels: expected 1 \(grayscale\) or 3 \(RGB\)"),
        (np.zeros((4, 4), np.uint8), {"channels": "3"}, TypeError, r"channels: expected the int 1 or 3, got '3'"),
        (
            np.zeros((4, 4), np.uint8),
            {"channels": 1},
            ValueError,
            r"preset 'imagenet' normalizes 3 channels but the images are loaded with channels=1; pass a Preset with "
            r"one mean/std value per channel or a single one for all, e.g. Preset\('imagenet', 256, 224, \(0\.449,\), "
            r"\(0\.226,\)\)",
        ),
        (np.full((4, 4), 255.0), {}, ValueError, r"found values in \[255, 255\]; divide by 255 .* or pass a tensor"),
        (np.full((4, 4), -0.5), {}, ValueError, r"float numpy images must lie in \[0, 1\], found .*-0\.5"),
        (np.full((4, 4), np.nan), {}, ValueError, r"image\): found 16 non-finite value\(s\) \(NaN or Inf\)"),
        (np.zeros((3, 32, 40), np.uint8), {}, ValueError, r"looks CxHxW; pass arr\.transpose\(1, 2, 0\)"),
        (np.zeros((32, 40, 5), np.uint8), {}, ValueError, r"HxW or HxWxC with C in \(1, 3, 4\), got shape"),
        (np.zeros((2, 32, 40, 3), np.uint8), {}, ValueError, r"for a batch pass a list of arrays"),
        (np.zeros((0, 4), np.uint8), {}, ValueError, r"got an empty image of shape \(0, 4\)"),
        (np.zeros((4, 4), np.int64), {}, TypeError, r"numpy image dtype int64 is not supported; expected uint8"),
        (np.zeros((4, 4), np.uint16), {}, TypeError, r"dtype uint16 .* arr / 65535"),
        # uint8 tensors are images (torchvision.io.read_image); other integer tensors are refused
        (torch.zeros(3, 4, 4, dtype=torch.int16), {}, TypeError, r"got dtype torch\.int16.*x\.float\(\) / 255"),
        (torch.zeros(5, 6, 3, dtype=torch.uint8), {}, ValueError, r"uint8 tensors are read as images.*permute"),
        (torch.zeros(4, 4), {}, ValueError, r"images: expected a tensor \(C, H, W\) or .*, got shape \(4, 4\)"),
        ([torch.zeros(1, 1, 3, 4, 4)], {}, ValueError, r"images\[0\]: .*got shape \(1, 1, 3, 4, 4\)"),
        (torch.zeros(0, 3, 4, 4), {}, ValueError, r"got an empty tensor of shape \(0, 3, 4, 4\)"),
        (42, {}, TypeError, r"images: expected a path, a PIL image, a numpy array .* got int"),
        ([[np.zeros((4, 4))]], {}, TypeError, r"images\[0\]: .*got list; nested lists are not supported"),
    ],
)
def test_load_images_errors(images: object, kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        load_images(images, **kwargs)


def test_channels_is_ignored_for_tensors() -> None:
    batch = load_images(torch.zeros(4, 2, 2), channels=4)
    assert batch.tensor.shape == (1, 4, 2, 2) and batch.images.shape == (1, 3, 2, 2)


# --- model helpers ---------------------------------------------------------------------------------------------------


def _net(in_channels: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3))


def test_model_device() -> None:
    assert model_device(_net()) == torch.device("cpu")
    assert model_device(nn.Conv2d(3, 4, 3, device="meta")).type == "meta"
    buffers_only = nn.BatchNorm2d(3, affine=False).to("meta")
    assert list(buffers_only.parameters()) == []
    assert model_device(buffers_only).type == "meta"
    assert model_device(nn.ReLU()) == torch.device("cpu")
    with pytest.raises(TypeError, match=r"model: expected a torch\.nn\.Module, got str"):
        model_device("resnet18")


def test_expected_channels() -> None:
    assert expected_channels(_net()) == 3
    assert expected_channels(nn.Sequential(nn.Sequential(nn.Identity(), _net(1)), _net(5))) == 1
    assert expected_channels(nn.Sequential(nn.Conv1d(2, 4, 3))) == 2
    assert expected_channels(nn.Conv3d(7, 4, 3)) == 7
    assert expected_channels(nn.Sequential(nn.Flatten(), nn.Linear(12, 2))) is None
    assert expected_channels(nn.Sequential(nn.LazyConv2d(4, 3))) is None  # in_channels unknown before first forward
    with pytest.raises(TypeError, match=r"model: expected a torch\.nn\.Module"):
        expected_channels(None)


def test_check_channels() -> None:
    net = _net()
    check_channels(net, torch.zeros(2, 3, 8, 8))
    with pytest.raises(
        ValueError,
        match=r"x has 1 channels \(shape \(2, 1, 8, 8\)\) but the model's first convolution '0' \(Conv2d\(3, 4, .*\)\) "
        r"expects 3; repeat its one channel: x\.expand\(-1, 3, \*x\.shape\[2:\]\)$",
    ):
        check_channels(net, torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"expects 1; average its channels to one: x\.mean\(dim=1, keepdim=True\)"):
        check_channels(_net(1), torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match=r"expects 5; give it the 5 channels the model was trained on"):
        check_channels(_net(5), torch.zeros(1, 3, 8, 8))
    check_channels(nn.Linear(3, 2), torch.zeros(2, 7))  # no convolution: nothing to check
    with pytest.raises(TypeError, match=r"x: expected a tensor \(N, C, \.\.\.\), got ndarray"):
        check_channels(net, np.zeros((1, 3, 8, 8)))
    with pytest.raises(ValueError, match=r"x: expected a tensor \(N, C, \.\.\.\) with a channel axis, got shape"):
        check_channels(net, torch.zeros(3))


def test_check_channels_on_a_loaded_batch(rgb_array: np.ndarray) -> None:
    net = _net()
    batch = load_images(rgb_array[..., 0], preprocess=SMALL)
    check_channels(net, batch.tensor)
    assert net(batch.tensor).shape == (1, 8, 28, 28)


def test_finite_checks_deferred_read_once_with_the_callers_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside `finite_checks_deferred` the checks queue their sums; `read_deferred` reads them with the caller's
    tensors in one `to_host`, raises for the first non-finite tensor by name and count, and returns the caller's
    values; outside the block (and after the read) `check_finite` raises at once."""
    good, bad = torch.ones(2, 3), torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]])
    extra = torch.tensor([[1, 0], [0, 1]], dtype=torch.uint8)
    calls: list[int] = []
    import hookviz.inputs as inputs_module

    real = inputs_module.to_host

    def counting(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        calls.append(len(tensors))
        return real(tensors)

    monkeypatch.setattr(inputs_module, "to_host", counting)
    with finite_checks_deferred():
        check_finite(good, "a")
        check_finite(good.double(), "b")
        (out,) = read_deferred([extra])
        assert torch.equal(out, extra) and calls == [3]  # two sums and the caller's tensor: one read
        with pytest.raises(ValueError, match=r"c: found 1 non-finite"):
            check_finite(bad[:1], "c")  # after the read: at once
    with finite_checks_deferred():
        check_finite(bad, "d")  # queued: nothing raised yet
        check_finite(good, "e")
        with pytest.raises(ValueError, match=r"d: found 2 non-finite value\(s\) \(NaN or Inf\) among 4"):
            read_deferred([])
    with finite_checks_deferred():
        check_finite(bad, "f")  # the block ends without a read (the call raised): the queue goes with it
    with pytest.raises(ValueError, match=r"g: found 2 non-finite"):
        check_finite(bad, "g")
