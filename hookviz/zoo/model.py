"""The embedded default model: `ShapesCNN`, a small CNN for the shapes data set, and its shipped weights.

``shapes_model()`` loads them (``hookviz/zoo/shapes_cnn.safetensors``: no pickle) after checking their sha256;
``python -m hookviz.zoo.train --out FILE`` reproduces them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..images import Preset
from .data import CLASSES, Shapes

M = TypeVar("M", bound=nn.Module)

WEIGHTS_FILE = Path(__file__).resolve().parent / "shapes_cnn.safetensors"
WEIGHTS_SHA256 = "ee9d35a2f7c96f62b2107a23f5cb29ae9f4ca8503ae2af9cbf1d09c9bfb41714"


class ShapesCNN(nn.Module):
    """A small CNN for the shapes data set (about 117k parameters): takes `Shapes.images` as they are.

    (N, 3, 64, 64) in [0, 1] -> (N, len(CLASSES)) logits. Three conv-BN-ReLU stages (the first two followed by a max
    pool: 64 -> 32 -> 16), then the last conv block ``features`` (two dilated conv-BN-ReLU at 16x16, so that the
    receptive field, 50 pixels, covers the largest object; the layer `hookviz.methods.choose_layer` picks for CAMs,
    a map of one cell per 4x4 pixels), a global average pool and a linear ``head`` (the class activation map
    architecture of Zhou et al., "Learning Deep Features for Discriminative Localization", CVPR 2016). On purpose it
    holds the cases hookviz must handle: one ``nn.ReLU`` module (``relu``) called twice per forward, a functional
    ``F.relu``, an in-place ReLU and BatchNorm.
    """

    # its own preprocessing (64x64, [0, 1], no normalization), which visualize(preprocess="auto") reads
    hookviz_preset = Preset("shapes", 64, 64, None, None)

    def __init__(self, num_classes: int = len(CLASSES)) -> None:
        super().__init__()
        # its class names, which figures use (hookviz.classes.class_names); another head names no classes
        self.hookviz_classes = CLASSES if num_classes == len(CLASSES) else None
        # the input normalisation lives in the model, so that it takes images in [0, 1]
        self.register_buffer("mean", torch.full((1, 3, 1, 1), 0.5), persistent=False)
        self.register_buffer("std", torch.full((1, 3, 1, 1), 0.25), persistent=False)
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32)
        self.conv3, self.bn3 = nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.features = nn.Sequential(
            nn.Conv2d(64, 96, 3, padding=2, dilation=2, bias=False),
            nn.BatchNorm2d(96),
            nn.ReLU(inplace=True),
            nn.Conv2d(96, 96, 3, padding=2, dilation=2, bias=False),
            nn.BatchNorm2d(96),
            nn.ReLU(),
        )
        self.head = nn.Linear(96, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = (x - self.mean) / self.std
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = self.relu(self.bn3(self.conv3(x)))
        return self.head(self.features(x).mean(dim=(2, 3)))


def shapes_model(weights: bool = True) -> ShapesCNN:
    """The embedded default model: a `ShapesCNN` in eval mode on the CPU, with the weights shipped in the package.

    The weights (``hookviz/zoo/shapes_cnn.safetensors``, float16, made by ``python -m hookviz.zoo.train``)
    reach at least 95 % accuracy on images of `shapes` it never saw. They are read as safetensors (plain tensors,
    no unpickling) after their sha256 is checked against `WEIGHTS_SHA256`. ``weights=False`` gives an untrained
    model (seeded initialisation is up to the caller: ``torch.manual_seed``).
    """
    return shipped(ShapesCNN, weights, WEIGHTS_FILE, WEIGHTS_SHA256)


def shipped(
    build: Callable[[], M],
    weights: object,
    path: Path,
    sha256: str,
    what: str = "shapes model",
    rebuild: str = "python -m hookviz.zoo.train",
) -> M:
    """A zoo model from `build`, in eval mode, with the weights shipped in `path` loaded when `weights` is True
    (`_load_weights`: sha256 checked, nothing unpickled); `weights` is checked before anything is built."""
    if not isinstance(weights, bool):
        raise TypeError(f"weights must be True (the shipped weights) or False (untrained), got {weights!r}")
    model = build()
    if weights:
        model.load_state_dict(_load_weights(path, sha256, what, rebuild))
    return model.eval()


def _load_weights(
    path: Path, sha256: str, what: str = "shapes model", rebuild: str = "python -m hookviz.zoo.train"
) -> dict[str, Tensor]:
    """The state dict in the safetensors file `path` as float32, after checking its sha256 (nothing is unpickled);
    `what` names the model and `rebuild` the command that remakes the file, in the errors."""
    if not path.is_file():
        raise FileNotFoundError(
            f"the {what}'s weights file {path} is missing; reinstall hookviz, or rebuild it with "
            f"`{rebuild} --out {path}`"
        )
    data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise RuntimeError(
            f"the {what}'s weights file {path} is corrupted or not the shipped one: sha256 mismatch, "
            f"expected {sha256}, got {got}"
        )
    state = safetensors.torch.load(data)  # tensors and a JSON header: nothing in the file is executed
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


@torch.no_grad()
def accuracy(model: nn.Module, data: Shapes, batch_size: int = 500) -> float:
    """The fraction of `data` that `model` (in eval mode) classifies right."""
    right = 0
    for i in range(0, len(data), batch_size):
        right += (model(data.images[i : i + batch_size]).argmax(1) == data.labels[i : i + batch_size]).sum().item()
    return right / max(len(data), 1)
