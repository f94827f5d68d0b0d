"""Patching sites: a layer, a layer x channel, x token position, x spatial cell or x attention head.

A site spec maps call keys (``"layer3"``, ``"relu#1"``) to a kind; `site_index` numbers the elements of one
sample's activation by the site they belong to, so that one comparison gives the masks of a whole chunk of sites and
one ``scatter_add`` sums per-site attributions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ._common import parse_key
from .layout import Axes

KINDS: tuple[str, ...] = ("layer", "channel", "token", "spatial", "head")


def parse_sites(model: nn.Module, sites: Any, heads: int | None) -> dict[str, str]:
    """``"layer3"`` / ``["layer3", "layer4"]`` (whole layers) or ``{"layer3": "channel", ...}`` -> {key: kind}."""
    if isinstance(sites, str):
        sites = {sites: "layer"}
    elif isinstance(sites, Sequence) and not isinstance(sites, str):
        sites = {s: "layer" for s in sites}
    if not isinstance(sites, Mapping) or not sites:
        raise TypeError(
            "sites must be a layer name, a list of them, or a dict {layer: kind} with kind one of "
            f"{', '.join(map(repr, KINDS))}; got {sites!r}"
        )
    out = {}
    for key, kind in sites.items():
        parse_key(model, key, "sites")
        if kind not in KINDS:
            raise ValueError(f"sites[{key!r}] = {kind!r} is not a site kind; use one of {', '.join(map(repr, KINDS))}")
        if kind == "head" and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
            raise ValueError(
                f"sites[{key!r}] = 'head' needs heads=<number of attention heads> (int >= 1), got {heads!r}"
            )
        out[key] = kind
    return out


def site_index(
    shape: Sequence[int], axes: Axes | None, kind: str, heads: int | None, key: str
) -> tuple[Tensor, tuple[int, ...]]:
    """(index, grid): `index` (broadcastable to one sample, batch axis of size 1) holds each element's site number;
    `grid` is the shape of the sites (() for a layer, (C,), (T,), (h, w), (heads,))."""
    ndim = len(shape)

    def along(values: Tensor, dims: tuple[int, ...]) -> Tensor:
        view = [1] * ndim
        for d in dims:
            view[d] = shape[d]
        return values.reshape(view)

    if kind == "layer":
        return torch.zeros([1] * ndim, dtype=torch.long), ()
    assert axes is not None  # every kind but "layer" has its axes resolved by the caller
    if kind == "channel":
        c = shape[axes.channel]
        return along(torch.arange(c), (axes.channel,)), (c,)
    if kind == "token":
        if axes.token is None:
            raise ValueError(
                f"sites[{key!r}] = 'token' needs a tokens layout (N, T, D); the layout there is {axes.layout!r}"
            )
        t = shape[axes.token]
        return along(torch.arange(t), (axes.token,)), (t,)
    if kind == "spatial":
        if axes.spatial is None:
            raise ValueError(
                f"sites[{key!r}] = 'spatial' needs an NCHW / NHWC layout; the layout there is {axes.layout!r}"
            )
        h, w = shape[axes.spatial[0]], shape[axes.spatial[1]]
        return along(torch.arange(h * w), axes.spatial), (h, w)
    d = shape[axes.channel]
    assert heads is not None
    if d % heads:
        raise ValueError(f"sites[{key!r}] = 'head': {d} features do not split into heads={heads} equal heads")
    return along(torch.arange(d) // (d // heads), (axes.channel,)), (heads,)
