"""The seam between computing an attribution and showing it.

The methods sit below the presentation layer (`hookviz.explanation`, `hookviz.text`) and never import it: their
``visualize`` hands plain data (tensors, names, options) to the presenter registered here for the kind of result
(``"images"``, ``"tokens"``), and the presentation modules register themselves when they are imported (which
``import hookviz`` always does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_PRESENTERS: dict[str, Callable[..., Any]] = {}


def presenter(kind: str) -> Callable[[F], F]:
    """Decorator: `fn` turns results of `kind` into the object a person looks at."""

    def deco(fn: F) -> F:
        _PRESENTERS[kind] = fn
        return fn

    return deco


def present(kind: str, *args: Any, **kwargs: Any) -> Any:
    """The presenter registered for `kind`, called with the given data."""
    try:
        fn = _PRESENTERS[kind]
    except KeyError:
        raise RuntimeError(
            f"no presenter for {kind!r} results is registered: import hookviz (it loads hookviz.explanation and "
            "hookviz.text, which register themselves)"
        ) from None
    return fn(*args, **kwargs)
