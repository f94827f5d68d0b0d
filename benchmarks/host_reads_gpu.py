"""The cases of tests/test_host_reads.py on a GPU: the host synchronisations of one call, counted by CUDA itself.

Each case (every registered method on resnet18 and the shapes ViT, AttnLRP / CP-LRP on a tiny LLaMA,
``explain_generation``, ``GradientFlow.step``) is built on ``cuda`` (``test_host_reads.DEVICE``; the "inputs on the
host" cases keep their batch on the CPU), called once to warm up, then once under
``torch.cuda.set_sync_debug_mode("warn")``: each warning is one synchronisation, located at the innermost line outside
torch (``hookviz/...``: hookviz's; ``transformers/...``: the model's own). This is the ground truth the CPU count of
`host_reads.HostReads` stands in for where CI has no GPU.

    python benchmarks/host_reads_gpu.py [--tree DIR] [--out FILE.json] [words ...]

``--tree DIR``: import hookviz from DIR instead (``git archive <commit> hookviz | tar -x -C DIR``: an older version,
counted with today's cases); words: only the cases whose names contain one. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _site(frames: list[traceback.FrameSummary], filename: str, lineno: int) -> str:
    """The warning's line, or where torch's own Python code issued it, the innermost line outside torch."""
    import torch

    torch_dir = str(Path(torch.__file__).parent)
    if not filename.startswith(torch_dir) and filename.endswith(".py"):
        return _short(filename, lineno)
    for f in reversed(frames):
        if not f.filename.startswith(torch_dir) and "warnings" not in f.filename and f.filename != __file__:
            return _short(f.filename, f.lineno or 0)
    return _short(filename, lineno)


def _short(path: str, lineno: int) -> str:
    parts = Path(path).parts
    for anchor in ("hookviz", "transformers", "tests", "torch"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor) :]) + f":{lineno}"
    return f"{Path(path).name}:{lineno}"


def count(call: Any, cuda: bool = True) -> tuple[int, int, Counter[str]]:
    """(synchronisations, those at a line of hookviz, per site) of one call after a warm-up call (`cuda` False: a dry
    run of the plumbing, nothing counted)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call()
    if not cuda:
        call()
        return 0, 0, Counter()
    torch.cuda.synchronize()
    sites: Counter[str] = Counter()
    shown = warnings.showwarning

    def record(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if "synchroniz" in str(message):
            sites[_site(traceback.extract_stack()[:-1], filename, lineno)] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = shown
    torch.cuda.synchronize()
    total = sum(sites.values())
    return total, sum(n for s, n in sites.items() if s.startswith("hookviz/")), sites


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", help="import hookviz from this folder")
    parser.add_argument("--out", default="host-reads-gpu.json")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the cases, nothing counted")
    parser.add_argument("words", nargs="*")
    args = parser.parse_args()
    sys.path[:0] = [*([args.tree] if args.tree else []), str(ROOT), str(ROOT / "tests")]
    import test_host_reads as cases
    import torch

    import hookviz

    cuda = args.device != "cpu"
    cases.DEVICE = torch.device(args.device)
    name_of = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    print(f"hookviz from {Path(hookviz.__file__).parent}; torch {torch.__version__}; {name_of}")
    print("| case | synchronisations | at hookviz's lines | sites |\n|---|---:|---:|---|")
    results: dict[str, Any] = {}
    for name, build in cases.CASES.items():
        if args.words and not any(w in name for w in args.words):
            continue
        try:
            total, ours, sites = count(build(), cuda)
        except Exception as exc:  # a case that fails is reported, the others still run
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"| {name} | error | | {type(exc).__name__}: {str(exc)[:150]} |", flush=True)
            continue
        results[name] = {"syncs": total, "hookviz": ours, "sites": dict(sites)}
        where = "; ".join(f"{s} x{n}" for s, n in sites.most_common(5))
        print(f"| {name} | {total} | {ours} | {where} |", flush=True)
    Path(args.out).write_text(json.dumps({"device": name_of, "cases": results}, indent=1))


if __name__ == "__main__":
    main()
