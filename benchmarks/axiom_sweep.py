"""The sums the attribution methods promise, checked in float64 on every architecture of ``arch_sweep.py``.

    python benchmarks/axiom_sweep.py [--only NAME ...] [--subset] [--methods deeplift ...] [--out PATH]

Random weights (seed 0, as the architecture sweep builds them), the whole model in float64, two inputs per
architecture, targets 0 and 1. For each architecture:

- ``deeplift``: DeepLift's summation-to-delta, ``sum(A) = f_c(x) - f_c(x')`` (Shrikumar et al. 2017), with the zero
  baseline and with a random non-zero one; the relative error ``|sum(A) - Δf| / |Δf|`` (worst input and target);
- ``deeplift-shap``: the same for DeepLiftShap over three random baselines, against ``f_c(x) - mean_b f_c(x'_b)``;
- ``lrp-epsilon-0``: LRP-epsilon with epsilon and stabilizer 0 on the model with every bias and every BatchNorm
  running mean set to zero (bias-free): the input relevance sums to ``f_c(x)`` (conservation);
- ``integrated-gradients``: completeness of 32-point Gauss-Legendre IG, ``|sum(A) - Δf| / |Δf|`` (a quadrature
  error, not a rounding one: reported, not judged).

Each cell is the worst relative error, and, where the rule engine reported operations without a rule, their names.
float64 rounding puts an exact method near 1e-13; the error of a missing rule is of order 1e-3 to 1.

Writes ``benchmarks/results/axioms.md``. The fast subset runs in ``tests/test_axioms.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.methods.lrp import composite

_PATH = Path(__file__).resolve().parent / "arch_sweep.py"
_spec = importlib.util.spec_from_file_location("arch_sweep", _PATH)
assert _spec is not None and _spec.loader is not None
sweep = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("arch_sweep", sweep)  # its dataclasses look their module up while being defined
_spec.loader.exec_module(sweep)

METHODS = ("deeplift", "deeplift-shap", "lrp-epsilon-0", "integrated-gradients")
TARGETS = [0, 1]


def logits(out: Any) -> Tensor:
    return out.logits if hasattr(out, "logits") else out


def scores(model: nn.Module, x: Tensor) -> Tensor:
    """(N, 2) scores of classes 0 and 1."""
    with torch.no_grad():
        return logits(model(x))[:, TARGETS]


U = 2.0**-53  # float64's unit roundoff


def rounding(model: nn.Module, a: Tensor, *outputs: Tensor) -> Tensor:
    """(N, K) rounding bound of an exact sum of the attributions `a` (N, K, ...) in float64: every operation rounds
    each term it adds once (relative u), so the computed sum differs from the exact one by at most about L u S, L
    the operations a term passes and S the sum of the magnitudes involved (|A| summed over the input, and the
    `outputs` |f(x)|, |f(x')|, (N, K) each). L is taken as 4 times the model's module count (a module runs a few
    operations; the two-factor split rounds twice per term)."""
    scale = a.abs().flatten(2).sum(2) + sum(o.abs() for o in outputs)
    return 4 * len(list(model.modules())) * U * scale


@dataclass
class Check:
    """One method's promised sum on one architecture: the worst relative error ``|sum - expected| / |expected|``,
    whether every gap is within `rounding`, and the operations reported as running without a rule."""

    error: float
    exact: bool
    uncovered: dict[str, int]


def judge(model: nn.Module, a: Tensor, expected: Tensor, *outputs: Tensor, uncovered: dict[str, int]) -> Check:
    gap = (a.flatten(2).sum(2) - expected).abs()
    rel = float((gap / expected.abs().clamp_min(1e-300)).max())
    return Check(rel, bool((gap <= rounding(model, a, *outputs)).all()), uncovered)


def worst(checks: list[Check]) -> Check:
    uncovered: dict[str, int] = {}
    for c in checks:
        uncovered.update(c.uncovered)
    return Check(max(c.error for c in checks), all(c.exact for c in checks), uncovered)


def bias_free(model: nn.Module) -> nn.Module:
    """`model` with every bias and every BatchNorm running mean zero, in place (LRP's conservation needs no bias)."""
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "bias", None)
            if isinstance(bias, Tensor):
                bias.zero_()
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                module.running_mean.zero_()
    return model


def _run(method: hv.Attribution, x: Tensor, **kwargs: Any) -> tuple[Tensor, dict[str, int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = method.attribute(x, target=torch.tensor([TARGETS] * x.shape[0]), **kwargs)
    coverage = getattr(method, "rule_coverage", None)
    return out, dict(coverage.uncovered) if coverage is not None else {}


def check_deeplift(model: nn.Module, x: Tensor, gen: torch.Generator) -> Check:
    checks = []
    fx = scores(model, x)
    for base in (torch.zeros_like(x[:1]), 0.5 * torch.randn(x[:1].shape, generator=gen, dtype=x.dtype)):
        a, uncovered = _run(hv.DeepLift(model, base), x)
        fb = scores(model, base)
        checks.append(judge(model, a, fx - fb, fx, fb, uncovered=uncovered))
    return worst(checks)


def check_deeplift_shap(model: nn.Module, x: Tensor, gen: torch.Generator) -> Check:
    bases = 0.5 * torch.randn((3, *x.shape[1:]), generator=gen, dtype=x.dtype)
    a, uncovered = _run(hv.DeepLiftShap(model, bases), x)
    fx, fb = scores(model, x), scores(model, bases)
    return judge(model, a, fx - fb.mean(0), fx, fb.abs().mean(0), uncovered=uncovered)


def check_lrp(model: nn.Module, x: Tensor, gen: torch.Generator) -> Check:
    bias_free(model)
    a, uncovered = _run(hv.LRP(model, composite("epsilon", epsilon=0.0, stabilizer=0.0)), x)
    fx = scores(model, x)
    return judge(model, a, fx, fx, uncovered=uncovered)


def check_ig(model: nn.Module, x: Tensor, gen: torch.Generator) -> Check:
    a, _ = _run(hv.IntegratedGradients(model, steps=32, batch_size=16), x)  # 64 path points, in chunks
    fx, fb = scores(model, x), scores(model, torch.zeros_like(x))
    check = judge(model, a, fx - fb, fx, fb, uncovered={})
    check.exact = False  # a quadrature: its error is not rounding (tests/test_axioms.py bounds it)
    return check


CHECKS: dict[str, Callable[[nn.Module, Tensor, torch.Generator], Check]] = {
    "deeplift": check_deeplift,
    "deeplift-shap": check_deeplift_shap,
    "lrp-epsilon-0": check_lrp,
    "integrated-gradients": check_ig,
}


def build(arch: Any) -> nn.Module:
    torch.manual_seed(0)
    model = arch.build().eval()
    sweep.live_head(model)
    return model.double()


def run_arch(arch: Any, methods: list[str]) -> dict[str, Check | str]:
    """{method: its Check, or why there is none} for one architecture."""
    if arch.tokens is not None:
        return dict.fromkeys(methods, "token ids: no input-space baseline")
    cells: dict[str, Check | str] = {}
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, arch.size, arch.size, generator=gen, dtype=torch.float64)
    for name in methods:
        model = build(arch)  # anew: lrp-epsilon-0 zeroes the biases
        try:
            cells[name] = CHECKS[name](model, x, gen)
        except Exception as exc:  # the table records failures, it does not stop on them
            cells[name] = f"✗ {type(exc).__name__}: {' '.join(str(exc).split())[:70]}…"
    return cells


def cell(value: Check | str) -> str:
    if isinstance(value, str):
        return value
    text = ("exact, " if value.exact else "") + f"{value.error:.1e}"
    ops = list(value.uncovered.items())
    if ops:
        text += " (no rule: " + ", ".join(f"{op} x{n}" for op, n in ops[:4]) + (" …" if len(ops) > 4 else "") + ")"
    return text


def table(results: dict[str, dict[str, Check | str]], methods: list[str]) -> str:
    lines = [
        f"torch {torch.__version__}, float64, random weights (seed 0), two inputs, targets 0 and 1; written by "
        "`python benchmarks/axiom_sweep.py`. Each cell: the worst relative error of the promised sum (module "
        'docstring), "exact" where every gap is within float64 rounding (`rounding`); "no rule": the operations the '
        "rule engine reported as running without one.",
        "",
        "| architecture | " + " | ".join(methods) + " |",
        "|---" * (len(methods) + 1) + "|",
    ]
    for name, cells in results.items():
        lines.append(f"| {name} | " + " | ".join(cell(cells[m]) for m in methods) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="architecture names to run (default: all)")
    parser.add_argument("--subset", action="store_true", help="the fast subset the architecture tests run")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    parser.add_argument("--out", default="benchmarks/results/axioms.md")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    archs = {a.name: a for a in (sweep.subset_archs() if args.subset else sweep.all_archs())}
    results: dict[str, dict[str, Check | str]] = {}
    for name in args.only or list(archs):
        start = time.perf_counter()
        try:
            results[name] = run_arch(archs[name], args.methods)
        except Exception as exc:  # a model that cannot be built at all still gets its row
            results[name] = dict.fromkeys(args.methods, f"✗ {type(exc).__name__}: {str(exc)[:60]}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table(results, args.methods))  # after every architecture: a long run leaves a record
        print(f"{name:34s} " + "  ".join(f"{m}={cell(results[name][m])[:50]}" for m in args.methods)
              + f"  {time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    print(table(results, args.methods))


if __name__ == "__main__":
    main()
