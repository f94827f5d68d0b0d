"""The relevance form's identity rule on normalisations (`NormIdentity`): relevance goes through the linear map
`hookviz.methods.lrp.norm.NormMap` (1/std held constant) by LRP-epsilon."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from hookviz.methods.lrp.norm import NormMap
from hookviz.methods.lrp.rules import stabilized_ratio

from .rulecall import Recompute, RuleCall, _audit


class _NormIdentityFn(torch.autograd.Function):
    """Output: the normalisation's output (boxed, ``(y,)``); backward: `NormIdentity`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, call: RuleCall, ybox: tuple[Tensor]) -> Tensor:
        ctx.call = call
        return ybox[0]  # boxed: not an input (handed on without a copy); the call computes it again where needed

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, r: Tensor) -> tuple[Tensor, None, None]:
        call = ctx.call
        nm: NormMap = call.extra
        (x,) = call.inputs()
        y = call.output(lambda: nm.forward(x))
        if isinstance(call.z, Recompute):
            call.z.release()  # every reader of y ran its backward before this one
        s = stabilized_ratio(r, y, call.rule.epsilon)
        r_in = (x * nm.transpose(s, nm.sigma(x))).to(x.dtype)
        _audit(call, r, r_in)
        return r_in, None, None
