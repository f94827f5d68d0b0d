"""The provided edits of `intervene`: zero / mean-ablate, scale, add a direction (steering), replace (patching).

Each edit acts on a selection of the activation: ``channels=``, ``tokens=`` (tokens layout) and ``region=`` (a
spatial box ``(y0, y1, x0, x1)``, half-open, or an (h, w) boolean mask; NCHW / NHWC layouts), combined with AND;
no selection means the whole activation. Indices are those of one sample: the edit applies to every sample of the
batch. Example::

    from hookviz.interventions import zero, replace
    with hv.intervene(model, {"layer3": zero(channels=[4, 7]), "layer4": replace(clean_cache, region=(0, 2, 0, 2))}):
        out = model(x)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch import Tensor

from .layout import Axes

Index: TypeAlias = "int | Sequence[int] | slice | Tensor"
Region: TypeAlias = "tuple[int, int, int, int] | Tensor"

__all__ = ["CallSite", "Edit", "add", "mean_ablate", "replace", "scale", "zero"]


@dataclass(frozen=True)
class CallSite:
    """Where an edit runs: the module `name`, its `call` index in this forward (0, 1, ... for a reused module), the
    result `key` (``name`` or ``name#call``, the keys of `cache` and the recorders) and the activation's `axes`."""

    name: str
    call: int
    key: str
    axes: Axes | None


def _check_index(value: Any, what: str) -> None:
    if value is None or isinstance(value, slice):
        return
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, a sequence of ints, a slice or a tensor, got a bool")
    if isinstance(value, int):
        return
    if isinstance(value, Tensor):
        if value.dtype != torch.bool and value.is_floating_point():
            raise TypeError(f"{what} must be an integer or boolean tensor, got dtype {value.dtype}")
        return
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return
    raise TypeError(f"{what} must be an int, a sequence of ints, a slice or a tensor, got {value!r}")


def _axis_mask(size: int, index: Any, what: str, device: torch.device) -> Tensor:
    mask = torch.zeros(size, dtype=torch.bool, device=device)
    if isinstance(index, Tensor) and index.dtype == torch.bool:
        if index.shape != (size,):
            raise ValueError(f"{what} as a boolean mask must have shape ({size},), got {tuple(index.shape)}")
        return index.to(device)
    if isinstance(index, slice):
        mask[index] = True
        return mask
    idx = torch.as_tensor([index] if isinstance(index, int) else index, dtype=torch.long).flatten()
    if idx.numel() and (idx.min() < -size or idx.max() >= size):
        bad = idx[(idx < -size) | (idx >= size)][0].item()
        raise ValueError(f"{what} index {bad} is out of range for an axis of size {size} (valid: 0..{size - 1})")
    mask[idx.to(device)] = True
    return mask


def selection_mask(
    shape: Sequence[int], axes: Axes, *, channels: Any = None, tokens: Any = None, region: Any = None,
    device: torch.device | None = None,
) -> Tensor | None:  # fmt: skip
    """A boolean mask broadcastable to an activation of `shape` (batch axis of size 1); None selects everything."""
    ndim = len(shape)
    mask: Tensor | None = None

    def combine(axis: int, part: Tensor) -> None:
        nonlocal mask
        view = [1] * ndim
        view[axis] = shape[axis]
        part = part.reshape(view)
        mask = part if mask is None else mask & part

    if channels is not None:
        combine(axes.channel, _axis_mask(shape[axes.channel], channels, "channels", device))
    if tokens is not None:
        if axes.token is None:
            raise ValueError(f"tokens= needs a tokens layout (N, T, D); this activation's layout is {axes.layout!r}")
        combine(axes.token, _axis_mask(shape[axes.token], tokens, "tokens", device))
    if region is not None:
        if axes.spatial is None:
            raise ValueError(
                f"region= needs a spatial layout (nchw / nhwc); this activation's layout is {axes.layout!r}"
            )
        ya, xa = axes.spatial
        h, w = shape[ya], shape[xa]
        if isinstance(region, Tensor):
            if region.dtype != torch.bool or tuple(region.shape) != (h, w):
                raise ValueError(
                    f"region as a mask must be a boolean tensor of shape ({h}, {w}), got {region.dtype} "
                    f"{tuple(region.shape)}"
                )
            cell = region.to(device)
        else:
            y0, y1, x0, x1 = region
            if not (0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w):
                raise ValueError(
                    f"region (y0, y1, x0, x1) = {tuple(region)} is empty or outside the ({h}, {w}) map (half-open box)"
                )
            cell = torch.zeros(h, w, dtype=torch.bool, device=device)
            cell[y0:y1, x0:x1] = True
        view = [1] * ndim
        view[ya], view[xa] = h, w
        cell = cell.reshape(view)
        mask = cell if mask is None else mask & cell
    return mask


class Edit:
    """An edit of one module output, restricted to ``channels`` / ``tokens`` / ``region`` (see the module docs).

    Subclasses implement `edited(activation, site)`, the fully edited activation; the selection keeps the
    original values outside it. Called as ``edit(activation, site)`` by `intervene`.
    """

    def __init__(self, *, channels: Index | None = None, tokens: Index | None = None, region: Region | None = None):
        _check_index(channels, "channels")
        _check_index(tokens, "tokens")
        if region is not None and not isinstance(region, Tensor):
            if not (
                isinstance(region, Sequence)
                and len(region) == 4
                and all(isinstance(v, int) and not isinstance(v, bool) for v in region)
            ):
                raise TypeError(f"region must be (y0, y1, x0, x1) ints or an (h, w) boolean tensor, got {region!r}")
        self.channels, self.tokens, self.region = channels, tokens, region

    def edited(self, activation: Tensor, site: CallSite) -> Tensor:
        raise NotImplementedError

    def __call__(self, activation: Tensor, site: CallSite) -> Tensor:
        if site.axes is None:
            raise ValueError(f"the edit for {site.key!r} needs the activation's layout")
        mask = selection_mask(
            activation.shape, site.axes, channels=self.channels, tokens=self.tokens, region=self.region,
            device=activation.device,
        )  # fmt: skip
        new = self.edited(activation, site).to(activation.dtype)
        # a fresh, dense tensor in every case: the result may be an expanded view or the cached source itself, and
        # a later in-place operation (nn.ReLU(inplace=True)) writes into it
        return new.clone(memory_format=torch.contiguous_format) if mask is None else torch.where(mask, new, activation)

    def _selection(self) -> str:
        parts = [f"{k}={v!r}" for k, v in (("channels", self.channels), ("tokens", self.tokens)) if v is not None]
        if self.region is not None:
            parts.append("region=..." if isinstance(self.region, Tensor) else f"region={tuple(self.region)!r}")
        return ", ".join(parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__.lstrip('_').lower()}({self._selection()})"


def _per_sample(value: Tensor, activation: Tensor, what: str, site: CallSite) -> Tensor:
    """`value` shaped like one sample of `activation` (or like the whole batch), on its device and dtype."""
    value = value.to(device=activation.device, dtype=activation.dtype)
    if value.shape == activation.shape or value.shape == activation.shape[1:]:
        return value
    if value.dim() == activation.dim() and value.shape[0] == 1 and value.shape[1:] == activation.shape[1:]:
        return value
    raise ValueError(
        f"{what} for {site.key!r} has shape {tuple(value.shape)}; the activation there has shape "
        f"{tuple(activation.shape)}: pass one sample's shape {tuple(activation.shape[1:])} or the batch's"
    )


class _Zero(Edit):
    def edited(self, activation: Tensor, site: CallSite) -> Tensor:
        return torch.zeros_like(activation)


class _Scale(Edit):
    def __init__(self, factor: float, **selection: Any) -> None:
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise TypeError(f"factor must be a number, got {type(factor).__name__}")
        super().__init__(**selection)
        self.factor = float(factor)

    def edited(self, activation: Tensor, site: CallSite) -> Tensor:
        return activation * self.factor

    def __repr__(self) -> str:
        return f"scale({self.factor}{', ' if self._selection() else ''}{self._selection()})"


class _MeanAblate(Edit):
    def __init__(self, mean: Tensor | Mapping[str, Tensor] | None = None, **selection: Any) -> None:
        if mean is not None and not isinstance(mean, Tensor | Mapping):
            raise TypeError(
                "mean must be None (the batch mean), a tensor or a cache keyed like hv.cache, "
                f"got {type(mean).__name__}"
            )
        super().__init__(**selection)
        self.mean = mean

    def edited(self, activation: Tensor, site: CallSite) -> Tensor:
        if self.mean is None:
            return activation.mean(0, keepdim=True).expand_as(activation)
        mean = _lookup(self.mean, site, "mean")
        if mean.shape == activation.shape[1:] or mean.shape == activation.shape:
            pass
        elif mean.dim() == activation.dim():  # a cache over a data set: average it
            mean = mean.mean(0)
        return _per_sample(mean, activation, "mean", site).expand_as(activation)


class _Add(Edit):
    def __init__(self, direction: Tensor, alpha: float = 1.0, **selection: Any) -> None:
        if not isinstance(direction, Tensor) or not direction.is_floating_point():
            raise TypeError(f"direction must be a floating-point tensor, got {type(direction).__name__}")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float):
            raise TypeError(f"alpha must be a number, got {type(alpha).__name__}")
        super().__init__(**selection)
        self.direction, self.alpha = direction, float(alpha)

    def edited(self, activation: Tensor, site: CallSite) -> Tensor:
        d = self.direction.to(device=activation.device, dtype=activation.dtype)
        channel = site.axes.channel if site.axes is not None else 1
        if d.dim() == 1:  # a direction in feature space, added at every position
            if d.shape[0] != activation.shape[channel]:
                raise ValueError(
                    f"direction for {site.key!r} has {d.shape[0]} entries; the activation has "
                    f"{activation.shape[channel]} channels on axis {channel}"
                )
            view = [1] * activation.dim()
            view[channel] = -1
            d = d.reshape(view)
        else:
            d = _per_sample(d, activation, "direction", site)
        return activation + self.alpha * d


class _Replace(Edit):
    def __init__(self, source: Tensor | Mapping[str, Tensor], **selection: Any) -> None:
        if not isinstance(source, Tensor | Mapping):
            raise TypeError(
                f"source must be a tensor or the activations of another input (hv.cache), got {type(source).__name__}"
            )
        super().__init__(**selection)
        self.source = source

    def edited(self, activation: Tensor, site: CallSite) -> Tensor:
        value = _per_sample(_lookup(self.source, site, "source"), activation, "source", site)
        return value.expand_as(activation)


def _lookup(source: Tensor | Mapping[str, Tensor], site: CallSite, what: str) -> Tensor:
    if isinstance(source, Tensor):
        return source
    if site.key not in source:
        raise KeyError(
            f"{what} holds no activation for {site.key!r}; it holds {', '.join(map(repr, source)) or 'nothing'} "
            f"(cache the layer with hv.cache(model, x, layers=[{site.name!r}]))"
        )
    return source[site.key]


def zero(*, channels: Index | None = None, tokens: Index | None = None, region: Region | None = None) -> Edit:
    """Zero-ablate the selection (every channel / token / cell when nothing is selected)."""
    return _Zero(channels=channels, tokens=tokens, region=region)


def mean_ablate(
    mean: Tensor | Mapping[str, Tensor] | None = None, *, channels: Index | None = None, tokens: Index | None = None,
    region: Region | None = None,
) -> Edit:  # fmt: skip
    """Replace the selection by a mean activation: `mean` shaped like one sample, a cache of a data set (``hv.cache``:
    averaged over its batch), or None for the mean over the current batch."""
    return _MeanAblate(mean, channels=channels, tokens=tokens, region=region)


def scale(
    factor: float, *, channels: Index | None = None, tokens: Index | None = None, region: Region | None = None
) -> Edit:
    """Multiply the selection by `factor`."""
    return _Scale(factor, channels=channels, tokens=tokens, region=region)


def add(
    direction: Tensor, alpha: float = 1.0, *, channels: Index | None = None, tokens: Index | None = None,
    region: Region | None = None,
) -> Edit:  # fmt: skip
    """Add ``alpha * direction`` (activation steering, Turner et al. 2023): a (C,) direction in feature space is added
    at every position of the selection; a tensor shaped like one sample is added as it is."""
    return _Add(direction, alpha, channels=channels, tokens=tokens, region=region)


def replace(
    source: Tensor | Mapping[str, Tensor], *, channels: Index | None = None, tokens: Index | None = None,
    region: Region | None = None,
) -> Edit:  # fmt: skip
    """Replace the selection by the activation of another input: `source` is ``hv.cache(model, other, layers=...)``
    (looked up by call key) or a tensor shaped like the activation (or one sample of it). Activation patching."""
    return _Replace(source, channels=channels, tokens=tokens, region=region)
