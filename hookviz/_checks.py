"""Argument checks shared by the whole library, one definition each, so that every message reads alike: it names the
argument, what came (its type where the type is the problem) and what is expected.

Two families. `int_at_least` / `positive_int` / `number_at_least` say what the value is for in parentheses and raise
TypeError for a wrong type, ValueError for a value out of range (``steps must be >= 1 (perturbation steps), got 0``).
`int_option` / `number_option` / `bool_option` take the whole expectation as one phrase and raise one error type
(``batch_size must be an int >= 1, got 0``), as options whose type and range are one statement do. A bool is never an
int or a number here, although Python says it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import Any


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A real number (int, float, numpy scalar) that is not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def int_at_least(name: str, value: object, minimum: int, what: str) -> int:
    """`value` as an int >= `minimum`; TypeError for another type, ValueError below `minimum` (`what`: its meaning)."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int ({what}), got {type(value).__name__} {value!r}")
    if value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be >= {minimum} ({what}), got {value}")
    return value  # type: ignore[return-value]


def positive_int(name: str, value: object, what: str) -> int:
    """`int_at_least(name, value, 1, what)`: counts of steps, samples, masks."""
    return int_at_least(name, value, 1, what)


def number_at_least(name: str, value: object, minimum: float, what: str) -> float:
    """`value` as a finite float >= `minimum`; TypeError for anything else that is not a finite number."""
    if not is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise TypeError(f"{name} must be a finite number ({what}), got {value!r}")
    if value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be >= {minimum} ({what}), got {value}")
    return float(value)  # type: ignore[arg-type]


def int_option(
    name: str,
    value: object,
    expected: str,
    *,
    minimum: int | None = 1,
    optional: bool = False,
    error: type[Exception] = ValueError,
) -> Any:
    """`value` if it is an int >= `minimum` (or None when `optional`), else ``error("{name} must be {expected}, got
    {value!r}")``."""
    if value is None and optional:
        return None
    if not is_int(value) or (minimum is not None and value < minimum):  # type: ignore[operator]
        raise error(f"{name} must be {expected}, got {value!r}")
    return value


def number_option(
    name: str,
    value: object,
    expected: str,
    ok: Callable[[Any], bool] = lambda v: True,
    *,
    optional: bool = False,
    error: type[Exception] = ValueError,
) -> Any:
    """`value` if it is a number for which `ok` holds (or None when `optional`), else ``error("{name} must be
    {expected}, got {value!r}")``."""
    if value is None and optional:
        return None
    if not is_number(value) or not ok(value):
        raise error(f"{name} must be {expected}, got {value!r}")
    return value


def bool_option(name: str, value: object, expected: str = "a bool", *, optional: bool = False) -> Any:
    """`value` if it is True or False (or None when `optional`), else ``TypeError("{name} must be {expected}, got
    {type}")``."""
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
