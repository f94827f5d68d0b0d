"""Headless Chromium (Debian's ``chromium``) driven by Playwright's Python API, for the reports' browser tests.

Nothing is downloaded: Playwright launches the system Chromium by its path (``HOOKVIZ_CHROMIUM`` or
``/usr/bin/chromium``); without it, or without Playwright, the test module that imports this one is skipped, saying
why. The fixtures `playwright` and `browser` (tests/conftest.py) start them per module: one Playwright per process
at a time, a second one refuses to start inside the first.
"""

from __future__ import annotations

import os
import shutil

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])")

CHROMIUM = os.environ.get("HOOKVIZ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.isfile(CHROMIUM):
    pytest.skip(
        f"no Chromium at {CHROMIUM!r}: install Debian's chromium (apt-get install -y chromium) or set HOOKVIZ_CHROMIUM",
        allow_module_level=True,
    )
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
