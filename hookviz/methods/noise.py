"""Noise over an attribution method: SmoothGrad and VarGrad.

`SmoothGrad` (Smilkov et al., 2017, "SmoothGrad: removing noise by adding noise", arXiv:1706.03825) averages any
method (`Saliency`, `GuidedBackprop`, `IntegratedGradients`, the CAMs, any `Attribution`) over noisy copies of the
input, or its square (SmoothGrad-Squared, Hooker et al., 2019, arXiv:1806.10758); `VarGrad` (Adebayo et al., 2018,
"Sanity Checks for Saliency Maps", arXiv:1810.03292) takes the variance over the same copies.

The noisy copies of the N inputs form one copy-major "expanded batch", run through the wrapped method in chunks of
at most ``batch_size`` rows and summed into the result with `index_add_` (the chunking helpers are shared with the
input-gradient methods in `gradient`). The Python loops are over chunks and whole-batch noise draws, never over
inputs, and the result does not depend on ``batch_size`` beyond float rounding.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import bool_option, number_option, positive_int
from .._device import to_device
from ..hooks import HookManager
from ..targets import TargetPlan, Targets, TargetSpec
from .base import Attribution, register
from .batch import acc_dtype, check_batch_size, chunks, forward_scores, plan_rows
from .forward import ForwardArgs, as_tuple, take_rows
from .gradient import Saliency


@register("smoothgrad")
class SmoothGrad(Attribution):
    r"""SmoothGrad (Smilkov et al., 2017, "SmoothGrad: removing noise by adding noise", arXiv:1706.03825).

    Averages any attribution method M (`Saliency`, `GuidedBackprop`, `InputXGradient`, `IntegratedGradients`, the
    CAMs, any `Attribution` instance) over n noisy copies of each input:
    $$ \hat M(x) = \frac{1}{n} \sum_{s=1}^{n} M(x + \epsilon_s), \quad
    \epsilon_s \sim \mathcal{N}\big(0, (\sigma (x_{max} - x_{min}))^2\big) $$
    with $$ x_{max} - x_{min} $$ taken per input sample (the paper's noise level, ``sigma=0.15`` is 15 %);
    ``squared=True`` averages $$ M(x + \epsilon_s)^2 $$ instead (SmoothGrad-Squared, Hooker et al., 2019,
    arXiv:1806.10758). Result shaped like M's: (N, C, H, W), or (N, K, C, H, W) with K targets per input; a tuple
    for several inputs (each input tensor gets its own noise, scaled by its own range).

    Args:
        method: the method to smooth, an `Attribution` instance (its model, ``eval_mode``, layer and hooks are used
            on every noisy pass); a bare `nn.Module` means ``Saliency(module)``.
        n: noisy copies per input.
        sigma: noise standard deviation as a fraction of each input's value range.
        batch_size: at most this many rows (noisy copies) per call of the method; None: all N * n at once. (A
            method that expands the batch itself, such as IntegratedGradients, chunks its rows by its own
            ``batch_size``.)
        squared: average the squared attributions (SmoothGrad-Squared).
        generator: a `torch.Generator` on the inputs' device for reproducible noise (None: the global generator).

    Targets: None means the top class of the *clean* input (one extra forward without gradients); ints, sequences,
    (N, K) tensors and callables apply to every noisy copy of their input (a callable is called once per noisy copy
    of the batch, on an output whose row i belongs to input i: `hookviz.targets.aligned_scores`). The returned
    scores are the target scores averaged over the noisy copies. ``additional_forward_args`` tensors with first
    dimension N follow their input's copies.

    Noise, exactly (so a reference can replicate it): the model is prepared and restored once per call; the copies
    are drawn in order s = 0, ..., n-1, each as one call
    ``eps = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)`` per input tensor x (N, ...),
    in the order of the inputs, and copy s is ``x + (sigma * (x_max - x_min)) * eps`` with ``x_max``/``x_min``
    the per-sample ``amax``/``amin`` over all non-batch axes (keepdim). The expanded batch is copy-major (row
    ``s * N + i`` is input i's copy s) and is cut into chunks of ``batch_size`` rows; copies are drawn lazily as
    chunks need them, so the noise (and the result) does not depend on ``batch_size``. The loop over draws is over
    whole-batch draws (one per noise sample), never over inputs.

    Example::

        smooth = SmoothGrad(GuidedBackprop(model), n=25, generator=torch.Generator().manual_seed(0))
        attr = smooth.attribute(x, target=281)
        smooth_ig = SmoothGrad(IntegratedGradients(model, steps=16), n=10, batch_size=5)
    """

    multi_input = True  # as the wrapped method: set per instance
    expands_batch = True
    _reduction: str = "mean"  # "mean", "mean_sq" (SmoothGrad-Squared) or "var" (VarGrad)

    def __init__(
        self,
        method: Attribution | nn.Module,
        n: int = 50,
        sigma: float = 0.15,
        *,
        batch_size: int | None = None,
        squared: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(method, type):
            raise TypeError(
                f"method must be an instance of an attribution method, got the class {method.__name__}; "
                f"pass e.g. {type(self).__name__}({method.__name__}(model))"
            )
        if isinstance(method, nn.Module):
            method = Saliency(method)
        if not isinstance(method, Attribution):
            raise TypeError(
                "method must be an attribution method instance (Saliency, IntegratedGradients, GradCAM, any hookviz "
                f"Attribution) or a model (smoothed Saliency), got {type(method).__name__}"
            )
        n = positive_int("n", n, "noisy copies per input")
        ok = lambda v: math.isfinite(v) and v >= 0  # noqa: E731
        number_option("sigma", sigma, "a finite number >= 0 (a fraction of the input range)", ok)
        batch_size = check_batch_size(batch_size)
        bool_option("squared", squared)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        super().__init__(method.model, eval_mode=method.eval_mode, backward=method.backward)
        self.method = method
        self.multi_input = method.multi_input  # several inputs exactly when the wrapped method takes them
        self.n = n
        self.sigma = float(sigma)
        self.batch_size = batch_size
        self.squared = squared
        self._reduction = "mean_sq" if squared else "mean"
        self.generator = generator
        self.display_defaults = dict(method.display_defaults)
        # the mean of a method's maps reduces like the method; a mean of squares is >= 0 and adds up
        self.token_reduction = "sum" if squared else method.token_reduction

    def __repr__(self) -> str:
        extra = f", batch_size={self.batch_size}" if self.batch_size is not None else ""
        extra += ", squared=True" if self.squared else ""
        return f"{type(self).__name__}({self.method!r}, n={self.n}, sigma={self.sigma}{extra})"

    def _explain(self, x: Tensor, target: TargetSpec, **kwargs: Any) -> tuple[Tensor, Targets]:
        g = self.generator
        device = as_tuple(x)[0].device
        if g is not None and g.device.type != device.type:
            raise ValueError(
                f"generator is on {g.device} but the inputs are on {device}; create it with "
                f"torch.Generator(device={str(device)!r})"
            )
        return super()._explain(x, target, **kwargs)

    def _prepared(self) -> AbstractContextManager[HookManager]:
        # the wrapped method prepares the model (its eval_mode), once for all noisy passes
        return self.method._prepared()

    def _run(
        self, x: Tensor | tuple[Tensor, ...], target: Any, hooks: HookManager, **kwargs: Any
    ) -> tuple[Tensor | tuple[Tensor, ...], Targets]:
        model, method = self.model, self.method
        xs = tuple(t.detach() for t in as_tuple(x))
        n_in = xs[0].shape[0]
        fwd: ForwardArgs = kwargs.get("forward_args") or ForwardArgs((), n_in)
        plan: TargetPlan = target
        indices = None
        if plan.indices is None and plan.fn is None:  # the top class of the clean input
            indices = forward_scores(model, xs, plan, self.batch_size, forward_args=fwd).indices
            plan = TargetPlan(indices, None, False, from_output=True)
        elif plan.indices is not None:
            indices = to_device(plan.indices, xs[0].device)
        scales = []
        for t in xs:
            dims = tuple(range(1, t.dim()))
            scales.append(self.sigma * (t.amax(dim=dims, keepdim=True) - t.amin(dim=dims, keepdim=True)))
        # per-input state of the wrapped method (IntegratedGradients' baselines), indexed like the rows
        state: dict[str, tuple[Tensor, ...]] = getattr(method, "_per_input_state", lambda xs: {})(xs)
        copy_index, copy = -1, xs
        sums: list[Tensor] | None = None
        squares: list[Tensor] | None = None
        score_total: Tensor | None = None
        multi, as_tuple_result = plan.multi, False
        for start, stop in chunks(n_in * self.n, self.batch_size):
            parts = []
            for s in range(start // n_in, (stop - 1) // n_in + 1):  # the copies this chunk touches, in order
                if s > copy_index:  # chunks are contiguous: s is the next copy to draw
                    copy_index, copy = s, tuple(t + scale * self._noise(t) for t, scale in zip(xs, scales, strict=True))
                lo, hi = max(start - s * n_in, 0), min(stop - s * n_in, n_in)
                parts.append(tuple(c[lo:hi] for c in copy))
            rows = torch.arange(start, stop, device=xs[0].device) % n_in
            on_host = torch.arange(start, stop) % n_in  # the targets' rows (`TargetPlan.take`)
            chunk = parts[0] if len(parts) == 1 else tuple(torch.cat(p) for p in zip(*parts, strict=True))
            run_kwargs: dict[str, Any] = {k: take_rows(v, rows) for k, v in state.items()}
            if method.multi_input:
                run_kwargs["forward_args"] = fwd.rows(rows)
            # a manager per chunk: the method places its hooks (rules) for this pass only
            with HookManager(model) as chunk_hooks:
                attr, targets = method._run(
                    chunk if method.multi_input else chunk[0], plan_rows(plan, on_host), chunk_hooks, **run_kwargs
                )
            as_tuple_result = isinstance(attr, tuple)
            attrs = tuple(a.detach().to(acc_dtype(a.dtype)) for a in as_tuple(attr))
            if sums is None:
                sums = [a.new_zeros((n_in, *a.shape[1:])) for a in attrs]
                squares = [a.new_zeros((n_in, *a.shape[1:])) for a in attrs]
                score_total = attrs[0].new_zeros((n_in, targets.scores.shape[1]))
            for e, a in enumerate(attrs):
                if self._reduction != "mean_sq":
                    sums[e].index_add_(0, rows, a)
                if self._reduction != "mean":
                    squares[e].index_add_(0, rows, a * a)  # type: ignore[index]
            score_total.index_add_(0, rows, targets.scores.detach().to(score_total.dtype))  # type: ignore[union-attr]
            multi = targets.multi
        assert sums is not None and squares is not None and score_total is not None  # n >= 1 and N >= 1
        result = tuple(self._reduce(total, sq) for total, sq in zip(sums, squares, strict=True))
        return (result if as_tuple_result else result[0]), Targets(score_total / self.n, indices, multi)

    def _noise(self, t: Tensor) -> Tensor:
        return torch.randn(t.shape, generator=self.generator, device=t.device, dtype=t.dtype)

    def _reduce(self, total: Tensor, squares: Tensor) -> Tensor:
        if self._reduction == "mean":
            return total / self.n
        if self._reduction == "mean_sq":
            return squares / self.n
        mean = total / self.n
        return (squares / self.n - mean * mean).clamp_min(0)  # rounding can push a zero variance below 0


@register("vargrad")
class VarGrad(SmoothGrad):
    r"""VarGrad (Adebayo et al., 2018, "Sanity Checks for Saliency Maps", arXiv:1810.03292; also Hooker et al., 2019,
    "A Benchmark for Interpretability Methods in Deep Neural Networks", arXiv:1806.10758).

    The variance of a method M over n noisy copies of each input, with SmoothGrad's noise (see `SmoothGrad`):
    $$ V(x) = \frac{1}{n} \sum_{s=1}^{n} M(x + \epsilon_s)^2
    - \Big(\frac{1}{n} \sum_{s=1}^{n} M(x + \epsilon_s)\Big)^2 $$
    (the population variance, as captum's ``NoiseTunnel(nt_type="vargrad")``), element-wise, >= 0. Result shaped
    like M's. Arguments as `SmoothGrad` (without ``squared``).

    Example::

        var = VarGrad(Saliency(model), n=25, sigma=0.15, batch_size=50).attribute(x, target=281)
    """

    def __init__(
        self,
        method: Attribution | nn.Module,
        n: int = 50,
        sigma: float = 0.15,
        *,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(method, n, sigma, batch_size=batch_size, generator=generator)
        self._reduction = "var"
        self.token_reduction = "sum"  # variances are >= 0 and add up
        # a variance is >= 0: shown on a sequential scale, not the signed one of the method
        if self.display_defaults.get("cmap") == "bwr":
            self.display_defaults.update(mode="minmax", cmap="inferno")
