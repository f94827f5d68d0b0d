"""The coalition methods against captum's on the same model and budget: KernelShap, ShapleyValueSampling, Lime,
FeatureAblation (docs/model-agnostic.md).

Usage::

    python benchmarks/bench_shapley.py [--device cpu] [--threads 1] [--repeats 3] [--out PATH.md]
    python benchmarks/bench_shapley.py --case resnet50 [--device cpu] [--threads 2] [--out PATH.md]

Cases (the default ``--case small``):

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

``--case resnet50`` (the issue's image case; one run of each, no warm-up beyond a short forward pass, as each run is
about a minute on two CPU cores): torchvision's resnet50 (``weights=None``, seed 0, eval), one 224 x 224 image
(``hookviz.zoo.shapes_image(224)``, ImageNet-normalised), about 64 SLIC superpixels from
``hookviz.methods.shapley.superpixels`` (the same mask is captum's ``feature_mask``), baseline 0, target the model's
top class. KernelShap and Lime with 1,000 coalitions; ShapleyValueSampling with 15 permutations (about 1,000 forward
rows: captum 15 x 64 + 1 = 961, hookviz reported 948); hookviz's default chunks (64 rows here), captum with
``perturbations_per_eval=64`` (its default of 1 is not timed here: a single-row pass per coalition). Wall and process
time (process time counts both threads). ``floor``: 1,000 forward rows of resnet50 in chunks of 64, scaled per method
to the rows hookviz evaluated. Values: ShapleyValueSampling with the same seed (the same permutations) as a max abs
difference; KernelShap and Lime (different algorithms) as the Pearson correlation of the per-superpixel values.
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
        n_rows = round((method.last_coalitions + 1) * x.shape[0])
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


def timed_once(fn: Callable[[], torch.Tensor]) -> tuple[float, float, torch.Tensor]:
    """Wall and process seconds of one run of fn(), and its value."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def whole_ms(seconds: float) -> str:
    """Whole milliseconds with thousands separators."""
    return f"{seconds * 1e3:,.0f}"


def bench_resnet50(device: torch.device) -> list[str]:
    """The resnet50 case: one image, ~64 superpixels, 1,000 coalitions; one run each (see the module's docstring)."""
    import captum.attr as ca
    import torchvision
    from torchvision.transforms.functional import normalize, to_tensor

    from hookviz.methods.shapley import superpixels
    from hookviz.zoo import shapes_image

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).to(device).eval()
    raw = to_tensor(shapes_image(224))[:3]
    x = normalize(raw, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]).unsqueeze(0).to(device)
    mask = superpixels(raw, 64).view(1, 1, 224, 224).to(device)
    groups = int(mask.max().item()) + 1
    with torch.no_grad():
        target = model(x).argmax(1)
        model(x.expand(8, -1, -1, -1))  # warm-up

    def per_group(a: torch.Tensor) -> torch.Tensor:
        """The value of each superpixel (constant over its pixels; its first channel's mean)."""
        flat, index = a[0, 0].flatten().double(), mask.flatten().cpu()
        sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, flat)
        return sums / torch.bincount(index, minlength=groups)

    rows_floor = 1000
    fake = x.expand(rows_floor, -1, -1, -1)

    def floor() -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([model(fake[s : s + 64]) for s in range(0, rows_floor, 64)])

    floor_wall, floor_cpu, _ = timed_once(floor)
    print(f"floor: {rows_floor} rows, {floor_wall:.1f} s wall, {floor_cpu:.1f} s process", flush=True)
    permutations = 15
    ours = {
        "KernelShap": hv.KernelShap(model, n_samples=1000, progress=False),
        "ShapleyValueSampling": hv.ShapleyValueSampling(model, n_samples=permutations, seed=0, progress=False),
        "Lime": hv.Lime(model, n_samples=1000, progress=False),
    }
    theirs = {
        "KernelShap": (ca.KernelShap, {"n_samples": 1000}),
        "ShapleyValueSampling": (ca.ShapleyValueSampling, {"n_samples": permutations}),
        "Lime": (ca.Lime, {"n_samples": 1000}),
    }
    lines = [
        f"resnet50 (weights=None, seed 0), 1 x 3 x 224 x 224, {groups} superpixels, baseline 0, target {target.item()}",
        "",
        "| method | forward rows (hookviz) | floor wall (ms) | hookviz wall (ms) | captum ppe=64 wall (ms) "
        "| hookviz / floor | captum / floor | speed-up vs captum (wall) | hookviz process (ms) | captum process (ms) "
        "| values |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, method in ours.items():
        t_ours, c_ours, a_ours = timed_once(
            lambda: method.attribute(x, target=target, feature_mask=mask)  # noqa: B023
        )
        n_rows = round((method.last_coalitions + 1) * x.shape[0])
        t_floor = floor_wall * n_rows / rows_floor
        cls, options = theirs[name]

        def run(cls=cls, options=options) -> torch.Tensor:  # noqa: ANN001
            torch.manual_seed(0)  # ShapleyValueSampling: the permutations of hookviz's seed=0
            return cls(model).attribute(x, target=target, feature_mask=mask, perturbations_per_eval=64, **options)

        t_captum, c_captum, a_captum = timed_once(run)
        if name == "ShapleyValueSampling":
            same = f"max abs difference {(a_ours - a_captum).abs().max().item():.1e}"
        else:
            ours_g, theirs_g = per_group(a_ours.cpu()), per_group(a_captum.cpu())
            same = f"correlation {torch.corrcoef(torch.stack([ours_g, theirs_g]))[0, 1].item():.3f}"
        lines.append(
            f"| {name} | {n_rows} | {whole_ms(t_floor)} | {whole_ms(t_ours)} | {whole_ms(t_captum)} "
            f"| {t_ours / t_floor:.2f} | {t_captum / t_floor:.2f} | {t_captum / t_ours:.2f}x "
            f"| {whole_ms(c_ours)} | {whole_ms(c_captum)} | {same} |"
        )
        print(lines[-1], flush=True)
    lines.append("")
    lines.append(
        f"floor: {rows_floor} rows of resnet50 in chunks of 64, {whole_ms(floor_wall)} ms wall "
        f"({whole_ms(floor_cpu)} ms process), scaled to each method's rows. One run of each (no repeats)."
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--case", choices=("small", "resnet50"), default="small")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")  # captum's, per call

    device = torch.device(args.device)
    if args.case == "resnet50":
        lines = bench_resnet50(device)
        lines.append(f"{args.device}, {args.threads} thread(s), torch {torch.__version__}.")
        table = "\n".join(lines)
        print(table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(table + "\n")
        return
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
