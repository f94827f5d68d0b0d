"""Recorders: module outputs (`ActivationRecorder`) and the gradients w.r.t. them (`GradientRecorder`), keyed by name.

Both are built on one `HookManager` each: a forward hook on every selected module stores its output, or places a tensor
hook on it that stores the gradient when the backward pass reaches it. Tensor hooks on the forward outputs (not full
backward hooks) are chosen on purpose: they see the gradient w.r.t. the module's output even when a later in-place
operation modifies that output (``nn.ReLU(inplace=True)``, ``out += identity`` in a ResNet block), where full backward
hooks make PyTorch raise (pytorch#61519).

**Keys.** Results are dicts keyed by the module's dotted name (``"layer1.0.conv1"``). A module that runs more than
once in one forward of the model (torchvision's ResNet blocks call ``self.relu`` twice) gets one key per call: the
first call is ``"layer1.0.relu"`` (no suffix), the second ``"layer1.0.relu#1"``, the third ``"layer1.0.relu#2"``: the
``i``-th call (counting from 0) is ``call_key(name, i)``. The count restarts at every call of the model itself, so the
keys are the same for every batch. A module called on its own, outside the model's forward, keeps counting.

Example::

    with ActivationRecorder(model, nn.ReLU, store="cpu", reduce=lambda t: t.mean((2, 3))) as rec:
        model(x)
    rec["layer1.0.relu#1"]             # (N, C) channel means of the second call of that ReLU

    grads = GradientRecorder(model, "layer4")
    grads.record(loader, loss=lambda out, batch: F.cross_entropy(out, batch[1]), max_batches=10)
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ._calls import CallCounter
from ._checks import bool_option, int_option
from ._progress import progress_bar
from .hooks import HookManager, Selector, select_modules
from .inputs import model_device
from .layouts import LayoutSpec, resolve_layout

__all__ = ["ActivationRecorder", "GradientRecorder", "call_key"]

Store = Literal["device", "cpu"]
Reduce = Callable[[Tensor], Tensor]
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def call_key(name: str, index: int) -> str:
    """The result key of the ``index``-th call (from 0) of module ``name`` in one forward: ``name``, ``name#1``, ..."""
    return name if index == 0 else f"{name}#{index}"


def first_tensor(output: Any) -> Tensor | None:
    """The tensor a module returned: the output itself, or the first element of a tuple/list (``nn.LSTM``,
    ``nn.MultiheadAttention``, most transformer blocks); None for anything else."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def _to_device(obj: Any, device: torch.device, requires_grad: bool = False) -> Any:
    if isinstance(obj, Tensor):
        t = obj.to(device, non_blocking=True)
        if requires_grad and t.is_floating_point():
            t = t.detach().requires_grad_()
        return t
    if isinstance(obj, tuple | list):
        return type(obj)(_to_device(o, device, requires_grad) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device, requires_grad) for k, v in obj.items()}
    return obj


def _default_forward(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, Tensor):
        return model(batch)
    if isinstance(batch, tuple | list) and batch:
        return model(batch[0])
    if isinstance(batch, dict):
        return model(**batch)
    raise TypeError(
        f"cannot feed a batch of type {type(batch).__name__} to the model: batches must be a tensor, a tuple/list "
        "whose first element is the input, or a dict of keyword arguments; pass forward=lambda model, batch: ... "
        "for anything else"
    )


class _Recorder:
    """Shared life cycle of the recorders: validate, place hooks through one HookManager, store, remove."""

    _what = "outputs"

    def __init__(
        self,
        model: nn.Module,
        select: Selector,
        *,
        store: Store = "device",
        dtype: torch.dtype | None = None,
        reduce: Reduce | None = None,
        accumulate: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if store not in ("device", "cpu"):
            raise ValueError(f"store must be 'device' (keep on the model's device) or 'cpu', got {store!r}")
        if dtype is not None and dtype not in _FLOAT_DTYPES:
            raise ValueError(
                f"dtype must be None (keep the tensor's dtype) or a floating dtype such as torch.float16 or "
                f"torch.bfloat16, got {dtype!r}"
            )
        if reduce is not None and not callable(reduce):
            raise TypeError(f"reduce must be a callable tensor -> tensor (or None), got {type(reduce).__name__}")
        bool_option("accumulate", accumulate, "True or False")
        self.model = model
        self.store = store
        self.dtype = dtype
        self.reduce = reduce
        self.accumulate = accumulate
        # resolved once, up front: an unknown name fails here, before any hook exists
        self.names: list[str] = [n for n, _ in select_modules(model, select)]
        self._selected = frozenset(self.names)
        self._hooks: HookManager | None = None
        self._calls = CallCounter()
        self._history: dict[str, list[Tensor]] = {}
        self._sync_devices: set[torch.device] = set()

    # -- life cycle ---------------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """True while the hooks are in place (between `start` and `stop`)."""
        return self._hooks is not None

    def start(self) -> _Recorder:
        """Place the hooks. Returns self, so ``rec = ActivationRecorder(model, sel).start()`` works."""
        if self._hooks is not None:
            raise RuntimeError(f"{type(self).__name__} is already recording; call stop() before start()")
        hooks = HookManager(self.model)
        try:
            hooks.forward_pre(self.model, self._on_model_forward)
            hooks.forward(lambda n, m: n in self._selected, self._on_forward, with_name=True)
        except BaseException:
            hooks.remove()
            raise
        self._calls.reset()
        self._hooks = hooks
        return self

    def stop(self) -> None:
        """Remove every hook this recorder placed (idempotent); the results stay."""
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.remove()

    def __enter__(self) -> _Recorder:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.stop()
        return False

    def clear(self) -> None:
        """Forget every recorded tensor."""
        self._history.clear()

    # -- results ------------------------------------------------------------------------------------------------
    @property
    def history(self) -> dict[str, list[Tensor]]:
        """Every stored tensor per key, in arrival order (one per forward or backward pass)."""
        self._sync()
        return {k: list(v) for k, v in self._history.items()}

    @property
    def results(self) -> dict[str, Tensor]:
        """The latest stored tensor per key."""
        self._sync()
        return {k: v[-1] for k, v in self._history.items()}

    def stack(self, dim: int = 0) -> dict[str, Tensor]:
        """Per key, `torch.stack` of all stored tensors (a new axis: one entry per pass; shapes must agree)."""
        self._sync()
        out = {}
        for k, v in self._history.items():
            shapes = {tuple(t.shape) for t in v}
            if len(shapes) > 1:
                raise ValueError(
                    f"cannot stack the tensors of {k!r}: their shapes differ ({sorted(shapes)}), e.g. a smaller last "
                    "batch; use cat() to join along the batch axis, or a DataLoader with drop_last=True"
                )
            out[k] = torch.stack(v, dim)
        return out

    def cat(self, dim: int = 0) -> dict[str, Tensor]:
        """Per key, `torch.cat` of all stored tensors along `dim` (the batch axis); 0-d values are stacked."""
        self._sync()
        return {k: torch.stack(v) if v[0].dim() == 0 else torch.cat(v, dim) for k, v in self._history.items()}

    def keys(self) -> list[str]:
        return list(self._history)

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._history:
            raise KeyError(f"no {self._what} recorded under {key!r}; recorded keys: {', '.join(self._history) or '-'}")
        self._sync()
        return self._history[key][-1]

    def __contains__(self, key: object) -> bool:
        return key in self._history

    def spatial(self, key: str, *, layout: LayoutSpec = None, input_size: tuple[int, int] | None = None) -> Tensor:
        """The latest tensor recorded under `key` as (N, C, h, w) maps, read in its layout (`hookviz.layouts`):
        NCHW as it is, channels-last (N, h, w, C) permuted, (N, T, D) tokens folded after their prefix tokens.

        `layout` ("nchw", "nhwc", "tokens" or a callable) overrides the inference; `input_size` (H, W) of the
        model's input tells channels-last maps and non-square token grids apart (square inputs are assumed
        without it). Raises `ValueError` naming the key, its shape and ``layout=`` where no layout fits.
        """
        t = self[key]
        module = dict(self.model.named_modules()).get(key.split("#")[0])
        return resolve_layout(key, t, layout=layout, input_size=input_size, module=module, model=self.model)(t)

    def __len__(self) -> int:
        return len(self._history)

    def __repr__(self) -> str:
        state = "recording" if self.active else "stopped"
        return (
            f"{type(self).__name__}({type(self.model).__name__}, {len(self.names)} modules, {state}, keys={len(self)})"
        )

    # -- over a data set ----------------------------------------------------------------------------------------
    def _iterate(self, loader: Iterable[Any], max_batches: int | None, progress: bool) -> Iterable[Any]:
        int_option("max_batches", max_batches, "a positive int or None", optional=True)
        batches: Iterable[Any] = loader if max_batches is None else itertools.islice(loader, max_batches)
        if not progress:
            return batches
        total = None
        if hasattr(loader, "__len__"):
            total = len(loader)  # type: ignore[arg-type]
            if max_batches is not None:
                total = min(total, max_batches)
        return progress_bar(batches, total=total, desc=f"{type(self).__name__}", unit="batch")

    def _run(self, batches: Iterable[Any], step: Callable[[Any], None]) -> dict[str, Tensor]:
        started = not self.active
        if started:
            self.start()
        saved, self.accumulate = self.accumulate, True
        try:
            for batch in batches:
                step(batch)
        finally:
            self.accumulate = saved
            if started:
                self.stop()
        return self.cat()

    # -- hooks --------------------------------------------------------------------------------------------------
    def _on_model_forward(self, module: nn.Module, args: Any) -> None:
        self._calls.reset()

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        raise NotImplementedError

    def _store(self, key: str, tensor: Tensor) -> None:
        with torch.no_grad():
            value = tensor.detach()
            if self.reduce is not None:
                value = self.reduce(value)
                if not isinstance(value, Tensor):
                    raise TypeError(f"reduce must return a tensor; for {key!r} it returned {type(value).__name__}")
            to_cpu = self.store == "cpu"
            non_blocking = to_cpu and value.device.type != "cpu"
            if non_blocking:
                self._sync_devices.add(value.device)
            # copy=True: the module's output may be modified in place later (in-place ReLU, `out += identity`)
            value = value.to(
                device="cpu" if to_cpu else value.device,
                dtype=self.dtype or value.dtype,
                non_blocking=non_blocking,
                copy=True,
            )
        if self.accumulate:
            self._history.setdefault(key, []).append(value)
        else:
            self._history[key] = [value]

    def _sync(self) -> None:
        # non-blocking device -> cpu copies are complete only once the device has caught up
        for device in self._sync_devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            else:
                getattr(torch, device.type).synchronize()  # e.g. torch.mps / torch.xpu
        self._sync_devices.clear()


class ActivationRecorder(_Recorder):
    """Records the outputs of the selected modules, keyed by module name (and call index, see the module docs).

    Args:
        model: the model; it is not changed, except for hooks that live only while the recorder records.
        select: which modules (any `select_modules` selector: name, glob, type, tuple of types, instance, predicate).
        store: ``"device"`` keeps the tensors where they are; ``"cpu"`` copies them to the CPU (non-blocking from a
            GPU; reading the results synchronizes once).
        dtype: cast the stored tensors (e.g. ``torch.float16`` or ``torch.bfloat16``) after `reduce`.
        reduce: a function applied to each output as it arrives, before storing, so that recording over a whole data
            set fits in memory, e.g. channel means ``lambda t: t.mean((2, 3))`` -> (N, C). Keep the batch axis first
            so that `cat` gives one row per sample; use `stack` for per-batch summaries.
        accumulate: keep every pass (True, the default) or only the latest one per key.

    Use it as a context manager, or call `start` and `stop`. Modules that return a tuple or list are recorded by
    their first element. Results: `results` (latest per key), `history` (every pass per key), `stack`, `cat`,
    ``rec[key]``.
    """

    _what = "output"

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        key = self._calls.key(name)
        tensor = first_tensor(output)
        if tensor is not None:
            self._store(key, tensor)

    def record(
        self,
        loader: Iterable[Any],
        *,
        max_batches: int | None = None,
        progress: bool = True,
        device: torch.device | str | None = None,
        forward: Callable[[nn.Module, Any], Any] | None = None,
    ) -> dict[str, Tensor]:
        """Run the model over `loader` under `torch.no_grad()` and return `cat()` of everything recorded.

        Each batch is moved to `device` (default: the model's) and fed as ``model(batch)`` (a tensor),
        ``model(batch[0])`` (a tuple/list, e.g. ``(images, labels)``) or ``model(**batch)`` (a dict), or as
        ``forward(model, batch)`` when given. Stops after `max_batches`; shows a tqdm progress bar when `progress`.
        Every batch is kept (whatever `accumulate` says), appended to what was recorded before.
        The model's ``training`` flag is left as it is: call ``model.eval()`` first for inference statistics.
        """
        dev = torch.device(device) if device is not None else model_device(self.model)
        run = forward or _default_forward
        batches = self._iterate(loader, max_batches, progress)

        def step(batch: Any) -> None:
            with torch.no_grad():
                run(self.model, _to_device(batch, dev))

        return self._run(batches, step)


class GradientRecorder(_Recorder):
    """Records the gradients w.r.t. the outputs of the selected modules, keyed like `ActivationRecorder`.

    A forward hook places a tensor hook on each selected module's output (when it requires grad); the tensor hook
    stores the gradient when the backward pass reaches it, with the same options as `ActivationRecorder` (`store`,
    `dtype`, `reduce`, `accumulate`). A gradient is keyed by the call that produced the output, so the two calls of a
    reused module get two keys even though their gradients arrive in reverse order. Nothing is recorded for outputs
    that do not require grad (under ``torch.no_grad()``, or when neither the input nor any parameter before the
    module requires grad).

    Tensor hooks belong to the tensors of one forward pass; they are released when the recorder stops, and at the
    start of each forward once every one placed so far has fired.
    """

    _what = "gradient"

    def __init__(self, model: nn.Module, select: Selector, **kwargs: Any) -> None:
        super().__init__(model, select, **kwargs)
        self._tensor_hooks: HookManager | None = None
        self._unfired: set[int] = set()  # tokens of the tensor hooks that have not fired yet
        self._tokens = itertools.count()

    def start(self) -> GradientRecorder:
        super().start()
        self._tensor_hooks = HookManager(self.model)
        self._unfired.clear()
        return self

    def stop(self) -> None:
        try:
            if self._tensor_hooks is not None:
                self._tensor_hooks.remove()
        finally:
            self._tensor_hooks = None
            self._unfired.clear()
            super().stop()

    def _on_model_forward(self, module: nn.Module, args: Any) -> None:
        super()._on_model_forward(module, args)
        if self._tensor_hooks is not None and not self._unfired:
            self._tensor_hooks.remove()  # every hook placed so far has fired: release their handles

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        key = self._calls.key(name)  # counted even when nothing is hooked, so keys match ActivationRecorder's
        tensor = first_tensor(output)
        if tensor is None or not tensor.requires_grad or self._tensor_hooks is None:
            return
        token = next(self._tokens)
        self._unfired.add(token)
        self._tensor_hooks.tensor(tensor, partial(self._on_grad, key, token))

    def _on_grad(self, key: str, token: int, grad: Tensor) -> None:
        self._unfired.discard(token)
        self._store(key, grad)

    def record(
        self,
        loader: Iterable[Any],
        *,
        loss: Callable[[Any, Any], Tensor] | None = None,
        max_batches: int | None = None,
        progress: bool = True,
        device: torch.device | str | None = None,
        forward: Callable[[nn.Module, Any], Any] | None = None,
    ) -> dict[str, Tensor]:
        """Run forward and backward over `loader` and return `cat()` of every recorded gradient.

        ``loss(output, batch)`` must return a scalar tensor (e.g. ``lambda out, b: F.cross_entropy(out, b[1])``).
        The backward pass is ``torch.autograd.grad`` w.r.t. the hooked outputs, so the parameters' ``.grad`` stay
        untouched; floating-point inputs are made to require grad so that even a model with frozen parameters has
        gradients to record. Batches are fed as in `ActivationRecorder.record`.
        """
        if loss is None or not callable(loss):
            raise ValueError(
                "GradientRecorder.record needs loss=callable(output, batch) -> scalar tensor, e.g. "
                "loss=lambda out, batch: F.cross_entropy(out, batch[1])"
            )
        dev = torch.device(device) if device is not None else model_device(self.model)
        run = forward or _default_forward
        batches = self._iterate(loader, max_batches, progress)

        def step(batch: Any) -> None:
            hooked: list[Tensor] = []

            def keep(module: nn.Module, args: Any, output: Any) -> None:
                tensor = first_tensor(output)
                if tensor is not None and tensor.requires_grad:
                    hooked.append(tensor)

            with HookManager(self.model) as collect:
                collect.forward(lambda n, m: n in self._selected, keep)
                with torch.enable_grad():
                    batch = _to_device(batch, dev, requires_grad=True)
                    value = loss(run(self.model, batch), batch)
            if not isinstance(value, Tensor) or value.numel() != 1:
                raise ValueError(f"loss must return a scalar tensor, got {_describe_value(value)}")
            # differentiate down to the inputs too: a hooked output modified in place later (in-place ReLU) keeps
            # its hook on the node that produced it, which runs only when the backward goes past it
            inputs = [t for t in _tensors(batch) if t.requires_grad]
            if hooked:
                torch.autograd.grad(value, inputs + hooked, allow_unused=True)
            else:
                warnings.warn(
                    "no selected module produced an output that requires grad; nothing to record for this batch",
                    stacklevel=3,
                )

        return self._run(batches, step)


def _tensors(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, tuple | list):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _describe_value(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__}"
