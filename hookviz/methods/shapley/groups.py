"""Feature groups: the ``feature_mask`` that says which elements of an input move together, and helpers that make one.

A feature mask is captum's: an integer tensor that broadcasts to the input (N, ...), holding group ids 0..M-1 (every
id used at least once, ids shared across the tensors of a tuple of inputs). Its first axis is 1 (the same groups for
every input) or N (groups per input; an input without some group gives that group 0). Every element of a group gets
the group's whole attribution (captum's convention): the attributions of the M groups, not of the elements, add up.

Helpers: `grid_mask` (patches), `superpixels` (SLIC, implemented here in torch: no dependency), `default_mask` (one
group per token, per tabular feature, or per cell of an 8 x 8 grid on images), `layouts` (the inputs that share their
masks) and `hierarchy` (the binary tree over one layout's groups that `PartitionShap` walks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._checks import is_int
from ..._device import to_host

Tree: TypeAlias = "int | tuple[Tree, Tree]"


def _pair(name: str, value: object) -> tuple[int, int]:
    values = value if isinstance(value, tuple) else (value, value)
    if len(values) != 2 or not all(is_int(v) and v >= 1 for v in values):  # type: ignore[operator]
        raise ValueError(f"{name} must be an int >= 1 or a pair (h, w) of them, got {value!r}")
    return values  # type: ignore[return-value]


def grid_mask(shape: Sequence[int], patch: int | tuple[int, int]) -> Tensor:
    """An (H, W) long mask of ``patch`` x ``patch`` cells over an image of spatial size ``shape = (H, W)`` (the last
    cells cut off at the edges), numbered row by row from 0; it broadcasts to (N, C, H, W) inputs.

    Example: ``grid_mask((32, 32), 8)`` gives 16 groups, a 4 x 4 grid.
    """
    if len(shape) < 2:
        raise ValueError(f"shape must end with (H, W), got {tuple(shape)!r}")
    h, w = int(shape[-2]), int(shape[-1])
    ph, pw = _pair("patch", patch)
    rows = torch.arange(h) // ph
    cols = torch.arange(w) // pw
    return rows[:, None] * math.ceil(w / pw) + cols[None, :]


def _lab_like(img: Tensor) -> Tensor:
    """Colour features for SLIC: the channels scaled to unit spread, so the `compactness` trade-off does not depend
    on whether an image is in [0, 1], [0, 255] or normalized."""
    flat = img.flatten(1)
    spread = (flat.max(1).values - flat.min(1).values).clamp_min(1e-12)
    return (img - flat.min(1).values[:, None, None]) / spread[:, None, None]


def _slic_one(img: Tensor, n_segments: int, compactness: float, iterations: int) -> Tensor:
    """SLIC (Achanta et al., 2012) on one (C, H, W) image: k-means on (colour, position), each centre searching a
    2S x 2S window (S the grid step), then ids relabelled 0..M-1 in order of first appearance."""
    c, h, w = img.shape
    colour = _lab_like(img.double())
    step = math.sqrt(h * w / n_segments)
    gh, gw = max(1, round(h / step)), max(1, round(w / step))
    cy = (torch.arange(gh, dtype=torch.float64) + 0.5) * h / gh
    cx = (torch.arange(gw, dtype=torch.float64) + 0.5) * w / gw
    cy, cx = torch.meshgrid(cy, cx, indexing="ij")
    cy, cx = cy.flatten(), cx.flatten()
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    yy, xx = yy.flatten(), xx.flatten()
    pix = colour.flatten(1).T  # (HW, C)
    idx = (cy.long().clamp(0, h - 1) * w + cx.long().clamp(0, w - 1)).to(img.device)
    centres = pix[idx]  # (K, C)
    # colour distance in [0, 1]^C units against spatial distance in units of S: compactness weighs the latter, as
    # skimage's slic does (its m / S factor)
    scale = compactness / 10.0 / step
    label = torch.zeros(h * w, dtype=torch.long)
    for _ in range(iterations):
        dc = torch.cdist(pix, centres) ** 2  # (HW, K)
        ds = (yy[:, None] - cy[None, :]) ** 2 + (xx[:, None] - cx[None, :]) ** 2
        d = dc + scale**2 * ds
        d = d.masked_fill(
            (yy[:, None] - cy[None, :]).abs().gt(step) | (xx[:, None] - cx[None, :]).abs().gt(step), math.inf
        )
        label = d.argmin(1)
        onehot = F.one_hot(label, cy.numel()).double()  # (HW, K)
        count = onehot.sum(0)
        keep = count > 0
        centres = torch.where(keep[:, None], (onehot.T @ pix) / count.clamp_min(1)[:, None], centres)
        cy = torch.where(keep, (onehot.T @ yy) / count.clamp_min(1), cy)
        cx = torch.where(keep, (onehot.T @ xx) / count.clamp_min(1), cx)
    _, first = torch.unique(label, return_inverse=True)
    return first.view(h, w)


def superpixels(image: Tensor, n_segments: int = 64, compactness: float = 10.0, *, iterations: int = 10) -> Tensor:
    """Superpixels by SLIC (Achanta et al., 2012, "SLIC Superpixels Compared to State-of-the-Art Superpixel
    Methods", TPAMI), implemented in torch (float64, on the host; no scikit-image needed).

    `image`: (C, H, W) or (N, C, H, W). Returns an (H, W) long mask for one image, or (N, 1, H, W) for a batch (each
    image numbered 0..M_i-1 on its own), to pass as ``feature_mask``. About `n_segments` segments (a regular grid of
    starting centres); `compactness` trades colour similarity against square shapes (higher: more grid-like). Unlike
    scikit-image's slic, colours are the image's channels scaled to [0, 1] (no CIELAB conversion) and connectivity
    is not enforced, so a segment may have detached pieces.
    """
    if not isinstance(image, Tensor) or image.dim() not in (3, 4) or not image.is_floating_point():
        raise ValueError("image must be a float tensor (C, H, W) or (N, C, H, W)")
    if not is_int(n_segments) or n_segments < 1:
        raise ValueError(f"n_segments must be an int >= 1, got {n_segments!r}")
    if image.dim() == 3:
        return _slic_one(image.detach().cpu(), n_segments, float(compactness), iterations)
    masks = [_slic_one(im.detach().cpu(), n_segments, float(compactness), iterations) for im in image]
    return torch.stack(masks).unsqueeze(1)


def default_mask(x: Tensor, cells: int = 8) -> Tensor:
    """The groups a method uses without a ``feature_mask``: token ids (N, T) and token embeddings (N, T, D): one
    group per token; tabular rows (N, D): one per feature; images (N, C, H, W): a `cells` x `cells` grid of patches
    over all channels; anything else: one per element."""
    shape = tuple(x.shape[1:])
    if not (x.is_floating_point() or x.is_complex()) and x.dim() == 2:
        return torch.arange(shape[0]).view(1, -1)
    if x.dim() == 2:
        return torch.arange(shape[0]).view(1, -1)
    if x.dim() == 3:
        return torch.arange(shape[0]).view(1, -1, 1)
    if x.dim() == 4:
        h, w = shape[-2:]
        return grid_mask((h, w), (math.ceil(h / cells), math.ceil(w / cells))).view(1, 1, h, w)
    return torch.arange(math.prod(shape)).view(1, *shape)


def check_masks(masks: Any, xs: tuple[Tensor, ...], cells: int = 8) -> tuple[tuple[Tensor, ...], int]:
    """Feature masks, one per input tensor, checked before any forward pass and brought to the inputs' rank with
    first axis 1 or N, on the host (`hierarchy` reads their layout there; `Coalitions` copies them to the inputs'
    device without a wait); and the number of groups M.

    None: `default_mask` per tensor, the ids of later tensors offset past the earlier ones'.
    """
    n = xs[0].shape[0]
    if masks is None:
        out, offset = [], 0
        for x in xs:
            m = default_mask(x, cells) + offset
            offset = int(m.max()) + 1
            out.append(m)
        masks = tuple(out)
    elif isinstance(masks, Tensor):
        masks = (masks,)
    if not isinstance(masks, tuple) or len(masks) != len(xs) or not all(isinstance(m, Tensor) for m in masks):
        raise TypeError(
            f"feature_mask must be an integer tensor (one per input tensor: a tuple of {len(xs)}) that broadcasts to "
            f"the inputs, got {type(masks).__name__}"
        )
    checked = []
    for k, (m, x) in enumerate(zip(masks, xs, strict=True)):
        where = "feature_mask" if len(xs) == 1 else f"feature_mask[{k}]"
        if m.is_floating_point() or m.is_complex() or m.dtype == torch.bool:
            raise TypeError(f"{where} must hold integer group ids 0..M-1, got dtype {m.dtype}")
        if m.dim() > x.dim():
            raise ValueError(f"{where} of shape {tuple(m.shape)} has more axes than the inputs {tuple(x.shape)}")
        full = m.reshape((1,) * (x.dim() - m.dim()) + tuple(m.shape))
        try:
            shape = torch.broadcast_shapes(full.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape or full.shape[0] not in (1, n):
            raise ValueError(
                f"{where} of shape {tuple(m.shape)} does not broadcast to the inputs' shape {tuple(x.shape)}; give one "
                f"mask for all inputs, e.g. {tuple(x.shape[1:])} or (1, {', '.join(map(str, x.shape[1:]))}), or one "
                f"per input, (N, ...) with N = {n}"
            )
        checked.append(full.long())
    # the ids on the host, in one copy (a device mask's only read: M, the number of groups, shapes all the work)
    host = to_host(checked)
    ids = torch.unique(torch.cat([m.flatten() for m in host]))
    if ids.numel() == 0 or int(ids[0]) != 0 or int(ids[-1]) != ids.numel() - 1:
        shown = ids[:8].tolist()
        raise ValueError(
            f"feature_mask group ids must be consecutive from 0 (0..M-1, each used), got ids {shown}"
            f"{'...' if ids.numel() > 8 else ''} ({ids.numel()} distinct); renumber them, e.g. with "
            "torch.unique(mask, return_inverse=True)[1]"
        )
    return tuple(host), ids.numel()


def spread(phi: Tensor, masks: tuple[Tensor, ...], xs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Group attributions (N, K, M) spread onto the inputs, (N, K, *x.shape[1:]): each element gets its group's."""
    n, k, _ = phi.shape
    out = []
    for m, x in zip(masks, xs, strict=True):
        flat = m.flatten(1)
        if m.shape[0] == 1:
            a = phi[:, :, flat[0]]
        else:
            a = torch.gather(phi, 2, flat[:, None, :].expand(n, k, flat.shape[1]))
        out.append(a.view(n, k, *m.shape[1:]).expand(n, k, *x.shape[1:]).contiguous())
    return tuple(out)


# -- the hierarchy of PartitionShap -----------------------------------------------------------------------------------
def _split(ids: list[int], coords: Tensor) -> Tree:
    """A binary tree over `ids`: halves at the median along the coordinate axis of widest spread (stable ties)."""
    if len(ids) == 1:
        return ids[0]
    pts = coords[ids]
    axis = int((pts.max(0).values - pts.min(0).values).argmax())
    order = sorted(range(len(ids)), key=lambda r: (float(pts[r, axis]), ids[r]))
    half = len(ids) // 2
    left = [ids[r] for r in order[:half]]
    right = [ids[r] for r in order[half:]]
    return (_split(left, coords), _split(right, coords))


def layouts(masks: tuple[Tensor, ...], n: int) -> list[Tensor]:
    """The N inputs grouped by the layout of their groups: the (n_b,) host indices of the inputs whose masks are equal
    in every tensor (per-input masks, first axis N; a mask shared by the batch, first axis 1, is everyone's), in
    order of their first input. One group when no mask is per input. Read on the host, where `check_masks` left the
    masks: no value of the device is read."""
    per = [mk.flatten(1) for mk in masks if mk.shape[0] > 1]
    if not per:
        return [torch.arange(n)]
    _, which = torch.unique(torch.cat(per, 1), dim=0, return_inverse=True)
    first = torch.full((int(which.max()) + 1,), n).scatter_reduce(0, which, torch.arange(n), "amin")
    rank = first.argsort().argsort()[which]  # the layouts numbered in order of their first input
    return list(rank.argsort(stable=True).split(torch.bincount(rank).tolist()))


def hierarchy(masks: tuple[Tensor, ...], m: int, row: int = 0) -> Tree:
    """The default hierarchy of `PartitionShap` for the layout of input `row` (its row of per-input masks; a mask
    shared by the batch is every input's): a binary tree over the groups present there, built by splitting them in
    halves at the median of their centroids along the widest axis (spatial halves for image patches and superpixels,
    contiguous halves for tabular features and tokens); with several input tensors, first by tensor."""
    per_tensor: list[Tree] = []
    for mask in masks:
        g = mask[0] if mask.shape[0] == 1 else mask[row]
        coords = torch.stack(
            torch.meshgrid(*[torch.arange(s, dtype=torch.float64) for s in g.shape], indexing="ij"), -1
        ).view(-1, g.dim())
        flat = g.flatten().cpu()
        present = torch.unique(flat).tolist()
        cent = torch.zeros(m, g.dim(), dtype=torch.float64)
        cent.index_add_(0, flat, coords)
        cent /= torch.bincount(flat, minlength=m).clamp_min(1)[:, None].double()
        per_tensor.append(_split(present, cent))
    seen: set[int] = set()
    trees = []
    for t in per_tensor:  # an id shared by two tensors stays in the first one's subtree
        kept = _prune(t, seen)
        if kept is not None:
            trees.append(kept)
    tree = trees[0]
    for t in trees[1:]:
        tree = (tree, t)
    return tree


def _prune(t: Tree, seen: set[int]) -> Tree | None:
    if isinstance(t, int):
        if t in seen:
            return None
        seen.add(t)
        return t
    a, b = _prune(t[0], seen), _prune(t[1], seen)
    return b if a is None else a if b is None else (a, b)


def check_tree(tree: Any, m: int) -> Tree:
    """An explicit hierarchy checked: nested tuples over the group ids 0..M-1, each exactly once; nodes with more
    than two children are split into halves (a binary tree)."""

    def norm(t: Any) -> Tree:
        if is_int(t):
            return t
        if isinstance(t, (tuple, list)) and len(t) >= 1:
            if len(t) == 1:
                return norm(t[0])
            half = len(t) // 2
            return (norm(t[:half]) if half > 1 else norm(t[0]), norm(t[half:]) if len(t) - half > 1 else norm(t[-1]))
        raise TypeError(f"hierarchy must be nested tuples of group ids, got {t!r}")

    out = norm(tree)
    leaves = leaves_of(out)
    if sorted(leaves) != list(range(m)):
        raise ValueError(f"hierarchy must hold every group id 0..{m - 1} exactly once, got {sorted(leaves)}")
    return out


def leaves_of(t: Tree) -> list[int]:
    return [t] if isinstance(t, int) else leaves_of(t[0]) + leaves_of(t[1])
