"""Session checks: under ``HOOKVIZ_REQUIRE_REFS=1`` (``.ci/run``) every reference library must be importable."""

from __future__ import annotations

import importlib

import pytest
from refs import REFERENCE_LIBRARIES, required


def pytest_sessionstart(session: pytest.Session) -> None:
    if not required():
        return
    missing = []
    for name in REFERENCE_LIBRARIES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if missing:
        raise pytest.UsageError(
            f"HOOKVIZ_REQUIRE_REFS=1 but reference libraries of the dev extra are missing: {', '.join(missing)}; "
            "install them with pip install -e '.[dev]'"
        )
