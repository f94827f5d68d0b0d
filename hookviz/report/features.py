"""`report_features`: a static HTML report of an SAE's latents over a data set (no server, no CDN; issue 37).

The data set is streamed in batches through the model with a hook on `layer` (the SAE encodes the layer's output);
nothing but running statistics is kept: per latent a running top-k of its contexts (the activation, the row and
position, the tokens around it with the latent's activation on each, or the image crop around it), a histogram with
fixed bins, its density (the fraction of positions where it fires), its maximum and, with a `metric`, the sum of its
attribution (`hookviz.features.latent_attribution`, gradient x activation) over the rows.

``index.html``: the latents with their density, max activation (and mean attribution), each linking to
``latent/<i>.html``: its top contexts (tokens highlighted by activation, or image crops), its histogram (an inline
SVG), the tokens its decoder direction promotes and suppresses (``W_dec[i] @ W_U``, the unembedding of the model's
output embeddings or of `unembed`; omitted without one) and its attribution. Every text from data is escaped.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from ..features._acts import batches, first_tensor, model_device, model_inputs
from ..features.attribution import latent_attribution
from ..features.sae import SAE
from ..hooks import HookManager
from ..interventions._common import prepared
from .concepts import _page
from .output import VERSION, mark, prepare_out
from .pages import _asset

__all__ = ["FeatureStats", "collect_features", "report_features"]

#: pixels of an image context's crop in the pages
CROP = 64


@dataclass
class FeatureStats:
    """The running statistics of the latents `latents` (L of them) after a pass over the data.

    ``top_values`` (k, L) descending (-inf where fewer than k positions were seen), ``top_rows`` / ``top_positions``
    (k, L) the data row and the position in it; ``top_tokens`` (k, L, W) the token ids around the position (-1 outside
    the row or on padding) with ``top_window`` (k, L, W) the latent's activation on each, the position at index
    `before`; ``top_images`` (k, L, 3, CROP, CROP) uint8 crops for image data. ``hist`` (L, bins + 2): counts of
    activations <= 0, then `bins` equal bins over (0, ``hist_max``], then above ``hist_max``; it sums to `positions`.
    ``fired`` (L,) positions > 0, ``max`` (L,); ``attribution`` (L,) summed over `rows` (with a metric)."""

    latents: list[int]
    top_values: Tensor
    top_rows: Tensor
    top_positions: Tensor
    top_tokens: Tensor | None
    top_window: Tensor | None
    top_images: Tensor | None
    hist: Tensor
    hist_max: Tensor
    fired: Tensor
    max: Tensor
    positions: int
    rows: int
    before: int
    attribution: Tensor | None = None

    @property
    def density(self) -> Tensor:
        return self.fired.double() / max(self.positions, 1)


def _positions(a: Tensor) -> tuple[Tensor, tuple[int, int] | None]:
    """Activations or latents (N, ...) -> (N, P, F) with the grid of a 4-D layer's positions."""
    if a.dim() == 2:
        return a[:, None], None
    if a.dim() == 3:
        return a, None
    if a.dim() == 4:
        n, c, h, w = a.shape
        return a.permute(0, 2, 3, 1).reshape(n, h * w, c), (h, w)
    raise ValueError(f"the layer's output has shape {tuple(a.shape)}: expected (N, D), (N, T, D) or (N, C, H, W)")


def _grid(p: int, grid: tuple[int, int] | None) -> tuple[tuple[int, int], int] | None:
    """The patch grid of P positions and the offset of the first patch (a class token first), or None."""
    if grid is not None:
        return grid, 0
    for offset in (0, 1):
        s = math.isqrt(max(p - offset, 0))
        if s > 0 and s * s == p - offset:
            return (s, s), offset
    return None


def _crops(images: Tensor, rows: Tensor, pos: Tensor, p: int, grid: tuple[int, int] | None) -> Tensor:
    """(k, L, 3, CROP, CROP) uint8: the region of each position (its patch and one patch around it; the whole image
    for a class token or a layer without a grid), each image scaled to its own range where outside [0, 1]."""
    x = images.detach().float().cpu()
    if x.min() < 0 or x.max() > 1:
        lo = x.amin((1, 2, 3), keepdim=True)
        x = (x - lo) / (x.amax((1, 2, 3), keepdim=True) - lo).clamp_min(1e-12)
    x = x.clamp(0, 1).expand(-1, 3, -1, -1) if x.shape[1] == 1 else x[:, :3]
    h, w = x.shape[-2:]
    found = _grid(p, grid)
    out = torch.zeros(*rows.shape, 3, CROP, CROP, dtype=torch.uint8)
    for (i, j), r in np.ndenumerate(rows.numpy()):
        img = x[r]
        q = int(pos[i, j])
        if found is not None and q >= found[1]:
            (gh, gw), off = found
            gy, gx = divmod(q - off, gw)
            y0, y1 = int((gy - 1) * h / gh), int((gy + 2) * h / gh)
            x0, x1 = int((gx - 1) * w / gw), int((gx + 2) * w / gw)
            img = img[:, max(y0, 0) : min(y1, h), max(x0, 0) : min(x1, w)]
        img = torch.nn.functional.interpolate(img[None], size=(CROP, CROP), mode="nearest")[0]
        out[i, j] = (img * 255).round().to(torch.uint8)
    return out


def collect_features(
    model: nn.Module,
    layer: str,
    sae: SAE,
    data: Any,
    *,
    latents: Sequence[int] | None = None,
    top: int = 10,
    bins: int = 32,
    hist_max: float | Tensor | None = None,
    metric: Callable[[Any], Tensor] | None = None,
    before: int = 8,
    after: int = 3,
    batch_size: int = 64,
) -> FeatureStats:
    """One streamed pass over `data` (a tensor (N, ...) split in `batch_size` rows, or an iterable of batches: tensors,
    ``(inputs, labels)`` tuples, dicts of keyword arguments with ``input_ids`` / ``attention_mask``): the running
    statistics of `report_features` (`FeatureStats`). `hist_max`: the top of the histograms' bins, one value or one
    per latent; by default twice each latent's largest activation in the first batch (1 where it did not fire)."""
    if not isinstance(sae, SAE):
        raise TypeError(f"sae must be a hookviz.features.SAE, got {type(sae).__name__}")
    chosen = list(range(sae.d_sae)) if latents is None else [int(i) for i in latents]
    if not chosen or any(not 0 <= i < sae.d_sae for i in chosen):
        raise ValueError(f"latents must be a non-empty list of latent indices in [0, {sae.d_sae}), got {latents!r}")
    for name, v in (("top", top), ("bins", bins), ("batch_size", batch_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if metric is not None and not callable(metric):
        raise TypeError(f"metric must be a callable model output -> (N,) scores, got {type(metric).__name__}")
    device = model_device(model)
    index = torch.tensor(chosen, device=device)
    n_lat = len(chosen)
    state: dict[str, Tensor] = {}
    hist = torch.zeros(n_lat, bins + 2, dtype=torch.long)
    fired = torch.zeros(n_lat, dtype=torch.long)
    high = torch.full((n_lat,), -math.inf)
    attribution = torch.zeros(n_lat, dtype=torch.float64) if metric is not None else None
    edge: Tensor | None = None
    if hist_max is not None:
        edge = torch.as_tensor(hist_max, dtype=torch.float32).expand(n_lat).clone()
    seen_positions = seen_rows = 0
    tokens_mode: bool | None = None
    captured: list[Tensor] = []
    with prepared(model, True), torch.no_grad(), HookManager(model) as hooks:
        hooks.forward(layer, lambda m, a, out: captured.append(first_tensor(out).detach()))
        for batch in batches(data, batch_size):
            args, kwargs = model_inputs(batch, device)
            first = kwargs.get("input_ids") if kwargs else args[0]
            if not isinstance(first, Tensor):
                raise TypeError("each batch needs its input tensor (or input_ids) to show the contexts")
            is_tokens = not first.is_floating_point()
            if tokens_mode is not None and tokens_mode != is_tokens:
                raise ValueError("the batches mix token ids and images")
            tokens_mode = is_tokens
            captured.clear()
            model(*args, **kwargs)
            if not captured:
                raise ValueError(f"{layer!r} did not run in the model's forward")
            f = sae.encode(captured[-1].to(sae.W_enc.dtype).movedim(1, -1) if captured[-1].dim() == 4
                           else captured[-1].to(sae.W_enc.dtype))  # fmt: skip
            f = f.movedim(-1, 1) if captured[-1].dim() == 4 else f
            acts, grid = _positions(f)
            acts = acts.index_select(-1, index).float()  # (N, P, L)
            n, p = acts.shape[:2]
            mask = torch.ones(n, p, dtype=torch.bool, device=acts.device)
            if is_tokens and "attention_mask" in kwargs and kwargs["attention_mask"].shape == (n, p):
                mask = kwargs["attention_mask"].bool()
            valid = acts[mask]  # (M, L)
            if edge is None:
                first_max = valid.amax(0).cpu() if len(valid) else torch.zeros(n_lat)
                edge = torch.where(first_max > 0, 2 * first_max, torch.ones_like(first_max))
            e = edge.to(valid.device)
            b = torch.where(valid <= 0, 0, torch.clamp(torch.ceil(valid / e * bins), 1, bins).long())
            b = torch.where(valid > e, bins + 1, b)
            flat = (b + torch.arange(n_lat, device=b.device) * (bins + 2)).reshape(-1)
            hist += torch.bincount(flat, minlength=n_lat * (bins + 2)).reshape(n_lat, bins + 2).cpu()
            fired += (valid > 0).sum(0).cpu()
            if len(valid):
                high = torch.maximum(high, valid.amax(0).cpu())
            # this batch's top-k of each latent, then merged with the running one
            scores = acts.masked_fill(~mask[..., None], -math.inf).reshape(n * p, n_lat)
            kk = min(top, n * p)
            vals, where = scores.topk(kk, dim=0)  # (kk, L)
            rows, pos = where // p, where % p
            cand = {"values": vals.cpu(), "rows": (rows + seen_rows).cpu(), "positions": pos.cpu()}
            if is_tokens:
                offs = torch.arange(-before, after + 1, device=acts.device)
                q = pos[..., None] + offs  # (kk, L, W)
                inside = (q >= 0) & (q < p)
                qc = q.clamp(0, p - 1)
                r3 = rows[..., None].expand_as(qc)
                inside &= mask[r3, qc]
                lat = torch.arange(n_lat, device=acts.device)[None, :, None].expand_as(qc)
                cand["tokens"] = torch.where(inside, first.to(acts.device)[r3, qc], -1).cpu()
                cand["window"] = torch.where(inside, acts[r3, qc, lat], 0.0).cpu()
            else:
                cand["images"] = _crops(first, rows.cpu(), pos.cpu(), p, grid)
            if state:
                cand = {k: torch.cat((state[k], v)) for k, v in cand.items()}
                order = cand["values"].topk(min(top, len(cand["values"])), dim=0).indices
                cand = {k: _take(v, order) for k, v in cand.items()}
            state = cand
            if metric is not None and attribution is not None:
                with prepared(model, True), torch.enable_grad():
                    inputs = kwargs if kwargs else args[0] if len(args) == 1 else tuple(args)
                    got = latent_attribution(model, inputs, {layer: sae}, metric).latents[layer]
                g, _ = _positions(got)
                g = g.index_select(-1, index) * mask[..., None]
                attribution += g.sum((0, 1)).double().cpu()
            seen_positions += int(mask.sum())
            seen_rows += n
    if not state:
        raise ValueError("data held no batch")
    return FeatureStats(
        chosen, state["values"], state["rows"], state["positions"], state.get("tokens"), state.get("window"),
        state.get("images"), hist, edge if edge is not None else torch.ones(n_lat), fired, high, seen_positions,
        seen_rows, before, attribution,
    )  # fmt: skip


def _take(v: Tensor, order: Tensor) -> Tensor:
    """Rows `order` (k, L) of `v` (2k, L, ...) per latent."""
    idx = order.reshape(*order.shape, *([1] * (v.dim() - 2))).expand(order.shape[0], *v.shape[1:])
    return v.gather(0, idx)


def unembedding(model: nn.Module, unembed: Any = None) -> Tensor | None:
    """W_U (d_model, vocab): `unembed` (an `nn.Linear` head or its weight (vocab, d_model)), else the model's
    ``get_output_embeddings()`` (Hugging Face's), else None."""
    if unembed is None:
        get = getattr(model, "get_output_embeddings", None)
        unembed = get() if callable(get) else None
        if unembed is None:
            return None
    weight = unembed.weight if isinstance(unembed, nn.Module) else unembed
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise TypeError("unembed must be the model's output layer (nn.Linear) or its weight (vocab, d_model)")
    return weight.detach().T


def logit_effects(sae: SAE, w_u: Tensor, latent: int) -> Tensor:
    """W_dec[latent] @ W_U: the logits the latent's decoder direction adds, (vocab,)."""
    return sae.W_dec[latent].detach().to(w_u.dtype).to(w_u.device) @ w_u


def _namer(tokenizer: Any) -> Callable[[int], str]:
    if tokenizer is None:
        return str
    if hasattr(tokenizer, "convert_ids_to_tokens"):
        return lambda i: str(tokenizer.convert_ids_to_tokens(int(i)))
    if hasattr(tokenizer, "decode"):
        return lambda i: str(tokenizer.decode([int(i)]))
    if callable(tokenizer):
        return lambda i: str(tokenizer(int(i)))
    raise TypeError("tokenizer must have convert_ids_to_tokens or decode, or be a callable id -> str")


def _svg_hist(counts: Tensor, top: float, bins: int) -> str:
    """The histogram of the positive activations (bins 1..bins and the overflow) as an inline SVG."""
    c = counts[1:].tolist()
    w, h, bar = 360, 120, 360 / (bins + 1)
    peak = max(max(c), 1)
    rects = []
    for j, v in enumerate(c):
        lo, hi = top * j / bins, top * (j + 1) / bins
        what = f"> {top:.3g}" if j == bins else f"({lo:.3g}, {hi:.3g}]"
        bh = h * v / peak
        fill = "#b3261e" if j == bins else "#0b57d0"
        rects.append(f'<rect x="{j * bar:.1f}" y="{h - bh:.1f}" width="{bar * 0.9:.1f}" height="{bh:.1f}" '
                     f'fill="{fill}"><title>{what}: {v}</title></rect>')  # fmt: skip
    return (
        f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 16}" role="img" '
        f'aria-label="histogram of the positive activations">{"".join(rects)}'
        f'<text x="0" y="{h + 13}" font-size="11">0</text>'
        f'<text x="{w}" y="{h + 13}" font-size="11" text-anchor="end">{top:.3g} | over</text></svg>'
    )


def _token_context(tokens: Tensor, window: Tensor, center: int, scale: float, name: Callable[[int], str]) -> str:
    e = html.escape
    parts = []
    for j, (t, a) in enumerate(zip(tokens.tolist(), window.tolist(), strict=True)):
        if t < 0:
            continue
        alpha = min(max(a / scale, 0.0), 1.0) if scale > 0 else 0.0
        cls = ' class="tok here"' if j == center else ' class="tok"'
        parts.append(f'<span{cls} style="background: rgba(255, 140, 0, {alpha:.2f})" title="{a:.4g}">'
                     f"{e(name(t))}</span>")  # fmt: skip
    return " ".join(parts)


def report_features(
    model: nn.Module,
    layer: str,
    sae: SAE,
    data: Any,
    out: str | os.PathLike[str],
    *,
    latents: Sequence[int] | None = None,
    top: int = 10,
    bins: int = 32,
    hist_max: float | Tensor | None = None,
    metric: Callable[[Any], Tensor] | None = None,
    tokenizer: Any = None,
    unembed: Any = None,
    logits: int = 10,
    before: int = 8,
    after: int = 3,
    batch_size: int = 64,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a static HTML report of `sae`'s latents at `layer` over `data` to `out`; returns its ``index.html``.

    Args:
        model, layer, sae: the model, the module whose output the SAE encodes, the SAE.
        data: a tensor (N, ...) or an iterable of batches (tensors, ``(inputs, labels)``, dicts with ``input_ids`` and
            ``attention_mask``: padding is left out), streamed once (`collect_features`). Integer inputs are
            tokens (contexts shown as highlighted tokens), float inputs (N, C, H, W) images (contexts as crops).
        latents: the latents to report (default all); top: contexts per latent; bins, hist_max: the histograms'.
        metric: model output -> (N,) scores: each latent's attribution (gradient x activation, summed over the
            positions) averaged over the rows.
        tokenizer: names the tokens (``convert_ids_to_tokens``, ``decode``, or a callable id -> str).
        unembed: the output layer for the promoted / suppressed tokens (default: ``get_output_embeddings()``; none:
            that part is left out); logits: how many of each.
        before, after: tokens shown around a token context's position.
        out, title, overwrite: as `report_concepts`'.

    Example::

        model, tok = hookviz.zoo.retrieval_lm()
        report_features(model, "blocks.0", retrieval_sae(), token_batches(200, seed=3), "sae-report/",
                        tokenizer=tok, unembed=model.head)
    """
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    w_u = unembedding(model, unembed)
    if w_u is not None and w_u.shape[0] != sae.d_in:
        raise ValueError(f"the unembedding takes {w_u.shape[0]} features, the SAE's decoder writes {sae.d_in}")
    name = _namer(tokenizer)
    path = prepare_out(out, overwrite)
    stats = collect_features(
        model, layer, sae, data, latents=latents, top=top, bins=bins, hist_max=hist_max, metric=metric,
        before=before, after=after, batch_size=batch_size,
    )  # fmt: skip
    (path / "latent").mkdir()
    (path / "report.css").write_text(_asset("report.css"), encoding="utf-8")
    e = html.escape
    t = e(title or f"SAE latents at {layer}: {len(stats.latents)} of {sae.d_sae}, {stats.rows} rows")
    density = stats.density
    rows = []
    for j, lat in enumerate(stats.latents):
        attr = ""
        if stats.attribution is not None:
            attr = f'<td class="num">{float(stats.attribution[j]) / max(stats.rows, 1):.4g}</td>'
        mx = float(stats.max[j])
        rows.append(f'<tr><td><a href="latent/{lat}.html">{lat}</a></td><td class="num">{float(density[j]):.4%}</td>'
                    f'<td class="num">{mx:.4g}</td>{attr}</tr>')  # fmt: skip
    head = '<th scope="col">mean attribution</th>' if stats.attribution is not None else ""
    table = (
        '<table class="summary features"><caption>density: the fraction of the '
        f'{stats.positions} positions where the latent fires</caption><thead><tr><th scope="col">latent</th>'
        f'<th scope="col">density</th><th scope="col">max activation</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    (path / "index.html").write_text(_page(t, "Latents", table, "report.css"), encoding="utf-8")
    for j, lat in enumerate(stats.latents):
        parts = [f"<p>density {float(density[j]):.4%} ({int(stats.fired[j])} of {stats.positions} positions), max "
                 f"activation {float(stats.max[j]):.4g}</p>"]  # fmt: skip
        scale = float(stats.max[j])
        ctx = []
        for r in range(stats.top_values.shape[0]):
            v = float(stats.top_values[r, j])
            if not v > 0:
                continue
            where = f"row {int(stats.top_rows[r, j])}, position {int(stats.top_positions[r, j])}"
            if stats.top_tokens is not None and stats.top_window is not None:
                shown = _token_context(stats.top_tokens[r, j], stats.top_window[r, j], stats.before, scale, name)
                ctx.append(f'<li><span class="num">{v:.4g}</span> <span class="ctx">{shown}</span> '
                           f'<small class="muted">{where}</small></li>')  # fmt: skip
            elif stats.top_images is not None:
                Image.fromarray(stats.top_images[r, j].permute(1, 2, 0).numpy()).save(
                    path / "latent" / f"{lat}-{r}.png"
                )
                ctx.append(f'<li class="crop"><figure><img src="{lat}-{r}.png" alt="context {r + 1}" width="{CROP}" '
                           f'height="{CROP}"><figcaption>{v:.4g}, {where}</figcaption></figure></li>')  # fmt: skip
        parts.append(f"<h2>Top contexts</h2><ol class=\"contexts\">{''.join(ctx)}</ol>" if ctx else
                     "<h2>Top contexts</h2><p>the latent never fired on the data</p>")  # fmt: skip
        top_edge = float(stats.hist_max[j])
        parts.append(f"<h2>Activations</h2>{_svg_hist(stats.hist[j], top_edge, bins)}<p class=\"muted\">"
                     f"{int(stats.hist[j, 0])} positions at 0; {bins} bins over (0, {top_edge:.3g}], then "
                     f"{int(stats.hist[j, -1])} above (red)</p>")  # fmt: skip
        if w_u is not None:
            effect = logit_effects(sae, w_u, lat)
            k = min(logits, effect.numel())
            lists = []
            for what, desc in (("promotes", True), ("suppresses", False)):
                order = torch.sort(effect, descending=desc, stable=True).indices[:k].tolist()
                items = "".join(f'<li><span class="tok">{e(name(i))}</span> {float(effect[i]):+.3g}</li>'
                                for i in order)  # fmt: skip
                lists.append(f'<div><h3>{what}</h3><ol class="logits {what}">{items}</ol></div>')
            parts.append(f'<h2>Logits (W_dec @ W_U)</h2><div class="logit-lists">{"".join(lists)}</div>')
        if stats.attribution is not None:
            a = float(stats.attribution[j]) / max(stats.rows, 1)
            parts.append(f"<h2>Attribution</h2><p>gradient x activation to the metric, summed over the positions, "
                         f"mean over {stats.rows} rows: {a:.4g}</p>")  # fmt: skip
        nav = f'<a href="../index.html">All latents</a> · {t}'
        (path / "latent" / f"{lat}.html").write_text(
            _page(f"Latent {lat}", nav, "".join(parts), "../report.css"), encoding="utf-8"
        )
    mark(path, {"format": "hookviz-report", "version": VERSION, "complete": True, "latents": stats.latents})
    return path / "index.html"
