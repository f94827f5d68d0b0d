"""The embedded vision transformer: `ShapesViT`, a small ViT for the shapes data set, and its shipped weights.

``shapes_vit()`` loads them (``hookviz/zoo/shapes_vit.safetensors``: no pickle) after checking their sha256;
``python -m hookviz.zoo.train --model vit --out FILE`` reproduces them.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..images import Preset
from .data import CLASSES
from .model import shipped

VIT_WEIGHTS_FILE = Path(__file__).resolve().parent / "shapes_vit.safetensors"
VIT_WEIGHTS_SHA256 = "b1e8b54460323816e909c5d8fbd47dc52ac0d996de423cbeafc1bec36d280e1c"


class Attention(nn.Module):
    """Multi-head self-attention with one fused ``F.scaled_dot_product_attention`` call (as timm's ``fused_attn``).

    (N, T, D) -> (N, T, D): ``qkv`` (one ``nn.Linear`` D -> 3D) split into `heads` heads of D / heads, the softmax
    attention of Vaswani et al. 2017 ("Attention Is All You Need"), then the output projection ``proj``.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be a multiple of heads, got dim={dim}, heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)  # (N, heads, T, D / heads)
        return self.proj(x.transpose(1, 2).reshape(n, t, d))


class Mlp(nn.Module):
    """``fc1`` (D -> hidden), ``nn.GELU``, ``fc2`` (hidden -> D), on each token."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x = x + attn(norm1(x))``, then ``x = x + mlp(norm2(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class ShapesViT(nn.Module):
    """A small vision transformer for the shapes data set (178k parameters): takes `Shapes.images` as they are.

    (N, 3, 64, 64) in [0, 1] -> (N, len(CLASSES)) logits, the architecture of Dosovitskiy et al., "An Image is Worth
    16x16 Words: Transformers for Image Recognition at Scale" (ICLR 2021), with timm's module names: the input is
    normalised inside the model (mean 0.5, std 0.25), ``patch_embed`` of stride `patch` = 8, an 8x8 grid of 64
    patch tokens of width `dim` = 64 (a convolutional stem, Xiao et al. 2021: 3x3 convs of stride 2, conv-BN-GELU
    64 -> 32 -> 16 with 24 and 48 channels, then a conv to `dim` at 8x8; a token sees the 15x15 pixels around its
    8x8 cell; a linear embedding of 8x8 patches learnt several times slower on these images, see
    docs/datasets.md), a learned class token ``cls_token`` put first
    (``num_prefix_tokens = 1``), learned position embeddings ``pos_embed`` (1, 65, dim; started from the 2-D
    sine-cosine embedding), `depth` = 4 pre-norm ``blocks`` (``norm1``, ``attn``, ``norm2``, ``mlp``:
    ``nn.LayerNorm``; self-attention of `heads` = 4 heads with one fused ``F.scaled_dot_product_attention`` call,
    its qkv one ``nn.Linear``, then ``proj``; an MLP ``fc1``, ``nn.GELU``, ``fc2`` of hidden width `mlp_ratio` *
    dim = 128; residuals written ``x = x + ...``), a final ``norm`` and a linear ``head`` on the class token. Tokens
    are (N, 65, dim): the class token, then the patches in row-major order. `hookviz.methods.choose_layer` picks
    ``blocks.3.norm1`` for CAMs (the LayerNorm before the last attention: a map on the 8x8 patch grid; after the
    last block only the class token reaches the head).
    """

    # its own preprocessing (64x64, [0, 1], no normalization), which visualize(preprocess="auto") reads
    hookviz_preset = Preset("shapes", 64, 64, None, None)
    num_prefix_tokens = 1  # the class token, as timm's attribute: hookviz.layouts reads it

    def __init__(
        self,
        num_classes: int = len(CLASSES),
        *,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        patch: int = 8,
        size: int = 64,
    ) -> None:
        super().__init__()
        if patch < 2 or patch & (patch - 1):
            raise ValueError(f"patch must be a power of 2 of at least 2 (a stem of stride-2 convs), got {patch}")
        if size % patch:
            raise ValueError(f"size must be a multiple of patch, got size={size}, patch={patch}")
        if dim % heads:
            raise ValueError(f"dim must be a multiple of heads, got dim={dim}, heads={heads}")
        if dim % 4:
            raise ValueError(f"dim must be a multiple of 4 (the 2-D sine-cosine position embedding), got {dim}")
        # its class names, which figures use (hookviz.classes.class_names); another head names no classes
        self.hookviz_classes = CLASSES if num_classes == len(CLASSES) else None
        self.register_buffer("mean", torch.full((1, 3, 1, 1), 0.5), persistent=False)
        self.register_buffer("std", torch.full((1, 3, 1, 1), 0.25), persistent=False)
        self.patch_embed = _conv_stem(dim, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        # learned, started from the 2-D sine-cosine embedding (as MAE, He et al. 2022): a grid to start from
        self.pos_embed = nn.Parameter(_sincos_2d(dim, size // patch))
        self.blocks = nn.Sequential(*(Block(dim, heads, mlp_ratio) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.apply(_init)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch_embed((x - self.mean) / self.std)  # (N, dim, h, w)
        pos = self.pos_embed
        if pos.shape[1] != 1 + x.shape[2] * x.shape[3]:
            # another input size (feature visualisation's random scalings): the patch position embeddings resampled
            # to the grid, bicubically, as timm's dynamic_img_size; at the trained size they are used as they are
            side = math.isqrt(pos.shape[1] - 1)
            grid = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=x.shape[2:], mode="bicubic", align_corners=False)
            pos = torch.cat([pos[:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
        x = x.flatten(2).transpose(1, 2)  # (N, h * w, dim), row-major
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def _conv_stem(dim: int, patch: int) -> nn.Sequential:
    """log2(patch) 3x3 convs of stride 2 (conv-BN-GELU, the last a plain conv to `dim`): the convolutional stem of
    Xiao et al. 2021 ("Early Convolutions Help Transformers See Better") in place of the linear patch embedding."""
    layers: list[nn.Module] = []
    width, steps = 3, patch.bit_length() - 1
    for i in range(steps - 1):
        out = dim * 3 // 8 * 2**i  # 24, 48 for dim 64: widths doubling towards the tokens
        layers += [nn.Conv2d(width, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out), nn.GELU()]
        width = out
    layers.append(nn.Conv2d(width, dim, 3, stride=2, padding=1))
    return nn.Sequential(*layers)


def _init(module: nn.Module) -> None:
    # the original ViT's initialisation (Xavier-uniform linear weights, zero biases), not timm's normal of std 0.02:
    # at width 64 the latter makes q and k so small that the attention stays uniform for hundreds of steps
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def _sincos_2d(dim: int, side: int) -> Tensor:
    """(1, 1 + side * side, dim): zeros for the class token, then per patch (row-major) sin and cos of its x, then of
    its y, at `dim` / 4 frequencies 10000^(-i / (dim / 4)) (Vaswani et al. 2017, in two dimensions)."""
    y, x = torch.meshgrid(
        torch.arange(side, dtype=torch.float64), torch.arange(side, dtype=torch.float64), indexing="ij"
    )
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    x, y = x.reshape(-1, 1) * omega, y.reshape(-1, 1) * omega
    grid = torch.cat([torch.sin(x), torch.cos(x), torch.sin(y), torch.cos(y)], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), grid]).float().unsqueeze(0)


def shapes_vit(weights: bool = True) -> ShapesViT:
    """The embedded vision transformer: a `ShapesViT` in eval mode on the CPU, with the weights shipped in the package.

    The weights (``hookviz/zoo/shapes_vit.safetensors``, float16, made by ``python -m hookviz.zoo.train --model
    vit``) are read as safetensors (plain tensors, no unpickling) after their sha256 is checked against
    `VIT_WEIGHTS_SHA256`. ``weights=False`` gives an untrained model (seeded initialisation is up to the caller:
    ``torch.manual_seed``).
    """
    return shipped(
        ShapesViT,
        weights,
        VIT_WEIGHTS_FILE,
        VIT_WEIGHTS_SHA256,
        "shapes ViT",
        "python -m hookviz.zoo.train --model vit",
    )
