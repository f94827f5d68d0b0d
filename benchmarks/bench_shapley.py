"""The coalition methods against captum's on the same model and budget: KernelShap, ShapleyValueSampling, Lime,
FeatureAblation (docs/model-agnostic.md).

Usage::

    python benchmarks/bench_shapley.py [--device cpu] [--threads 1] [--repeats 3] [--out PATH.md]

Cases:

- ``shapes CNN``: the zoo's shapes CNN (shipped weights), 4 shapes images of 64 x 64, a 4 x 4 grid of 16 x 16 patches
  (16 groups), baseline 0, targets the labels;
- ``tabular MLP``: an MLP 20 -> 64 -> 64 -> 3 (seed 0), 16 rows, one group per feature (20 groups), target 0.

Budgets, the same for both libraries: KernelShap 200 coalitions per input, ShapleyValueSampling 10 permutations, Lime
200 samples, FeatureAblation one coalition per group. hookviz runs with its default chunks (``batch_size=None``:
about 2^20 input elements per pass, at least 64 rows: 85 rows here for the images, 4096 for the table); captum with
its default ``perturbations_per_eval=1`` and with 64 (its only batching). ``floor``: the model's forward passes alone
over as many rows as hookviz evaluated (the coalitions times N, plus N), in hookviz's chunks. Lime is not the same
algorithm in both (captum fits a Lasso in scikit-learn on input-space cosine weights, hookviz a ridge in torch on
coalition weights), and neither is KernelShap (captum's 1e6 weights vs shap's elimination, different draws); the time
is for the same number of forward rows. Where the algorithms coincide the values are compared: FeatureAblation, and
ShapleyValueSampling with the same seed (the same permutations). Median of ``--repeats`` runs, process CPU seconds
(with one thread: the work, robust to other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

import hookviz as hv
from hookviz.zoo import shapes, shapes_model


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[float, torch.Tensor]:
    """The median process CPU seconds of fn() over `repeats` runs after a warm-up, and its value. With one thread the
    CPU time is the work itself, which other processes on a shared machine do not stretch as they stretch wall time."""
    out = fn()  # warm-up (and the value)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times), out


def ms(seconds: float) -> str:
    """Milliseconds with 3 significant digits."""
    return f"{seconds * 1e3:.3g}"


def cases(device: torch.device) -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]]:
    data = shapes(4, seed=3)
    cnn = shapes_model().to(device).eval()
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3)).to(device).eval()
    rows = torch.randn(16, 20, generator=torch.Generator().manual_seed(1)).to(device)
    return {
        "shapes CNN (4 x 64 x 64, 16 patches)": (
            cnn,
            data.images.to(device),
            hv.grid_mask((64, 64), 16).view(1, 1, 64, 64).to(device),
            data.labels.to(device),
        ),
        "tabular MLP (16 x 20 features)": (mlp, rows, torch.arange(20).view(1, 20).to(device), torch.zeros(16).long()),
    }


def bench_case(
    case: str, model: nn.Module, x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor, repeats: int
) -> list[str]:
    """The table's rows of one case."""
    import captum.attr as ca

    ours = {
        "KernelShap": hv.KernelShap(model, n_samples=200, progress=False),
        "ShapleyValueSampling": hv.ShapleyValueSampling(model, n_samples=10, seed=0, progress=False),
        "Lime": hv.Lime(model, n_samples=200, progress=False),
        "FeatureAblation": hv.FeatureAblation(model, progress=False),
    }
    theirs = {
        "KernelShap": (ca.KernelShap, {"n_samples": 200}),
        "ShapleyValueSampling": (ca.ShapleyValueSampling, {"n_samples": 10}),
        "Lime": (ca.Lime, {"n_samples": 200}),
        "FeatureAblation": (ca.FeatureAblation, {}),
    }
    lines = []
    for name, method in ours.items():
        t_ours, a_ours = timed(lambda: method.attribute(x, target=target, feature_mask=mask), repeats)  # noqa: B023
        n_rows = (method.last_coalitions + 1) * x.shape[0]
        fake = x[torch.arange(n_rows, device=x.device) % x.shape[0]]

        def floor(fake: torch.Tensor = fake, step: int = method.last_rows_per_pass) -> torch.Tensor:
            with torch.no_grad():
                return torch.cat([model(fake[s : s + step]) for s in range(0, fake.shape[0], step)])

        t_floor, _ = timed(floor, repeats)
        cls, options = theirs[name]
        t_captum = {}
        a_captum = None
        for ppe in (1, 64):

            def run(cls=cls, options=options, ppe=ppe) -> torch.Tensor:  # noqa: ANN001
                torch.manual_seed(0)  # ShapleyValueSampling: the permutations of hookviz's seed=0
                return cls(model).attribute(x, target=target, feature_mask=mask, perturbations_per_eval=ppe, **options)

            t_captum[ppe], a_captum = timed(run, repeats)
        same = "-"
        if name in ("FeatureAblation", "ShapleyValueSampling"):
            same = f"{(a_ours - a_captum).abs().max().item():.1e}"
        best = min(t_captum.values())
        lines.append(
            f"| {case} | {name} | {ms(t_floor)} | {ms(t_ours)} | {ms(t_captum[1])} | {ms(t_captum[64])} "
            f"| {best / t_ours:.1f}x | {same} |"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")  # captum's, per call

    device = torch.device(args.device)
    lines = [
        "| case | method | forward floor (ms) | hookviz (ms) | captum ppe=1 (ms) | captum ppe=64 (ms) | "
        "speed-up vs best captum | max abs difference |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case, (model, x, mask, target) in cases(device).items():
        lines += bench_case(case, model, x, mask, target.to(device), args.repeats)
    lines.append("")
    lines.append(
        f"{args.device}, {args.threads} thread(s), torch {torch.__version__}, median process CPU time of "
        f"{args.repeats} runs after a warm-up."
    )
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
