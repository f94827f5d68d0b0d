"""The life cycle every attribution method shares (template method).

``attribute(x, target)``: check the target spec and the input -> prepare the model (eval mode, parameters frozen,
grad enabled even under ``torch.no_grad()``, hooks placed through one `HookManager`) -> one forward pass -> the
(N, K) target scores -> one batched backward pass -> restore the model exactly as it was, in a ``finally``.
Subclasses implement `_run` (and usually only a one-line rule inside it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from ..hooks import HookManager
from ..inputs import check_model_inputs, expected_channels, load_images, model_device
from ..targets import BackwardStrategy, Targets, TargetSpec, check_target
from .scope import active_call

if TYPE_CHECKING:
    from ..explanation import Explanation

METHODS: dict[str, type[Attribution]] = {}


def register(name: str) -> Callable[[type[Attribution]], type[Attribution]]:
    """Class decorator: make a method available by `name` (CLI ``--method``, `get_method`)."""

    def deco(cls: type[Attribution]) -> type[Attribution]:
        METHODS[name] = cls
        cls.key = name
        return cls

    return deco


def get_method(name: str) -> type[Attribution]:
    """The attribution class registered under `name` (e.g. ``"guided-backprop"``, ``"gradcam"``)."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(METHODS))}") from None


class Attribution:
    """Base class of attribution methods: owns the model preparation and restoration.

    Args:
        model: any `nn.Module`; it is left exactly as it was after every call (hooks, ``training`` flags,
            ``requires_grad`` flags, parameter and buffer values, existing ``.grad`` tensors).
        eval_mode: put the model in eval mode during the call (default). With ``False`` the modules keep their
            modes; buffers changed by the forward pass (BatchNorm running statistics) are restored afterwards,
            but samples are no longer independent under batch statistics.
        backward: how K targets per input are batched: ``"loop"`` (K backward passes over the retained graph),
            ``"vmap"`` (vectorized backward passes over chunks of the K seeds) or ``"auto"`` (default: the loop on
            the CPU, where it measured faster, e.g. resnet18 at 224x224 with K = 10: 344 ms vs 379 ms; vmap on GPUs,
            falling back to the loop where vmap cannot batch an operation; see `hookviz.targets.auto_strategy`).
    """

    key: ClassVar[str] = ""
    display_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: nn.Module, *, eval_mode: bool = True, backward: BackwardStrategy = "auto") -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(eval_mode, bool):
            raise TypeError(f"eval_mode must be True or False, got {type(eval_mode).__name__} {eval_mode!r}")
        if backward not in ("auto", "vmap", "loop"):
            raise ValueError(f"backward must be 'auto', 'vmap' or 'loop', got {backward!r}")
        self.model = model
        self.eval_mode = bool(eval_mode)
        self.backward = backward

    # -- public API ---------------------------------------------------------------------------------------------
    def attribute(self, inputs: Tensor, target: TargetSpec = None) -> Tensor:
        """Raw attribution for a batch `inputs` (N, ...); see the subclass for the result's shape.

        With an (N, K) `target` the result gains a K axis after N. `inputs` are checked before any work (rank and
        channels against the model's first convolution, finite values; `hookviz.inputs.check_model_inputs`) and cast
        to the model's parameter dtype and device: a float64 batch on a float32 model is explained in float32.
        """
        return self._explain(self._check_inputs(inputs), target)[0]

    def visualize(
        self,
        images: Any,
        target: TargetSpec = None,
        *,
        preprocess: Any = "imagenet",
        labels: Sequence[str] | Any | None = None,
    ) -> Explanation:
        """Explain images given as paths, PIL images, numpy arrays or tensors; returns an `Explanation`.

        Non-tensor images go through `preprocess` (default: the ImageNet preset; any callable such as a
        torchvision weights' ``transforms()``); tensors are used as given. `labels`: class names indexed by class id,
        or a torchvision weights enum member (its ``meta["categories"]``). The `Explanation` shows itself in Jupyter.
        """
        from ..explanation import Explanation

        batch = load_images(
            images,
            preprocess=preprocess,
            device=model_device(self.model),
            channels=expected_channels(self.model) or 3,
        )
        x = self._check_inputs(batch.tensor)
        attribution, targets = self._explain(x, target)
        return Explanation(
            attribution=attribution.detach(),
            images=batch.images,
            inputs=x,
            targets=targets.indices,
            scores=targets.scores.detach(),
            method=type(self).__name__,
            multi_target=targets.multi,
            labels=labels,
            display=dict(self.display_defaults),
            coverage=getattr(self, "coverage", None),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    # -- life cycle ---------------------------------------------------------------------------------------------
    def _explain(self, x: Tensor, target: TargetSpec, **kwargs: Any) -> tuple[Tensor, Targets]:
        spec = check_target(target, x.shape[0])
        with self._prepared() as hooks:
            attribution, targets = self._run(x, spec, hooks, **kwargs)
        if not targets.multi:
            attribution = attribution.squeeze(1)
        return attribution, targets

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        """One forward and one batched backward; returns the attribution with a K axis, (N, K, ...)."""
        raise NotImplementedError

    def _check_inputs(self, x: Any) -> Tensor:
        """The batch checked against the model and cast to its device and parameter dtype (`check_model_inputs`)."""
        return check_model_inputs(self.model, x)

    @contextmanager
    def _prepared(self) -> Iterator[HookManager]:
        """Snapshot the model, prepare it for one explanation, and restore it in ``finally``.

        The block is one active call (`scope.active_call`): the method's hooks act only while it is the innermost.
        Everything is undone for any exception, ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit``
        included (a generator context manager gets them thrown in at ``yield``).
        """
        if torch.is_inference_mode_enabled():
            raise RuntimeError(
                "hookviz methods need autograd, which torch.inference_mode() switches off; call them outside "
                "inference_mode (torch.no_grad() is fine)"
            )
        model = self.model
        modes = [(m, m.training) for m in model.modules()]
        flags = [(p, p.requires_grad) for p in model.parameters()]
        # Train-mode forwards update BatchNorm running statistics; keep a copy to put back.
        buffers = (
            [(b, b.detach().clone()) for b in model.buffers()]
            if not self.eval_mode and any(t for _, t in modes)
            else []
        )
        try:
            if self.eval_mode:
                model.eval()
            for p, _ in flags:
                p.requires_grad_(False)  # no weight gradients are computed, none can reach .grad
            with active_call(), torch.enable_grad(), HookManager(model) as hooks:
                yield hooks
        finally:
            for m, training in modes:
                m.training = training
            for p, requires_grad in flags:
                p.requires_grad_(requires_grad)
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
