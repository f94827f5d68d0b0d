"""The reference libraries cannot vanish in silence: a missing one skips only its own comparisons, and fails them
under HOOKVIZ_REQUIRE_REFS=1 (what .ci/run sets)."""

from __future__ import annotations

import pytest
from refs import REFERENCE_LIBRARIES, reference, require


def test_a_missing_reference_skips_only_the_test_that_uses_it(monkeypatch) -> None:
    monkeypatch.delenv("HOOKVIZ_REQUIRE_REFS", raising=False)
    lazy = reference("hookviz_no_such_library")  # building the proxy imports nothing: the module's tests still run
    assert getattr(lazy, "_pytestfixturefunction", None) is None  # nor does pytest's collection probing it
    with pytest.raises(pytest.skip.Exception, match="reference library hookviz_no_such_library is missing"):
        lazy.Saliency  # noqa: B018
    with pytest.raises(pytest.skip.Exception, match="pip install -e '.\\[dev\\]'"):
        require("hookviz_no_such_library")


def test_a_missing_reference_fails_when_ci_requires_them(monkeypatch) -> None:
    monkeypatch.setenv("HOOKVIZ_REQUIRE_REFS", "1")
    with pytest.raises(pytest.fail.Exception, match="HOOKVIZ_REQUIRE_REFS=1: comparisons may not be skipped"):
        reference("hookviz_no_such_library").Saliency  # noqa: B018


def test_the_reference_libraries_of_the_dev_extra_are_listed() -> None:
    # the list conftest checks under CI names what setup.cfg's dev extra installs for the comparisons
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[1] / "setup.cfg").read_text(encoding="utf-8")
    dev = setup.split("dev =", 1)[1].split("\n\n", 1)[0].split("notebook =")[0]
    for name in REFERENCE_LIBRARIES:
        assert name.split(".")[0] in dev, f"{name} is checked under HOOKVIZ_REQUIRE_REFS=1 but not in the dev extra"
