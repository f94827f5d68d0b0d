"""CRP conditions: which channels (neurons, heads) of which layers the relevance must pass through.

A condition set is ``{layer: channels}`` (Achtibat et al., 2023, "From attribution maps to human-understandable
explanations through Concept Relevance Propagation", Nature Machine Intelligence 5, Sec. "Concept Relevance
Propagation": the product of the masks of several layers). `layer` is any `HookManager` selector naming one module
(a module, its dotted name, a glob); `channels` an int, a sequence of ints or a 1-D integer tensor of indices, or
`Heads` for the heads of an attention. A list of K sets gives K conditional maps from one forward pass.

Where the channels are (`channel_axis`): axis 1 of a convolution-like output (N, C, ...): 4-D and 5-D outputs and the
3-D outputs of 1-d convolutions, BatchNorms and pools; the last axis of token outputs (N, T, D) and of (N, D).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...hooks import Selector
from ...methods.layer import resolve_one_module

# 3-D outputs (N, C, L) whose channel axis is 1; every other 3-D output is a token layer (N, T, D)
_CHANNEL_FIRST_1D: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.ConvTranspose1d,
    nn.BatchNorm1d,
    nn.MaxPool1d,
    nn.AvgPool1d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveMaxPool1d,
    nn.InstanceNorm1d,
)
_PROJECTIONS = ("proj", "out_proj", "o_proj", "c_proj", "dense")
_HEAD_COUNTS = ("heads", "num_heads", "n_heads", "num_attention_heads", "n_head")


@dataclass(frozen=True)
class Heads:
    """Heads of an attention as a CRP condition: ``{"blocks.0.attn": Heads([0, 3])}``.

    The heads are read where they are still apart: the input of the attention's output projection (N, T, H * d),
    split into `num_heads` blocks of d on its last axis (head h = features h*d ... (h+1)*d - 1, the order of
    ``x.transpose(1, 2).reshape(n, t, d)`` in timm's and the zoo's attention). The condition keys the attention module
    (its projection found as a child named ``proj`` / ``out_proj`` / ``o_proj`` / ``c_proj`` / ``dense``, its head
    count from an attribute ``heads`` / ``num_heads`` / ...) or the projection itself with `num_heads` given.
    ``nn.MultiheadAttention`` calls its ``out_proj`` weights inside ``F.multi_head_attention_forward``, not as a
    module: its heads cannot be conditioned on this way (an error says so).
    """

    heads: int | Sequence[int] | Tensor
    num_heads: int | None = None


@dataclass
class Site:
    """One conditioned (or measured) layer: where its tensor is and how its channels are laid out."""

    name: str
    module: nn.Module
    heads: int | None = None  # the input of an output projection split into this many heads

    @property
    def what(self) -> str:
        return f"the heads of {self.name!r}" if self.heads else f"the output of {self.name!r}"

    def channel_axis(self, t: Tensor) -> int:
        if self.heads or t.dim() <= 2:
            return t.dim() - 1
        if t.dim() == 3:
            return 1 if isinstance(self.module, _CHANNEL_FIRST_1D) else 2
        return 1

    def num_channels(self, t: Tensor) -> int:
        if self.heads:
            return self.heads
        return t.shape[self.channel_axis(t)]

    def mask(self, t: Tensor, idx: Tensor) -> Tensor:
        """A 0/1 mask broadcasting to `t` that keeps the channels `idx`."""
        keep = torch.zeros(self.num_channels(t), dtype=t.dtype, device=t.device)
        keep[idx.to(t.device)] = 1
        if self.heads:
            keep = keep.repeat_interleave(t.shape[-1] // self.heads)
        shape = [1] * t.dim()
        shape[self.channel_axis(t)] = keep.numel()
        return keep.view(shape)

    def per_channel(self, r: Tensor) -> Tensor:
        """(N, ...) relevance at the site -> (N, C): each channel's sum."""
        axis = self.channel_axis(r)
        moved = r.movedim(axis, -1)
        if self.heads:
            moved = moved.unflatten(-1, (self.heads, -1)).sum(-1)
        return moved.reshape(r.shape[0], -1, moved.shape[-1]).sum(1)

    def per_channel_max(self, t: Tensor) -> Tensor:
        """(N, ...) activation at the site -> (N, C): each channel's largest value (ActMax's score)."""
        moved = t.detach().movedim(self.channel_axis(t), -1)
        if self.heads:
            moved = moved.unflatten(-1, (self.heads, -1)).movedim(-1, -2).flatten(-3, -2)
        return moved.reshape(t.shape[0], -1, moved.shape[-1]).amax(1)


Condition = dict[str, Tensor]  # site name -> channel indices (1-D int64)


def _indices(value: object, where: str) -> Tensor:
    if isinstance(value, bool):
        raise TypeError(f"{where}: channels must be ints, got a bool")
    if isinstance(value, int):
        idx = torch.tensor([value])
    elif isinstance(value, Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool or value.dim() > 1:
            raise TypeError(f"{where}: a channel tensor must hold integer indices (0-D or 1-D), got {value.dtype} "
                            f"of shape {tuple(value.shape)}")  # fmt: skip
        idx = value.reshape(-1).long().cpu()
    elif isinstance(value, Sequence) and not isinstance(value, str):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(f"{where}: channels must be ints, got {list(value)!r}")
        idx = torch.tensor(list(value), dtype=torch.long)
    else:
        raise TypeError(f"{where}: channels must be an int, a list of ints or a tensor of indices, got "
                        f"{type(value).__name__}")  # fmt: skip
    if idx.numel() == 0:
        raise ValueError(f"{where}: no channels given (an empty condition keeps no relevance)")
    if (idx < 0).any():
        raise ValueError(f"{where}: channel indices must be >= 0, got {idx.tolist()}")
    return idx


def _head_site(model: nn.Module, name: str, module: nn.Module, spec: Heads) -> Site:
    if isinstance(module, nn.MultiheadAttention):
        raise ValueError(
            f"conditions: {name!r} is an nn.MultiheadAttention, which applies its out_proj inside "
            "F.multi_head_attention_forward, where its heads cannot be taken apart by a hook; condition on its output "
            "neurons instead, or use an attention whose output projection is a module call (timm's, the zoo's ViT)"
        )
    proj_name, proj = name, module
    if not isinstance(module, nn.Linear):
        found = [(c, getattr(module, c)) for c in _PROJECTIONS if isinstance(getattr(module, c, None), nn.Linear)]
        if not found:
            raise ValueError(
                f"conditions: Heads on {name!r} ({type(module).__name__}): no output projection found (a child "
                f"nn.Linear named one of {', '.join(_PROJECTIONS)}); key the condition by the projection and give "
                "Heads(..., num_heads=H)"
            )
        proj_name, proj = f"{name}.{found[0][0]}" if name else found[0][0], found[0][1]
    num = spec.num_heads
    if num is None:
        num = next((getattr(module, a) for a in _HEAD_COUNTS if isinstance(getattr(module, a, None), int)), None)
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise ValueError(
            f"conditions: Heads on {name!r}: the number of heads is not known (no attribute "
            f"{' / '.join(_HEAD_COUNTS)}); give Heads(..., num_heads=H)"
        )
    if proj.in_features % num:
        raise ValueError(f"conditions: {proj_name!r} takes {proj.in_features} features, not a multiple of "
                         f"num_heads={num}")  # fmt: skip
    return Site(proj_name, proj, heads=num)


def parse_conditions(
    model: nn.Module, conditions: Mapping[Selector, object] | Sequence[Mapping[Selector, object]]
) -> tuple[list[Condition], dict[str, Site], bool]:
    """(condition sets, the sites they name, whether one set was given as a dict) from the user's `conditions`;
    types, layers and non-negative indices checked here, the channel counts after the forward pass
    (`check_channels`)."""
    single = isinstance(conditions, Mapping)
    sets = [conditions] if single else conditions
    if not isinstance(sets, Sequence) or isinstance(sets, str) or not sets:
        raise TypeError(
            "conditions must be a dict {layer: channels} or a non-empty list of them, got "
            f"{type(conditions).__name__}"
        )
    sites: dict[str, Site] = {}
    parsed: list[Condition] = []
    for k, cond in enumerate(sets):
        where = "conditions" if single else f"conditions[{k}]"
        if not isinstance(cond, Mapping):
            raise TypeError(f"{where} must be a dict {{layer: channels}}, got {type(cond).__name__}")
        one: Condition = {}
        for layer, value in cond.items():
            try:
                name, module = resolve_one_module(model, layer)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{where}: {exc}") from None
            if isinstance(value, Heads):
                site = _head_site(model, name, module, value)
                idx = _indices(value.heads, f"{where}[{name!r}]")
            else:
                site = Site(name, module)
                idx = _indices(value, f"{where}[{name!r}]")
            known = sites.setdefault(site.name, site)
            if known.heads != site.heads:
                raise ValueError(f"{where}: {site.name!r} is conditioned both on heads and on its output")
            if site.name in one:
                raise ValueError(f"{where}: {site.name!r} named twice in one condition set")
            one[site.name] = idx
        parsed.append(one)
    return parsed, sites, single


def check_channels(sets: list[Condition], sites: dict[str, Site], tensors: dict[str, Tensor], single: bool) -> None:
    """`ValueError` naming the first condition that names a channel its layer does not have (after the forward)."""
    for k, cond in enumerate(sets):
        for name, idx in cond.items():
            site = sites[name]
            c = site.num_channels(tensors[name])
            if int(idx.max()) >= c:
                where = "conditions" if single else f"conditions[{k}]"
                bad = [int(i) for i in idx if i >= c]
                unit = "heads" if site.heads else "channels"
                shape, axis = tuple(tensors[name].shape), site.channel_axis(tensors[name])
                raise ValueError(
                    f"{where}[{name!r}]: {unit} {bad} out of range: {site.what} has {c} {unit} (shape {shape}, "
                    f"{unit} on axis {axis}), valid 0..{c - 1}"
                )
