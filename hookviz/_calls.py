"""Call counting: a module called several times in one forward pass gets one key per call (``name``, ``name#1``, ...).

Shared by the recorders and GradientFlow, which key what they keep by call, not by hook order."""

from __future__ import annotations

from typing import Any


class CallCounter:
    """Per-forward call counts of each module name, turned into keys (``name`` for the first call, ``name#i`` after)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def reset(self, *_: Any) -> None:
        """Forget the counts (at the start of each forward pass; takes and ignores hook arguments)."""
        self.counts.clear()

    def key(self, name: str) -> str:
        """The key of this call of module `name`, counting it."""
        i = self.counts.get(name, 0)
        self.counts[name] = i + 1
        return name if i == 0 else f"{name}#{i}"
