"""Headless Chromium (Debian's ``chromium``) for the reports' browser tests (driven by Playwright's Python API) and
for benchmarks/bench_report*.py.

Nothing is downloaded: Playwright launches the system Chromium by its path, `CHROMIUM` (``HOOKVIZ_CHROMIUM`` or
``/usr/bin/chromium``). A test module calls `require` after its imports: without Playwright or Chromium it is
skipped, saying why. The fixtures `playwright` and `browser` (tests/conftest.py) start them per module: one
Playwright per process at a time, a second one refuses to start inside the first.
"""

from __future__ import annotations

import os
import shutil

CHROMIUM = os.environ.get("HOOKVIZ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# the machine's closed network refuses Chromium's background connections; these flags keep it from trying
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require() -> None:
    """Skip the calling test module (at its import) without Playwright or without Chromium."""
    import pytest

    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])")
    if not os.path.isfile(CHROMIUM):
        pytest.skip(
            f"no Chromium at {CHROMIUM!r}: install Debian's chromium (apt-get install -y chromium) or set "
            "HOOKVIZ_CHROMIUM",
            allow_module_level=True,
        )
