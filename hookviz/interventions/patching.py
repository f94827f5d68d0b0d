"""Activation patching (causal tracing): the metric of a corrupted run with one site patched from the clean run.

Meng et al., "Locating and Editing Factual Associations in GPT", NeurIPS 2022; conventions after Heimersheim &
Nanda, "How to use and interpret activation patching", 2024: *denoising* (clean activations patched into the
corrupted run: which sites are sufficient to restore the behaviour) by default, *noising* (corrupt into clean:
which sites are necessary) on request; the normalised score is the fraction of the clean-corrupt metric difference
that the patch restores.

Many sites run in one forward: the corrupted batch is repeated once per site of a chunk (site-major), and, in the
k-th copy, the elements of site k are replaced by their clean values. ``batch_size`` bounds the rows (sites x
samples) of one forward. The prefix is shared (`hookviz.interventions.prefix`): the module calls that finish before
the site return their outputs from the one unpatched run, so a chunk computes only what comes after the site; the
values are those of one forward per site, bit for bit.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..record import ActivationRecorder
from ._common import (
    ChunkBuffers,
    batch_size_of,
    call_model,
    describe_shapes,
    expand_inputs,
    parse_key,
    prepared,
    same_shapes,
)
from .intervene import intervene
from .layout import check_layout, edit_axes
from .prefix import (
    PrefixPlan,
    check_plan,
    plan_prefix,
    probe_calls,
    record_calls,
    short_circuited,
    skippable_share,
)
from .sites import parse_sites, site_index

__all__ = ["PatchingResult", "patching"]

Metric = Callable[[Any], Tensor]


@dataclass
class PatchingResult:
    """Per layer key, the metric with each site patched: ``values[key]`` is (N, *grid), grid () for a whole layer,
    (C,) channels, (T,) tokens, (h, w) spatial cells, (heads,) heads. `clean` and `corrupt` are the unpatched
    metrics (N,); `kinds` the site kind of each key; `method` "exact" or "attribution" (the gradient estimate)."""

    values: dict[str, Tensor]
    clean: Tensor
    corrupt: Tensor
    kinds: dict[str, str]
    direction: str = "denoise"
    method: str = "exact"

    def __getitem__(self, key: str) -> Tensor:
        return self.values[key]

    def keys(self) -> list[str]:
        return list(self.values)

    def normalized(self, eps: float = 1e-8) -> dict[str, Tensor]:
        """Per key, ``(patched - start) / (end - start)``, per sample: 0 = no effect, 1 = the whole effect. Start is
        the corrupted run when denoising, the clean run when noising (end the other one)."""
        start, end = (self.corrupt, self.clean) if self.direction == "denoise" else (self.clean, self.corrupt)
        out = {}
        for k, v in self.values.items():
            shape = (-1,) + (1,) * (v.dim() - 1)
            diff = (end - start).reshape(shape)
            safe = torch.where(diff.abs() < eps, torch.full_like(diff, eps), diff)
            out[k] = (v - start.reshape(shape)) / safe
        return out

    def table(self, normalized: bool = True) -> list[dict[str, Any]]:
        """One row per site (mean over the samples): layer, kind, site (index or (y, x)), value."""
        values = self.normalized() if normalized else self.values
        rows = []
        for k, v in values.items():
            mean = v.float().mean(0)
            grid = tuple(mean.shape)
            for i, value in enumerate(mean.flatten().tolist()):
                site: Any = () if not grid else (divmod(i, grid[1]) if len(grid) == 2 else i)
                rows.append({"layer": k, "kind": self.kinds[k], "site": site, "value": value})
        return rows


def _check_metric_value(value: Any, n: int, what: str = "metric") -> Tensor:
    if not isinstance(value, Tensor) or value.shape != (n,):
        got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(
            f"{what} must return one value per sample, a tensor of shape ({n},), got {got}; e.g. "
            "metric=lambda out: out[:, 3] - out[:, 5] (a logit difference)"
        )
    return value


def check_patching_args(
    model: nn.Module, clean: Any, corrupt: Any, metric: Any, sites: Any, heads: Any, layout: Any, direction: Any
) -> tuple[dict[str, str], int]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    n = batch_size_of(clean, "clean")
    batch_size_of(corrupt, "corrupt")
    if not same_shapes(clean, corrupt):
        raise ValueError(
            f"clean and corrupt must have the same shapes (one corrupted input per clean one), got clean "
            f"{describe_shapes(clean)} and corrupt {describe_shapes(corrupt)}"
        )
    if not callable(metric):
        raise TypeError(f"metric must be a callable output -> (N,) tensor, got {type(metric).__name__}")
    if direction not in ("denoise", "noise"):
        raise ValueError(
            f"direction must be 'denoise' (clean into corrupt) or 'noise' (corrupt into clean), got {direction!r}"
        )
    if isinstance(layout, Mapping):
        for k, v in layout.items():
            check_layout(v, f"layout[{k!r}]")
    else:
        check_layout(layout)
    return parse_sites(model, sites, heads), n


def run_with_cache(
    model: nn.Module, inputs: Any, keys: Sequence[str], metric: Metric
) -> tuple[Tensor, dict[str, Tensor]]:
    """One forward under no_grad: the metric (N,) and the outputs of the modules of `keys`, by call key."""
    names = {parse_key(model, k, "sites")[0] for k in keys}
    recorder = ActivationRecorder(model, lambda n, m: n in names, accumulate=False)
    with torch.no_grad(), recorder:
        out = call_model(model, inputs)
    acts = recorder.results
    missing = [k for k in keys if k not in acts]
    if missing:
        raise ValueError(
            f"sites {', '.join(map(repr, missing))} never ran in the forward (or returned no tensor): nothing to patch"
        )
    return metric(out), acts


def one_call(key: str) -> str:
    """The `intervene` key of exactly the call a site key names: sites follow `hookviz.record` ("relu" is the first
    call), while an `intervene` key without "#" edits every call."""
    return key if "#" in key else f"{key}#0"


def layout_of(layout: Any, key: str) -> str | None:
    return layout.get(key) if isinstance(layout, Mapping) else layout


# a layer with fewer sites runs whole forwards: checking the shared prefix costs about two of them
SHARE_MIN_SITES = 4
# the prefix is shared where it saves more than this many forwards of N rows: the probe (2N) and the check (N) cost
# about three, so sharing must save (sites x the share of the forward that can be skipped) more than that
SHARE_MIN_SAVING = 4.0
# on the CPU, a chunk with the prefix shared is mostly memory traffic (cached outputs repeated, element-wise ops of
# the forward): past the caches' size more rows gain nothing and cost bandwidth, so a chunk holds at most this many
# bytes of the site's activation (benchmarks/bench_patching.py: on the shapes CNN at features.4, 64 rows per forward
# ran 2.7x faster than 384). 4 MiB rather than 8: in a process where no larger block has raised glibc's mmap and
# trim thresholds, the first chunk of every call at 8 MiB faulted its pages in again (8,369 minor faults, 33 MiB:
# the chunk's storage and the model's temporaries, returned to the system when the call ended); at 4 MiB only the
# first call's first chunk does. Shapes CNN, 1 thread, CPU ms per call in a fresh process (first call / later calls /
# after a larger variant, median of 5 processes x 6 calls; 3 at the other layers):
# features.4 106 / 97 / 99 at 4 MiB against 130 / 118 / 98 at 8 MiB; features.0 280 / 225 / 218 against
# 356 / 263 / 229; conv3 227 / 196 / 191 against 268 / 276 / 217
SHARED_CPU_CHUNK_BYTES = 4 * 2**20


def _shared_sites_per_forward(per_forward: int, source: Tensor, n: int) -> int:
    if source.device.type != "cpu":
        return per_forward
    row = max(1, source[:1].numel() * source.element_size())
    return max(1, min(per_forward, SHARED_CPU_CHUNK_BYTES // (row * n)))


def patching(
    model: nn.Module,
    clean: Any,
    corrupt: Any,
    metric: Metric,
    sites: str | Sequence[str] | Mapping[str, str],
    *,
    heads: int | None = None,
    layout: str | Mapping[str, str] | None = None,
    batch_size: int = 512,
    direction: Literal["denoise", "noise"] = "denoise",
    eval_mode: bool = True,
    share_prefix: bool = True,
) -> PatchingResult:
    """Activation patching: the metric of the corrupted run with each site patched from the clean run.

    Args:
        model: any module; it comes back exactly as it was.
        clean, corrupt: inputs of the same shapes (tensors (N, ...), tuples of positional arguments or dicts of keyword
            arguments): sample i of one is paired with sample i of the other.
        metric: ``metric(output) -> (N,)``, one value per sample (e.g. a logit difference, the logit of the clean
            class); it always sees N rows aligned with `clean` / `corrupt`, so it may use per-sample labels. Samples
            must not interact in the forward (eval-mode BatchNorm is fine).
        sites: a layer key, a list of them (one site per layer), or ``{key: kind}``, kind ``"layer"``,
            ``"channel"``, ``"token"`` (tokens layout), ``"spatial"`` (every (y, x) cell; NCHW / NHWC) or ``"head"``
            (the feature axis split into `heads` equal slices: the concatenated head outputs, e.g. the input of an
            attention's output projection). Keys follow `hookviz.record` (``"relu#1"``: second call).
        heads: the number of heads for ``"head"`` sites.
        layout: ``"nchw"``, ``"nhwc"``, ``"tokens"`` (or a dict per key); None infers (4-D NCHW, 3-D tokens).
        batch_size: at most this many rows (sites x samples, at least N) per forward pass (on the CPU with the prefix
            shared, fewer where the site's activation would pass `SHARED_CPU_CHUNK_BYTES`: such chunks are memory
            bound).
        direction: ``"denoise"`` patches clean activations into the corrupted run (default), ``"noise"`` corrupted
            ones into the clean run.
        eval_mode: run in eval mode (restored after).
        share_prefix: compute what comes before a layer once (True, the default, for layers of at least
            `SHARE_MIN_SITES` sites where it saves more than `SHARE_MIN_SAVING` forwards, judged from the timed first
            run): every module call that finishes before the site returns its output from the unpatched run
            (`hookviz.interventions.prefix`, checked on the model before use, with a warning and whole forwards where
            the check fails). False runs whole forwards. The values are the loop's, bit for bit, on the CPU.

    Returns a `PatchingResult`: ``result[key]`` is (N, *grid) metric values; ``result.normalized()`` the fraction of
    the effect each site restores; ``result.table()`` one row per site. Cost: ceil(sites x N / batch_size) forward
    passes per layer, of only the part after the site when the prefix is shared (plus a probe at batch 2N and one
    check per layer), plus two. Memory: one forward of `batch_size` rows, plus the module outputs of one unpatched
    forward of N rows when the prefix is shared.
    """
    kinds, n = check_patching_args(model, clean, corrupt, metric, sites, heads, layout, direction)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int (rows per forward), got {batch_size!r}")
    if not isinstance(share_prefix, bool):
        raise TypeError(f"share_prefix must be True or False, got {share_prefix!r}")
    source_in, target_in = (clean, corrupt) if direction == "denoise" else (corrupt, clean)
    with prepared(model, eval_mode):
        m_source, acts = run_with_cache(model, source_in, list(kinds), metric)
        m_source = _check_metric_value(m_source, n)
        with torch.no_grad():
            m_target = _check_metric_value(metric(call_model(model, target_in)), n)
        m_clean, m_corrupt = (m_source, m_target) if direction == "denoise" else (m_target, m_source)
        values = {}
        per_forward = max(1, batch_size // n)
        for key, kind in kinds.items():
            source = acts[key]
            axes = (
                None
                if kind == "layer"
                else edit_axes(source.dim(), layout_of(layout, key), where=f"layout for {key!r}")
            )
            index, grid = site_index(source.shape, axes, kind, heads, key)
            index = index.to(source.device)
            n_sites = max(1, int(torch.tensor(grid).prod().item()) if grid else 1)
            plan = _shared_plan(model, target_in, key, n_sites) if share_prefix and n_sites >= SHARE_MIN_SITES else None
            sites_per_forward = per_forward if plan is None else _shared_sites_per_forward(per_forward, source, n)
            # each element's site, in one sample's activation; the chunks' tensors of k x N rows in storage reused
            # from chunk to chunk (a fresh process otherwise maps and faults in megabytes per chunk)
            site_of = index.expand(1, *source.shape[1:]).reshape(-1)
            buffers, chunks = ChunkBuffers(), []
            for start in range(0, n_sites, sites_per_forward):
                ids = range(start, min(n_sites, start + sites_per_forward))
                chunks.append(_patched_chunk(model, target_in, source, site_of, ids, key, metric, n, plan, buffers))
            values[key] = torch.cat(chunks, 0).reshape(*grid, n).movedim(-1, 0) if grid else chunks[0][0]
    return PatchingResult(values, m_clean, m_corrupt, kinds, direction, "exact")


def _shared_plan(model: nn.Module, target_in: Any, key: str, n_sites: int) -> PrefixPlan | None:
    """The prefix plan of `key`, checked on the model; None (whole forwards) when there is nothing to skip or the
    check fails (then with a warning: the user is told why the call is slower than it could be).

    Each layer records its own unpatched run, at N and at 2N, with the hooks of the loop at that layer (some models
    behave differently with hooks): the prefix of one layer is not taken from a run hooked for another. The first
    run also times the calls: where the sites times the share of the forward that could be skipped is under
    `SHARE_MIN_SAVING` forwards, the probe is not paid for (no warning: nothing is wrong, sharing would not pay)."""
    site_name = parse_key(model, key, "sites")[0]
    expected, calls = record_calls(model, target_in, site_name)
    if n_sites * skippable_share(calls, key) <= SHARE_MIN_SAVING:
        return None  # a site early in the network: sharing would cost more than it saves
    probe = probe_calls(model, target_in, site_name, calls)[1]
    plan = plan_prefix(calls, probe, key)
    why = plan if isinstance(plan, str) else None
    if isinstance(plan, PrefixPlan):
        if not plan.skip and not plan.site_cached:
            return None
        why = check_plan(model, target_in, plan, expected)
    if why is not None:
        warnings.warn(
            f"patching {key!r}: the prefix is not shared, every chunk runs the whole model: {why}; pass "
            "share_prefix=False to silence this",
            stacklevel=3,
        )
        return None
    return plan  # type: ignore[return-value]


def _patched_chunk(
    model: nn.Module, target_in: Any, source: Tensor, site_of: Tensor, ids: range, key: str, metric: Metric, n: int,
    plan: PrefixPlan | None = None, buffers: ChunkBuffers | None = None,
) -> Tensor:  # fmt: skip
    """The metric (k, N) of k copies of the target run, copy j with the elements of site ``ids[j]`` patched (`site_of`:
    the site of each element of one sample); with a `plan`, the calls before the site are not run but taken from the
    unpatched run; with `buffers`, the chunk's inputs and copies are written into storage kept for the next chunk."""
    k = len(ids)
    # the elements each copy takes from the source: (copy j, element e of one sample), found once per chunk; writing
    # only them into a copy of the target activation reads and writes far less than a where() over every element
    element = torch.nonzero((site_of >= ids[0]) & (site_of <= ids[-1]))[:, 0]
    copy = site_of[element] - ids[0]
    values = source.reshape(n, -1)[:, element].T  # (elements, N)
    fresh = plan is not None and plan.site_cached  # the site's output is then a copy made for this run alone

    def patch(a: Tensor) -> Tensor:
        out = a if fresh else a.clone() if buffers is None else buffers.copy(("site",), a)
        out.view(k, n, -1)[copy, :, element] = values.to(a.dtype)
        return out

    if plan is not None:
        edits = short_circuited(model, plan, k, patch, buffers=buffers)
    else:
        edits = intervene(model, {one_call(key): patch})
    with torch.no_grad(), edits as fired:
        out = call_model(model, expand_inputs(target_in, k, buffers))
    if plan is not None and not fired:
        raise RuntimeError(
            f"patching with a shared prefix: the site {key!r} did not run in a patched forward (its control flow "
            "changed between runs); pass share_prefix=False"
        )
    # the metric sees N rows aligned with the inputs (it may close over per-sample labels), once per copy
    return torch.stack([_check_metric_value(metric(slice_rows(out, j * n, (j + 1) * n)), n) for j in range(k)])


def slice_rows(out: Any, start: int, stop: int) -> Any:
    """Rows start:stop of a model output: a tensor, a tuple / list / dict of them (Hugging Face outputs are dicts)."""
    if isinstance(out, Tensor):
        return out[start:stop] if out.dim() else out
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return type(out)(*(slice_rows(v, start, stop) for v in out))
    if isinstance(out, tuple | list):
        return type(out)(slice_rows(v, start, stop) for v in out)
    if isinstance(out, Mapping):
        sliced = {k: slice_rows(v, start, stop) for k, v in out.items()}
        try:
            return type(out)(**sliced)
        except TypeError:
            return sliced
    raise TypeError(
        f"cannot split a model output of type {type(out).__name__} per site; return tensors, tuples or dicts"
    )
