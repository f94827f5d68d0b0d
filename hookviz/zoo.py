"""Embedded sample data and the embedded default model: the synthetic shapes data set and a small CNN trained on it.

`shapes(n, seed=...)` draws a labelled data set on the fly (no downloads): one object of one of eight classes per
image, at a random position, scale, rotation and colour, on a textured background cluttered with distractors that
belong to no class, with its pixel mask and box. `shapes_model()` is a small CNN whose weights ship in the package
(``hookviz/weights/shapes_cnn.pt``); ``python -m hookviz.zoo train --out FILE`` reproduces them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import Tensor, nn
from torch.utils.data import Dataset

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring", "crescent", "heart")

# Images are drawn in chunks of this many, each from its own generator seeded by (seed, chunk index): image i
# depends on (seed, i, size) only, so shapes(10, seed=s) is the first ten images of shapes(1000, seed=s).
_CHUNK = 256
_DISTRACTORS = 5  # slots per image, each drawn with probability 0.7: _BARS thin bars, then soft blobs
_BARS = 3


def shapes_image(size: int = 224, seed: int = 0) -> Image.Image:
    """An RGB image of a few filled shapes (circle, square, triangle) on a soft gradient background.

    Deterministic for a given `seed`; used by `hookviz demo` and the tests as a sample image that needs no file.
    """
    if size < 16:
        raise ValueError(f"size must be at least 16 pixels, got {size}")
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    for y in range(size):  # vertical gradient so the background is not flat
        shade = 40 + int(60 * y / size)
        draw.line([(0, y), (size, y)], fill=(shade, shade + 20, shade + 40))
    s = size / 224
    jitter = lambda: rng.randint(-8, 8) * s  # noqa: E731
    cx, cy, r = 60 * s + jitter(), 70 * s + jitter(), 38 * s
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(220, 40, 40))
    x0, y0 = 125 * s + jitter(), 40 * s + jitter()
    draw.rectangle([x0, y0, x0 + 70 * s, y0 + 70 * s], fill=(40, 90, 220))
    tx, ty = 110 * s + jitter(), 200 * s
    draw.polygon([(tx - 55 * s, ty), (tx + 55 * s, ty), (tx, ty - 80 * s)], fill=(240, 210, 40))
    return img


# ---------------------------------------------------------------------------------------------------- the data set


@dataclass(frozen=True)
class Shapes:
    """A batch of the shapes data set (see `shapes`).

    Attributes:
        images: (N, 3, size, size) float32 in [0, 1].
        labels: (N,) int64, indices into `classes`.
        masks: (N, size, size) bool, the object's pixels (never empty; distractors are drawn under the object, so
            every object pixel is visible).
        boxes: (N, 4) int64 ``(x0, y0, x1, y1)``, the mask's bounding box with inclusive corners (the convention of
            ``torchvision.ops.masks_to_boxes``): ``masks[i, y0:y1 + 1, x0:x1 + 1]`` holds every object pixel.
        classes: the class names.
    """

    images: Tensor
    labels: Tensor
    masks: Tensor
    boxes: Tensor
    classes: tuple[str, ...] = CLASSES

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int | slice | Sequence[int] | Tensor) -> Shapes:
        """The items at `index` as a `Shapes`; an int gives a `Shapes` of length 1 (the batch axis is kept)."""
        if isinstance(index, int):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"index {index} is out of range for Shapes of length {n}")
            index = slice(index, index + 1 if index != -1 else None)
        return Shapes(self.images[index], self.labels[index], self.masks[index], self.boxes[index], self.classes)


class ShapesDataset(Dataset):
    """`shapes(n, seed=seed, size=size)` as a ``torch.utils.data.Dataset`` of ``(image, label)`` pairs.

    ``image`` is a (3, size, size) float32 tensor in [0, 1], ``label`` a 0-d int64 tensor; the whole `Shapes` (masks
    and boxes included) is ``dataset.shapes``.
    """

    def __init__(self, n: int, *, seed: int = 0, size: int = 64) -> None:
        self.shapes = shapes(n, seed=seed, size=size)
        self.seed, self.size = seed, size  # recorded by explain_dataset, so a report can redraw the images
        self.classes = self.shapes.classes

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.shapes.images[index], self.shapes.labels[index]


def shapes(n: int, *, seed: int, size: int = 64) -> Shapes:
    """`n` synthetic images, each with one object of one of `CLASSES`, its class, its pixel mask and its box.

    Each object has a random position (fully inside the image), scale (diameter about 30 % to 50 % of `size`),
    rotation, slight anisotropy, colour (contrasting with the background) and a linear shading; it sits on a
    textured background (a colour gradient, blotches, a grating, pixel noise) with up to five distractors under it
    (up to three thin bars and two soft blobs, which belong to no class), so a classifier has to find the object.
    Edges are antialiased; the mask holds the pixels at least half covered by the object.

    Deterministic: image i depends on (`seed`, i, `size`) only (a prefix of a longer set is the shorter set), and
    different seeds give different images. Drawn batch-wise with torch ops on the CPU: 10,000 images of 64x64 cost
    about 4.4 s of one core.

    Returns:
        a `Shapes`: images (n, 3, size, size) float32 in [0, 1], labels (n,) int64, masks (n, size, size) bool,
        boxes (n, 4) int64 (x0, y0, x1, y1) inclusive.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise ValueError(f"size must be an int of at least 16 pixels, got {size!r}")
    images = torch.empty(n, 3, size, size)
    labels = torch.empty(n, dtype=torch.long)
    masks = torch.empty(n, size, size, dtype=torch.bool)
    for c in range(math.ceil(n / _CHUNK)):
        part = slice(c * _CHUNK, min(n, (c + 1) * _CHUNK))
        images[part], labels[part], masks[part] = _draw_chunk(seed, c, part.stop - part.start, size)
    return Shapes(images, labels, masks, _boxes(masks))


def _generator(seed: int, chunk: int) -> torch.Generator:
    digest = hashlib.sha256(f"hookviz.shapes:{seed}:{chunk}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _boxes(masks: Tensor) -> Tensor:
    """(N, 4) inclusive (x0, y0, x1, y1) of non-empty (N, H, W) masks."""
    cols, rows = masks.any(dim=1), masks.any(dim=2)  # (N, W), (N, H)
    w, h = cols.shape[1], rows.shape[1]
    xs, ys = torch.arange(w), torch.arange(h)
    big = max(w, h)
    return torch.stack(
        [
            torch.where(cols, xs, big).amin(1),
            torch.where(rows, ys, big).amin(1),
            torch.where(cols, xs, -1).amax(1),
            torch.where(rows, ys, -1).amax(1),
        ],
        dim=1,
    )


def _uniform(g: torch.Generator, shape: tuple[int, ...], low: float, high: float) -> Tensor:
    return torch.rand(shape, generator=g) * (high - low) + low


def _draw_chunk(seed: int, chunk: int, m: int, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """The `m` first images of chunk `chunk`: every random number of the full chunk is drawn (in a fixed order),
    so that an image does not depend on how many images are drawn after it."""
    g, c, k = _generator(seed, chunk), _CHUNK, _DISTRACTORS
    s = size / 64  # lengths below are in pixels of a 64x64 image
    # every random draw first, for the whole chunk
    labels = torch.randint(len(CLASSES), (c,), generator=g)
    radius = _uniform(g, (c,), 9.5, 16.0) * s
    aniso = _uniform(g, (c,), 0.88, 1.12)
    angle = _uniform(g, (c,), 0.0, 2 * math.pi)
    centre = torch.rand(c, 2, generator=g)  # mapped into the free margin below
    delta = _uniform(g, (c, 3), 0.2, 0.6)
    shade = _uniform(g, (c,), -0.15, 0.15)
    field = _uniform(g, (c, 3, 3), 0.15, 0.85)  # per channel: the colour at the centre, its x and y slopes
    blotch = torch.randn(c, 1, 8, 8, generator=g) * _uniform(g, (c, 1, 1, 1), 0.0, 0.08)
    grating = _uniform(g, (c, 4), 0.0, 1.0)  # amplitude, frequency, orientation, phase
    noise_sd = _uniform(g, (c, 1, 1, 1), 0.0, 0.04)
    d_on = torch.rand(c, k, generator=g) < 0.7
    d_pos = torch.rand(c, k, 2, generator=g) * size
    d_len = _uniform(g, (c, k), 6.0, 20.0) * s  # bars: half-length
    d_width = _uniform(g, (c, k), 0.6, 1.6) * s  # bars: half-width
    d_angle = _uniform(g, (c, k), 0.0, math.pi)
    d_reach = _uniform(g, (c, k), 3.0, 8.0) * s  # blobs: radius where they fade out
    d_colour = torch.rand(c, k, 3, generator=g)
    noise = torch.rand(c, 3, size, size, generator=g)[:m]  # uniform: cheaper to draw than normal

    def head(t: Tensor) -> Tensor:
        return t[:m]

    labels, radius, aniso, angle, centre, delta, shade = map(head, (labels, radius, aniso, angle, centre, delta, shade))
    field, blotch, grating, noise_sd = map(head, (field, blotch, grating, noise_sd))
    d_on, d_pos, d_len, d_width, d_angle, d_reach, d_colour = map(
        head, (d_on, d_pos, d_len, d_width, d_angle, d_reach, d_colour)
    )

    coords = torch.arange(size, dtype=torch.float32) + 0.5  # pixel centres
    py, px = coords.view(1, size, 1), coords.view(1, 1, size)

    # background: a linear colour gradient + monochrome blotches + a grating
    centred = (coords - size / 2) / size
    slope = (field[:, :, 1:] - 0.5) * 0.8
    img = (field[:, :, :1, None] + slope[:, :, :1, None] * centred.view(1, 1, 1, size)) + slope[:, :, 1:, None] * (
        centred.view(1, 1, size, 1)
    )
    img += F.interpolate(blotch, size=(size, size), mode="bilinear", align_corners=False)
    amp, freq, ori, phase = (grating[:, i].view(m, 1, 1) for i in range(4))
    ori = ori * math.pi
    wave = torch.sin((px * torch.cos(ori) + py * torch.sin(ori)) * (freq * 6 + 2) * (2 * math.pi / size) + phase * 6.3)
    img += (amp * 0.12 * wave).unsqueeze(1)
    background_mean = img.mean(dim=(2, 3))  # (m, 3): the object's colour is chosen against it

    # distractors, drawn under the object: thin bars (hard edges) in the first slots, soft blobs in the others
    for j in range(k):
        dx = px - d_pos[:, j, 0].view(m, 1, 1)  # (m, 1, size): the broadcasts stay cheap until combined
        dy = py - d_pos[:, j, 1].view(m, 1, 1)  # (m, size, 1)
        if j < _BARS:
            cos, sin = torch.cos(d_angle[:, j]).view(m, 1, 1), torch.sin(d_angle[:, j]).view(m, 1, 1)
            along = (dx * cos + dy * sin).abs_().sub_(d_len[:, j].view(m, 1, 1))
            across = (dy * cos - dx * sin).abs_().sub_(d_width[:, j].view(m, 1, 1))
            alpha = torch.maximum(along, across).neg_().add_(0.5).clamp_(0, 1)
        else:  # 0.85 (1 - d^2 / reach^2)^2 inside the reach: a soft disc with no edge
            reach2 = d_reach[:, j].view(m, 1, 1) ** 2
            alpha = (dx * dx / reach2 + dy * dy / reach2).neg_().add_(1).clamp_(min=0).square_().mul_(0.85)
        alpha = alpha.mul_(d_on[:, j].view(m, 1, 1)).unsqueeze(1)
        img.lerp_(d_colour[:, j].view(m, 3, 1, 1).expand_as(img), alpha)

    # the object: position in the margin that keeps it inside the image
    margin = radius * 1.12 + 1
    cxy = margin.unsqueeze(1) + centre * (size - 2 * margin).unsqueeze(1)
    colour = torch.where(background_mean > 0.5, background_mean - delta, background_mean + delta).clamp(0, 1)
    masks = torch.zeros(m, size, size, dtype=torch.bool)
    for label in range(len(CLASSES)):
        idx = (labels == label).nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        r, a, th = radius[idx].view(-1, 1, 1), aniso[idx].view(-1, 1, 1), angle[idx].view(-1, 1, 1)
        dx, dy = px - cxy[idx, 0].view(-1, 1, 1), py - cxy[idx, 1].view(-1, 1, 1)
        cos, sin = torch.cos(th), torch.sin(th)
        u = (dx * cos + dy * sin) / (r * a)
        v = (dy * cos - dx * sin) * a / r
        dist = _SHAPES[label](u, v) * r  # about the signed distance in pixels
        alpha = (0.5 - dist).clamp(0, 1).unsqueeze(1)
        tint = colour[idx].view(-1, 3, 1, 1) + (shade[idx].view(-1, 1, 1) * u).unsqueeze(1)
        img[idx] = img[idx].lerp_(tint.clamp_(0, 1), alpha)
        masks[idx] = dist <= 0

    img = img.add_(noise.sub_(0.5).mul_(noise_sd * math.sqrt(12))).clamp_(0, 1)  # noise_sd: its standard deviation
    return img, labels, masks


# Signed-distance-like functions of the classes in unit coordinates (the object fits in the unit disc, up to the
# anisotropy): negative inside, about the Euclidean distance near the edge, so `0.5 - d * radius` antialiases.
def _circle(u: Tensor, v: Tensor) -> Tensor:
    return torch.sqrt(u * u + v * v) - 0.9


def _square(u: Tensor, v: Tensor) -> Tensor:
    return torch.maximum(u.abs(), v.abs()) - 0.72


def _triangle(u: Tensor, v: Tensor) -> Tensor:
    # equilateral, circumradius 1.05 (inradius 0.525), centred on its centroid
    d = v
    for t in (math.pi / 2 + 2 * math.pi / 3, math.pi / 2 + 4 * math.pi / 3):
        d = torch.maximum(d, u * math.cos(t) + v * math.sin(t))
    return d - 0.525


def _star(u: Tensor, v: Tensor) -> Tensor:
    # five points: the boundary radius goes from 1.05 at a tip to 0.45 between tips
    r, phi = torch.sqrt(u * u + v * v), torch.atan2(v, u)
    sector = 2 * math.pi / 5
    t = 1 - (torch.remainder(phi, sector) - sector / 2).abs() / (sector / 2)  # 1 at a tip, 0 between
    return (r - (0.45 + 0.6 * t)) * 0.8


def _cross(u: Tensor, v: Tensor) -> Tensor:
    au, av = u.abs(), v.abs()
    return torch.minimum(torch.maximum(au - 0.95, av - 0.3), torch.maximum(au - 0.3, av - 0.95))


def _ring(u: Tensor, v: Tensor) -> Tensor:
    return (torch.sqrt(u * u + v * v) - 0.72).abs() - 0.28  # outer radius 1.0, inner 0.44


def _crescent(u: Tensor, v: Tensor) -> Tensor:
    outer = torch.sqrt(u * u + v * v) - 0.95
    bite = 0.72 - torch.sqrt((u - 0.5) ** 2 + v * v)
    return torch.maximum(outer, bite)


def _heart(u: Tensor, v: Tensor) -> Tensor:
    # two discs over a downward-pointing triangle, recentred and scaled to the unit disc (the notch between the discs
    # and the long tip keep it apart from a square or a circle)
    k = 0.86
    x, y = u * k, v * k + 0.135
    ax = x.abs()
    lobe = torch.sqrt((ax - 0.36) ** 2 + (y + 0.28) ** 2) - 0.40
    wedge = torch.maximum(0.836 * ax + 0.548 * y - 0.520, -y - 0.18)
    return torch.minimum(lobe, wedge) / k


_SHAPES = (_circle, _square, _triangle, _star, _cross, _ring, _crescent, _heart)


# ---------------------------------------------------------------------------------------------------- the model

WEIGHTS_FILE = Path(__file__).resolve().parent / "weights" / "shapes_cnn.pt"
WEIGHTS_SHA256 = "96c24028b9b3e9c73417ec8e3c7a107a3827bf1517586e663c877a8ab1769fdb"
FRESH_SEED = 0  # the split `train` reports; training draws from seeds 1_000_000 + 1000 * seed + epoch only
_TRAIN_SEED_BASE = 1_000_000


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

    def __init__(self, num_classes: int = len(CLASSES)) -> None:
        super().__init__()
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

    The weights (``hookviz/weights/shapes_cnn.pt``, float16, made by ``python -m hookviz.zoo train``; see the README)
    reach at least 95 % accuracy on images of `shapes` it never saw. They are loaded with ``weights_only=True``
    after their sha256 is checked against `WEIGHTS_SHA256`. ``weights=False`` gives an untrained model (seeded
    initialisation is up to the caller: ``torch.manual_seed``).
    """
    if not isinstance(weights, bool):
        raise TypeError(f"weights must be True (the shipped weights) or False (untrained), got {weights!r}")
    model = ShapesCNN()
    if weights:
        model.load_state_dict(_load_weights(WEIGHTS_FILE, WEIGHTS_SHA256))
    return model.eval()


def _load_weights(path: Path, sha256: str) -> dict[str, Tensor]:
    """The state dict in `path` as float32, after checking the file's sha256 (loading executes no code)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"the shapes model's weights file {path} is missing; reinstall hookviz, or rebuild it with "
            f"`python -m hookviz.zoo train --out {path}`"
        )
    data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise RuntimeError(
            f"the shapes model's weights file {path} is corrupted or not the shipped one: sha256 mismatch, "
            f"expected {sha256}, got {got}"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


@torch.no_grad()
def accuracy(model: nn.Module, data: Shapes, batch_size: int = 500) -> float:
    """The fraction of `data` that `model` (in eval mode) classifies right."""
    right = 0
    for i in range(0, len(data), batch_size):
        right += (model(data.images[i : i + batch_size]).argmax(1) == data.labels[i : i + batch_size]).sum().item()
    return right / max(len(data), 1)


def train(
    out: str | Path,
    *,
    seed: int = 0,
    epochs: int = 8,
    per_epoch: int = 6144,
    batch_size: int = 64,
    lr: float = 4e-3,
    fresh: int = 2000,
    progress: bool = True,
) -> dict[str, float | str]:
    """Train a `ShapesCNN` and write its float16 state dict to `out`; returns the fresh-split accuracy and sha256.

    Each epoch draws `per_epoch` new images (seed ``1_000_000 + 1000 * seed + epoch``; random horizontal flips on
    top), AdamW with a one-cycle learning rate (Smith & Topin, 2019). The accuracy is measured after the round trip
    through float16, on `fresh` images of seed `FRESH_SEED`, which training never draws from.
    """
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    model = ShapesCNN().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=5e-4)
    steps = epochs * math.ceil(per_epoch / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25)
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    bar = tqdm(total=steps, disable=not progress, desc="train", unit="step")
    for epoch in range(epochs):
        data = shapes(per_epoch, seed=_TRAIN_SEED_BASE + 1000 * seed + epoch)
        order = torch.randperm(per_epoch, generator=g)
        model.train()
        right = seen = 0
        for i in range(0, per_epoch, batch_size):
            idx = order[i : i + batch_size]
            x, y = data.images[idx], data.labels[idx]
            flip = torch.rand(len(idx), generator=g) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x).contiguous(memory_format=torch.channels_last)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            right += (logits.argmax(1) == y).sum().item()
            seen += len(idx)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", acc=f"{right / seen:.3f}")
            bar.update()
    bar.close()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # saved through a buffer: torch.save names the archive after the file, which would make the sha256 depend on it
    buffer = io.BytesIO()
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}, buffer)
    out.write_bytes(buffer.getvalue())
    trained = ShapesCNN()
    trained.load_state_dict(_load_weights(out, hashlib.sha256(out.read_bytes()).hexdigest()))
    return {
        "fresh_accuracy": accuracy(trained.eval(), shapes(fresh, seed=FRESH_SEED)),
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "bytes": out.stat().st_size,
        "seconds": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hookviz.zoo train --out FILE``: reproduce the shipped weights."""
    parser = argparse.ArgumentParser(prog="python -m hookviz.zoo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train the shapes CNN and write its weights")
    p.add_argument("--out", required=True, help="where to write the float16 state dict (.pt)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--per-epoch", type=int, default=6144, help="new images drawn for each epoch")
    p.add_argument("--fresh", type=int, default=2000, help="images of the fresh split the accuracy is measured on")
    args = parser.parse_args(argv)
    result = train(args.out, seed=args.seed, epochs=args.epochs, per_epoch=args.per_epoch, fresh=args.fresh)
    print(f"wrote {Path(args.out).resolve()} ({result['bytes']} bytes) in {result['seconds']:.0f} s")
    print(f"accuracy on a fresh split ({args.fresh} images, seed {FRESH_SEED}): {result['fresh_accuracy']:.4f}")
    print(f"sha256 {result['sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
