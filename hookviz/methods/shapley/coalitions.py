"""The coalition engine shared by the model-agnostic methods: the value v(S) of coalitions of feature groups.

A coalition S is a row of an (S, M) bool tensor over the M feature groups (`groups`): True keeps the input's
elements of that group, False replaces them by the baseline's. v(S) is the target score of the input so built,
``torch.where(coalition[group_ids], x, baseline)``, averaged over the baselines when they are a distribution
(`Background`). All S x N (x B background rows) inputs form one expanded batch, row ``(s * N + i) * B + j``, built on
the model's device chunk by chunk (at most ``batch_size`` rows, and at most ``max_memory`` bytes of built inputs) and
scored for all K targets of each input by the same forward passes. Where inputs need coalitions of their own
(KernelShap's varying groups, PartitionShap's hierarchy per layout), blocks of (coalitions, inputs) follow one another
in that batch (`Coalitions.blocks`). The coalitions themselves are drawn on the host from a `torch.Generator` (the
same draws on every device, for every chunk size) and copied to the device once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._checks import int_option, is_int, is_number
from ..._device import to_device
from ..._progress import progress_bar
from ...hooks import HookManager
from ...inputs import check_finite, finite_checks_deferred, read_deferred
from ...targets import TargetPlan, Targets, TargetSpec
from ..batch import chunks, forward_scores, plan_rows
from ..forward import ForwardArgs
from ..perturbation import PerturbationAttribution
from .groups import check_masks, spread


class Background:
    """A distribution of baselines: v(S) is the mean target score over baselines drawn from `samples` (B, ...), the
    interventional (baseline) Shapley value of the background distribution (shap's KernelExplainer with background
    data). `draws`: how many of the B samples to use (drawn without replacement with the method's generator, once
    per call, the same for every coalition, so efficiency holds against their mean); None: all B. Each coalition
    costs ``draws`` rows per input.
    """

    def __init__(self, samples: Tensor | tuple[Tensor, ...], draws: int | None = None) -> None:
        items = samples if isinstance(samples, tuple) else (samples,)
        if not items or not all(isinstance(s, Tensor) and s.dim() >= 1 and s.shape[0] >= 1 for s in items):
            raise TypeError("Background needs a tensor (B, ...) of B >= 1 baselines (or a tuple, one per input)")
        if len({s.shape[0] for s in items}) != 1:
            raise ValueError("Background: the tensors of a tuple must share the number of samples B")
        for s in items:
            check_finite(s, "Background samples")
        self.samples = items
        self.draws = int_option("draws", draws, "None (all samples) or an int >= 1", optional=True)

    def __repr__(self) -> str:
        return f"Background(B={self.samples[0].shape[0]}, draws={self.draws})"


def _gaussian_blur(x: Tensor, sigma: float) -> Tensor:
    """A separable Gaussian blur of images (N, C, H, W), reflect padding, kernel radius 3 sigma (cut to the image)."""
    radius = max(1, min(int(3 * sigma + 0.5), (min(x.shape[-2:]) - 1)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64, device=x.device)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = (k / k.sum()).to(x.dtype)
    c = x.shape[1]
    y = F.pad(x, (radius, radius, 0, 0), mode="reflect")
    y = F.conv2d(y, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    y = F.pad(y, (0, 0, radius, radius), mode="reflect")
    return F.conv2d(y, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def check_baselines(spec: object) -> None:
    """A baselines spec checked when it is given (before any input is seen): a number, a tensor, ``"blur"`` /
    ``("blur", sigma)``, a `Background`, or a tuple of those (one per input tensor)."""
    if isinstance(spec, Background):
        return
    if isinstance(spec, tuple) and not (len(spec) == 2 and spec[0] == "blur"):
        for s in spec:
            check_baselines(s)
        return
    if isinstance(spec, str) or (isinstance(spec, tuple) and spec and spec[0] == "blur"):
        sigma = spec[1] if isinstance(spec, tuple) else 1.0
        if spec != "blur" and not (isinstance(spec, tuple) and is_number(sigma) and sigma > 0):
            raise ValueError(f"baselines: a string must be 'blur' or ('blur', sigma > 0), got {spec!r}")
        return
    if isinstance(spec, Tensor):
        if spec.is_complex() or spec.dtype == torch.bool:
            raise TypeError(f"baselines tensor must hold real numbers, got dtype {spec.dtype}")
        check_finite(spec, "baselines")
        return
    if not is_number(spec) or not math.isfinite(spec):  # type: ignore[arg-type]
        raise TypeError(
            "baselines must be a finite number, a tensor that broadcasts to the inputs, 'blur' (a Gaussian blur of "
            f"the image), a Background(samples) distribution, or a tuple of those (one per input); got {spec!r}"
        )


class Reference:
    """The baselines of one call: per input tensor either (N, ...) rows (one baseline per input) or (B, ...) rows of
    a background distribution (``self.b`` rows per coalition and input)."""

    def __init__(self, tensors: tuple[Tensor, ...], b: int) -> None:
        self.tensors = tensors
        self.b = b  # background rows per coalition and input; 1: one baseline per input

    def rows(self, t: int, s: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """The baseline rows of input tensor `t` for the expanded rows of coalitions `s`, inputs `i`, samples `j`."""
        return self.tensors[t][i]


class BackgroundReference(Reference):
    """Baselines drawn from a distribution: row j of the samples, whatever the input."""

    def rows(self, t: int, s: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return self.tensors[t][j]


def resolve_baselines(
    spec: object, xs: tuple[Tensor, ...], generator: torch.Generator | None, blur_default: float | None = None
) -> Reference:
    """The baselines of the inputs `xs` from a spec (checked: shapes, dtypes), before any forward pass."""
    n = xs[0].shape[0]
    if isinstance(spec, Background):
        if len(spec.samples) != len(xs):
            raise ValueError(f"Background has {len(spec.samples)} tensors, the inputs {len(xs)}")
        b = spec.samples[0].shape[0]
        out = []
        pick = None
        if spec.draws is not None and spec.draws < b:
            pick = torch.randperm(b, generator=generator)[: spec.draws]
        for s, x in zip(spec.samples, xs, strict=True):
            if tuple(s.shape[1:]) != tuple(x.shape[1:]):
                raise ValueError(
                    f"Background samples of shape {tuple(s.shape)} do not match the inputs' shape {tuple(x.shape)}: "
                    f"give B samples shaped like one input, (B, {', '.join(map(str, x.shape[1:]))})"
                )
            s = s if pick is None else s[to_device(pick, s.device)]  # drawn on the host: copied without a wait
            out.append(to_device(s.detach().to(x.dtype), x.device))
        return BackgroundReference(tuple(out), out[0].shape[0])
    specs = spec if isinstance(spec, tuple) and not (len(spec) == 2 and spec[0] == "blur") else (spec,) * len(xs)
    if len(specs) != len(xs):
        raise ValueError(f"baselines: a tuple of {len(specs)} specs for {len(xs)} input tensors")
    out = []
    for k, (s, x) in enumerate(zip(specs, xs, strict=True)):
        where = "baselines" if len(xs) == 1 else f"baselines[{k}]"
        if isinstance(s, Background):
            raise TypeError(f"{where}: a Background distribution covers all input tensors; pass it alone")
        if isinstance(s, str) or isinstance(s, tuple):
            if x.dim() != 4 or not x.is_floating_point():
                raise ValueError(
                    f"{where}='blur' blurs images: the input must be float (N, C, H, W), got {tuple(x.shape)}"
                )
            sigma = s[1] if isinstance(s, tuple) else (blur_default or max(x.shape[-2:]) / 16)
            out.append(_gaussian_blur(x.detach(), float(sigma)))
        elif isinstance(s, Tensor):
            try:
                shape = torch.broadcast_shapes(s.shape, x.shape)
            except RuntimeError:
                shape = None
            if shape != x.shape:
                raise ValueError(
                    f"{where} of shape {tuple(s.shape)} does not broadcast to the inputs' shape {tuple(x.shape)}; give "
                    f"one baseline ({', '.join(map(str, x.shape[1:]))}) or one per input (N, ...), or a "
                    "Background(samples) distribution"
                )
            out.append(to_device(s.detach().to(x.dtype), x.device).expand_as(x))
        else:
            out.append(torch.full((), float(s), dtype=x.dtype, device=x.device).expand_as(x))  # type: ignore[arg-type]
    del n
    return Reference(tuple(out), 1)


def varying_groups(xs: tuple[Tensor, ...], masks: tuple[Tensor, ...], m: int, ref: Reference) -> Tensor:
    """The (N, M) uint8 on the inputs' device (1: varies), unread, of the groups that vary for each input (shap's
    `KernelExplainer` ``varying_groups``): a group varies when one of its elements differs from the baseline's, or,
    with a `Background`, from that element of some background row. A group that does not vary changes no built input
    whatever the coalition: its Shapley value is exactly 0. Exact equality (shap compares with ``np.allclose``). The
    caller reads it before any forward pass, with the finite checks (`hookviz.inputs.read_deferred`: one wait)."""
    n, dev = xs[0].shape[0], xs[0].device
    out = torch.zeros(n, m, dtype=torch.uint8, device=dev)
    for t, (x, g) in enumerate(zip(xs, masks, strict=True)):
        base = ref.tensors[t]
        if isinstance(ref, BackgroundReference):  # the B rows in chunks of about 2^24 compared elements
            differs = torch.zeros(x.shape, dtype=torch.bool, device=dev)
            step = max(1, 2**24 // max(x.numel(), 1))
            for lo in range(0, base.shape[0], step):
                differs |= (x.unsqueeze(1) != base[lo : lo + step].unsqueeze(0)).any(1)
        else:
            differs = x != base
        ids = to_device(g, dev).expand(n, *x.shape[1:]).reshape(n, -1)  # the host mask, copied without a wait
        out.scatter_reduce_(1, ids, differs.reshape(n, -1).to(torch.uint8), "amax")
    return out


class Coalitions:
    """v(S) for batches of coalitions on one call's inputs: `values` runs the chunked forward passes."""

    def __init__(
        self,
        method: CoalitionAttribution,
        xs: tuple[Tensor, ...],
        masks: tuple[Tensor, ...],
        m: int,
        ref: Reference,
        plan: TargetPlan,
        fwd: ForwardArgs,
        rows_per_pass: int,
    ) -> None:
        self.method = method
        self.xs = xs
        self.mask_tensors = masks  # on the host (`check_masks`): `hierarchy` reads their layout there
        self.device = xs[0].device
        # the group ids on the inputs' device, copied once without a wait: every chunk indexes them
        self.device_masks = tuple(to_device(mk, self.device) for mk in masks)
        self.masks = tuple(mk.flatten(1) for mk in self.device_masks)
        self.shapes = tuple(mk.shape for mk in masks)
        self.m = m
        self.ref = ref
        self.plan = plan
        self.fwd = fwd
        self.rows_per_pass = rows_per_pass
        self.n = xs[0].shape[0]
        self.passes = 0  # forward passes run so far (coalition rows / rows_per_pass, rounded up per call)
        self.k = 1  # targets per input, set once the clean pass has resolved them
        self.evaluated = 0  # (coalition, input) pairs evaluated so far (each on every background row)
        self.varying: Tensor | None = None  # (N, M) bool on the host where the method asked for it (`_varying`)

    def values(self, coalitions: Tensor, label: str = "coalitions") -> Tensor:
        """v(S) of the (S, M) bool `coalitions` on every input: (S, N, K) in float64."""
        return self.blocks([(coalitions, torch.arange(self.n))], label)[0]

    def blocks(self, blocks: list[tuple[Tensor, Tensor]], label: str = "coalitions") -> list[Tensor]:
        """v(S) of several blocks, each (S_b, M) bool coalitions and the (n_b,) host indices of the inputs they are
        evaluated on: a list of (S_b, n_b, K) float64, all blocks' rows scored by the same chunked forward passes (a
        block's row ``(s * n_b + i) * B + j``, the blocks one after another). Inputs that need different coalitions
        (KernelShap's varying groups, PartitionShap's hierarchy per layout) so share every forward pass."""
        dev, b = self.device, self.ref.b
        counts = [(z.shape[0], inputs.numel()) for z, inputs in blocks]
        pairs = [s * n for s, n in counts]
        self.evaluated += sum(pairs)
        if sum(pairs) == 0:
            return [torch.zeros(s, n, self.k, dtype=torch.float64, device=dev) for s, n in counts]
        # the blocks as tables (host, copied once without a wait): where each block's rows, coalitions, inputs and
        # (coalition, input) pairs start, and its number of inputs
        coalitions = torch.cat([to_device(z.bool(), dev) for z, _ in blocks])  # drawn on the host, copied once
        inputs = torch.cat([i.long() for _, i in blocks])
        sizes = torch.tensor([[p * b, s, n, p] for (s, n), p in zip(counts, pairs, strict=True)]).view(-1, 4)
        table = torch.cat([sizes.cumsum(0) - sizes, sizes[:, 2:3].clamp_min(1)], 1)  # starts, and n_b
        tables = (table, inputs), (to_device(table, dev), to_device(inputs, dev))

        def locate(r: Tensor, on: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            """The block rows `r`'s coalition, input, background sample and (coalition, input) pair indices."""
            tab, inp = tables[on]
            k = torch.searchsorted(tab[:, 0].contiguous(), r, right=True) - 1
            start, first_s, first_i, first_p, width = tab[k].unbind(1)
            local = r - start
            j, p = local % b, local // b
            return first_s + p // width, inp[first_i + p % width], j, first_p + p

        out: Tensor | None = None
        for start, stop in self._chunks(sum(pairs) * b, label):
            s, i, j, pair = locate(torch.arange(start, stop, device=dev), 1)
            keep = coalitions[s]  # (R, M)
            built = []
            for t, (x, g, shape) in enumerate(zip(self.xs, self.masks, self.shapes, strict=True)):
                mask = keep[:, g[0]] if g.shape[0] == 1 else torch.gather(keep, 1, g[i])
                mask = mask.view(stop - start, *shape[1:])
                built.append(torch.where(mask, x[i], self.ref.rows(t, s, i, j)))
            on_host = locate(torch.arange(start, stop), 0)[1]  # the targets' rows (`TargetPlan.take`), on the host
            scores = forward_scores(
                self.method.model, tuple(built), plan_rows(self.plan, on_host), None, forward_args=self.fwd.rows(i)
            ).scores.double()
            if out is None:
                out = torch.zeros(sum(pairs), scores.shape[1], dtype=torch.float64, device=dev)
            out.index_add_(0, pair, scores)
            self.passes += 1
        assert out is not None
        return [v.view(s, n, -1) for v, (s, n) in zip((out / b).split(pairs), counts, strict=True)]

    def _chunks(self, total: int, label: str) -> Iterator[tuple[int, int]]:
        steps = math.ceil(total / self.rows_per_pass)
        progress = self.method.progress
        bar = progress_bar(
            total=steps,
            enabled=progress is not False,
            desc=f"{type(self.method).__name__} ({label})",
            unit="pass",
            delay=0.0 if progress else 2.0,
            leave=False,
        )
        try:
            for rows in chunks(total, self.rows_per_pass):
                yield rows
                bar.update()
        finally:
            bar.close()


class CoalitionAttribution(PerturbationAttribution):
    """Shared by the coalition methods: feature groups, baselines, the memory budget, the generator, the engine.

    Args:
        model: any module (forward passes only: no hooks, no gradients; TorchScript models work).
        feature_mask: the default groups (`hookviz.methods.shapley.groups`); None: one group per token / tabular
            feature, an 8 x 8 grid of patches on images. `attribute` takes one per call too.
        baselines: the default baselines: a number, a tensor broadcasting to the inputs, ``"blur"`` (a Gaussian blur
            of the image, sigma = max(H, W) / 16; ``("blur", sigma)`` to choose), a `Background` distribution, or a
            tuple of those per input tensor.
        batch_size: rows (built inputs) per forward pass at most; None (default): about 2^20 input elements per pass
            (4 MiB of float32), between 64 and 4096 rows: 64 rows of 224 x 224 images, 85 of 64 x 64 ones, 4096
            tabular rows, so that small models are not run in many small passes.
        max_memory: bytes of built inputs per forward pass at most (None: no limit but `batch_size`); a budget
            below one row's inputs is refused before any forward pass, with both numbers.
        seed / generator: the draws (coalitions, permutations, background samples) come from `generator` (a cpu
            `torch.Generator`, advanced by every call) or else from a new generator seeded with `seed` on every call
            (the same draws each call; None: seeded from torch's global generator).
        progress: a tqdm bar: True, False, or None (shown only when the run lasts more than 2 s).
    """

    multi_input = True
    expands_batch = True
    display_defaults = {"reduce": "sum", "mode": "absmax", "cmap": "bwr", "overlay": False}
    grid_cells = 8  # default image groups: a grid of grid_cells x grid_cells patches

    def __init__(
        self,
        model: nn.Module,
        *,
        feature_mask: Tensor | tuple[Tensor, ...] | None = None,
        baselines: Any = 0.0,
        batch_size: int | None = None,
        max_memory: int | None = None,
        seed: int | None = 0,
        generator: torch.Generator | None = None,
        progress: bool | None = None,
        eval_mode: bool = True,
    ) -> None:
        super().__init__(model, batch_size=batch_size, progress=progress, eval_mode=eval_mode)
        check_baselines(baselines)
        self.max_memory = int_option("max_memory", max_memory, "None or an int >= 1 (bytes)", optional=True)
        if seed is not None and not is_int(seed):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.feature_mask = feature_mask
        self.baselines = baselines
        self.seed = seed
        self.generator = generator

    def _allows_integer_inputs(self) -> bool:
        return True  # token ids: a coalition keeps a token or puts the baseline's id (a pad / mask token) there

    def _generator(self) -> torch.Generator:
        if self.generator is not None:
            return self.generator
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, ()).item())
        return torch.Generator().manual_seed(seed)

    # -- calling convention ----------------------------------------------------------------------------------------
    def attribute(  # type: ignore[override]
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetSpec = None,
        *,
        feature_mask: Tensor | tuple[Tensor, ...] | None = None,
        baselines: Any = None,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Tensor | tuple[Tensor, ...]:
        """Attributions shaped like `inputs` (N, ...), or (N, K, ...) with K targets; each element holds its group's
        value. `feature_mask` / `baselines` override the method's defaults for this call."""
        return self.attribute_with_targets(
            inputs,
            target,
            feature_mask=feature_mask,
            baselines=baselines,
            additional_forward_args=additional_forward_args,
            forward_kwargs=forward_kwargs,
        )[0]

    def attribute_with_targets(  # type: ignore[override]
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetSpec = None,
        *,
        feature_mask: Tensor | tuple[Tensor, ...] | None = None,
        baselines: Any = None,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> tuple[Tensor | tuple[Tensor, ...], Targets]:
        if baselines is not None:
            check_baselines(baselines)
        # the inputs' and baselines' finite checks are read in `_explain`, with what the method reads before its work
        # (KernelShap's varying groups): one wait per call
        with finite_checks_deferred():
            x, kwargs, single = self._call_args(inputs, additional_forward_args, forward_kwargs)
            kwargs["feature_mask"] = feature_mask
            kwargs["baselines"] = baselines
            attribution, targets = self._explain(x, target, **kwargs)
        return (attribution[0] if single and isinstance(attribution, tuple) else attribution), targets

    def _explain(self, x: Any, target: Any, **kwargs: Any) -> tuple[Any, Targets]:
        # groups, baselines and the budget are checked here, before the model is touched
        xs = x if isinstance(x, tuple) else (x,)
        mask_spec = kwargs.pop("feature_mask", None)
        masks, m = check_masks(self.feature_mask if mask_spec is None else mask_spec, xs, self.grid_cells)
        self._check_groups(m)
        self._check_batch(xs[0].shape[0])
        spec = kwargs.pop("baselines", None)
        generator = self._generator()
        ref = resolve_baselines(self.baselines if spec is None else spec, xs, generator)
        row_bytes = sum(t[0].numel() * t.element_size() for t in xs)
        elements = sum(t[0].numel() for t in xs)
        rows = self.batch_size if self.batch_size is not None else min(max(64, 2**20 // max(elements, 1)), 4096)
        if self.max_memory is not None:
            if self.max_memory < row_bytes:
                raise ValueError(
                    f"max_memory={self.max_memory} bytes does not hold one coalition's input row ({row_bytes} bytes: "
                    f"{' + '.join(str(tuple(t.shape[1:])) for t in xs)} elements of {xs[0].dtype}); raise max_memory "
                    f"to at least {row_bytes} bytes"
                )
            rows = min(rows, self.max_memory // row_bytes)
        # read here, before any forward pass, with the finite checks queued so far (KernelShap's varying groups)
        differs = self._varying(tuple(t.detach() for t in xs), masks, m, ref)
        read = read_deferred([] if differs is None else [differs])
        varying = read[0].bool() if read else None
        kwargs.update(groups=(masks, m), reference=ref, rows_per_pass=rows, generator=generator, varying=varying)
        return super()._explain(x, target, **kwargs)

    def _check_groups(self, m: int) -> None:
        """Refuse group counts the method cannot handle (before any forward pass)."""

    def _check_batch(self, n: int) -> None:
        """Refuse batch sizes the method cannot handle (before any forward pass)."""

    def _varying(self, xs: tuple[Tensor, ...], masks: tuple[Tensor, ...], m: int, ref: Reference) -> Tensor | None:
        """The groups that vary per input (`varying_groups`, unread), where the method uses them; None: not needed."""
        return None

    def _run(self, x: Any, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Any, Targets]:
        xs = tuple(t.detach() for t in (x if isinstance(x, tuple) else (x,)))
        masks, m = kwargs["groups"]
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), xs[0].shape[0])
        targets, plan = self._clean(xs, target, fwd)  # type: ignore[arg-type]
        engine = Coalitions(self, xs, masks, m, kwargs["reference"], plan, fwd, kwargs["rows_per_pass"])
        engine.k = targets.scores.shape[1]
        engine.varying = kwargs["varying"]
        phi = self._groups(engine, targets.scores.double(), kwargs["generator"])  # (N, K, M)
        # what the call cost, for benchmarks and curious users: forward passes and coalitions per input (the clean
        # pass aside; a mean where inputs took different numbers, KernelShap's varying groups)
        per_input = engine.evaluated / engine.n
        self.last_passes = engine.passes
        self.last_coalitions = int(per_input) if per_input.is_integer() else per_input
        self.last_rows_per_pass = engine.rows_per_pass
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in xs) else torch.float32
        return spread(phi.to(dtype), engine.device_masks, xs), targets

    def _groups(self, engine: Coalitions, clean: Tensor, generator: torch.Generator) -> Tensor:
        """The (N, K, M) float64 attributions of the M groups; `clean` the (N, K) scores of the inputs."""
        raise NotImplementedError


def solve_host_matrix(a: Tensor, b: Tensor) -> Tensor:
    """``a^-1 b`` for a square float64 `a` built on the host from the coalitions and their weights alone (drawn
    there) and `b` on the model's device (from the scores).

    `a` is LU-factored on the host, where whether it is singular is known without reading anything from the device
    (``torch.linalg.solve`` on the device would read its error flag back: a wait), and the factors go to the device
    without one (`to_device`). On one device the result equals ``torch.linalg.solve(a, b)`` bit for bit (that is
    its factorization and solve). A singular `a` (too few distinct coalitions for some direction) takes the
    least-norm solution ``pinv(a) @ b``, as before."""
    lu, pivots, info = torch.linalg.lu_factor_ex(a)
    if int(info) != 0:  # a host tensor: no wait
        return to_device(torch.linalg.pinv(a), b.device) @ b
    return torch.linalg.lu_solve(to_device(lu, b.device), to_device(pivots, b.device), b)


def full_and_empty(m: int) -> Tensor:
    """The (2, M) coalitions [all groups, no group]."""
    return torch.stack([torch.ones(m, dtype=torch.bool), torch.zeros(m, dtype=torch.bool)])
