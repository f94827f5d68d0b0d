"""The attention probabilities of every attention call in one forward pass, also where the model uses a fused kernel.

Rollouts need, per attention layer, the probabilities ``A = softmax(q k^T * scale + mask)`` (N, H, T, S), and
gradient rollout needs them in the autograd graph, with the layer's output computed from them. Attention reaches
the model's code in three forms, all seen by a `torch.overrides.TorchFunctionMode` that is active only during the
method's own forward pass (and only for its own call: `hookviz.methods.scope`), with no process-wide patching and
without the user switching attention implementations:

- ``F.scaled_dot_product_attention`` (timm's ``fused_attn=True``, Hugging Face's ``attn_implementation="sdpa"``):
  the call is decomposed as the eager path computes it, from the call's q, k, v, ``attn_mask``, ``is_causal``,
  ``scale`` and ``enable_gqa`` (PyTorch's documented reference implementation): ``A = softmax(q k^T * scale + bias)``
  with ``-inf`` where a boolean mask or the causal mask is False, then ``A @ v``; A is recorded and the output is
  computed from it, so A is in the graph;
- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, torchvision's ViT, which asks
  ``need_weights=False``): the call runs with ``need_weights=True, average_attn_weights=False``, PyTorch's own
  explicit path (``softmax(q k^T / sqrt(d) + mask)``, then a matmul with v), and returns what the caller asked for;
  the recorded node is the softmax output that path multiplies with v (the ``_base`` of the per-head weights it
  returns). The module's fused fast path is never taken while a function mode is active;
- explicit matmul/softmax code (timm ``fused_attn=False``, Hugging Face ``"eager"``): a softmax called inside an
  attention module (`hookviz.methods.cam_layer.is_attention_module`) is the attention's probabilities.

Where nothing upstream of A needs a gradient (frozen weights, an input that is not differentiated), A (or the
query, key and value of ``F.multi_head_attention_forward``) becomes a leaf that does, so the target's gradient at
A exists; nothing upstream is cut, since nothing upstream was in the graph.

An attention module that runs without any of these calls inside it (a custom kernel) raises `AttentionNotVisible`
naming it after the forward pass, and a TorchScript attention module raises it before the forward pass: a rollout
that silently missed a layer would be wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ...hooks import HookManager
from ..cam_layer import is_attention_module, is_attention_name
from ..rules.ops import bind_mha, bind_sdpa
from ..rules.sdpa import sdpa_probabilities
from ..scope import acting, current_call

SOFTMAX_FUNCTIONS: dict[Callable[..., Any], str] = {
    F.softmax: "F.softmax",
    torch.softmax: "torch.softmax",
    Tensor.softmax: "Tensor.softmax",
}


class AttentionNotVisible(RuntimeError):
    """An attention module ran, but no softmax, ``F.scaled_dot_product_attention`` or ``nn.MultiheadAttention`` call
    inside it was visible to the capture (a TorchScript module, a custom kernel)."""


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the attention modules of `model`: ``nn.MultiheadAttention`` and classes whose name says
    attention (`is_attention_module`), TorchScript modules judged by their original class name."""
    return [(n, m) for n, m in model.named_modules() if _is_attention(m)]


def _is_attention(module: nn.Module) -> bool:
    if isinstance(module, torch.jit.ScriptModule):
        return is_attention_name(str(getattr(module, "original_name", "")))
    return is_attention_module(module)


@dataclass
class Captured:
    """One attention call: its probabilities and the graph node to differentiate for the gradient at them.

    ``probs``: (N, H, T, S) as the layer computed them; ``node``: the tensor in the graph (the probabilities
    themselves, or the (N * H, T, S) softmax output of ``nn.MultiheadAttention``'s explicit path); ``heads``: H;
    ``source``: which form was seen (``"sdpa"``, ``"nn.MultiheadAttention"``, ``"softmax"``); ``module``: the
    innermost attention module that ran it.
    """

    probs: Tensor
    node: Tensor
    heads: int
    source: str
    module: str

    def gradient(self, grad: Tensor) -> Tensor:
        """The gradient at `node` with a K axis after its first, (M, K, ...), as (N, K, H, T, S)."""
        n, h, t, s = self.probs.shape
        k = grad.shape[1]
        if grad.shape[0] == n and grad.dim() == 5:
            return grad
        return grad.reshape(n, h, k, t, s).transpose(1, 2)


class _Mode(TorchFunctionMode):
    """Routes the attention calls of the capture's own forward pass to it; everything else runs unchanged."""

    def __init__(self, capture: AttentionCapture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        capture = self.capture
        if not acting(capture.call):
            return func(*args, **kwargs)  # the forward pass of another hookviz call nested inside this one
        if func is F.scaled_dot_product_attention:
            return capture.sdpa(args, kwargs)
        if func is F.multi_head_attention_forward:
            return capture.mha(func, args, kwargs)
        if func in SOFTMAX_FUNCTIONS and capture.stack:
            return capture.softmax(func, args, kwargs)
        return func(*args, **kwargs)


class AttentionCapture:
    """The attention calls of one forward pass, in call order (`captured`), for the call active when it is made.

    `place_hooks` puts forward-pre and forward hooks on the attention modules (through the method's `HookManager`,
    so they go with it); `forward_pass` is the context around the forward pass only: the function mode, undone in
    ``finally``; it raises `AttentionNotVisible` afterwards when an attention module ran without a visible call.
    """

    def __init__(self, model: nn.Module, hooks: HookManager) -> None:
        self.model = model
        self.hooks = hooks
        self.call = current_call()
        self.captured: list[Captured] = []
        self.stack: list[list[Any]] = []  # [name, module, calls seen] of the attention modules now running
        self.unseen: list[tuple[str, nn.Module]] = []
        self.in_forward = False
        self.batch: int | None = None  # N of the forward pass, to split (N * H, T, S) softmax outputs into heads

    def place_hooks(self) -> None:
        modules = attention_modules(self.model)
        if not modules:
            return
        scripted = [n for n, m in modules if isinstance(m, torch.jit.ScriptModule)]
        if scripted:  # hooks cannot be placed on them, and the calls inside them are not Python calls
            raise AttentionNotVisible(
                f"the attention module {scripted[0]!r} (a TorchScript module) runs its attention inside TorchScript, "
                "where hookviz cannot see the softmax or F.scaled_dot_product_attention call, so its attention "
                "probabilities cannot be read; explain the module before scripting it"
            )
        chosen = {id(m) for _, m in modules}

        def selected(name: str, module: nn.Module) -> bool:
            return id(module) in chosen

        def enter(name: str, module: nn.Module, args: tuple) -> None:
            if self.in_forward and acting(self.call):
                self.stack.append([name, module, 0])

        def leave(name: str, module: nn.Module, args: tuple, output: Any) -> None:
            if not (self.in_forward and acting(self.call)):
                return
            for i in range(len(self.stack) - 1, -1, -1):
                if self.stack[i][1] is module:
                    entry = self.stack.pop(i)
                    if entry[2] == 0:
                        self.unseen.append((name, module))
                    break

        self.hooks.forward_pre(selected, enter, with_name=True)
        self.hooks.forward(selected, leave, with_name=True, always_call=True)

    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        self.in_forward = True
        try:
            with _Mode(self):
                yield
        finally:
            self.in_forward = False
            self.stack.clear()
        if self.unseen:
            name, module = self.unseen[0]
            kind = "a TorchScript module" if isinstance(module, torch.jit.ScriptModule) else type(module).__name__
            more = f" (and {len(self.unseen) - 1} more calls)" if len(self.unseen) > 1 else ""
            raise AttentionNotVisible(
                f"the attention module {name!r} ({kind}) ran{more}, but no softmax, F.scaled_dot_product_attention "
                "or nn.MultiheadAttention call inside it was visible to hookviz (a TorchScript module or a custom "
                "kernel computes it), so its attention probabilities cannot be read; run that module as plain "
                "PyTorch code (not scripted), or with F.scaled_dot_product_attention or an explicit softmax"
            )

    # -- the three forms -----------------------------------------------------------------------------------------
    def _record(self, probs: Tensor, node: Tensor, heads: int, source: str) -> None:
        for entry in self.stack:
            entry[2] += 1
        module = self.stack[-1][0] if self.stack else "(no attention module)"
        self.captured.append(Captured(probs, node, heads, source, module))

    def sdpa(self, args: tuple, kwargs: dict) -> Tensor:
        bound = bind_sdpa(args, kwargs)
        probs = sdpa_probabilities(bound)
        if not probs.requires_grad:
            probs = probs.detach().requires_grad_(True)
        value = bound["value"]
        if bound.get("enable_gqa") and value.dim() >= 3:
            value = value.repeat_interleave(probs.size(-3) // value.size(-3), -3)
        p = bound.get("dropout_p", 0.0)
        out = (F.dropout(probs, p, training=True) if p > 0 else probs) @ value
        heads = probs.shape[-3] if probs.dim() == 4 else 1
        self._record(_four_d(probs, heads), probs, heads, "sdpa")
        return out

    def mha(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        a = bind_mha(args, kwargs)
        asked, average = a["need_weights"], a["average_attn_weights"]
        if a["is_causal"] and a["attn_mask"] is None:  # PyTorch's explicit path needs the mask itself
            t, s = a["query"].shape[0], a["key"].shape[0]
            a["attn_mask"] = torch.ones(t, s, dtype=torch.bool, device=a["query"].device).triu(1)
            a["is_causal"] = False
        if not any(isinstance(a[k], Tensor) and a[k].requires_grad for k in ("query", "key", "value")):
            # nothing upstream is in the graph: leaves (one per distinct tensor, so self-attention stays q is k is v)
            leaves: dict[int, Tensor] = {}
            for k in ("query", "key", "value"):
                t = a[k]
                a[k] = leaves.setdefault(id(t), t.detach().requires_grad_(True))
        a["need_weights"], a["average_attn_weights"] = True, False
        out, weights = func(**a)
        node = weights._base
        if node is None or not node.requires_grad:
            raise AttentionNotVisible(
                "nn.MultiheadAttention's explicit path did not return its weights as a view of the softmax output it "
                f"multiplies with v (PyTorch {torch.__version__}); the attention probabilities cannot be read"
            )
        heads = a["num_heads"]
        probs = weights if weights.dim() == 4 else weights.unsqueeze(0)  # an unbatched call
        self._record(probs, node, heads, "nn.MultiheadAttention")
        if not asked:
            return out, None
        return out, (weights.mean(dim=-3) if average else weights)

    def softmax(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Tensor:
        probs = func(*args, **kwargs)
        if not isinstance(probs, Tensor) or probs.dim() not in (3, 4) or not probs.is_floating_point():
            return probs
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dim not in (-1, probs.dim() - 1):
            return probs  # not a distribution over keys
        if not probs.requires_grad:
            probs = probs.detach().requires_grad_(True)
        n = self.batch
        if probs.dim() == 4:
            heads = probs.shape[1]
        elif n is not None and probs.shape[0] % n == 0:
            heads = probs.shape[0] // n  # (N * H, T, S), batch-major as nn.MultiheadAttention lays them out
        else:
            heads = 1
        self._record(_four_d(probs, heads), probs, heads, "softmax")
        return probs


def _four_d(probs: Tensor, heads: int) -> Tensor:
    """(N, H, T, S) from probabilities laid out (N, H, T, S), (N * H, T, S) or (N, T, S)."""
    if probs.dim() == 4:
        return probs
    return probs.reshape(-1, heads, *probs.shape[-2:])
