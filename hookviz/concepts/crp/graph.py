"""A concept's children: which channels of an earlier layer carry its relevance (one level of zennit-crp's
``AttributionGraph``; Achtibat et al., 2023, Nature Machine Intelligence 5, "hierarchical concept decomposition").

For one input, the relevance at `earlier_layer` conditioned on the concept (layer, channel): R_{c'|c} = Σ a ⊙ g at
the earlier layer with the later layer masked to channel c, for each channel c' of the earlier layer. Where every
path from the concept to the input passes through the earlier layer and the rules conserve, the children's shares
sum to the concept's own relevance R_c.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...hooks import Selector
from ...methods.layer import resolve_one_module
from .conditions import Site, parse_conditions


@dataclass
class Children:
    """`concept` = (layer name, channel); `layer`: the earlier layer; `relevance` (N, C'): every channel's share of
    the concept's relevance; `channels` / `shares` (N, top): the `top` channels by share, largest first; `total`
    (N,): the concept's relevance R_c at its own layer."""

    concept: tuple[str, int]
    layer: str
    relevance: Tensor
    channels: Tensor
    shares: Tensor
    total: Tensor

    def __repr__(self) -> str:
        rows = [f"Children of {self.concept[0]}[{self.concept[1]}] at {self.layer!r}:"]
        for i in range(self.channels.shape[0]):
            kids = ", ".join(f"{int(c)}: {float(s):.3g}" for c, s in zip(self.channels[i], self.shares[i], strict=True))
            rows.append(f"  input {i}: R_c = {float(self.total[i]):.3g}; {kids}")
        return "\n".join(rows)


def children(
    crp: Any,  # a `CRP` (not imported: `crp` imports this module)
    inputs: Tensor,
    target: Any,
    concept: tuple[Selector, int],
    earlier_layer: Selector,
    *,
    top: int = 5,
    forward_kwargs: dict[str, Any] | None = None,
) -> Children:
    """See `CRP.children`: one forward pass, one backward pass to the concept's layer, one from it below."""
    if not isinstance(concept, tuple) or len(concept) != 2:
        raise TypeError(f"concept must be a (layer, channel) pair, got {concept!r}")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be an int >= 1, got {top!r}")
    layer, channel = concept
    sets, sites, _ = parse_conditions(crp.model, {layer: channel})
    later = next(iter(sets[0]))
    name, module = resolve_one_module(crp.model, earlier_layer)
    if name == later:
        raise ValueError(f"earlier_layer {name!r} is the concept's own layer; name a layer that runs before it")
    sites[name] = Site(name, module)
    out = crp._crp(inputs, target, sets, sites, [name], forward_kwargs, None, want_input=False)
    rel = out.recorded[name][:, 0]
    shares, idx = torch.topk(rel, min(top, rel.shape[1]), dim=1)
    total = out.entering[later][:, int(sets[0][later][0])]
    return Children((later, int(sets[0][later][0])), name, rel, idx, shares, total)
