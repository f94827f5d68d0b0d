"""Progress bars: tqdm (a runtime dependency) behind one function, so every bar of the library looks and closes
alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar over `iterable` (or a manual one with ``total=``); with ``enabled=False`` it draws nothing, iterates
    `iterable` as it is, and its ``update``/``set_description``/``close`` do nothing, so callers need no branches."""
    return tqdm(iterable, disable=not enabled, **options)
