"""What a GradientFlow watches, and how: the watched modules and parameters (each parameter attributed to the deepest
watched module that contains it) and, for each module, whether its output and the gradient w.r.t. it get a hook at
every recorded step, are looked through by the NaN localisation, or are seen through their parameters' gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from ..hooks import Selector, select_modules
from .layout import _base

#: Modules whose output norm is reported as the activation norm, and whose dead units are counted when they are ReLUs.
ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.RReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Softsign,
)
#: Parameter-free modules whose backward cannot turn a finite gradient into a non-finite one (given a finite forward):
#: the NaN localisation looks through them, so the gradients w.r.t. their outputs need no hook at every step.
TRANSPARENT: tuple[type[nn.Module], ...] = (
    *ACTIVATIONS,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.Flatten,
    nn.Unflatten,
    nn.Identity,
)
# outputs exactly 0 on a negative input: a unit that is 0 for the whole batch is dead
_RELU_LIKE: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)


def _default_select(name: str, module: nn.Module) -> bool:
    """Leaf modules, and modules that own parameters directly."""
    return next(module.children(), None) is None or next(module.parameters(recurse=False), None) is not None


def _owner(pname: str, watched: frozenset[str]) -> str | None:
    """The deepest watched module whose subtree holds parameter `pname`."""
    parts = pname.split(".")[:-1]
    for cut in range(len(parts), -1, -1):
        name = ".".join(parts[:cut])
        if name in watched:
            return name
    return None


@dataclass(frozen=True)
class _Watched:
    """The watched modules and parameters, resolved once, up front (a bad selector fails before any hook exists).

    `probes`: modules whose output is observed (a forward hook) at every recorded step; `grad_probes`: those whose
    output gradient is observed too (a tensor hook); `transparent`: modules the NaN localisation looks through;
    `deferrable`: activations whose output statistics may wait for the compiled kernel at the end of the step.
    """

    module_names: list[str]
    types: dict[str, str]
    relu_like: frozenset[str]
    param_names: list[str]
    params: list[nn.Parameter]
    param_module: list[str]
    params_of: dict[str, list[int]]
    watched: frozenset[str]
    probes: frozenset[str]
    grad_probes: frozenset[str]
    transparent: frozenset[str]
    deferrable: frozenset[str]

    def describe(self, key: str) -> str:
        """A call key and its module type, for messages: ``'layer1.relu#1' (ReLU)``."""
        return f"{key or '<model>'!r} ({self.types.get(_base(key), '?')})"


def _watch(model: nn.Module, select: Selector | None, output_stats: Literal["parameter-free", "all"]) -> _Watched:
    """Resolve `select` (default: `_default_select`) on `model` and plan how each watched module is observed."""
    watched = select_modules(model, _default_select if select is None else select)
    module_names = [n for n, _ in watched]
    names = frozenset(module_names)
    param_names: list[str] = []
    params: list[nn.Parameter] = []
    param_module: list[str] = []
    for pname, p in model.named_parameters():
        owner = _owner(pname, names)
        if owner is not None:
            param_names.append(pname)
            params.append(p)
            param_module.append(owner)
    params_of: dict[str, list[int]] = {}
    for i, m in enumerate(param_module):
        params_of.setdefault(m, []).append(i)
    transparent: frozenset[str] = frozenset()  # looked through by the NaN localisation
    if output_stats == "all":
        probes = grad_probes = names
    else:
        trainable = {param_module[i] for i, p in enumerate(params) if p.requires_grad}
        probes = frozenset(n for n in module_names if n not in trainable)
        # pooling, dropout, reshapes: nothing to report and nothing they could break, so no hook at all
        inert = {n for n, m in watched if isinstance(m, TRANSPARENT) and not isinstance(m, ACTIVATIONS)}
        probes = probes - inert
        transparent = frozenset(n for n, m in watched if isinstance(m, TRANSPARENT))
        grad_probes = frozenset(probes - transparent)
    # activation outputs whose statistics can wait for the compiled kernel at the end of the step
    activations = {n for n, m in watched if isinstance(m, ACTIVATIONS)}
    return _Watched(
        module_names=module_names,
        types={n: type(m).__name__ for n, m in watched},
        relu_like=frozenset(n for n, m in watched if isinstance(m, _RELU_LIKE)),
        param_names=param_names,
        params=params,
        param_module=param_module,
        params_of=params_of,
        watched=names,
        probes=probes,
        grad_probes=grad_probes,
        transparent=transparent,
        deferrable=frozenset(activations & (probes - grad_probes)),
    )
