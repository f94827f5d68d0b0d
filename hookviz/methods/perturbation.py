"""Perturbation methods: explain a model by changing its input and watching the target score, forward passes only.

`Occlusion` slides a window of a baseline value over the input; `RISE` weights random smooth masks by the score
of the masked input. Neither places a hook or differentiates anything, so both work on any model, including
models without ReLUs and TorchScript modules (`torch.jit.script` / `torch.jit.trace`), which take no hooks.

Both lay their perturbed inputs out in one "expanded batch" (perturbation-major: row ``p * N + i`` is input i
under perturbation p) and run it in chunks of at most ``batch_size`` rows, building each chunk's perturbations on
the model's device when it is needed; the results do not depend on ``batch_size`` beyond float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import bool_option, is_int, is_number, number_option, positive_int
from .._device import to_device
from .._progress import progress_bar
from ..hooks import HookManager
from ..targets import TargetPlan, Targets, class_logits
from .base import Attribution, register
from .baseline import baseline_like
from .batch import acc_dtype, check_batch_size, chunks, forward_scores, plan_rows
from .forward import ForwardArgs


def _check_progress(progress: object) -> bool | None:
    bool_option("progress", progress, "None (a bar only on runs longer than 2 s), True or False", optional=True)
    return progress


def _check_pair(name: str, value: object, what: str) -> tuple[int, ...]:
    """An int (the same along every spatial axis) or a tuple of ints >= 1, one per axis."""
    values = value if isinstance(value, tuple) else (value,)
    if not values or not all(is_int(v) for v in values):
        raise TypeError(f"{name} must be an int or a tuple of ints ({what}), got {value!r}")
    if any(v < 1 for v in values):
        raise ValueError(f"{name} must be >= 1 along every axis ({what}), got {value!r}")
    return values


class PerturbationAttribution(Attribution):
    """Shared by the perturbation methods: the clean forward pass, chunked scoring of perturbed rows, progress.

    ``eval_mode`` as in `Attribution`; nothing is differentiated, so there is no ``backward`` option. Targets: None
    means the top class of the clean input; a callable target is called once per window or mask of the batch, on an
    output whose row i belongs to input i (`hookviz.targets.aligned_scores`).
    """

    def __init__(
        self, model: nn.Module, *, batch_size: int | None = 64, progress: bool | None = None, eval_mode: bool = True
    ) -> None:
        super().__init__(model, eval_mode=eval_mode)
        self.batch_size = check_batch_size(batch_size)
        self.progress = _check_progress(progress)

    def _clean(self, x: Tensor, plan: TargetPlan, fwd: ForwardArgs | None = None) -> tuple[Targets, TargetPlan]:
        """Target scores of the unperturbed inputs, and a plan in which "top class" is resolved to class indices.

        Also checks the target against the model output (class range, output shape) before any perturbed pass.
        """
        targets = forward_scores(self.model, x, plan, self.batch_size, forward_args=fwd)
        if plan.indices is None and plan.fn is None:
            plan = TargetPlan(targets.indices, None, False, from_output=True)
        return targets, plan

    def _score(self, rows: Tensor, plan: TargetPlan, softmax: bool = False, fwd: ForwardArgs | None = None) -> Tensor:
        """(M, K) target scores of perturbed `rows` (M, ...) in one forward pass; `plan` holds these rows' targets,
        `fwd` their extra forward arguments (`ForwardArgs.rows`).

        `softmax`: score class targets by their softmax probability instead of the raw output.
        """
        fwd = fwd or ForwardArgs((), rows.shape[0])
        if softmax and plan.fn is None:
            with torch.no_grad():
                out = class_logits(fwd(self.model, (rows,)))
            probs = torch.softmax(out.to(acc_dtype(out.dtype)), dim=1)
            return probs.gather(1, to_device(plan.indices, out.device))  # type: ignore[arg-type]
        return forward_scores(self.model, rows, plan, None, forward_args=fwd).scores

    def _passes(self, total: int, label: str) -> Iterator[tuple[int, int]]:
        """Row ranges of the expanded batch, behind a tqdm bar unless ``progress=False`` (None: after 2 s)."""
        n = 1 if self.batch_size is None else math.ceil(total / self.batch_size)
        delay = 0.0 if self.progress else 2.0
        bar = progress_bar(
            total=n,
            enabled=self.progress is not False,
            desc=f"{type(self).__name__} ({label})",
            unit="pass",
            delay=delay,
            leave=False,
        )
        try:  # closed also when the caller's loop raises (the generator is closed then)
            for rows in chunks(total, self.batch_size):
                yield rows
                bar.update()
        finally:
            bar.close()


@register("occlusion")
class Occlusion(PerturbationAttribution):
    r"""Occlusion (Zeiler & Fergus, 2014, "Visualizing and Understanding Convolutional Networks",
    arXiv:1311.2901). Forward passes only.

    A window of the baseline value slides over the input; each position p gives the score drop
    $$ d_p = y_c(x) - y_c(x \odot (1 - W_p) + b \odot W_p) $$ and every element gets the mean drop of the windows
    that cover it: $$ A = \sum_p d_p W_p \big/ \sum_p W_p $$. Result shaped like the input, (N, C, H, W) (the window
    covers every channel, so the C maps are equal), or (N, K, C, H, W) with K targets per input. The drop is of the
    raw model output (logits), or of a callable target's score.

    Windows, as captum's `Occlusion` with ``sliding_window_shapes=(C, h, w)`` and ``strides=(C, sh, sw)`` (same
    numbers to float32 rounding): along an axis of length D the windows start at 0, s, 2s, ... , ceil((D - w) / s)
    * s, and a last window that would run past the end is cut off there. Every element is covered (the stride is
    at most the window).

    Args:
        window: window size (h, w) along the last axes of the input (an int: the same along every axis after N and
            C; for (N, D) inputs, along D). Axes before them (channels) are covered whole. Must fit in the input.
        stride: step between windows, at most the window along every axis; None: equal to the window (tiles).
        baseline: the value occluded elements take: a number, or a tensor that broadcasts to the inputs' shape.
        batch_size: occluded inputs per forward pass (rows of all inputs and windows together).
        progress: a tqdm bar: True, False, or None (shown only when the run lasts more than 2 s).

    Cost: N * (number of windows) rows forward plus N for the clean inputs; no backward pass.

    Example::

        attr = Occlusion(model, window=(16, 16), stride=(8, 8)).attribute(x, target=281)   # like x
    """

    display_defaults = {"reduce": "sum", "mode": "absmax", "cmap": "bwr", "overlay": False}

    def _baseline_for(self, x: Tensor) -> Tensor:
        """The baseline as a tensor like `x`, with a clear error if it does not broadcast."""
        return baseline_like(self.baseline, x)  # type: ignore[arg-type]

    def __init__(
        self,
        model: nn.Module,
        window: int | tuple[int, ...] = (16, 16),
        stride: int | tuple[int, ...] | None = None,
        baseline: Tensor | float = 0.0,
        *,
        batch_size: int | None = 64,
        progress: bool | None = None,
        eval_mode: bool = True,
    ) -> None:
        window_t = _check_pair("window", window, "window size per axis")
        stride_t = None if stride is None else _check_pair("stride", stride, "step between windows per axis")
        if stride_t is not None and len(stride_t) > 1 and len(window_t) > 1 and len(stride_t) != len(window_t):
            raise ValueError(f"stride {stride!r} must give one step per window axis, window is {window!r}")
        if isinstance(baseline, Tensor):
            if baseline.is_complex() or baseline.dtype == torch.bool:
                raise TypeError(f"baseline tensor must hold real numbers, got dtype {baseline.dtype}")
        elif not is_number(baseline):
            raise TypeError(
                "baseline must be a number or a tensor that broadcasts to the inputs' shape; "
                f"got {type(baseline).__name__}"
            )
        super().__init__(model, batch_size=batch_size, progress=progress, eval_mode=eval_mode)
        self.window = window
        self.stride = stride
        self.baseline = baseline

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__}, window={self.window}, stride={self.stride})"

    def _geometry(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(window, stride) per occluded axis (the last ones of `shape`, an input's shape without N), checked."""
        spatial = len(shape) - 1 if len(shape) > 1 else 1  # axes after C; the feature axis of (N, D) inputs
        window = _check_pair("window", self.window, "")
        if len(window) == 1 and not isinstance(self.window, tuple):
            window = window * spatial
        stride = window if self.stride is None else _check_pair("stride", self.stride, "")
        if len(stride) == 1 and not isinstance(self.stride, tuple):
            stride = stride * len(window)
        if len(window) > len(shape) or len(stride) != len(window):
            raise ValueError(
                f"window {self.window!r} and stride {self.stride!r} must give one size per occluded axis (at most "
                f"{len(shape)} for inputs of shape (N, {', '.join(map(str, shape))}))"
            )
        dims = shape[len(shape) - len(window) :]
        if any(w > d for w, d in zip(window, dims, strict=True)):
            raise ValueError(
                f"window {window} is larger than the input {dims} along the occluded axes; choose a window that fits"
            )
        if any(s > w and w < d for s, w, d in zip(stride, window, dims, strict=True)):
            raise ValueError(
                f"stride {stride} is larger than the window {window}: elements between windows would never be "
                "occluded; use a stride <= the window"
            )
        return window, stride

    def _explain(self, x: Tensor, target: Any, **kwargs: Any) -> tuple[Tensor, Targets]:
        self._geometry(tuple(x.shape[1:]))  # window errors before any work
        kwargs["baseline"] = self._baseline_for(x)
        return super()._explain(x, target, **kwargs)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        x = x.detach()
        baseline: Tensor = kwargs["baseline"]
        n_in, shape = x.shape[0], tuple(x.shape[1:])
        window, stride = self._geometry(shape)
        dims = shape[len(shape) - len(window) :]
        lead = len(shape) - len(window)  # axes covered whole (channels)
        # 1-D windows per axis: (S_a, D_a), row j covers [j * s, j * s + w) cut off at D
        counts = [math.ceil((d - w) / s) + 1 for w, s, d in zip(window, stride, dims, strict=True)]
        axis_masks = []
        for w, s, d, c in zip(window, stride, dims, counts, strict=True):
            starts = torch.arange(c, device=x.device).unsqueeze(1) * s
            pos = torch.arange(d, device=x.device)
            axis_masks.append((pos >= starts) & (pos < starts + w))
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), n_in)
        targets, plan = self._clean(x, target, fwd)
        clean = targets.scores.to(acc_dtype(targets.scores.dtype))
        n_windows = math.prod(counts)
        drops = clean.new_empty((n_windows * n_in, clean.shape[1]))
        for start, stop in self._passes(n_windows * n_in, "windows"):
            rows = torch.arange(start, stop, device=x.device)
            inputs, p = rows % n_in, rows // n_in
            on_host = torch.arange(start, stop) % n_in  # the targets' rows (`TargetPlan.take`)
            mask = torch.ones((stop - start,) + (1,) * len(shape), dtype=torch.bool, device=x.device)
            for a in reversed(range(len(window))):  # window index p in row-major order over the axes
                p, j = p // counts[a], p % counts[a]
                view = [stop - start] + [1] * len(shape)
                view[1 + lead + a] = dims[a]
                mask = mask & axis_masks[a][j].view(view)
            occluded = torch.where(mask, baseline[inputs], x[inputs])
            scores = self._score(occluded, plan_rows(plan, on_host), fwd=fwd.rows(inputs))
            drops[start:stop] = clean[inputs] - scores.to(drops.dtype)
        # sum_p d_p W_p, axis by axis (the windows are products of 1-D masks), then the mean over covering windows
        attr = drops.view(*counts, n_in, -1).movedim((-2, -1), (0, 1))  # (N, K, S_1, ..., S_k)
        cover = torch.ones((), dtype=attr.dtype, device=x.device)
        for a, m in enumerate(axis_masks):
            m = m.to(attr.dtype)
            attr = (attr.movedim(2 + a, -1) @ m).movedim(-1, 2 + a)
            cover = cover.unsqueeze(-1) * m.sum(0)
        attr = attr / cover
        attr = attr.reshape(*attr.shape[:2], *(1,) * lead, *dims).expand(*attr.shape[:2], *shape).contiguous()
        return attr, targets


@register("rise")
class RISE(PerturbationAttribution):
    r"""RISE (Petsiuk et al., 2018, "RISE: Randomized Input Sampling for Explanation of Black-box Models",
    arXiv:1806.07421). Forward passes only.

    The target score of the input masked by n random smooth masks $M_i$ weights those masks:
    $$ S = \frac{1}{n\,p} \sum_{i=1}^{n} f_c(x \odot M_i)\, M_i $$, the expected score given that a pixel is kept.
    Result (N, 1, H, W) for (N, C, H, W) inputs (one map over all channels), or (N, K, 1, H, W) with K targets per
    input. $f_c$ is the softmax probability of class c (the paper's confidence), the raw output with
    ``softmax=False``, or a callable target's score as it is.

    Masks, as in the authors' code: a random binary grid of ``cell`` x ``cell`` cells, each kept (1) with
    probability p, is upsampled bilinearly (``align_corners=False``, edges clamped; the authors' skimage resize
    reflects at the edges) to ``(cell + 1) * ceil(H / cell)`` x ``(cell + 1) * ceil(W / cell)`` and cropped to
    H x W at a random offset in ``[0, ceil(H / cell))`` x ``[0, ceil(W / cell))``. The same masks apply to every
    input. They come from ``g = torch.Generator().manual_seed(seed)`` on the cpu (so they are the same on every
    device and for every ``batch_size``): ``grid = torch.rand(n, cell, cell, generator=g) < p``, then
    ``dy = torch.randint(0, ceil(H / cell), (n,), generator=g)``, then ``dx = torch.randint(0, ceil(W / cell),
    (n,), generator=g)`` (see `masks`).

    Args:
        n_masks: number of masks n (the paper uses 4000 to 8000 on ImageNet; the map's noise falls as 1/sqrt(n)).
        cell: grid cells per side (the paper's s).
        p: probability that a cell is kept, in (0, 1].
        seed: seed of the masks; None draws one from torch's global generator on each call.
        softmax: score class targets by their softmax probability (default, the paper's) or by the raw output.
        batch_size: masked inputs per forward pass (rows of all inputs and masks together).
        progress: a tqdm bar: True, False, or None (shown only when the run lasts more than 2 s).

    Cost: N * n_masks rows forward plus N for the clean inputs; no backward pass.

    Example::

        sal = RISE(model, n_masks=4000, seed=0, batch_size=128).attribute(x, target=281)   # (N, 1, H, W)
    """

    display_defaults = {"reduce": None, "mode": "minmax", "cmap": "jet", "overlay": True}

    def __init__(
        self,
        model: nn.Module,
        n_masks: int = 4000,
        cell: int = 7,
        p: float = 0.5,
        *,
        seed: int | None = 0,
        softmax: bool = True,
        batch_size: int | None = 64,
        progress: bool | None = None,
        eval_mode: bool = True,
    ) -> None:
        n_masks = positive_int("n_masks", n_masks, "number of random masks")
        cell = positive_int("cell", cell, "grid cells per side")
        number_option("p", p, "a number in (0, 1] (the probability that a cell is kept)", lambda v: 0 < v <= 1)
        if seed is not None and not is_int(seed):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        bool_option("softmax", softmax)
        super().__init__(model, batch_size=batch_size, progress=progress, eval_mode=eval_mode)
        self.n_masks = n_masks
        self.cell = cell
        self.p = float(p)
        self.seed = seed
        self.softmax = softmax

    def __repr__(self) -> str:
        name = type(self.model).__name__
        return f"{type(self).__name__}({name}, n_masks={self.n_masks}, cell={self.cell}, p={self.p}, seed={self.seed})"

    def _draw(self, size: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
        """The (n, 1, cell, cell) binary grids and the (n,) row and column offsets, on the cpu."""
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, ()).item())
        g = torch.Generator().manual_seed(seed)
        n, s = self.n_masks, self.cell
        grids = torch.rand(n, s, s, generator=g) < self.p
        dy = torch.randint(0, math.ceil(size[0] / s), (n,), generator=g)
        dx = torch.randint(0, math.ceil(size[1] / s), (n,), generator=g)
        return grids.unsqueeze(1), dy, dx

    def _upsample(
        self, grids: Tensor, dy: Tensor, dx: Tensor, size: tuple[int, int], dtype: torch.dtype, device: torch.device
    ) -> Tensor:
        """(m, H, W) masks from (m, 1, cell, cell) grids and their offsets."""
        h, w = size
        s = self.cell
        up = (s + 1) * math.ceil(h / s), (s + 1) * math.ceil(w / s)
        # drawn on the host, copied without a wait
        big = F.interpolate(to_device(grids, device).to(dtype), size=up, mode="bilinear", align_corners=False)
        rows = to_device(dy, device).unsqueeze(1) + torch.arange(h, device=device)  # (m, H)
        cols = to_device(dx, device).unsqueeze(1) + torch.arange(w, device=device)  # (m, W)
        m = torch.arange(grids.shape[0], device=device)
        return big[m[:, None, None], 0, rows[:, :, None], cols[:, None, :]]

    def masks(self, size: tuple[int, int], *, device: torch.device | str | None = None) -> Tensor:
        """The (n_masks, 1, H, W) float32 masks a call on inputs of spatial size `size` uses (with ``seed`` set)."""
        size = _check_pair("size", size, "(H, W)")  # type: ignore[assignment]
        if len(size) != 2:
            raise ValueError(f"size must be (H, W), got {size!r}")
        grids, dy, dx = self._draw(size)
        dev = torch.device(device) if device is not None else grids.device
        return self._upsample(grids, dy, dx, size, torch.float32, dev).unsqueeze(1)

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        if x.dim() != 4:
            raise ValueError(f"RISE masks images: inputs must be (N, C, H, W), got shape {tuple(x.shape)}")
        x = x.detach()
        n_in, size = x.shape[0], (x.shape[-2], x.shape[-1])
        grids, dy, dx = self._draw(size)
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), n_in)
        targets, plan = self._clean(x, target, fwd)
        acc = acc_dtype(x.dtype)
        sal = torch.zeros((n_in, targets.scores.shape[1], 1, *size), dtype=acc, device=x.device)
        for start, stop in self._passes(self.n_masks * n_in, "masks"):
            first, last = start // n_in, (stop - 1) // n_in + 1  # the masks this chunk touches
            masks = self._upsample(grids[first:last], dy[first:last], dx[first:last], size, x.dtype, x.device)
            rows = torch.arange(start, stop, device=x.device)
            inputs, m = rows % n_in, rows // n_in - first
            on_host = torch.arange(start, stop) % n_in  # the targets' rows (`TargetPlan.take`)
            row_masks = masks[m].unsqueeze(1)  # (M, 1, H, W)
            scores = self._score(x[inputs] * row_masks, plan_rows(plan, on_host), self.softmax, fwd.rows(inputs))
            scores = scores.to(acc)
            sal.index_add_(0, inputs, scores[:, :, None, None, None] * row_masks.to(acc).unsqueeze(1))
        return sal / (self.n_masks * self.p), targets
