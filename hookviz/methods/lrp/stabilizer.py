r"""The stabilizer as a factor on the gradient, and the audit's sums of one rule call (gradient-times-input form).

LRP in gradient-times-input form carries $$ g = R / a $$ (relevance over activation) backward, so that the relevance
at a tensor a is $$ a \odot g $$ (Achtibat et al., 2024, "AttnLRP", Sec. 3.4; `lxt`'s efficient mode). A rule of the
form $$ R_x = x \odot M^\top (R_z / \mathrm{stab}(z)) $$ with z = M x + b (LRP-epsilon on a linear layer, the sum
rule on a sum of branches or an average pooling, the identity rule on a normalisation with its std held) is then
$$ g_x = M^\top (g_z \odot z / \mathrm{stab}(z)) $$: the operation's own gradient, with the output's gradient
multiplied by $$ z / \mathrm{stab}(z) $$ (`Stabilized`), where ``stab(z) = z + eps * sign(z)``, sign(0) = +1 (zennit's
stabilizer). With eps 0 the factor is 1 and no Function is placed (the plain gradient; `factor` is None).

The audit's sums come from the same backward pass, on the device: the relevance that entered the call,
$$ \sum z \odot g $$, and the relevance that left it, $$ \sum x \odot g_x = \sum (M x) \odot g' = \sum (z - b) \odot g'
$$ (the offset b: a bias, a constant added; a product's shares scale it), per input, without reading a value
(`AuditEntry.add` writes them into the pass's one buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .audit import AuditEntry
from .rules import rounded


def factor(z: Tensor, epsilon: float) -> Tensor:
    r"""$$ z / \mathrm{stab}(z) = |z| / (|z| + \epsilon) $$ (stab(z) = z + eps sign(z) has z's sign, sign(0) = +1, and
    negating both is exact: the same quotient bit for bit, a zero's sign aside), a fresh tensor: three elementwise
    kernels, where z over stab(z) takes four. `epsilon` > 0."""
    a = z.abs()
    d = a + rounded(epsilon, torch.get_default_dtype())
    return a.div_(d)


def per_input(a: Tensor, b: Tensor, n: int) -> Tensor:
    """``sum(a * b)`` per input, (n,): over every axis but the first where the first is the batch's (n); else the
    total, spread evenly (a factor without the batch axis first). `b` broadcasts to `a`."""
    if a.dim() > 0 and a.shape[0] == n:
        if a.shape == b.shape:
            return torch.linalg.vecdot(a.reshape(n, -1), b.reshape(n, -1))
        return (a * b).reshape(n, -1).sum(1)
    return (a * b).sum().expand(n) / n


def per_input_sum(t: Tensor, n: int) -> Tensor:
    """``sum(t)`` per input, (n,) (`per_input` without a second factor)."""
    if t.dim() > 0 and t.shape[0] == n:
        return t.reshape(n, -1).sum(1)
    return t.sum().expand(n) / n


class Site:
    """One application of a rule in the forward pass, kept for its backward pass: the audit entry, the output z (an
    alias: an in-place change downstream, ``out += identity``, is noticed by its version and z computed again by
    `again`), the stabilizer, and what the audit's "left" subtracts (`offset`, the output's part that is not a
    function of the input: a bias, b' of a folded BatchNorm; None: none) and multiplies (`share`: the product rules'
    factor shares, 1 elsewhere). `scale`: a per-channel factor for the gradient passed on (a BatchNorm folded into
    the layer before it: its input gets s g', the BatchNorm's own gradient). `finite`: z may hold infinities (a sum
    with an attention mask of -inf), where the relevance is 0: they are read as 0 (the factor 0, the audit's terms
    0), as the relevance form's rules gave masked logits none."""

    __slots__ = ("entry", "epsilon", "z", "version", "again", "offset", "share", "scale", "n", "finite")

    def __init__(
        self,
        entry: AuditEntry | None,
        epsilon: float,
        z: Tensor,
        again: Callable[[], Tensor] | None,
        n: int,
        offset: Tensor | None = None,
        share: float = 1.0,
        scale: Tensor | None = None,
        finite: bool = False,
    ) -> None:
        self.entry = entry
        self.finite = finite
        self.epsilon = epsilon
        self.z = z.detach()
        self.version = z._version
        self.again = again
        self.offset = offset
        self.share = share
        self.scale = scale
        self.n = n

    def output(self) -> Tensor:
        """z as the forward pass computed it: computed again where the model changed it in place afterwards."""
        if self.z._version == self.version:
            return self.z
        if self.again is None:
            name = self.entry.name if self.entry is not None else "an operation"
            raise RuntimeError(
                f"LRP: the output of {name!r} was modified in place after its rule read it, so the rule cannot be "
                "evaluated; make the in-place operation that follows it out of place"
            )
        with torch.no_grad():
            return self.again()

    def audit(self, z: Tensor, g: Tensor, gp: Tensor) -> None:
        """The sums of this call: entered ``sum z g``, left ``share * sum (z - offset) g'`` (`gp` = g')."""
        if self.entry is None:
            return
        offset = self.offset
        if self.finite and offset is not None:
            offset = torch.nan_to_num(offset, nan=0.0, posinf=0.0, neginf=0.0)
        left_of = z if offset is None else z - offset
        if self.share == 1.0 and self.entry.add_dots(z, g, left_of, gp, self.n):
            return
        left = per_input(left_of, gp, self.n)
        self.entry.add(per_input(z, g, self.n), left if self.share == 1.0 else left * self.share)


class Stabilized(torch.autograd.Function):
    """Output: z, the operation's output as computed (boxed, ``(z,)``, handed on without a copy; `graph`, the same
    values with the operation's own graph, links it); backward: ``g z / stab(z)`` to `graph` (times the site's
    `scale`), and the audit's sums."""

    @staticmethod
    def forward(ctx: Any, graph: Tensor, zbox: tuple[Tensor], site: Site) -> Tensor:
        ctx.site = site
        return zbox[0]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        site: Site = ctx.site
        z = site.output()
        if site.finite:
            z = torch.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0)
        gp = g if site.epsilon == 0 else g * factor(z.to(g.dtype), site.epsilon)
        site.audit(z, g, gp)
        return (gp if site.scale is None else gp * site.scale), None, None


def stabilized(graph: Tensor, site: Site) -> Tensor:
    """`graph` (an operation's output with its own graph) whose gradient is multiplied by z / stab(z) (`Stabilized`);
    the returned tensor holds the same values, handed on without a copy."""
    return Stabilized.apply(graph, (graph.detach(),), site)  # an alias of its own: the site's would be a cycle
