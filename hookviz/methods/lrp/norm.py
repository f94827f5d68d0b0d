r"""The identity rule on normalisations (AttnLRP, Achtibat et al., 2024, Sec. 3.3.2): LayerNorm / RMSNorm with
1/std held constant is the linear map $$ y = A x + b $$ (`NormMap`, found for a module by `norm_map`); in gradient
form its transpose carries the gradient (`gradient_form`). GroupNorm the same, per group (`GroupNormFn`)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


def _eps_of(module: nn.Module, x: Tensor) -> float:
    for attr in ("variance_epsilon", "eps", "epsilon"):
        v = getattr(module, attr, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return float(torch.finfo(x.dtype).eps)


class NormMap:
    r"""One normalisation as a linear map of its input with the std held constant:
    $$ y = w \odot (x - \mu [\mathrm{centre}]) / \sigma + b $$ over the last ``dims`` dimensions."""

    __slots__ = ("centre", "dims", "weight", "bias", "eps")

    def __init__(self, centre: bool, dims: int, weight: Tensor | None, bias: Tensor | None, eps: float) -> None:
        self.centre, self.dims, self.eps = centre, dims, eps
        self.weight = None if weight is None else weight.detach()
        self.bias = None if bias is None else bias.detach()

    def _axes(self) -> tuple[int, ...]:
        return tuple(range(-self.dims, 0))

    def sigma(self, x: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.centre:  # written out: a third of the time of Tensor.var over the last axis on one CPU thread
            c = xf - xf.mean(self._axes(), keepdim=True)
            var = (c * c).mean(self._axes(), keepdim=True)
        else:
            var = xf.pow(2).mean(self._axes(), keepdim=True)
        return (var + self.eps).sqrt()

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        c = xf - xf.mean(self._axes(), keepdim=True) if self.centre else xf
        y = c / self.sigma(x)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def transpose(self, g: Tensor, sigma: Tensor) -> Tensor:
        """``A^T g``: the gradient of the map (std constant) applied to `g`."""
        return self._transpose_scaled(g / sigma)

    def transpose_rstd(self, g: Tensor, rstd: Tensor) -> Tensor:
        """`transpose` given 1/std (what ``torch.native_layer_norm`` returns) instead of the std."""
        return self._transpose_scaled(g * rstd)

    def _transpose_scaled(self, h: Tensor) -> Tensor:
        if self.weight is not None:
            h = h * self.weight
        if self.centre:
            h = h - h.mean(self._axes(), keepdim=True)
        return h


# the form (index into norm_map's candidates) identified for a normalisation module: checked once, at its first call
_FORMS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def norm_map(name: str, module: nn.Module, x: Tensor, output: Tensor) -> NormMap:
    """The `NormMap` of a normalisation module; for modules found by name (and subclasses of nn.LayerNorm, which
    may normalise other axes, like timm's ``LayerNorm2d``), the form whose output equals the module's is taken.
    A module none of the forms reproduces raises `ValueError` naming it."""
    if type(module) in (nn.LayerNorm, nn.RMSNorm):
        dims = len(module.normalized_shape)
        eps = module.eps if module.eps is not None else float(torch.finfo(x.dtype).eps)
        return NormMap(isinstance(module, nn.LayerNorm), dims, module.weight, getattr(module, "bias", None), eps)
    eps = _eps_of(module, x)
    w = getattr(module, "weight", None)
    b = getattr(module, "bias", None)
    w = w if isinstance(w, Tensor) and w.shape == x.shape[-1:] else None
    b = b if isinstance(b, Tensor) and b.shape == x.shape[-1:] else None
    forms = [lambda: NormMap(True, 1, w, b, eps), lambda: NormMap(False, 1, w, b, eps)]
    if w is not None:
        forms.append(lambda: NormMap(False, 1, 1 + w.detach(), b, eps))  # Gemma's RMSNorm scales by (1 + w)
    known = _FORMS.get(module)
    if known is not None and known < len(forms):  # its form was identified at an earlier call: only that one built
        return forms[known]()
    candidates = [form() for form in forms]
    ref = output.detach().float()
    tol = 1e-3 * float(ref.abs().max()) + 1e-5
    for i, cand in enumerate(candidates):
        y = cand.forward(x.detach()).float()
        if y.shape == ref.shape and bool(((y - ref).abs() <= tol).all()):
            _FORMS[module] = i
            return cand
    raise ValueError(
        f"LRP: {name!r} ({type(module).__name__}) looks like a normalisation layer, but its output is neither a "
        "LayerNorm nor an RMSNorm of its last dimension (with its weight and bias), so the identity rule cannot be "
        "applied; give it a rule in the composite's name_map"
    )


class GroupNormFn(torch.autograd.Function):
    r"""Output: ``F.group_norm``'s output as computed (boxed); backward: the transpose of the map with each group's
    1/std held constant, $$ y = w_c (x - \mu_g) r_g + b_c $$: $$ g_x = h - \mathrm{mean}_g(h) $$ with
    $$ h = g\, w_c\, r_g $$ (the centring is its own transpose). The groups' 1/std, (N, G, 1), is kept: `rstd` as
    ``torch.native_group_norm`` computed it with the output where given, else taken here; half precision is carried
    in float32."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        ybox: tuple[Tensor],
        groups: int,
        weight: Tensor | None,
        eps: float,
        rstd: Tensor | None = None,
    ) -> Tensor:
        if rstd is None:
            xg = x.detach().reshape(x.shape[0], groups, -1)
            xf = xg.float() if xg.dtype in (torch.float16, torch.bfloat16) else xg
            rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + eps)
        ctx.save_for_backward(rstd.reshape(x.shape[0], groups, 1))
        ctx.groups, ctx.weight = groups, None if weight is None else weight.detach()
        return ybox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None, None, None]:
        (rstd,) = ctx.saved_tensors
        h = g.to(rstd.dtype)
        if ctx.weight is not None:
            h = h * ctx.weight.to(rstd.dtype).view(1, -1, *(1,) * (g.dim() - 2))
        hg = h.reshape(g.shape[0], ctx.groups, -1) * rstd
        hg = hg - hg.mean(-1, keepdim=True)
        return hg.reshape(g.shape).to(g.dtype), None, None, None, None, None
