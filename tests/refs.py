"""Reference libraries of the dev extra (captum, Quantus, SciPy) for the tests that compare against them.

Only a comparison that touches a reference library depends on it: without the library that one test skips, and the
hand-computed and float64-reference tests of the same file still run. Under ``HOOKVIZ_REQUIRE_REFS=1`` (set by
``.ci/run``) a missing reference library fails the test instead, so CI cannot go green on skipped comparisons.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

import pytest

# what the dev extra of setup.cfg installs for the comparisons and the ecosystems tested against; tests/conftest.py
# checks them all under CI, so no test file that imports one of them can skip there
REFERENCE_LIBRARIES = (
    "captum.attr",
    "quantus",
    "scipy.ndimage",
    "scipy.stats",
    "zennit",  # LRP against zennit (test_lrp)
    "lxt",  # AttnLRP / CP-LRP against lxt 2.1 (test_attnlrp)
    "shap",  # ShapleyValues / KernelShap against shap's Exact and Kernel explainers (test_shapley)
    "lucent.optvis.param",  # feature visualisation against lucent (test_featurevis)
    "timm",  # the architectures (test_layouts, test_arch_sweep)
    "transformers",  # Hugging Face outputs and the HF Trainer callback
    "accelerate",  # the HF Trainer needs it (TrainingArguments raises ImportError without it)
    "lightning.pytorch",  # the Lightning callbacks
    "tensorboard",  # the callbacks' event files
    "playwright.sync_api",  # the report in a real browser
)


def required() -> bool:
    return os.environ.get("HOOKVIZ_REQUIRE_REFS", "") == "1"


def require(name: str) -> ModuleType:
    """The module `name`; without it the calling test skips, or fails under ``HOOKVIZ_REQUIRE_REFS=1``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"the reference library {name} is missing ({exc}); install the dev extra: pip install -e '.[dev]'"
        if required():
            pytest.fail(f"{message} (HOOKVIZ_REQUIRE_REFS=1: comparisons may not be skipped)", pytrace=False)
        pytest.skip(message)


class reference:  # noqa: N801 (used like a module: captum_attr.Saliency)
    """A module imported when a test first uses it (`require`), so that only the tests that use it depend on it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            # pytest's collection probes module globals for private markers (fixtures, ...): importing here would
            # skip the whole module, which is what this proxy exists to avoid
            raise AttributeError(attr)
        return getattr(require(self._name), attr)
