"""Feature-visualisation objectives: what an image is optimised to excite (Olah et al., "Feature Visualization",
Distill 2017; the conventions of Lucid / lucent).

An `Objective` maps the activations of the layers it names to one value per image, to be *maximised*; objectives
add, subtract and scale (``channel("head", 3) - 0.5 * channel("head", 5)``). ``"layer:12"`` is short for
``channel("layer", 12)``. Layers are module names or call keys (``"relu#1"``). Outputs are read as (N, C, ...):
NCHW maps, (N, C) vectors; pass ``layout="nhwc"`` or ``"tokens"`` for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .layout import check_layout

__all__ = ["Objective", "as_objective", "channel", "direction", "diversity", "neuron"]

Acts = Mapping[str, Tensor]


def _channels_first(t: Tensor, layout: str | None) -> Tensor:
    """(N, C, ...) view of a layer output in `layout` (NHWC and tokens move their feature axis to 1)."""
    if layout == "nhwc" or layout == "tokens":
        return t.movedim(-1, 1)
    return t


class Objective:
    """A value per image (shape (B,)) computed from the activations of `layers`, to be maximised.

    ``fn(acts)`` gets ``{layer key: activation}``; `checks` validate indices against the activation shapes before
    any optimisation step (``check(shapes)`` raises a ValueError naming the problem).
    """

    def __init__(
        self,
        layers: tuple[str, ...],
        fn: Callable[[Acts], Tensor],
        description: str,
        checks: tuple[Callable[[Mapping[str, torch.Size]], None], ...] = (),
    ) -> None:
        self.layers, self.fn, self.description, self.checks = layers, fn, description, checks

    def __call__(self, acts: Acts) -> Tensor:
        return self.fn(acts)

    def check(self, shapes: Mapping[str, torch.Size]) -> None:
        for check in self.checks:
            check(shapes)

    def _combine(self, other: Objective, sign: float, symbol: str) -> Objective:
        return Objective(
            tuple(dict.fromkeys(self.layers + other.layers)),
            lambda acts: self(acts) + sign * other(acts),
            f"{self.description} {symbol} {other.description}",
            self.checks + other.checks,
        )

    def __add__(self, other: Any) -> Objective:
        if isinstance(other, int | float) and other == 0:
            return self  # sum() starts from 0
        return self._combine(as_objective(other), 1.0, "+")

    __radd__ = __add__

    def __sub__(self, other: Any) -> Objective:
        return self._combine(as_objective(other), -1.0, "-")

    def __mul__(self, weight: float) -> Objective:
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise TypeError(f"an objective can be scaled by a number, got {type(weight).__name__}")
        return Objective(self.layers, lambda acts: weight * self(acts), f"{weight:g} * {self.description}", self.checks)

    __rmul__ = __mul__

    def __neg__(self) -> Objective:
        return self * -1.0

    def __repr__(self) -> str:
        return f"Objective({self.description})"


def _index_check(layer: str, axis_value: int, size_of: Callable[[torch.Size], int], what: str, desc: str):  # noqa: ANN202
    def check(shapes: Mapping[str, torch.Size]) -> None:
        size = size_of(shapes[layer])
        if not -size <= axis_value < size:
            raise ValueError(f"objective {desc}: {what} {axis_value} is out of range; {layer!r} has {size} {what}s")

    return check


def _channel_count(layout: str | None) -> Callable[[torch.Size], int]:
    return lambda shape: shape[-1] if layout in ("nhwc", "tokens") else shape[1]


def channel(layer: str, n: int, *, layout: str | None = None) -> Objective:
    """The mean activation of channel `n` of `layer` over its positions (a unit of a (N, C) layer: its value)."""
    check_layout(layout)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"channel index n must be an int, got {n!r}")
    desc = f"{layer}:{n}"

    def fn(acts: Acts) -> Tensor:
        a = _channels_first(acts[layer], layout)[:, n]
        return a.reshape(a.shape[0], -1).mean(1)

    return Objective((layer,), fn, desc, (_index_check(layer, n, _channel_count(layout), "channel", desc),))


def neuron(layer: str, n: int, x: int | None = None, y: int | None = None, *, layout: str | None = None) -> Objective:
    """Channel `n` of `layer` at one position (y, x) of an NCHW / NHWC map; the centre by default (lucent's choice:
    for even sizes, the bottom-right cell of the central 2x2)."""
    check_layout(layout)
    desc = f"neuron {layer}:{n} at ({y}, {x})"

    def fn(acts: Acts) -> Tensor:
        a = _channels_first(acts[layer], layout)
        if a.dim() != 4:
            raise ValueError(f"neuron needs a spatial map (N, C, h, w) at {layer!r}, got shape {tuple(a.shape)}")
        h, w = a.shape[2:]
        return a[:, n, h // 2 if y is None else y, w // 2 if x is None else x]

    return Objective((layer,), fn, desc, (_index_check(layer, n, _channel_count(layout), "channel", desc),))


def direction(layer: str, vector: Tensor, *, layout: str | None = None) -> Objective:
    """The cosine similarity between `vector` (C,) and the activation vector at each position, averaged (lucent's
    ``direction``)."""
    check_layout(layout)
    if not isinstance(vector, Tensor) or vector.dim() != 1:
        raise TypeError(f"vector must be a 1-D tensor of one value per channel, got {vector!r}")
    desc = f"direction at {layer}"

    def fn(acts: Acts) -> Tensor:
        a = _channels_first(acts[layer], layout)
        v = vector.to(a).reshape(1, -1, *([1] * (a.dim() - 2)))
        sim = F.cosine_similarity(v, a, dim=1)
        return sim.reshape(sim.shape[0], -1).mean(1)

    def check(shapes: Mapping[str, torch.Size]) -> None:
        c = _channel_count(layout)(shapes[layer])
        if vector.shape[0] != c:
            raise ValueError(f"objective {desc}: vector has {vector.shape[0]} entries, {layer!r} has {c} channels")

    return Objective((layer,), fn, desc, (check,))


def diversity(layer: str, *, layout: str | None = None) -> Objective:
    """Diversity of a batch (lucent's ``diversity``): minus the cosine similarity of each image's Gram matrix of
    `layer` with the others', per image (their sum over the batch is lucent's value). Add it with a weight to render
    several different images of one unit."""
    check_layout(layout)

    def fn(acts: Acts) -> Tensor:
        a = _channels_first(acts[layer], layout)
        b, c = a.shape[:2]
        flat = a.reshape(b, c, -1)
        grams = F.normalize((flat @ flat.transpose(1, 2)).reshape(b, -1), dim=1)
        sim = grams @ grams.T
        return -(sim.sum(1) - sim.diagonal()) / b

    return Objective((layer,), fn, f"diversity at {layer}")


def as_objective(obj: Any) -> Objective:
    """An `Objective` as it is; ``"layer:12"`` -> ``channel("layer", 12)``."""
    if isinstance(obj, Objective):
        return obj
    if isinstance(obj, str):
        layer, sep, n = obj.rpartition(":")
        if not sep or not layer or not n.lstrip("-").isdigit():
            raise ValueError(f"objective {obj!r} must read 'layer:channel', e.g. 'features.4:12' or 'head:3'")
        return channel(layer, int(n))
    raise TypeError(f"objective must be an Objective or a 'layer:channel' string, got {type(obj).__name__}")
