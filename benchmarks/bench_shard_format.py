"""Shard format for `explain_dataset`: safetensors (one file) against .npy (three files), write + read, with fsync.

Usage::

    python benchmarks/bench_shard_format.py [--items 1024] [--shape 3 64 64] [--repeats 5]

A shard of `items` float16 maps plus int64 targets and float32 scores is written the way `explain_dataset` writes
(temporary file, flush, fsync, atomic rename, SHA-256 of the bytes) and read back (SHA-256 of the file, then the
maps as a float32 tensor). Prints the median ms of each.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save


def durable(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1024)
    parser.add_argument("--shape", type=int, nargs="+", default=[3, 64, 64])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    tensors = {
        "maps": torch.randn(args.items, *args.shape).half(),
        "targets": torch.arange(args.items),
        "scores": torch.randn(args.items, 1),
    }
    root = Path(tempfile.mkdtemp())

    def st_write(i: int) -> None:
        data = save(tensors)
        hashlib.sha256(data).hexdigest()
        durable(root / f"s{i}.safetensors", data)

    def st_read(i: int) -> None:
        path = root / f"s{i}.safetensors"
        hashlib.sha256(path.read_bytes()).hexdigest()
        with safe_open(str(path), framework="pt") as f:
            f.get_tensor("maps").float()

    def npy_write(i: int) -> None:
        for key, t in tensors.items():
            buf = io.BytesIO()
            np.save(buf, t.numpy())
            data = buf.getvalue()
            hashlib.sha256(data).hexdigest()
            durable(root / f"n{i}.{key}.npy", data)

    def npy_read(i: int) -> None:
        for key in tensors:
            hashlib.sha256((root / f"n{i}.{key}.npy").read_bytes()).hexdigest()
        torch.from_numpy(np.array(np.load(root / f"n{i}.maps.npy", mmap_mode="r"))).float()

    for name, write, read in (("safetensors", st_write, st_read), ("npy", npy_write, npy_read)):
        w, r = [], []
        for i in range(args.repeats):
            t = time.perf_counter()
            write(i)
            w.append(1e3 * (time.perf_counter() - t))
            t = time.perf_counter()
            read(i)
            r.append(1e3 * (time.perf_counter() - t))
        med_w, med_r = statistics.median(w), statistics.median(r)
        print(f"{name}: write {med_w:.0f} ms, read {med_r:.0f} ms (median of {args.repeats})")
    for p in root.iterdir():
        p.unlink()
    root.rmdir()


if __name__ == "__main__":
    main()
