"""Constants follow the input's dtype: every registered method on a float64 model with float64 inputs returns float64,
and no operation it runs mixes float32 and float64 tensors.

The CPU stand-in for the CUDA check (tests/test_cuda.py, which CI cannot run): a constant built without the data's
dtype (``torch.tensor(mean)``, ``torch.zeros(n)``, a float32 buffer) is also one built without its device, and a
float64 run shows it as an operation whose floating-point tensor arguments have two dtypes. `DtypeMix` records every
such operation with the line of hookviz that ran it. It is a TorchDispatchMode, not a TorchFunctionMode: a function
mode does not see the backward pass (the rules' autograd Functions, tensor hooks), a dispatch mode sees every aten
operation of both passes. What may mix: 0-dim tensors (a Python number reaches aten as a 0-dim float64 tensor, and a
0-dim tensor does not decide the result's dtype) and integer or bool tensors (indices, masks), which are not
floating-point; conversions (``Tensor.to``) take one tensor and never count.
"""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cuda import MODELS, ON_RESNET, ON_VIT, build, inputs
from torch import Tensor
from torch.utils import _pytree
from torch.utils._python_dispatch import TorchDispatchMode

import hookviz

HOOKVIZ = str(Path(hookviz.__file__).parent)
# what the float64 run uses on the CPU: cheaper than test_cuda.py's settings (same code paths)
OPTIONS: dict[str, dict[str, Any]] = {
    "smoothgrad": {"n": 2},
    "vargrad": {"n": 2},
    "integrated-gradients": {"steps": 2},
    "scorecam": {"batch_size": 64},
    "occlusion": {"window": (16, 16)},
    "rise": {"n_masks": 4, "cell": 4, "seed": 0},
    "gradient-shap": {"n_samples": 2, "stdevs": 0.1},
}


class DtypeMix(TorchDispatchMode):
    """Records the aten operations whose floating-point tensor arguments (0-dim ones aside) have more than one dtype:
    (operation, dtypes, the innermost line of hookviz that ran it) -> count."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: Counter[tuple[str, tuple[str, ...], str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        leaves = _pytree.tree_leaves((args, kwargs))
        dtypes = {t.dtype for t in leaves if isinstance(t, Tensor) and t.is_floating_point() and t.dim() > 0}
        if len(dtypes) > 1:
            where = next(
                (f"{Path(f.filename).relative_to(HOOKVIZ)}:{f.lineno}" for f in reversed(traceback.extract_stack()[:-1])
                 if f.filename.startswith(HOOKVIZ)),
                "outside hookviz",
            )  # fmt: skip
            self.mixed[(str(func), tuple(sorted(str(d) for d in dtypes)), where)] += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize(("model_name", "name"), [("resnet18", n) for n in ON_RESNET] + [("vit", n) for n in ON_VIT])
@pytest.mark.filterwarnings("ignore::UserWarning")  # IG's convergence warning at 2 steps, uncovered operations
def test_float64_model_gives_float64_without_mixing_dtypes(model_name: str, name: str) -> None:
    model, x = MODELS[model_name](torch.float64), inputs(torch.float64, size=32 if model_name == "resnet18" else 64)
    method = build(name, model, OPTIONS)
    with DtypeMix() as mode:
        out = method.attribute(x, target=[1, 2])
    mixed = "".join(f"\n  {n} {dtypes} at {where} ({count}x)" for (n, dtypes, where), count in mode.mixed.items())
    assert out.dtype == torch.float64 and not mixed, f"result {out.dtype}; operations mixing dtypes:{mixed or ' none'}"
