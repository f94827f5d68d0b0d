"""`FeatureVisualization`: optimise images to excite a unit, channel or direction (Olah et al., "Feature
Visualization", Distill 2017), with lucent's defaults, hooks only on the layers the objective names.

Differences from lucent on purpose: its ``hook_model`` places a forward hook on every module and never removes it,
and keeps the module's output tensor, which a later in-place ReLU overwrites (so a "pre-ReLU" objective reads the
post-ReLU value); here one `HookManager` hooks the named modules only, for the duration of the call, and keeps a
copy in the graph taken as the module returns. Gradients are taken with ``torch.autograd.grad`` w.r.t. the image
parameters (lucent's ``loss.backward()`` also fills the model's ``.grad``). No global random state is used. Images
are rendered at `size` (lucent upsamples anything smaller than 224 to 224 before the model; here the model sees the
transformed `size` image, which suits small models such as the shapes CNN).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks import HookManager
from ..record import call_key, first_tensor
from ._common import parse_key, prepared
from .objectives import Objective, as_objective, diversity
from .parameterization import ImageParam
from .transforms import Transform, compose, standard_transforms

__all__ = ["FeatureVisualization"]

ObjectiveLike = Objective | str


class _Stop(Exception):  # noqa: N818  raised by a hook once every needed layer has run: the rest is not computed
    pass


def _size(size: Any) -> tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool) and size >= 8:
        return size, size
    if isinstance(size, tuple | list) and len(size) == 2 and all(isinstance(s, int) and s >= 8 for s in size):
        return int(size[0]), int(size[1])
    raise ValueError(f"size must be an int or (h, w) of at least 8 pixels, got {size!r}")


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


class FeatureVisualization:
    """Render images that maximise an objective of `model` (see `hookviz.interventions.objectives`).

    Args:
        model: takes (B, 3, h, w) images in [0, 1] (after `preprocess`); it comes back exactly as it was.
        size: rendered image size, int or (h, w) (lucent: 128).
        fft: Fourier parameterisation (True, lucent's default) or pixels.
        decorrelate: decorrelated colour space (True, lucent's default).
        steps: optimisation steps (lucent: 512).
        lr: Adam's learning rate (lucent: 0.05).
        transforms: random transforms per step, ``f(image, generator) -> image``; None: lucent's standard ones
            (pad, jitter, scale, rotate, jitter); ``[]`` for none.
        preprocess: applied to the transformed image before the model (e.g. a normalisation); None: nothing.
        sd: standard deviation of the initial parameters (lucent: 0.01, a nearly uniform grey image). A model whose
            first ReLUs are all off on a flat image (the shapes CNN) has a zero gradient there: start from more
            contrast (e.g. 0.1).
        model_size: resize every transformed image to this size before the model (lucent's ``fixed_image_size``),
            for models that take one input size only (ViT); None: the model sees the transformed image as it is.
        eval_mode: run the model in eval mode (restored after).

    Example::

        fv = hv.FeatureVisualization(model, size=64, steps=256)
        images = fv.render(["head:0", "head:1"], seed=0)     # (2, 3, 64, 64) in [0, 1], one per unit
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        size: int | tuple[int, int] = 128,
        fft: bool = True,
        decorrelate: bool = True,
        steps: int = 512,
        lr: float = 0.05,
        transforms: Sequence[Transform] | None = None,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        sd: float = 0.01,
        model_size: int | tuple[int, int] | None = None,
        eval_mode: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        for flag, what in ((fft, "fft"), (decorrelate, "decorrelate"), (eval_mode, "eval_mode")):
            if not isinstance(flag, bool):
                raise TypeError(f"{what} must be True or False, got {flag!r}")
        if isinstance(lr, bool) or not isinstance(lr, int | float) or lr <= 0:
            raise ValueError(f"lr must be a positive number, got {lr!r}")
        if isinstance(sd, bool) or not isinstance(sd, int | float) or sd <= 0:
            raise ValueError(f"sd must be a positive number, got {sd!r}")
        if preprocess is not None and not callable(preprocess):
            raise TypeError(f"preprocess must be callable or None, got {type(preprocess).__name__}")
        self.model = model
        self.size = _size(size)
        self.fft, self.decorrelate, self.eval_mode = fft, decorrelate, eval_mode
        self.steps = _positive_int(steps, "steps")
        self.lr = float(lr)
        self.transforms = standard_transforms() if transforms is None else list(transforms)
        self.preprocess = preprocess
        self.sd = float(sd)
        self.model_size = None if model_size is None else _size(model_size)
        self.last_values: Tensor | None = None

    # ----------------------------------------------------------------------------------------------------------
    def render(
        self,
        objective: ObjectiveLike | Sequence[ObjectiveLike],
        *,
        batch: int | None = None,
        diversity_weight: float = 0.0,
        steps: int | None = None,
        seed: int = 0,
    ) -> Tensor:
        """Optimise images for `objective` and return them, (B, 3, h, w) in [0, 1] on the model's device.

        `objective`: an `Objective` or ``"layer:channel"``, rendered `batch` times (default 1); or a list of them,
        one image each (all optimised together, each for its own objective). ``diversity_weight`` > 0 adds lucent's
        diversity term at the first objective's first layer, so that a batch of one unit shows different images.
        Deterministic for a given `seed`. ``last_values`` holds the objective of each final image (untransformed).
        """
        objectives, per_image = self._objectives(objective, batch)
        if isinstance(diversity_weight, bool) or not isinstance(diversity_weight, int | float) or diversity_weight < 0:
            raise ValueError(f"diversity_weight must be a number >= 0, got {diversity_weight!r}")
        n_steps = self.steps if steps is None else _positive_int(steps, "steps")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        div = diversity(objectives[0].layers[0]) if diversity_weight > 0 else None
        layers = tuple(dict.fromkeys(k for o in objectives for k in o.layers))
        needed = {k: parse_key(self.model, k, "objective layer") for k in layers}
        b = len(objectives) if per_image else (1 if batch is None else _positive_int(batch, "batch"))
        device = _device(self.model)
        g = torch.Generator().manual_seed(seed)
        param = ImageParam(
            b, *self.size, fft=self.fft, decorrelate=self.decorrelate, sd=self.sd, generator=g, device=device
        )
        transform = compose(self.transforms)
        if self.model_size is not None:
            resize = self.model_size

            def transform(x: Tensor, g: torch.Generator, _t=transform) -> Tensor:  # noqa: ANN001
                return F.interpolate(_t(x, g), size=resize, mode="bilinear", align_corners=True)

        def total(acts: dict[str, Tensor]) -> Tensor:
            if per_image:
                value = torch.stack([o(acts)[i] for i, o in enumerate(objectives)])
            else:
                value = objectives[0](acts)
            if div is not None:
                value = value + diversity_weight * div(acts)
            return value

        with prepared(self.model, self.eval_mode, freeze=True), self._hooks(needed) as run:
            with torch.no_grad():
                shapes = {k: v.shape for k, v in run(param()).items()}
            for o in objectives:
                o.check(shapes)
            optimizer = torch.optim.Adam(param.parameters, lr=self.lr)
            with torch.enable_grad():
                for _ in range(n_steps):
                    value = total(run(transform(param(), g)))
                    (grad,) = torch.autograd.grad(-value.sum(), param.parameters)
                    param.raw.grad = grad
                    optimizer.step()
            with torch.no_grad():
                images = param()
                self.last_values = total(run(images)).detach()
        return images.detach()

    def score(self, objective: ObjectiveLike, images: Tensor, batch_size: int = 256) -> Tensor:
        """The objective's value for each of `images` (B, 3, h, w) in [0, 1] (no transforms), (B,) under no_grad:
        compare a rendered image with data-set images."""
        obj = as_objective(objective)
        if not isinstance(images, Tensor) or images.dim() != 4:
            raise ValueError(f"images must be a (B, 3, h, w) tensor, got {getattr(images, 'shape', images)!r}")
        needed = {k: parse_key(self.model, k, "objective layer") for k in obj.layers}
        out = []
        with prepared(self.model, self.eval_mode), self._hooks(needed) as run, torch.no_grad():
            for chunk in images.split(_positive_int(batch_size, "batch_size")):
                acts = run(chunk.to(_device(self.model)))
                obj.check({k: v.shape for k, v in acts.items()})
                out.append(obj(acts))
        return torch.cat(out)

    # ----------------------------------------------------------------------------------------------------------
    def _objectives(self, objective: Any, batch: Any) -> tuple[list[Objective], bool]:
        if isinstance(objective, Sequence) and not isinstance(objective, str):
            if not objective:
                raise ValueError("objective is an empty list; pass one objective or a list of them")
            if batch is not None:
                raise ValueError("batch= applies to one objective; a list renders one image per objective")
            return [as_objective(o) for o in objective], True
        return [as_objective(objective)], False

    def _hooks(self, needed: dict[str, tuple[str, int | None]]) -> Any:
        """A context yielding ``run(image) -> {layer key: activation}``: hooks on the named modules only."""
        model, preprocess = self.model, self.preprocess
        names = {name for name, _ in needed.values()}
        acts: dict[str, Tensor] = {}
        counts: dict[str, int] = {}

        def on_forward(name: str, module: nn.Module, args: Any, output: Any) -> None:
            i = counts.get(name, 0)
            counts[name] = i + 1
            key = call_key(name, i)
            wanted = key if key in needed else (name + "#0" if i == 0 and name + "#0" in needed else None)
            tensor = first_tensor(output)
            if wanted is None or tensor is None:
                return
            # a copy in the graph, taken now: a later in-place op (nn.ReLU(inplace=True)) cannot overwrite it
            acts[wanted] = tensor.clone()
            if len(acts) == len(needed):
                raise _Stop

        class _Context:
            def __enter__(self_ctx) -> Callable[[Tensor], dict[str, Tensor]]:  # noqa: N805
                self_ctx.hooks = HookManager(model)
                try:
                    self_ctx.hooks.forward(lambda n, m: n in names, on_forward, with_name=True)
                except BaseException:
                    self_ctx.hooks.remove()
                    raise

                def run(image: Tensor) -> dict[str, Tensor]:
                    acts.clear()
                    counts.clear()
                    try:
                        model(preprocess(image) if preprocess is not None else image)
                    except _Stop:
                        pass
                    missing = [k for k in needed if k not in acts]
                    if missing:
                        raise ValueError(
                            f"objective layer(s) {', '.join(map(repr, missing))} never ran in the forward (or "
                            "returned no tensor)"
                        )
                    return dict(acts)

                return run

            def __exit__(self_ctx, *exc: Any) -> bool:  # noqa: N805
                self_ctx.hooks.remove()
                return False

        return _Context()


def _device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
