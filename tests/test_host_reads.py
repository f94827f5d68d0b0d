"""No waits (issue 35, part 1): the host synchronisations of every registered method, `explain_generation` and
`GradientFlow.step`, counted on the CPU by `host_reads.HostReads` and held to a budget per call.

The cases: every registered method on a torchvision resnet18 (weights=None) and the zoo's shapes ViT, 2 x 3 x 64 x 64
inputs on the device (and for four methods on the host, the model on the device), target ``[1, 2]`` (a list: its
indices go from the host to the device); AttnLRP and CP-LRP on a tiny Hugging Face LLaMA (2 layers, hidden 32, eager
and sdpa attention) at the token embedding, the last position's logit of token 5; `explain_generation` on the zoo's
retrieval LM (2 prompts, their answers forced) with Input x Gradient and AttnLRP; `GradientFlow.step` on a small MLP
(a step, three steps of which the last reads the full buffer out, a monitor's first step); PartitionShap on the
resnet18 with a mask per image (two layouts: a hierarchy each). Each case is counted on its second call (the first
may choose a layer or build a cache), and only the reads hookviz makes: the model's own (Hugging Face's cache builds
tensors from Python lists) are reported, not counted. Tensors a method holds from its construction (LRP's z^B bounds,
a feature mask) are host tensors (`_held`).

The budget (`BUDGET`): at most one host synchronisation per call, the validation that reads values (finite inputs)
before any work; none with the batch on the host. Where a method is not there, its budget is the count measured, with
the reason, so that the test fails when a count grows. ``python tests/test_host_reads.py`` prints the table of every
case; benchmarks/results/host-reads-cpu.md holds it before and after the work, beside the synchronisations an H100
counted for the same cases (``torch.cuda.set_sync_debug_mode``, benchmarks/host_reads_gpu.py): the same numbers.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
from host_reads import HostReads
from test_cuda import ON_RESNET, ON_VIT, resnet18, vit
from torch import Tensor, nn

import hookviz as hv
from hookviz import zoo

# cheap settings (test_float64.py's): the same code paths as the defaults
OPTIONS: dict[str, dict[str, Any]] = {
    "smoothgrad": {"n": 2},
    "vargrad": {"n": 2},
    "integrated-gradients": {"steps": 2},
    "scorecam": {"batch_size": 64},
    "occlusion": {"window": (16, 16)},
    "rise": {"n_masks": 4, "cell": 4, "seed": 0},
    "gradient-shap": {"n_samples": 2, "stdevs": 0.1},
}
TARGET = [1, 2]
# where the cases run: the CPU here; benchmarks/host_reads_gpu.py sets a GPU to count the same calls' synchronisations
DEVICE = torch.device("cpu")


@cache
def _model(name: str) -> nn.Module:
    return {"resnet18": resnet18, "vit": vit}[name]().to(DEVICE)


@cache
def _images() -> Tensor:
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def _held(obj: Any, depth: int = 5) -> list[Tensor]:
    """The tensors a method holds from its construction (LRP's z^B bounds, a baseline), in its attributes and theirs,
    the model's left out: built on the host (`HostReads` counts what it moves to the device)."""
    if isinstance(obj, Tensor):
        return [obj]
    if depth == 0 or isinstance(obj, nn.Module | str | bytes | type) or callable(obj) and not hasattr(obj, "__dict__"):
        return []
    if isinstance(obj, dict):
        items: Any = obj.values()
    elif isinstance(obj, list | tuple | set):
        items = obj
    else:
        items = getattr(obj, "__dict__", {}).values()
    return [t for item in items for t in _held(item, depth - 1)]


def _method_case(model_name: str, name: str, on_host: bool = False) -> Callable[[], Any]:
    method = hv.get_method(name)(_model(model_name), **OPTIONS.get(name, {}))
    x = _images() if on_host else _images().to(DEVICE)

    def call() -> Any:
        return method.attribute(x, target=TARGET)

    call.host = (*_held(method), *((x,) if on_host else ()))  # type: ignore[attr-defined]
    return call


@cache
def _llama(impl: str) -> nn.Module:
    from test_attnlrp import _hf

    return _hf("llama", impl).to(DEVICE)


def _llama_case(impl: str, composite: str) -> Callable[[], Any]:
    pytest.importorskip("transformers")
    lrp = hv.LRP(_llama(impl), composite, layer="model.embed_tokens")
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    return lambda: lrp.attribute(ids, target=lambda out: out.logits[:, -1, 5])


def _generation_case(method: str) -> Callable[[], Any]:
    model, tokenizer = zoo.retrieval_lm()
    model.to(DEVICE)
    data = zoo.retrieval(2, seed=0)
    prompts, answers = data.prompts, data.answer_texts
    return lambda: hv.explain_generation(model, tokenizer, prompts, method=method, target=answers)


def _flow_case(steps: int, buffer: int, first: bool = False) -> Callable[[], Any]:
    """`steps` training steps of a small MLP watched by GradientFlow with a buffer of `buffer` rows, after one that
    builds its layout (`first`: the step that builds it, on a fresh monitor each call). Measured on the second call
    (`count`): with 3 steps and 3 rows, the last step fills the buffer and reads it out."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(DEVICE)
    x, y = torch.randn(4, 8, device=DEVICE), torch.tensor([1, 2, 0, 1], device=DEVICE)

    def step(flow: hv.GradientFlow) -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        flow.step()
        model.zero_grad()

    def first_step() -> None:
        with hv.GradientFlow(model, fused_stats=False, buffer_steps=buffer) as flow:
            step(flow)

    if first:
        return first_step
    flow = hv.GradientFlow(model, fused_stats=False, buffer_steps=buffer).start()
    step(flow)
    return lambda: [step(flow) for _ in range(steps)]


def _partition_per_input_case() -> Callable[[], Any]:
    """PartitionShap with a mask per image, two layouts (an 8 x 8 grid and its transpose): a hierarchy each, built
    from the masks on the host, their traversals sharing the forward passes."""
    grid = hv.grid_mask((64, 64), 8)
    method = hv.PartitionShap(_model("resnet18"), feature_mask=torch.stack([grid, grid.T.contiguous()]).unsqueeze(1))
    x = _images().to(DEVICE)

    def call() -> Any:
        return method.attribute(x, target=TARGET)

    call.host = tuple(_held(method))  # type: ignore[attr-defined]
    return call


CASES: dict[str, Callable[[], Callable[[], Any]]] = {
    **{f"resnet18 {n}": (lambda n=n: _method_case("resnet18", n)) for n in ON_RESNET},
    **{f"vit {n}": (lambda n=n: _method_case("vit", n)) for n in ON_VIT},
    # the batch on the host, the model on the device: checked where it is, copied without a wait
    **{
        f"resnet18 {n}, inputs on the host": (lambda n=n: _method_case("resnet18", n, on_host=True))
        for n in ("saliency", "gradcam", "integrated-gradients", "lrp")
    },
    **{
        f"llama-{impl} {c}": (lambda impl=impl, c=c: _llama_case(impl, c))
        for impl in ("eager", "sdpa")
        for c in ("attn-lrp", "cp-lrp")
    },
    **{f"explain_generation {m}": (lambda m=m: _generation_case(m)) for m in ("input-x-gradient", "attn-lrp")},
    "resnet18 partition-shap, a mask per image": _partition_per_input_case,
    "GradientFlow.step": lambda: _flow_case(1, 32),
    "GradientFlow.step x3, the buffer read out": lambda: _flow_case(3, 3),
    "GradientFlow.step, the first (layout)": lambda: _flow_case(1, 32, first=True),
}

# at most one read per call (GradientFlow: per step, and the read-out of a full buffer); fewer where less is needed.
# A case above it would be listed here with the count measured and why (module docstring)
BUDGET: dict[str, int] = dict.fromkeys(CASES, 1) | {"GradientFlow.step": 0}
# the batch on the host: checked there, copied without a wait; the target's classes too; the checks after the work
# (CAM's empty maps, IG's completeness) read without a wait (`hookviz._device.after_work`)
BUDGET |= {c: 0 for c in CASES if "on the host" in c}


def count(case: str) -> HostReads:
    """The host reads of the case's second call."""
    call = CASES[case]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # IG's convergence at 2 steps, uncovered operations, empty maps
        call()
        with HostReads(host=getattr(call, "host", ())) as reads:
            call()
    return reads


@pytest.mark.parametrize("case", list(CASES))
def test_host_reads_within_budget(case: str) -> None:
    reads = count(case)
    assert reads.ours <= BUDGET[case], f"{case}: {reads.ours} host reads, budget {BUDGET[case]}:{reads.report()}"


# -- the counter itself, on known examples -----------------------------------------------------------------------------
def _reads(fn: Callable[[], Any]) -> HostReads:
    with HostReads() as reads:
        fn()
    return reads


def test_counter_counts_known_reads() -> None:
    x = torch.randn(5, requires_grad=True)
    t = x.detach()
    assert _reads(lambda: x.sum().item()).total == 1
    assert _reads(lambda: bool(t.any())).total == 1
    assert _reads(lambda: t[t > 0]).total == 1  # a boolean mask: nonzero
    assert _reads(lambda: t.nonzero()).total == 1
    assert _reads(lambda: torch.where(t > 0)).total == 1
    assert _reads(lambda: t.cpu().tolist()).total == 1  # the copy is on the host: reading it is free
    assert _reads(lambda: t.tolist()).total == 1
    assert _reads(lambda: t.to("cpu")).total == 1
    assert _reads(lambda: float(t.max())).total == 1
    assert _reads(lambda: torch.equal(t, t)).total == 1
    assert _reads(lambda: t.unique()).total == 1
    assert _reads(lambda: t[torch.tensor([0, 1])]).total == 1  # an index built on the host goes to the device
    assert _reads(lambda: torch.tensor([0.5, 1.0], device=t.device)).total == 1  # a blocking copy to the device


def test_counter_passes_device_work() -> None:
    x = torch.randn(5, requires_grad=True)
    t = x.detach()

    def forward_backward() -> None:
        y = torch.where(x > 0, x, 0.1 * x).pow(2)
        torch.autograd.grad(y.sum(), x)

    assert _reads(forward_backward).total == 0
    assert _reads(lambda: t[torch.arange(2, device=t.device)]).total == 0  # built on the device
    assert _reads(lambda: t * torch.tensor(2.0)).total == 0  # a 0-dim host tensor is a scalar to a kernel
    assert _reads(lambda: torch.zeros(3).sum().item()).total == 0  # on the host throughout
    assert _reads(lambda: t.masked_fill(t > 0, 0.0)).total == 0


def test_counter_sees_the_backward_pass() -> None:
    class Reads(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Tensor) -> Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: Tensor) -> Tensor:
            return g * 2 if bool(g.sum() > 0) else g  # a read in the backward pass

    x = torch.randn(5, requires_grad=True)
    reads = _reads(lambda: torch.autograd.grad(Reads.apply(x).sum(), x))
    assert reads.total == 1 and "test_host_reads.py" in reads.report()


def test_counter_copies_to_the_device_once() -> None:
    t = torch.randn(4)

    def index_twice() -> None:
        idx = torch.tensor([0, 1])
        t[idx] + t[idx[:1]]

    assert _reads(index_twice).total == 1


def main() -> None:
    """Print the markdown table of every case (or of the cases whose names contain an argument; -v: each read)."""
    wanted = [a for a in sys.argv[1:] if not a.startswith("-")]
    names = [c for c in CASES if not wanted or any(a in c for a in wanted)]
    print("| case | host reads (hookviz) | all |\n|---|---:|---:|")
    for case in names:
        reads = count(case)
        print(f"| {case} | {reads.ours} | {reads.total} |", flush=True)
        if "-v" in sys.argv:
            print(reads.report(), file=sys.stderr)


if __name__ == "__main__":
    main()
