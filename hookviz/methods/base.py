"""The life cycle every attribution method shares (template method).

``attribute(x, target)``: check the target spec and the input -> prepare the model (eval mode, under the model's
lock: one call per model at a time, see `scope`; grad enabled even under ``torch.no_grad()``, hooks placed through
one `HookManager`) -> one forward pass -> the (N, K) target scores -> one batched backward pass -> restore the
model exactly as it was, in a ``finally``. Subclasses implement `_run` (and usually only a one-line rule inside it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .._device import call_starts
from .._modes import training_restored
from .._present import present
from ..classes import class_names
from ..hooks import HookManager
from ..images import choose_preprocess, load_images
from ..inputs import check_model_inputs, expected_channels, model_device
from ..targets import BackwardStrategy, Targets, TargetSpec, check_target
from .scope import active_call, model_lock

METHODS: dict[str, type[Attribution]] = {}


def _result_dtype(t: Tensor) -> Tensor:
    """Results in float32 at least (float16 / bfloat16 models give float32 maps; float64 stays float64)."""
    if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
        return t.float()
    return t


def register(name: str) -> Callable[[type[Attribution]], type[Attribution]]:
    """Class decorator: make a method available by `name` (CLI ``--method``, `get_method`)."""

    def deco(cls: type[Attribution]) -> type[Attribution]:
        METHODS[name] = cls
        cls.key = name
        return cls

    return deco


def _spelling(name: str) -> str:
    """A method name without case, spaces, hyphens or underscores: "Grad-CAM", "grad_cam" and "gradcam" agree."""
    return re.sub(r"[\s_\-]+", "", name.lower().replace("\u00d7", "x"))


def suggest_method(name: str) -> str | None:
    """The registry name `name` most likely means, or None: the one spelled the same but for case, spaces, hyphens
    and underscores (``"Grad-CAM"``, the figures' spelling, -> ``"gradcam"``), a class name (``"GuidedBackprop"``
    -> ``"guided-backprop"``), else the closest such spelling (`difflib`, ratio >= 0.75)."""
    if not isinstance(name, str):
        return None
    spellings: dict[str, str] = {}
    for key in METHODS:
        spellings.setdefault(_spelling(key), key)
    for key, cls in METHODS.items():
        spellings.setdefault(_spelling(cls.__name__), key)
    wanted = _spelling(name)
    if wanted in spellings:
        return spellings[wanted]
    close = difflib.get_close_matches(wanted, list(spellings), n=1, cutoff=0.75)
    return spellings[close[0]] if close else None


def get_method(name: str) -> type[Attribution]:
    """The attribution class registered under `name` (e.g. ``"guided-backprop"``, ``"gradcam"``); an unknown name
    raises ValueError with the name it most likely means (`suggest_method`) and the registry."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        close = suggest_method(name)
        hint = f"did you mean {close!r}? " if close is not None else ""
        raise ValueError(f"unknown method {name!r}; {hint}available: {', '.join(sorted(METHODS))}") from None


class Attribution:
    """Base class of attribution methods: owns the model preparation and restoration.

    Args:
        model: any `nn.Module`; it is left exactly as it was after every call (hooks, ``training`` flags,
            ``requires_grad`` flags, parameter and buffer values, existing ``.grad`` tensors).
        eval_mode: put the model in eval mode during the call (default). With ``False`` the modules keep their
            modes; buffers changed by the forward pass (BatchNorm running statistics) are restored afterwards,
            but samples are no longer independent under batch statistics.
        backward: how K targets per input are batched: ``"loop"`` (K backward passes over the retained graph),
            ``"vmap"`` (vectorized backward passes over chunks of the K seeds) or ``"auto"`` (default: vmap where one
            backward pass is too small to keep the device busy, the loop otherwise, by the elements the pass
            differentiates: measured crossovers in `hookviz.targets.auto_strategy`; falling back to the loop where
            vmap cannot batch an operation).
    """

    key: ClassVar[str] = ""
    display_defaults: ClassVar[dict[str, Any]] = {}
    # several inputs and additional_forward_args: `_run` then gets a tuple of inputs and ``forward_args=``
    multi_input: ClassVar[bool] = False
    # evaluates the model on several rows per input (per-sample extra forward arguments are expanded with them)
    expands_batch: ClassVar[bool] = False
    # how a token's score reduces the embedding axis of an attribution at a token layer (`TokenExplanation`,
    # `explain_generation`): "sum" where the attribution is a signed share of the score that adds up (input x
    # gradient, Integrated Gradients, relevance), "norm" (L2) for a plain gradient, whose signed sum is no attribution
    token_reduction: ClassVar[str] = "sum"

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
    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetSpec = None,
        *,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Tensor | tuple[Tensor, ...]:
        """Raw attribution for a batch `inputs` (N, ...); see the subclass for the result's shape.

        With an (N, K) `target` the result gains a K axis after N. `inputs` are checked before any work (rank and
        channels against the model's first convolution, finite values; `hookviz.inputs.check_model_inputs`) and cast
        to the model's parameter dtype and device: a float64 batch on a float32 model is explained in float32.
        Methods with several inputs (``multi_input``) take a tuple of tensors sharing N, passed to ``forward`` as
        ``model(*inputs, *additional_forward_args)``, and return a tuple of attributions shaped like them;
        `additional_forward_args` (one argument or a tuple) are passed on to ``forward`` but not attributed.
        `forward_kwargs` (every method): keyword arguments of ``forward``, e.g. ``{"attention_mask": mask}`` for a
        Hugging Face model; tensors among them must have first dimension N and follow their rows wherever a method
        expands the batch (noisy copies, path points, masked inputs); anything else is passed as it is.

        Model outputs: class targets read a tensor (N, classes), the ``logits`` attribute or key of an output object
        (Hugging Face's ``ModelOutput``, a dict), or the first element of a tuple output (`hookviz.targets`). Results
        are float32 whatever the model's dtype (float64 stays float64).
        """
        return self.attribute_with_targets(
            inputs, target, additional_forward_args=additional_forward_args, forward_kwargs=forward_kwargs
        )[0]

    def attribute_with_targets(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetSpec = None,
        *,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> tuple[Tensor | tuple[Tensor, ...], Targets]:
        """`attribute`, and the resolved targets: ``.indices`` (N, K) classes (None for a callable target) and
        ``.scores`` (N, K), from the same forward pass (what the data-set runner stores and the metrics reuse)."""
        x, kwargs, single = self._call_args(inputs, additional_forward_args, forward_kwargs)
        attribution, targets = self._explain(x, target, **kwargs)
        return (attribution[0] if single and isinstance(attribution, tuple) else attribution), targets

    def visualize(
        self,
        images: Any,
        target: TargetSpec = None,
        *,
        preprocess: Any = "auto",
        weights: Any = None,
        labels: Sequence[str] | Any | None = None,
        vocab: Sequence[str] | Callable[[int], str] | None = None,
        tokens: bool | None = None,
        additional_forward_args: Any = None,
        forward_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Explain images given as paths, PIL images, numpy arrays or tensors; returns a `hookviz.Explanation`.

        Paths, PIL images, numpy arrays and uint8 tensors (``torchvision.io.read_image``: (C, H, W) or (N, C, H, W),
        scaled by 1/255) go through `preprocess`; float tensors are used as given. ``preprocess="auto"`` (default)
        uses the model's own preprocessing (`hookviz.images.auto_preprocess`: a preset the model carries, the
        transforms of torchvision `weights`, a timm model's data config, a Hugging Face model's config, else
        ImageNet); a preset name, a `Preset` or any callable (e.g. ``weights.transforms()``) always wins. The choice
        is in the Explanation's ``preprocess`` (and its repr). `weights`: a torchvision weights enum member: its
        ``transforms()`` and, unless `labels` is given, its ``meta["categories"]``. `labels`: class names indexed
        by class id, or a weights enum member; default: the names the model supplies (`hookviz.classes.class_names`:
        the zoo's models, a Hugging Face ``config.id2label``). The `Explanation` shows itself in Jupyter.

        Token ids (an integer (N, T) tensor, with a method built with ``layer=``, e.g. the embedding) give a
        `hookviz.text.TokenExplanation` instead, with `vocab` (a list or a callable id -> str) naming the tokens:
        ``tokens=True`` says so explicitly; with None (default) integer tensors other than uint8 are token ids and
        uint8 tensors are images. `forward_kwargs` (e.g. ``{"attention_mask": mask}``) go to ``forward``.

        The result objects live in the presentation layer above the methods; they are reached through
        `hookviz._present` (registered by `hookviz.explanation` and `hookviz.text`), not imported here.
        """
        if tokens is not None and not isinstance(tokens, bool):
            raise TypeError(f"tokens must be None (inferred), True or False, got {type(tokens).__name__}")
        integer = isinstance(images, Tensor) and not (images.is_floating_point() or images.is_complex())
        if tokens is True and not integer:
            got = f"a {images.dtype} tensor" if isinstance(images, Tensor) else type(images).__name__
            raise TypeError(f"tokens=True needs an integer tensor of token ids (N, T), got {got}")
        if tokens or (tokens is None and integer and images.dtype != torch.uint8):
            return present(
                "tokens",
                self,
                images,
                target,
                vocab=vocab,
                labels=labels if labels is not None else class_names(self.model, weights),
                additional_forward_args=additional_forward_args,
                forward_kwargs=forward_kwargs,
            )
        preprocess, chosen = choose_preprocess(self.model, preprocess, weights)
        batch = load_images(
            images,
            preprocess=preprocess,
            device=model_device(self.model),
            channels=expected_channels(self.model) or 3,
        )
        x, kwargs, _ = self._call_args(batch.tensor, additional_forward_args, forward_kwargs)
        with model_lock(self.model):  # the per-call report (coverage) read before another thread's call replaces it
            attribution, targets = self._explain(x, target, **kwargs)
            coverage = getattr(self, "coverage", None)
        # multi-input methods take and give tuples: one image tensor came, one attribution goes
        attribution = attribution[0] if isinstance(attribution, tuple) else attribution
        x = x[0] if isinstance(x, tuple) else x
        return present(
            "images",
            attribution=attribution.detach(),
            images=batch.images,
            inputs=x,
            targets=targets.indices,
            scores=targets.scores.detach(),
            method=self.method_label,
            multi_target=targets.multi,
            labels=labels if labels is not None else class_names(self.model, weights),
            display=dict(self.display_defaults),
            coverage=coverage,
            preprocess=chosen if batch.preprocess is not None else "none (float tensors are used as given)",
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    @property
    def method_label(self) -> str:
        """The method's name on its results (``Explanation.method``, figure titles): the class name, plus what tells
        two configurations of one class apart where that matters to a reader (LRP's composite)."""
        return type(self).__name__

    # -- life cycle ---------------------------------------------------------------------------------------------
    def _explain(self, x: Tensor, target: TargetSpec, **kwargs: Any) -> tuple[Tensor, Targets]:
        spec = check_target(target, (x[0] if isinstance(x, tuple) else x).shape[0])
        with self._prepared() as hooks:
            attribution, targets = self._run(x, spec, hooks, **kwargs)
        if isinstance(attribution, tuple):  # one attribution per input tensor
            attribution = tuple(_result_dtype(a) for a in attribution)
        else:
            attribution = _result_dtype(attribution)
        if not targets.multi:
            if isinstance(attribution, tuple):
                attribution = tuple(a.squeeze(1) for a in attribution)
            else:
                attribution = attribution.squeeze(1)
        return attribution, targets

    def _run(self, x: Tensor, target: Any, hooks: HookManager, **kwargs: Any) -> tuple[Tensor, Targets]:
        """One forward and one batched backward; returns the attribution with a K axis, (N, K, ...)."""
        raise NotImplementedError

    def _check_inputs(self, x: Any, where: str = "inputs", *, conv_check: bool = True) -> Tensor:
        """The batch checked against the model and cast to its device and parameter dtype (`check_model_inputs`)."""
        return check_model_inputs(self.model, x, where, conv_check=conv_check)

    # -- several inputs and extra forward arguments (see methods/forward.py) -------------------------------------
    def _allows_integer_inputs(self) -> bool:
        """Whether integer inputs (token ids) are allowed: only when the method attributes to a layer."""
        return False

    def _call_args(
        self, inputs: Any, additional_forward_args: Any, forward_kwargs: Any = None
    ) -> tuple[Any, dict[str, Any], bool]:
        """Check `inputs` (a tensor or a tuple of tensors), `additional_forward_args` and `forward_kwargs` before any
        work.

        Returns what `_explain` takes (a tuple of tensors for ``multi_input`` methods, else the one tensor), its
        keyword arguments (``forward_args=`` for ``multi_input`` methods and wherever `forward_kwargs` came), and
        whether one tensor came.
        """
        from .forward import check_forward_args

        call_starts()  # earlier calls' checks whose values have come warn before this call's own
        single = not isinstance(inputs, tuple)
        if not self.multi_input and (not single or additional_forward_args is not None):
            what = "a tuple of inputs" if not single else "additional_forward_args"
            raise TypeError(
                f"{type(self).__name__} does not take {what}; it explains one input tensor passed alone to forward"
            )
        if forward_kwargs is not None and not isinstance(forward_kwargs, dict):
            check_forward_args(None, 0, expanding=False, method="", forward_kwargs=forward_kwargs)  # raises
        xs = self._check_input_tuple(inputs)
        fwd = check_forward_args(
            additional_forward_args,
            xs[0].shape[0],
            expanding=self.expands_batch,
            method=type(self).__name__,
            forward_kwargs=forward_kwargs,
        )
        if not self.multi_input:
            return xs[0], ({"forward_args": fwd} if fwd.kwargs else {}), True
        return xs, {"forward_args": fwd}, single

    def _check_input_tuple(self, inputs: Any) -> tuple[Tensor, ...]:
        """`_check_inputs` for a tensor or each tensor of a tuple, which must share the batch size N."""
        single = not isinstance(inputs, tuple)
        items = (inputs,) if single else inputs
        if not items:
            raise ValueError("inputs is an empty tuple; give one tensor (N, ...) or a tuple of tensors sharing N")
        checked = []
        for k, x in enumerate(items):
            where = "inputs" if single else f"inputs[{k}]"
            if isinstance(x, Tensor) and not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
                if not self._allows_integer_inputs():
                    raise TypeError(
                        f"{where} is an integer tensor ({x.dtype}); {type(self).__name__} differentiates its inputs, "
                        "so they must be floating-point (images: x.float() / 255); integer inputs such as token ids "
                        "are explained at a layer: pass layer= (e.g. the embedding module) to Saliency, "
                        "InputXGradient or IntegratedGradients"
                    )
                if x.dim() < 1 or x.shape[0] == 0:
                    raise ValueError(f"{where} needs a non-empty batch axis first, (N, ...); got {tuple(x.shape)}")
                checked.append(x.to(model_device(self.model)))
                continue
            # which tensor of a tuple feeds the first convolution is unknown, so only a single input is checked
            # against it
            checked.append(self._check_inputs(x, where, conv_check=single))
        sizes = [x.shape[0] for x in checked]
        if len(set(sizes)) > 1:
            raise ValueError(
                f"inputs: the tensors of a tuple must share the batch size N (their first dimension); got sizes "
                f"{sizes} for shapes {[tuple(x.shape) for x in checked]}"
            )
        return tuple(checked)

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
        with model_lock(model), training_restored(model) as modes:  # calls on one model run one at a time
            training = any(flag for _, flag in modes)
            # Train-mode forwards update BatchNorm running statistics; keep a copy to put back.
            buffers = [(b, b.detach().clone()) for b in model.buffers()] if not self.eval_mode and training else []
            # Parameters keep their requires_grad: freezing them would take the weight gradients of a training step
            # that another thread runs meanwhile. No weight gradient is computed anyway (the methods differentiate
            # with torch.autograd.grad w.r.t. inputs or layer outputs: the engine prunes the weight branches) and
            # none reaches .grad.
            try:
                if self.eval_mode and training:  # a model already in eval mode everywhere is left as it is
                    model.eval()
                with active_call(), torch.enable_grad(), HookManager(model) as hooks:
                    yield hooks
            finally:
                with torch.no_grad():
                    for b, saved in buffers:
                        b.copy_(saved)
