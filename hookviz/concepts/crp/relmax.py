"""RelMax / ActMax reference examples over a data set (Achtibat et al., 2023, Nature Machine Intelligence 5, Sec.
"Relevance maximization"): for each concept (channel) of a layer, the data set's examples where it is most relevant
and where it is most active, each cropped to where the concept is.

- RelMax score of example i for channel c: R_c(x_i) = Σ a ⊙ g at the layer (`CRP.concept_relevance`) for the
  example's target (its top class, a given class or its label). ActMax score: the channel's largest activation.
- At data-set scale: batches, a running top-k per channel merged after each batch (never all scores in memory),
  state saved after each shard of `shard_size` items (atomically: temporary file, fsync, rename), so that a run
  killed and started again continues where it stopped and gives the result of one uninterrupted run; ranks (torchrun's
  RANK / WORLD_SIZE, or `rank` / `world_size` given) take contiguous blocks of shards as `explain_dataset` does, and
  the ranks' top-k lists merge into the one top-k of the whole data set (ties by the lower index, so any order of
  shards and ranks gives the same lists).
- Crops: RelMax examples to the bounding box of the concept's conditional heat map where it is at least `fraction`
  of its largest value; ActMax examples to the receptive field of the largest activation (the input pixels its
  gradient reaches); both made square and resized to `crop_size`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...dataset.distributed import World, current_world
from ...hooks import Selector
from ...methods.layer import resolve_one_module
from .conditions import Site

_STATE_VERSION = 1


@dataclass
class TopK:
    """Per concept: `indices` (C, k) of data-set items, best first; `scores` (C, k); `targets` (C, k) the class
    each RelMax score was taken for (-1 for ActMax and callable targets). Empty slots (fewer than k items): -1."""

    indices: Tensor
    scores: Tensor
    targets: Tensor

    @staticmethod
    def empty(c: int, k: int) -> TopK:
        return TopK(torch.full((c, k), -1, dtype=torch.long), torch.full((c, k), -math.inf, dtype=torch.float64),
                    torch.full((c, k), -1, dtype=torch.long))  # fmt: skip

    def merge(self, indices: Tensor, scores: Tensor, targets: Tensor) -> TopK:
        """The top k of self and the candidates (C, M): by score, ties by the lower index (any order, same lists)."""
        k = self.indices.shape[1]
        idx = torch.cat([self.indices, indices], 1)
        sc = torch.cat([self.scores, scores.double()], 1)
        tg = torch.cat([self.targets, targets], 1)
        big = torch.iinfo(torch.long).max
        order = torch.argsort(torch.where(idx < 0, big, idx), dim=1, stable=True)
        idx, sc, tg = idx.gather(1, order), sc.gather(1, order), tg.gather(1, order)
        order = torch.argsort(sc, dim=1, descending=True, stable=True)[:, :k]
        return TopK(idx.gather(1, order), sc.gather(1, order), tg.gather(1, order))


@dataclass
class ReferenceExamples:
    """RelMax / ActMax reference examples of `channels` of `layer`: `relevance` and `activation` (`TopK`), and
    when computed the crops (C, k, channels, crop_size, crop_size) with their boxes (C, k, 4: top, left, bottom,
    right, in input pixels). `complete`: every shard of every rank is in (else this rank's part only)."""

    layer: str
    channels: Tensor
    relevance: TopK
    activation: TopK
    complete: bool = True
    relevance_crops: Tensor | None = None
    activation_crops: Tensor | None = None
    relevance_boxes: Tensor | None = None
    activation_boxes: Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        k = self.relevance.indices.shape[1]
        return (f"ReferenceExamples(layer={self.layer!r}, {len(self.channels)} concepts, top {k}, "
                f"complete={self.complete}, crops={'yes' if self.relevance_crops is not None else 'no'})")  # fmt: skip

    def figure(
        self, kind: str = "relevance", concepts: Sequence[int] | None = None, *, title: str | None = None
    ) -> Any:
        """A grid of crops: one row per concept (its channel, then its k examples with their item index and score),
        RelMax (``kind="relevance"``) or ActMax (``"activation"``). Returns a matplotlib Figure."""
        import matplotlib.pyplot as plt

        if kind not in ("relevance", "activation"):
            raise ValueError(f"kind must be 'relevance' or 'activation', got {kind!r}")
        crops = self.relevance_crops if kind == "relevance" else self.activation_crops
        if crops is None:
            raise ValueError("no crops: call relmax(..., crops=True) (needs the data set once more)")
        top = self.relevance if kind == "relevance" else self.activation
        rows = list(range(len(self.channels))) if concepts is None else [self._row(c) for c in concepts]
        k = crops.shape[1]
        fig, axes = plt.subplots(len(rows), k, figsize=(1.3 * k + 0.6, 1.45 * len(rows) + 0.4), squeeze=False)
        for r, row in enumerate(rows):
            for j in range(k):
                ax = axes[r, j]
                ax.set_xticks([])
                ax.set_yticks([])
                if int(top.indices[row, j]) < 0:
                    ax.axis("off")
                    continue
                img = crops[row, j].float()
                img = img.permute(1, 2, 0) if img.shape[0] in (1, 3) else img[0]
                lo, hi = float(img.min()), float(img.max())
                ax.imshow(((img - lo) / (hi - lo if hi > lo else 1.0)).clamp(0, 1).squeeze(-1).numpy(), cmap="gray")
                ax.set_title(f"#{int(top.indices[row, j])}  {float(top.scores[row, j]):.2g}", fontsize=7)
                if j == 0:
                    ax.set_ylabel(f"ch {int(self.channels[row])}", fontsize=8)
        what = "RelMax (most relevant)" if kind == "relevance" else "ActMax (most activating)"
        fig.suptitle(title or f"{what} examples of {self.layer!r}: item index and score", fontsize=9)
        fig.tight_layout()
        return fig

    def _row(self, channel: int) -> int:
        hits = (self.channels == channel).nonzero()
        if not len(hits):
            raise ValueError(f"channel {channel} is not among this result's channels {self.channels.tolist()}")
        return int(hits[0])


def _items(data: Any, idx: Sequence[int]) -> tuple[Tensor, Tensor | None]:
    """The images (B, ...) and labels (B,) or None of the items `idx` of a map-style data set or a tensor."""
    if isinstance(data, Tensor):
        return data[list(idx)], None
    images, labels = [], []
    for i in idx:
        item = data[i]
        if isinstance(item, (tuple, list)):
            images.append(torch.as_tensor(item[0]))
            labels.append(int(item[1]) if len(item) > 1 else -1)
        else:
            images.append(torch.as_tensor(item))
    return torch.stack(images), (torch.tensor(labels) if labels else None)


def _atomic_write(path: Path, payload: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_state(path: Path, config: dict[str, Any], done: list[int], rel: TopK, act: TopK) -> None:
    from safetensors.torch import save

    tensors = {f"{kind}.{f}": getattr(t, f).contiguous() for kind, t in (("rel", rel), ("act", act))
               for f in ("indices", "scores", "targets")}  # fmt: skip
    # tensors first, then the record naming them: a kill between the two leaves the older record, still consistent
    _atomic_write(path.with_suffix(".safetensors"), save(tensors))
    record = {"version": _STATE_VERSION, "config": config, "done": sorted(done)}
    _atomic_write(path.with_suffix(".json"), json.dumps(record).encode())


def _load_state(path: Path) -> tuple[dict[str, Any], list[int], TopK, TopK] | None:
    from safetensors.torch import load_file

    meta, data = path.with_suffix(".json"), path.with_suffix(".safetensors")
    if not meta.exists() or not data.exists():
        return None
    record = json.loads(meta.read_text())
    t = load_file(str(data))
    tops = [TopK(t[f"{kind}.indices"], t[f"{kind}.scores"], t[f"{kind}.targets"]) for kind in ("rel", "act")]
    return record["config"], record["done"], tops[0], tops[1]


def _target_key(target: Any) -> Any:
    if target is None or target == "label" or (isinstance(target, int) and not isinstance(target, bool)):
        return target
    raise TypeError(f"target must be None (each item's top class), an int or 'label', got {target!r}")


def relmax(
    crp: Any,
    data: Any,
    layer: Selector,
    out: str | os.PathLike[str],
    *,
    channels: Sequence[int] | Tensor | None = None,
    k: int = 8,
    target: int | str | None = None,
    heads: int | None = None,
    batch_size: int = 64,
    shard_size: int = 1024,
    resume: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    crops: bool = True,
    fraction: float = 0.5,
    crop_size: int = 48,
    forward_kwargs: dict[str, Any] | None = None,
) -> ReferenceExamples:
    """RelMax and ActMax reference examples of `layer`'s `channels` (default: all) over `data` (a map-style data
    set of images or ``(image, label, ...)`` tuples, or a tensor (N, ...)) with `crp` (a `CRP`); state in `out`.

    `target`: None (each item's top class), an int, or ``"label"``. `resume`: continue the run found in `out` (one
    made with other settings is refused, the difference named); False: refuse an existing run. `rank` /
    `world_size`: this process's share (default: torchrun's environment); the result is merged over the ranks when
    every rank's shards are in (else ``complete=False``: this rank's part). `crops`: crop the top examples (one more
    pass over the k x C top items). See the module docstring."""
    for name, v, lo in (("k", k, 1), ("batch_size", batch_size, 1), ("shard_size", shard_size, 1),
                        ("crop_size", crop_size, 2)):  # fmt: skip
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    target_key = _target_key(target)
    name, module = resolve_one_module(crp.model, layer)
    site = crp._site(name, heads) if heads else Site(name, module)
    n = len(data)
    if n < 1:
        raise ValueError("data is empty")
    world = current_world() if rank is None and world_size is None else World(rank or 0, world_size or 1, rank or 0)
    if not 0 <= world.rank < world.size:
        raise ValueError(f"rank={world.rank} and world_size={world.size} are inconsistent")
    num_shards = math.ceil(n / shard_size)
    # the layer's channel count from one item: every error about channels comes before the data-set pass
    probe = crp._crp(_items(data, [0])[0], target if isinstance(target, int) else None, [{}], {site.name: site},
                     [site.name], forward_kwargs, None, want_input=False)  # fmt: skip
    c_all = probe.recorded[site.name].shape[-1]
    chans = torch.arange(c_all) if channels is None else torch.as_tensor(channels, dtype=torch.long).reshape(-1)
    if chans.numel() == 0 or int(chans.min()) < 0 or int(chans.max()) >= c_all:
        raise ValueError(f"channels: {chans.tolist()} out of range: {site.what} has {c_all} channels (0..{c_all - 1})")
    config = {"layer": site.name, "heads": site.heads, "k": k, "channels": chans.tolist(), "target": target_key,
              "n": n, "shard_size": shard_size, "world_size": world.size, "model": type(crp.model).__qualname__,
              "composite": crp.composite.name}  # fmt: skip
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"relmax-rank{world.rank}"
    state = _load_state(path)
    if state is not None and not resume:
        raise ValueError(f"a RelMax run is already in {str(folder)!r}; pass resume=True to continue it, or another out")
    if state is not None and state[0] != config:
        diff = {key: (state[0].get(key), v) for key, v in config.items() if state[0].get(key) != v}
        raise ValueError(f"the RelMax run in {str(folder)!r} was made with other settings (stored, now): {diff}")
    done, rel, act = (
        (state[1], state[2], state[3]) if state else ([], TopK.empty(len(chans), k), TopK.empty(len(chans), k))
    )
    for shard in world.shards(num_shards):
        if shard in done:
            continue
        for start in range(shard * shard_size, min(n, (shard + 1) * shard_size), batch_size):
            idx = list(range(start, min(start + batch_size, (shard + 1) * shard_size, n)))
            x, labels = _items(data, idx)
            if target_key == "label":
                if labels is None:
                    raise ValueError("target='label' needs a data set of (image, label) items")
                tgt: Any = labels
            else:
                tgt = target_key
            res = crp._crp(x, tgt, [{}], {site.name: site}, [site.name], forward_kwargs, None, want_input=False)
            r = res.recorded[site.name][:, 0][:, chans].T.cpu()  # (C, B)
            a = res.activation[site.name][:, chans].T.cpu()
            items = torch.tensor(idx).expand(len(chans), -1)
            classes = res.targets.indices
            t_rel = (classes[:, 0].cpu() if classes is not None else torch.full((len(idx),), -1)).expand(len(chans), -1)
            rel = rel.merge(items, r, t_rel)
            act = act.merge(items, a, torch.full_like(items, -1))
        done.append(shard)
        _save_state(path, config, done, rel, act)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world.barrier()
    complete = True
    for other in range(world.size):
        if other == world.rank:
            continue
        st = _load_state(folder / f"relmax-rank{other}")
        other_world = World(other, world.size, other)
        if st is None or st[0] != config or set(st[1]) != set(other_world.shards(num_shards)):
            complete = False
            continue
        rel = rel.merge(st[2].indices, st[2].scores, st[2].targets)
        act = act.merge(st[3].indices, st[3].scores, st[3].targets)
    result = ReferenceExamples(site.name, chans, rel, act, complete=complete, meta=config)
    if crops and complete and _items(data, [0])[0].dim() == 4:  # images (C, H, W): crops; other inputs: none
        _crop(crp, data, site, result, fraction, crop_size, forward_kwargs)
    return result


def _box(mask: Tensor) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) of the True pixels of `mask` (H, W); the whole image if none."""
    h, w = mask.shape
    rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
    if not len(rows):
        return 0, 0, h, w
    return int(rows[0]), int(cols[0]), int(rows[-1]) + 1, int(cols[-1]) + 1


def _square_crop(img: Tensor, box: tuple[int, int, int, int], size: int) -> Tensor:
    """`img` (C, H, W) cut to `box` grown to a square (inside the image where it fits), resized to size x size."""
    _, h, w = img.shape
    top, left, bottom, right = box
    side = min(max(bottom - top, right - left), h, w)
    cy, cx = (top + bottom) / 2, (left + right) / 2
    t = int(min(max(round(cy - side / 2), 0), h - side))
    lft = int(min(max(round(cx - side / 2), 0), w - side))
    patch = img[:, t : t + side, lft : lft + side].float()
    return F.interpolate(patch[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


def _crop(crp: Any, data: Any, site: Site, res: ReferenceExamples, fraction: float, size: int, fk: Any) -> None:
    """Crops of the top examples: conditional heat maps for RelMax, receptive fields of the maximum for ActMax."""
    c, k = res.relevance.indices.shape
    rel_crops, act_crops = [], []
    rel_boxes, act_boxes = torch.zeros(c, k, 4, dtype=torch.long), torch.zeros(c, k, 4, dtype=torch.long)
    first = _items(data, [0])[0]
    blank = torch.zeros(first.shape[1], size, size)
    for row, ch in enumerate(res.channels.tolist()):
        for top, crops, boxes, kind in ((res.relevance, rel_crops, rel_boxes, "rel"),
                                        (res.activation, act_crops, act_boxes, "act")):  # fmt: skip
            valid = [j for j in range(k) if int(top.indices[row, j]) >= 0]
            out = [blank] * k
            if valid:
                x, _ = _items(data, [int(top.indices[row, j]) for j in valid])
                if kind == "rel":
                    tg = top.targets[row, valid]
                    tgt: Any = None if bool((tg < 0).any()) else tg
                    cond = {site.name: _condition_value(site, ch)}
                    heat = crp.attribute(x, tgt, conditions=cond, forward_kwargs=fk).detach()
                    maps = heat.sum(1) if heat.dim() == 4 else heat
                    maps = maps.clamp(min=0)
                    peak = maps.flatten(1).amax(1).view(-1, *[1] * (maps.dim() - 1))
                    masks = (maps >= fraction * peak) & (peak > 0)
                else:
                    masks = _receptive_field(crp, x, site, ch)
                for slot, j in enumerate(valid):
                    box = _box(masks[slot]) if masks.dim() == 3 else (0, 0, *x.shape[-2:])
                    boxes[row, j] = torch.tensor(box)
                    out[j] = _square_crop(x[slot].detach().cpu(), box, size) if x.dim() == 4 else blank
            crops.append(torch.stack(out))
    res.relevance_crops, res.activation_crops = torch.stack(rel_crops), torch.stack(act_crops)
    res.relevance_boxes, res.activation_boxes = rel_boxes, act_boxes


def _condition_value(site: Site, ch: int) -> Any:
    if site.heads:
        from .conditions import Heads

        return Heads(ch, num_heads=site.heads)
    return ch


def _receptive_field(crp: Any, x: Tensor, site: Site, ch: int) -> Tensor:
    """(B, H, W): the input pixels that the largest activation of channel `ch` depends on (its gradient's support,
    plain autograd in eval mode: the receptive field of that unit, as far as the input reaches it)."""
    taken: list[Tensor] = []
    x = x.to(next(iter(crp.model.parameters())).device, next(iter(crp.model.parameters())).dtype)
    with crp._prepared() as hooks:
        if site.heads:
            hooks.forward_pre(site.module, lambda m, args: taken.append(args[0]))
        else:
            hooks.forward(site.module, lambda m, args, o: taken.append(o))
        leaf = x.detach().requires_grad_(True)
        crp.model(leaf)
        t = taken[0]
        moved = t.movedim(site.channel_axis(t), -1)
        if site.heads:
            moved = moved.unflatten(-1, (site.heads, -1)).movedim(-1, -2).flatten(-3, -2)
        unit = moved.reshape(t.shape[0], -1, moved.shape[-1])[..., ch].amax(1)
        (g,) = torch.autograd.grad(unit.sum(), leaf)
    return (g.abs().flatten(1, 1) if g.dim() == 3 else g.abs().sum(1)) > 0
