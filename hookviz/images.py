"""Images: paths, PIL images, numpy arrays and tensors -> a model-ready batch plus a copy a person can look at.

:func:`load_images` returns a :class:`Batch` holding two pixel-aligned tensors on one device:

- ``tensor``: (N, C, H, W) float32, what the model gets;
- ``images``: (N, 3, H, W) float32 in [0, 1], what is drawn under a saliency map.

Tensors are taken as model-ready and pass through unchanged. Everything else is read as float RGB (or L) in [0, 1]
and goes through a :class:`Preset` (resize the shorter side, center crop, normalize) or any callable.

Example::

    batch = load_images(["cat.png", "dog.jpg"], preprocess="imagenet", device=model_device(model))
    check_channels(model, batch.tensor)
    logits = model(batch.tensor)

Checks of a batch against a model (channels, rank, dtype, device) are in `hookviz.inputs`.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor, nn
from torchvision.transforms import InterpolationMode

from .inputs import check_finite, expected_channels

__all__ = [
    "IMAGENET",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PRESETS",
    "Batch",
    "ImageLike",
    "Preprocess",
    "Preset",
    "auto_preprocess",
    "choose_preprocess",
    "describe_preprocess",
    "load_images",
]

Preprocess = Callable[[Tensor], Tensor]
"""Float (C, H, W) tensor in [0, 1] -> (C, H, W) float tensor ready for the model."""

ImageLike = str | os.PathLike | Image.Image | np.ndarray | Tensor
"""One image (path, PIL image, HxW / HxWxC numpy array) or a model-ready (C, H, W) / (N, C, H, W) tensor."""

# ITU-R 601-2 luma, the weights PIL's convert("L") uses, so channels=1 matches what PIL would give.
_LUMA = (0.299, 0.587, 0.114)
_EPS = 1e-8


def _float_tuple(values: Any, name: str) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of floats such as (0.485, 0.456, 0.406), got {values!r}")
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: expected a sequence of floats such as (0.485, 0.456, 0.406), got {values!r}") from exc
    if not out:
        raise ValueError(f"{name}: expected at least one value (one per channel, or one for all), got {values!r}")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name}: expected finite values, got {out}")
    return out


def _check_float_image(img: Any, where: str) -> None:
    if not isinstance(img, Tensor):
        raise TypeError(f"{where}: expected a float tensor (C, H, W) or (N, C, H, W), got {type(img).__name__}")
    if img.ndim not in (3, 4):
        raise ValueError(f"{where}: expected a tensor (C, H, W) or (N, C, H, W), got shape {tuple(img.shape)}")
    if not img.is_floating_point():
        raise TypeError(
            f"{where}: expected a float tensor in [0, 1], got dtype {img.dtype}; convert with img.float() / 255"
        )


@dataclass(frozen=True)
class Preset:
    """Resize (shorter side) -> center crop -> normalize. Applied to float CHW or NCHW tensors in [0, 1].

    ``resize``/``crop`` of None skip that step; ``mean``/``std`` of None skip normalization. ``mean`` and ``std``
    hold one value per channel, or a single value for all channels. Lists are stored as tuples of floats.
    """

    name: str
    resize: int | None
    crop: int | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Preset.name: expected a str, got {type(self.name).__name__} {self.name!r}")
        for field in ("resize", "crop"):
            value = getattr(self, field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Preset.{field}: expected a positive int (pixels) or None, got {value!r}")
            if value < 1:
                raise ValueError(f"Preset.{field}: expected a positive int (pixels) or None, got {value}")
        # A crop larger than the resized side would be padded with black by center_crop.
        if self.resize is not None and self.crop is not None and self.crop > self.resize:
            raise ValueError(
                f"Preset {self.name!r}: crop={self.crop} is larger than resize={self.resize}, so the crop would be "
                f"padded with black; use crop <= resize (e.g. resize=256, crop=224)"
            )
        if (self.mean is None) != (self.std is None):
            raise ValueError(
                f"Preset {self.name!r}: mean and std must both be set or both be None, got mean={self.mean!r}, "
                f"std={self.std!r}"
            )
        if self.mean is None or self.std is None:
            return
        mean = _float_tuple(self.mean, "Preset.mean")
        std = _float_tuple(self.std, "Preset.std")
        if len(mean) != len(std):
            raise ValueError(
                f"Preset {self.name!r}: mean has {len(mean)} values but std has {len(std)}; give one per channel"
            )
        if any(s <= 0 for s in std):
            raise ValueError(f"Preset.std: expected positive values, got {std}")
        # Frozen dataclass: coerce lists to tuples so presets stay hashable and immutable.
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def _stats(self, img: Tensor, where: str) -> tuple[Tensor, Tensor] | None:
        """(mean, std) shaped (C or 1, 1, 1) on img's device and dtype; None when this preset does not normalize."""
        if self.mean is None or self.std is None:
            return None
        channels = img.shape[-3]
        if len(self.mean) not in (1, channels):
            raise ValueError(
                f"{where}: preset {self.name!r} has {len(self.mean)} mean/std values but the image has {channels} "
                f"channels (shape {tuple(img.shape)}); load 3-channel images (load_images(..., channels=3)) or use a "
                f"Preset with {channels} (or 1) mean/std values"
            )
        mean = torch.tensor(self.mean, dtype=img.dtype, device=img.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=img.dtype, device=img.device).view(-1, 1, 1)
        return mean, std

    def geometry(self, img: Tensor) -> Tensor:
        """Resize the shorter side to ``resize`` (bilinear, antialiased), then center-crop ``crop`` x ``crop``.

        img: (C, H, W) or (N, C, H, W) float. Returns the same layout, (..., crop, crop) when ``crop`` is set.
        """
        _check_float_image(img, f"Preset({self.name!r}).geometry: img")
        if self.resize is not None:
            img = TF.resize(img, [self.resize], interpolation=InterpolationMode.BILINEAR, antialias=True)
        if self.crop is not None:
            img = TF.center_crop(img, [self.crop])
        return img

    def normalize(self, img: Tensor) -> Tensor:
        """(img - mean) / std per channel. img: (C, H, W) or (N, C, H, W) float; same shape out (identity: no mean)."""
        where = f"Preset({self.name!r}).normalize: img"
        _check_float_image(img, where)
        stats = self._stats(img, where)
        if stats is None:
            return img
        mean, std = stats
        return (img - mean) / std

    def denormalize(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`normalize`, clamped to [0, 1] for display. x: (C, H, W) or (N, C, H, W); same shape out."""
        where = f"Preset({self.name!r}).denormalize: x"
        _check_float_image(x, where)
        stats = self._stats(x, where)
        if stats is None:
            return x.clamp(0, 1)
        mean, std = stats
        return (x * std + mean).clamp(0, 1)

    def __call__(self, img: Tensor) -> Tensor:
        """normalize(geometry(img)). img: (C, H, W) or (N, C, H, W) float in [0, 1]."""
        return self.normalize(self.geometry(img))


# the ImageNet statistics every torchvision and most timm classifiers were trained with (defined once, here)
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
IMAGENET = Preset("imagenet", 256, 224, IMAGENET_MEAN, IMAGENET_STD)
PRESETS: dict[str, Preset] = {"imagenet": IMAGENET, "none": Preset("none", None, None, None, None)}
# ImageNet's geometry and its statistics averaged over the channels: the default for a 1-channel model
IMAGENET_GRAY = Preset("imagenet-gray", 256, 224, (sum(IMAGENET_MEAN) / 3,), (sum(IMAGENET_STD) / 3,))


class _TimmTransform:
    """timm's eval transform (resize, center crop, normalize) for float (C, H, W) tensors in [0, 1], with the
    ``mean``/``std`` attributes `load_images` uses to undo the normalization for display."""

    def __init__(self, config: dict[str, Any], transform: Callable[[Tensor], Tensor]) -> None:
        self.config = config
        self.transform = transform
        self.mean = tuple(config["mean"])
        self.std = tuple(config["std"])

    def __call__(self, img: Tensor) -> Tensor:
        return self.transform(img)

    def __repr__(self) -> str:
        c = self.config
        size = "x".join(map(str, c["input_size"][1:]))
        return (
            f"timm data config ({size}, crop_pct {c.get('crop_pct')}, {c.get('interpolation')}, "
            f"mean {tuple(round(v, 4) for v in self.mean)}, std {tuple(round(v, 4) for v in self.std)})"
        )


def _timm_preprocess(model: nn.Module) -> _TimmTransform | None:
    """timm's ``resolve_data_config`` + ``create_transform`` for a timm model (one with a ``pretrained_cfg``)."""
    if not isinstance(getattr(model, "pretrained_cfg", None), dict):
        return None
    try:
        from timm.data import create_transform, resolve_data_config
    except ImportError:
        return None
    config = resolve_data_config({}, model=model)
    # on tensors: torchvision's Resize / CenterCrop take them, timm's MaybeToTensor passes them through
    return _TimmTransform(config, create_transform(**config, is_training=False))


def describe_preprocess(preprocess: Any) -> str:
    """A short name of a preprocessing for titles and reprs (a Preset's geometry and normalization, a callable's
    repr or class name)."""
    if preprocess is None:
        return "none"
    if isinstance(preprocess, str):
        preprocess = PRESETS.get(preprocess, preprocess)
    if isinstance(preprocess, Preset):
        geometry = []
        if preprocess.resize is not None:
            geometry.append(f"resize {preprocess.resize}")
        if preprocess.crop is not None:
            geometry.append(f"crop {preprocess.crop}")
        norm = "[0, 1]" if preprocess.mean is None else f"mean {preprocess.mean}, std {preprocess.std}"
        return f"{preprocess.name} ({', '.join(geometry + [norm])})"
    if isinstance(preprocess, _TimmTransform):
        return repr(preprocess)
    text = " ".join(repr(preprocess).split())
    return text if len(text) <= 160 else type(preprocess).__name__


@functools.lru_cache(maxsize=32)  # one processor built per model type, not per call
def _processor_stats(model_type: str) -> tuple[tuple[float, ...], tuple[float, ...], str] | None:
    """(mean, std, processor class name): the defaults of the Hugging Face image processor registered for
    `model_type` (e.g. ``ViTImageProcessor``: 0.5, 0.5); None when transformers has none for it."""
    try:
        from transformers.models.auto import image_processing_auto as auto
    except ImportError:
        return None
    names = auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    if isinstance(names, Mapping):  # transformers 5: {"pil": ..., "torchvision": ...}
        names = names.get("pil") or names.get("torchvision") or next(iter(names.values()), None)
    elif isinstance(names, (tuple, list)):  # transformers 4: (slow, fast)
        names = next((n for n in names if n), None)
    if not isinstance(names, str):
        return None
    try:
        processor = auto.get_image_processor_class_from_name(names)()
        mean, std = processor.image_mean, processor.image_std
        return tuple(float(v) for v in mean), tuple(float(v) for v in std), names
    except Exception:  # noqa: BLE001 - a processor that cannot be built with its defaults names no statistics
        return None


# transformers' IMAGENET_STANDARD_MEAN / _STD, what most of its image processors default to
_HF_STANDARD = (0.5, 0.5, 0.5)


def _hf_preprocess(model: nn.Module) -> tuple[Preset, str] | None:
    """A Hugging Face image model's own preprocessing, from its config: ``image_size`` (the side the patch and
    position embeddings are built for) and ``num_channels``, normalised with the mean and std its image processor
    class defaults to (`_processor_stats`; 0.5 / 0.5, transformers' standard, when there is none).

    Geometry: resize the shorter side to ``image_size``, then a center crop; the same pixels as the processors'
    direct resize to ``image_size`` x ``image_size`` for square images (a non-square image is cropped, not
    squashed). None for a model without such a config."""
    config = getattr(model, "config", None)
    size = getattr(config, "image_size", None)
    if config is None or size is None or not hasattr(config, "model_type"):
        return None
    if isinstance(size, (tuple, list)) and len(size) == 2 and size[0] == size[1]:
        size = size[0]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(
            f"model.config.image_size is {size!r}; hookviz reads a square side (an int) from it for "
            f"preprocess='auto'; pass preprocess= yourself (a Preset or a callable (C, H, W) -> (C, H, W))"
        )
    channels = getattr(config, "num_channels", 3)
    found = _processor_stats(str(config.model_type))
    mean, std, source = found if found is not None else (_HF_STANDARD, _HF_STANDARD, "transformers' standard")
    if len(mean) != channels or len(std) != channels:
        # another channel count than the processor's statistics: one value for every channel (their average)
        mean, std = (sum(mean) / len(mean),), (sum(std) / len(std),)
    preset = Preset(f"{config.model_type} config", size, size, mean, std)
    return preset, (
        f"the model's config (image_size {size}, num_channels {channels}; mean/std of {source}): "
        f"{describe_preprocess(preset)}"
    )


def auto_preprocess(model: nn.Module, weights: Any = None) -> tuple[Preset | Preprocess, str]:
    """The preprocessing `model` expects, and how it was found: the one rule of ``preprocess="auto"``, the default
    of every entry point that takes images (`visualize`, `hookviz.grid`, `hookviz.explain_dataset` and
    `hookviz.report` given image files, the command line).

    In order: a preset the model carries (``model.hookviz_preset``: a `Preset` or a callable; the shapes models of
    `hookviz.zoo` carry their 64x64, [0, 1] one); torchvision weights' ``transforms()`` when `weights` (a weights
    enum member) is given; a timm model's data config (``timm.data.resolve_data_config`` + ``create_transform``,
    when timm is installed and the model has a ``pretrained_cfg``); a Hugging Face image model's config
    (``config.image_size``, ``config.num_channels``, the mean/std its image processor class defaults to, see
    `_hf_preprocess`); else the ImageNet preset (for a model whose first convolution takes one channel, with the
    ImageNet mean and std averaged over the channels, `IMAGENET_GRAY`).
    """
    own = getattr(model, "hookviz_preset", None)
    if own is not None:
        if not (isinstance(own, Preset) or callable(own)):
            raise TypeError(
                f"model.hookviz_preset must be a hookviz.Preset or a callable (C, H, W) -> (C, H, W), got "
                f"{type(own).__name__}"
            )
        return own, f"the model's own preset: {describe_preprocess(own)}"
    if weights is not None:
        transforms = getattr(weights, "transforms", None)
        if not callable(transforms):
            raise TypeError(
                f"weights must be a torchvision weights enum member (e.g. ResNet18_Weights.DEFAULT), whose "
                f"transforms() gives its preprocessing; got {type(weights).__name__}"
            )
        return transforms(), f"{weights}.transforms(): {describe_preprocess(transforms())}"
    timm_transform = _timm_preprocess(model)
    if timm_transform is not None:
        return timm_transform, repr(timm_transform)
    hf = _hf_preprocess(model)
    if hf is not None:
        return hf
    if expected_channels(model) == 1:
        return IMAGENET_GRAY, f"default for a 1-channel model: {describe_preprocess(IMAGENET_GRAY)}"
    return IMAGENET, f"default: {describe_preprocess(IMAGENET)}"


def choose_preprocess(model: nn.Module, preprocess: Any = "auto", weights: Any = None) -> tuple[Any, str]:
    """(what to pass to `load_images` as ``preprocess``, a line saying what it is): `auto_preprocess` for
    ``"auto"``, else `preprocess` as given (a preset name, a `Preset`, a callable or None)."""
    if isinstance(preprocess, str) and preprocess == "auto":
        return auto_preprocess(model, weights)
    return preprocess, f"given: {describe_preprocess(preprocess)}"


@dataclass
class Batch:
    """What :func:`load_images` returns.

    tensor: (N, C, H, W) float32 on the requested device, what the model gets.
    images: (N, 3, H, W) float32 in [0, 1], same device and H, W as ``tensor``, what a person sees under the map.
    preprocess: the Preset or callable applied to non-tensor images (``PRESETS['none']`` for preprocess=None);
        None when every input was a tensor.
    """

    tensor: Tensor
    images: Tensor
    preprocess: Preset | Preprocess | None


def _resolve_preprocess(preprocess: Any) -> tuple[Preset | Preprocess, Preset | None]:
    """Return (transform, display): display turns the transform's output back into [0, 1] pixels, None = min-max."""
    if preprocess is None:
        return PRESETS["none"], PRESETS["none"]
    if isinstance(preprocess, str):
        if preprocess == "auto":
            raise ValueError(
                "preprocess: 'auto' needs the model, which load_images does not get; call a method's visualize(), "
                "or pass auto_preprocess(model)[0]"
            )
        if preprocess not in PRESETS:
            raise ValueError(
                f"preprocess: unknown preset {preprocess!r}; valid names are {sorted(PRESETS)}, or pass a Preset, "
                f"a callable (C, H, W) -> (C, H, W), or None"
            )
        preset = PRESETS[preprocess]
        return preset, preset
    if isinstance(preprocess, Preset):
        return preprocess, preprocess
    if not callable(preprocess):
        raise TypeError(
            f"preprocess: expected a preset name {sorted(PRESETS)}, a Preset, a callable (C, H, W) -> (C, H, W) or "
            f"None, got {type(preprocess).__name__}"
        )
    mean, std = getattr(preprocess, "mean", None), getattr(preprocess, "std", None)
    if mean is None or std is None:
        return preprocess, None
    # torchvision's ImageClassification exposes mean/std: undo them so the display shows the real pixels.
    try:
        display = Preset(type(preprocess).__name__, None, None, mean, std)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"preprocess: {type(preprocess).__name__} has mean={mean!r} and std={std!r} attributes that cannot be "
            f"used to undo its normalization for display ({exc}); give it per-channel float mean/std or remove them"
        ) from exc
    return preprocess, display


def _resolve_device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device: expected a torch.device, a str such as 'cuda:0', or None, got {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device: {device!r} is not a valid device; use e.g. 'cpu', 'cuda' or 'cuda:0'") from exc


def _uint8_images(x: Tensor, where: str) -> list[tuple[Tensor, str]]:
    """A uint8 image tensor (C, H, W) or (N, C, H, W), C in 1, 3, 4 (``torchvision.io.read_image``'s layout) ->
    one (C, H, W) uint8 tensor per image, each with its name for messages."""
    shape = tuple(x.shape)
    if x.ndim not in (3, 4) or shape[-3] not in (1, 3, 4):
        hint = (
            "; it looks channels-last (H, W, C): pass x.permute(2, 0, 1)"
            if x.ndim == 3 and shape[-1] in (1, 3, 4)
            else ""
        )
        raise ValueError(
            f"{where}: uint8 tensors are read as images (C, H, W) or (N, C, H, W) with C in 1, 3 or 4 (the layout "
            f"of torchvision.io.read_image), got shape {shape}{hint}; token ids go to visualize(..., tokens=True)"
        )
    if x.numel() == 0:
        raise ValueError(f"{where}: got an empty tensor of shape {shape}")
    if x.ndim == 3:
        return [(x.detach(), where)]
    return [(img, f"{where}[{k}]") for k, img in enumerate(x.detach())]


def _check_tensor(x: Tensor, where: str) -> Tensor:
    """Validate a model-ready tensor and give it a batch axis: (C, H, W) -> (1, C, H, W)."""
    if x.ndim not in (3, 4):
        raise ValueError(
            f"{where}: expected a tensor (C, H, W) or (N, C, H, W), got shape {tuple(x.shape)}; add a channel axis "
            f"to a 2-D image with x[None], or pass a list of (C, H, W) tensors instead of a 5-D one"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{where}: expected a float tensor, got dtype {x.dtype}; tensors are used as is (no preprocessing), so "
            f"convert and preprocess it yourself, e.g. IMAGENET(x.float() / 255), or pass a numpy array or PIL image"
        )
    if x.numel() == 0:
        raise ValueError(f"{where}: got an empty tensor of shape {tuple(x.shape)}")
    check_finite(x, where)
    return x if x.ndim == 4 else x[None]


def _pixels_from_array(arr: np.ndarray, where: str, allowed: tuple[int, ...] = (1, 3, 4)) -> Tensor:
    """HxW or HxWxC (C in ``allowed``) numpy image -> (C, H, W) CPU tensor, uint8 (0..255) or float32 in [0, 1]."""
    shape = arr.shape
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif arr.ndim == 3 and shape[-1] not in allowed:
        if shape[0] in (1, 3, 4):
            raise ValueError(
                f"{where}: numpy images are HxWxC but got shape {shape}, which looks CxHxW; pass arr.transpose(1, 2, 0)"
            )
        raise ValueError(f"{where}: numpy images are HxW or HxWxC with C in (1, 3, 4), got shape {shape}")
    elif arr.ndim != 3:
        raise ValueError(
            f"{where}: numpy images are HxW or HxWxC with C in (1, 3, 4), got shape {shape}; for a batch pass a list "
            f"of arrays (or a model-ready (N, C, H, W) tensor)"
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{where}: got an empty image of shape {shape}")
    # Copies below also fix negative strides, read-only buffers and non-native byte order that torch rejects.
    if arr.dtype == np.uint8:
        out = torch.from_numpy(np.array(arr, order="C", copy=True))
    elif arr.dtype == np.bool_ or arr.dtype.kind == "f":
        out = torch.from_numpy(arr.astype(np.float32, order="C"))
        check_finite(out, f"{where} (float numpy image)")
        lo, hi = out.min().item(), out.max().item()
        if lo < 0 or hi > 1:
            raise ValueError(
                f"{where}: float numpy images must lie in [0, 1], found values in [{lo:.4g}, {hi:.4g}]; divide by "
                f"255 if they are 0..255 pixel values, or pass a tensor (tensors are used as is, without preprocessing)"
            )
    else:
        raise TypeError(
            f"{where}: numpy image dtype {arr.dtype} is not supported; expected uint8 (0..255), bool, or float in "
            f"[0, 1]; convert e.g. with arr.astype(np.uint8) for 0..255 integers or arr / 65535 for 16-bit images"
        )
    return out.permute(2, 0, 1)


def _upright(im: Image.Image) -> Image.Image:
    """The image as it is meant to be seen: a JPEG's EXIF orientation (phone photos) applied, the tag removed."""
    try:
        orientation = im.getexif().get(0x0112, 1)  # 0x0112: the EXIF Orientation tag
    except Exception:  # a broken EXIF block is no reason to refuse the pixels
        return im
    return ImageOps.exif_transpose(im) if orientation not in (None, 1) else im


def _pixels_from_pil(im: Image.Image, where: str) -> Tensor:
    """PIL image -> (C, H, W) CPU tensor with C in 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA); uint8 or float32 in [0, 1].

    The EXIF orientation is applied first (`_upright`)."""
    im = _upright(im)
    mode = im.mode
    if mode.startswith("I;16"):
        # PIL's convert() clips 16-bit values at 255; scale them instead.
        return torch.from_numpy(np.asarray(im).astype(np.float32) / 65535)[None]
    if mode == "I":
        arr = np.asarray(im)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > 65535:
            raise ValueError(
                f"{where}: PIL image of mode 'I' is read as 16-bit (divided by 65535), but its values span "
                f"[{lo}, {hi}]; convert it to a float tensor in [0, 1] yourself"
            )
        return torch.from_numpy(arr.astype(np.float32) / 65535)[None]
    if mode == "F":
        return _pixels_from_array(np.asarray(im), where + " (PIL image of mode 'F')")
    transparent = "transparency" in im.info
    try:
        if mode in ("LA", "La") or (mode in ("1", "L") and transparent):
            im = im.convert("LA")
        elif mode in ("RGBA", "RGBa", "PA") or transparent:
            im = im.convert("RGBA")
        elif mode in ("1", "L"):
            im = im.convert("L")
        elif mode != "RGB":
            im = im.convert("RGB")
    except ValueError as exc:
        raise ValueError(f"{where}: cannot convert a PIL image of mode {mode!r} to RGB ({exc})") from exc
    # LA gives 2 channels, which only PIL produces, so only here is C == 2 allowed.
    return _pixels_from_array(np.asarray(im), where, allowed=(1, 2, 3, 4))


def _bomb_message(path: Path, exc: Exception, where: str) -> str:
    """PIL refuses images of more than twice ``Image.MAX_IMAGE_PIXELS`` pixels (a decompression bomb guard)."""
    found = re.search(r"\((\d+) pixels\)", str(exc))  # PIL: "Image size (N pixels) exceeds limit of M pixels, ..."
    pixels = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
    limit = Image.MAX_IMAGE_PIXELS
    allowed = f"{2 * limit:,} (twice PIL.Image.MAX_IMAGE_PIXELS = {limit:,})" if limit else "PIL's limit"
    return (
        f"{where}: {str(path)!r} has {pixels}, more than {allowed}, so PIL refuses to open it as a possible "
        "decompression bomb; if you trust the file, raise the limit before loading, e.g. "
        "PIL.Image.MAX_IMAGE_PIXELS = 10 * PIL.Image.MAX_IMAGE_PIXELS (None switches the check off)"
    )


def _pixels_from_path(path: Path, where: str) -> Tensor:
    if path.is_dir():
        raise IsADirectoryError(f"{where}: {str(path)!r} is a directory; pass the path of an image file")
    if not path.exists():
        raise FileNotFoundError(f"{where}: no such file {str(path)!r}")
    try:
        im = Image.open(path)
    except UnidentifiedImageError as exc:
        raise ValueError(f"{where}: {str(path)!r} is not an image file PIL can read") from exc
    except Image.DecompressionBombError as exc:
        raise ValueError(_bomb_message(path, exc, where)) from exc
    with im:
        try:
            im.load()
        except (OSError, SyntaxError, ValueError) as exc:
            raise ValueError(f"{where}: could not decode image file {str(path)!r} ({exc})") from exc
        return _pixels_from_pil(im, where)


def _pixels(item: Any, where: str) -> Tensor:
    if isinstance(item, (str, os.PathLike)):
        return _pixels_from_path(Path(item), where)
    if isinstance(item, Image.Image):
        return _pixels_from_pil(item, where)
    if isinstance(item, np.ndarray):
        return _pixels_from_array(item, where)
    raise TypeError(
        f"{where}: expected a path, a PIL image, a numpy array HxW / HxWxC or a tensor (C, H, W) / (N, C, H, W), got "
        f"{type(item).__name__}" + ("; nested lists are not supported" if isinstance(item, (list, tuple)) else "")
    )


def _to_float(pixels: Tensor, channels: int) -> Tensor:
    """(C, H, W) uint8 or float pixels, C in 1..4 (2 and 4 carry alpha) -> (channels, H, W) float32 in [0, 1]."""
    x = pixels.float() / 255 if pixels.dtype == torch.uint8 else pixels
    if x.shape[0] in (2, 4):
        # Composite over white: transparent pixels otherwise keep arbitrary (often black) colour values.
        color, alpha = x[:-1], x[-1:]
        x = color * alpha + (1 - alpha)
    if channels == 3 and x.shape[0] == 1:
        x = x.repeat(3, 1, 1)
    elif channels == 1 and x.shape[0] == 3:
        x = (x * x.new_tensor(_LUMA).view(3, 1, 1)).sum(0, keepdim=True)
    return x


def _minmax(x: Tensor) -> Tensor:
    """Per-image min-max over channels and pixels. x: (N, C, H, W) -> same shape in [0, 1]; constant -> zeros."""
    flat = x.flatten(1)
    lo = flat.amin(1).view(-1, 1, 1, 1)
    hi = flat.amax(1).view(-1, 1, 1, 1)
    return ((x - lo) / (hi - lo + _EPS)).clamp(0, 1)


def _to_rgb(x: Tensor) -> Tensor:
    """(N, C, H, W) in [0, 1] -> (N, 3, H, W): 1 channel repeated, other counts but 3 averaged then repeated."""
    if x.shape[1] == 3:
        return x
    if x.shape[1] != 1:
        x = x.mean(1, keepdim=True)
    return x.expand(-1, 3, -1, -1)


def _apply(
    transform: Preset | Preprocess, display: Preset | None, img: Tensor, device: torch.device, where: str
) -> tuple[Tensor, Tensor]:
    """Float (C, H, W) in [0, 1] -> (model input (1, C', H', W'), display (1, 3, H', W'))."""
    if isinstance(transform, Preset):
        # Antialiased bilinear is a convex combination, so clamping only removes float rounding.
        shown = transform.geometry(img).clamp(0, 1)
        return transform.normalize(shown)[None], _to_rgb(shown[None])
    try:
        out = transform(img)
    except Exception as exc:
        raise RuntimeError(
            f"{where}: preprocess {type(transform).__name__} failed on a float (C, H, W) tensor in [0, 1] of shape "
            f"{tuple(img.shape)} on {img.device}: {exc}. load_images hands tensors, not PIL images, to preprocess "
            "callables"
        ) from exc
    if not isinstance(out, Tensor) or out.ndim != 3 or not out.is_floating_point():
        got = f"shape {tuple(out.shape)} dtype {out.dtype}" if isinstance(out, Tensor) else type(out).__name__
        raise TypeError(
            f"{where}: preprocess {type(transform).__name__} must return a float (C, H, W) tensor, got {got}"
        )
    out = out.to(device=device, dtype=torch.float32)[None]
    shown = _minmax(out) if display is None else display.denormalize(out)
    return out, _to_rgb(shown)


def _describe_sizes(sizes: Sequence[tuple[int, ...]], wheres: Sequence[str]) -> str:
    groups: dict[tuple[int, ...], list[str]] = {}
    for size, where in zip(sizes, wheres, strict=True):
        groups.setdefault(size, []).append(where)
    return "; ".join("x".join(map(str, size)) + " at " + ", ".join(ws) for size, ws in groups.items())


def load_images(
    images: ImageLike | Sequence[ImageLike],
    *,
    preprocess: str | Preset | Preprocess | None = "imagenet",
    device: torch.device | str | None = None,
    channels: int = 3,
) -> Batch:
    """Load one image or a list of them (mixed forms allowed) into a :class:`Batch` on ``device``.

    Accepted forms:

    - path (str or os.PathLike), opened with PIL (first frame of animations);
    - PIL image of any mode; alpha (RGBA, LA, P with transparency) is composited over white. 16-bit modes
      ('I;16', 'I') are divided by 65535, mode 'F' must lie in [0, 1];
    - numpy array HxW or HxWxC (C in 1, 3, 4, where 4 is RGBA, composited over white): uint8 0..255, bool, or float
      in [0, 1];
    - tensor (C, H, W) or (N, C, H, W), float: taken as model-ready, so NOT preprocessed; it gets a batch axis and
      is copied (detached) to ``device``. Its display copy is min-max scaled per image and made 3-channel;
    - tensor (C, H, W) or (N, C, H, W), uint8 (``torchvision.io.read_image``), C in 1, 3, 4: images, scaled by
      1/255 and preprocessed like the forms above.

    Paths and PIL images are turned upright by their EXIF orientation (phone photos). All but float tensors become
    float (channels, H, W) in [0, 1] (``channels`` 3: RGB, 1: ITU-R 601-2 luminance), then:

    - ``"imagenet"`` (default) or a Preset: ``images = preset.geometry(img)``, ``tensor = preset.normalize(images)``;
    - ``None`` or ``"none"``: nothing is applied (``tensor == images`` for 3 channels);
    - another callable (C, H, W) -> (C, H, W), e.g. ``weights.transforms()``: ``tensor = preprocess(img)``; the
      display undoes ``preprocess.mean``/``preprocess.std`` when it has them, else is min-max scaled.

    Devices: a preset runs on ``device`` (the pixels move there first, so resizing and normalizing use the GPU). A
    callable runs where the pixels are, as in a torchvision data pipeline: on the CPU for paths, PIL images and numpy
    arrays (and uint8 CPU tensors), on its own device for a uint8 tensor already on a GPU; its output then moves to
    ``device``. So a transform written for CPU images (one that builds ``torch.tensor(mean)`` constants) works with
    ``device="cuda"``; to run a callable on the GPU, pass the pixels as a uint8 tensor on the GPU.

    All images must end with the same H, W. Returns contiguous float32 ``tensor`` (N, C, H, W) and ``images``
    (N, 3, H, W). Nothing passed in is modified.
    """
    transform, display = _resolve_preprocess(preprocess)
    target = _resolve_device(device)
    if isinstance(channels, bool) or not isinstance(channels, int):
        raise TypeError(f"channels: expected the int 1 or 3, got {channels!r}")
    single = not isinstance(images, (list, tuple))
    items = [images] if single else list(images)
    if not items:
        raise ValueError("images: got an empty list; pass at least one path, PIL image, numpy array or tensor")
    wheres = ["images"] if single else [f"images[{i}]" for i in range(len(items))]
    has_non_tensor = any(not isinstance(item, Tensor) or item.dtype == torch.uint8 for item in items)
    if has_non_tensor:
        if channels not in (1, 3):
            raise ValueError(
                f"channels: expected 1 (grayscale) or 3 (RGB) for non-tensor images, got {channels}; pass a tensor "
                f"to feed another channel count"
            )
        if isinstance(transform, Preset) and transform.mean is not None and len(transform.mean) not in (1, channels):
            # visualize passes the model's channel count here, so the fix is a preset that fits it, not channels=
            raise ValueError(
                f"preprocess: preset {transform.name!r} normalizes {len(transform.mean)} channels but the images are "
                f"loaded with channels={channels}; pass a Preset with one mean/std value per channel or a single one "
                f"for all, e.g. Preset({transform.name!r}, {transform.resize}, {transform.crop}, "
                f"({sum(transform.mean) / len(transform.mean):.3f},), ({sum(transform.std) / len(transform.std):.3f},))"
            )

    model_parts: list[Tensor] = []
    display_parts: list[Tensor] = []
    # Where the float work happens: a Preset runs on the target device (the (mostly uint8) pixels move first); a
    # callable runs where the pixels are (the CPU for decoded images, a uint8 tensor's own device), as in a
    # torchvision data pipeline, since a transform written for CPU images builds CPU constants.
    run_on = (lambda pixels: pixels.to(target)) if isinstance(transform, Preset) else (lambda pixels: pixels)
    for item, where in zip(items, wheres, strict=True):
        if isinstance(item, Tensor) and item.dtype == torch.uint8:
            for pixels, name in _uint8_images(item, where):
                x, shown = _apply(transform, display, _to_float(run_on(pixels), channels), target, name)
                model_parts.append(x)
                display_parts.append(shown)
        elif isinstance(item, Tensor):
            # detach: the batch is a fresh input, not a node in the caller's graph.
            x = _check_tensor(item, where).detach().to(device=target, dtype=torch.float32)
            model_parts.append(x)
            display_parts.append(_to_rgb(_minmax(x)))
        else:
            img = _to_float(run_on(_pixels(item, where)), channels)
            x, shown = _apply(transform, display, img, target, where)
            model_parts.append(x)
            display_parts.append(shown)

    sizes = [tuple(x.shape[-2:]) for x in model_parts]
    if len(set(sizes)) > 1:
        raise ValueError(
            f"images: all images must end with the same height x width to be batched, got "
            f"{_describe_sizes(sizes, wheres)}; pass a preset that crops (preprocess='imagenet' or "
            f"Preset(name, resize, crop, mean, std)) or resize them first"
        )
    counts = [(x.shape[1],) for x in model_parts]
    if len(set(counts)) > 1:
        raise ValueError(
            f"images: all model inputs must have the same number of channels, got {_describe_sizes(counts, wheres)} "
            f"channels; tensors are used as is, so match their channels to `channels` (or convert them yourself)"
        )
    return Batch(
        tensor=torch.cat(model_parts).contiguous(),
        images=torch.cat(display_parts).contiguous(),
        preprocess=transform if has_non_tensor else None,
    )
