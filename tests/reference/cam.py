"""Slow textbook references for the CAM family, in float64: A and dy/dA by autograd through a forward hook on a
float64 copy of the model, then each paper's formula applied literally, with loops over samples, channels and
positions. Only for tests: nothing here is fast, and nothing is shared with `hookviz.methods.cam`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .relu_rules import double_copy, guided_backprop

Fold = Callable[[Tensor], Tensor]


def acts_and_grads(
    model: nn.Module, layer: str, x: Tensor, target: Tensor, fold: Fold | None = None
) -> tuple[Tensor, Tensor]:
    """A = the layer's output and G = d y_target / dA, float64, (N, C, h, w) each (after `fold` for token layers).

    `target`: (N,) class indices, one per input.
    """
    m = double_copy(model)
    store: dict[str, Tensor] = {}

    def keep(module: nn.Module, args: object, out: Tensor) -> None:
        store["a"] = out

    handle = dict(m.named_modules())[layer].register_forward_hook(keep)
    try:
        xd = x.double().requires_grad_(True)  # so the layer output is in the graph
        y = m(xd)
    finally:
        handle.remove()
    score = y[torch.arange(x.shape[0]), target].sum()
    (g,) = torch.autograd.grad(score, store["a"])
    a = store["a"].detach()
    if fold is not None:
        a, g = fold(a), fold(g)
    return a, g


def fold_vit_tokens(t: Tensor, side: int) -> Tensor:
    """(N, 1 + side^2, D) with a class token first -> (N, D, side, side), written out differently from hookviz."""
    n, _, d = t.shape
    patches = t[:, 1:, :]
    out = torch.zeros(n, d, side, side, dtype=t.dtype)
    for i in range(side):
        for j in range(side):
            out[:, :, i, j] = patches[:, i * side + j, :]
    return out


def _cam(acts: Tensor, weight_of: Callable[[int, int], Tensor | float]) -> Tensor:
    """ReLU(sum_k w_k A_k) with w_k = weight_of(n, k) (a number or an (h, w) map), (N, 1, h, w)."""
    n_, c_ = acts.shape[:2]
    cam = torch.zeros(n_, 1, *acts.shape[2:], dtype=torch.float64)
    for n in range(n_):
        for k in range(c_):
            cam[n, 0] += weight_of(n, k) * acts[n, k]
    return cam.clamp(min=0)


def gradcam(a: Tensor, g: Tensor) -> Tensor:
    h, w = a.shape[-2:]
    return _cam(a, lambda n, k: sum(g[n, k, i, j] for i in range(h) for j in range(w)) / (h * w))


def gradcam_pp(a: Tensor, g: Tensor) -> Tensor:
    """Chattopadhay et al. (2018), Eq. 19 with the exponential score: alpha = g^2 / (2 g^2 + sum_ab A_ab g^3)."""
    h, w = a.shape[-2:]

    def weight(n: int, k: int) -> float:
        total = 0.0
        s = a[n, k].sum().item()
        for i in range(h):
            for j in range(w):
                gij = g[n, k, i, j].item()
                num = gij**2
                den = 2 * gij**2 + s * gij**3
                alpha = num / den if gij != 0 and den != 0 else 0.0
                total += alpha * max(gij, 0.0)
        return total

    return _cam(a, weight)


def layercam(a: Tensor, g: Tensor) -> Tensor:
    return _cam(a, lambda n, k: g[n, k].clamp(min=0))


def xgradcam(a: Tensor, g: Tensor, eps: float = 1e-7) -> Tensor:
    h, w = a.shape[-2:]

    def weight(n: int, k: int) -> float:
        s = a[n, k].sum().item()
        return sum(a[n, k, i, j].item() / (s + eps) * g[n, k, i, j].item() for i in range(h) for j in range(w))

    return _cam(a, weight)


def hirescam(a: Tensor, g: Tensor) -> Tensor:
    return _cam(a, lambda n, k: g[n, k])


def scorecam(
    model: nn.Module,
    layer: str,
    x: Tensor,
    target: Tensor | Callable[[Tensor], Tensor],
    fold: Fold | None = None,
) -> Tensor:
    """Wang et al. (2020): one masked forward per input and channel; softmax probability of the target class
    (a callable target: its score, no softmax). A constant channel masks with zeros."""
    m = double_copy(model)
    n_ = x.shape[0]
    idx = target if isinstance(target, Tensor) else torch.zeros(n_, dtype=torch.long)
    a, _ = acts_and_grads(model, layer, x, idx, fold)
    xd = x.double()
    weights = torch.zeros(n_, a.shape[1], dtype=torch.float64)
    with torch.no_grad():
        for n in range(n_):
            for k in range(a.shape[1]):
                up = F.interpolate(a[n, k][None, None], size=x.shape[-2:], mode="bilinear", align_corners=False)
                lo, hi = up.min(), up.max()
                mask = torch.zeros_like(up) if hi == lo else (up - lo) / (hi - lo)
                out = m(xd[n : n + 1] * mask)
                if isinstance(target, Tensor):
                    weights[n, k] = torch.softmax(out, dim=1)[0, target[n]]
                else:
                    weights[n, k] = target(out)[0]
    return _cam(a, lambda n, k: weights[n, k].item())


def guided_gradcam(model: nn.Module, layer: str, x: Tensor, target: Tensor) -> Tensor:
    """Selvaraju et al. (2017): guided backprop times the Grad-CAM map, upsampled bilinearly to the input size."""
    a, g = acts_and_grads(model, layer, x, target)
    cam = F.interpolate(gradcam(a, g), size=x.shape[-2:], mode="bilinear", align_corners=False)
    return guided_backprop(model, x, target).to(cam.dtype) * cam
