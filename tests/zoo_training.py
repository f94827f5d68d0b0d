"""The check every zoo training test starts with: train twice from the CLI, the same bytes whatever the file's name."""

from __future__ import annotations

import hashlib
from pathlib import Path

import safetensors.torch
from torch import Tensor

from hookviz import zoo


def trained_twice(tmp_path: Path, capsys, args: list[str], fresh: str) -> tuple[Path, dict[str, Tensor]]:
    """Train with `args` into two files; assert the printed sha256 and fresh-split line (`fresh`, e.g. "16 images")
    and byte-equal files; return the first file and its state dict."""
    out = tmp_path / "first.safetensors"
    assert zoo.main(["--out", str(out), *args]) == 0
    printed = capsys.readouterr().out
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    assert f"sha256 {sha}" in printed and f"accuracy on a fresh split ({fresh}, seed 0):" in printed
    again = tmp_path / "sub" / "other.safetensors"
    assert zoo.main(["--out", str(again), *args]) == 0
    assert again.read_bytes() == out.read_bytes()  # seeded: the same bytes, whatever the file's name
    return out, safetensors.torch.load_file(out)
