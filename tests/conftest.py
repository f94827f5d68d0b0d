"""Session checks: under ``HOOKVIZ_REQUIRE_REFS=1`` (``.ci/run``) every reference library must be importable."""

from __future__ import annotations

import importlib

import pytest
from refs import REFERENCE_LIBRARIES, required

from hookviz.zoo import shapes_image


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


# the CLI tests' two image files and spy on grid (tests/test_cli.py, tests/test_cli_models.py)
@pytest.fixture
def images(tmp_path) -> list[str]:
    """Two small local image files (png and jpg) written by the test."""
    a, b = tmp_path / "a.png", tmp_path / "b.jpg"
    shapes_image(72, seed=1).save(a)
    shapes_image(72, seed=2).save(b)
    return [str(a), str(b)]


@pytest.fixture
def grids(monkeypatch) -> list:
    """Every figure `hookviz explain` draws, with the arguments it passed to grid."""
    import hookviz.figures as figures

    drawn = []
    real = figures.grid

    def spy(*args, **kwargs):
        fig = real(*args, **kwargs)
        drawn.append((fig, kwargs))
        return fig

    monkeypatch.setattr(figures, "grid", spy)
    return drawn


# the reports' browser tests (tests/chromium.py: they skip themselves without Playwright or Chromium): one Playwright
# per module (a second one refuses to start inside the first), and its headless Chromium
@pytest.fixture(scope="module")
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright):
    from chromium import CHROMIUM, FLAGS

    b = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
    try:
        yield b
    finally:
        b.close()
