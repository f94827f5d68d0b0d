"""Display options of an `Explanation` (``DISPLAY_KEYS``): their checks, their fallbacks, and how a call's options,
the method's display defaults and the fallbacks combine (see `hookviz.explanation`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import display as _display
from ._checks import bool_option, int_option, is_number

DISPLAY_KEYS = (
    "reduce",
    "mode",
    "cmap",
    "overlay",
    "sign",
    "scale",
    "alpha",
    "alpha_by_map",
    "percentile",
    "max_rows",
)
# what an option falls back to when neither the call nor the method's display defaults set it; "reduce" has no entry:
# without one, maps keep their channels (and 1-channel views reduce with "max-abs"), and "percentile" None means
# the mode's own default (hookviz.display.DEFAULT_PERCENTILE)
_FALLBACKS: dict[str, Any] = {
    "mode": "minmax",
    "cmap": "jet",
    "overlay": True,
    "sign": "all",
    "scale": "sample",
    "alpha": 0.5,
    "alpha_by_map": False,
    "percentile": None,
    "max_rows": 8,
}


class _UnsetType:
    """Sentinel type: "argument not given", distinct from an explicit None."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _UnsetType()


def _check_option(key: str, value: Any, name: str) -> None:
    """Check one display option; ``name`` is how the message calls it (``display['mode']`` or ``mode``).

    None is accepted for every key: "use the default" (for ``reduce``: keep the channels).
    """
    if value is None:
        return
    choices = {
        "reduce": _display.REDUCTIONS,
        "mode": _display.NORMALIZATIONS,
        "sign": _display.SIGNS,
        "scale": _display.SCALES,
    }
    if key in choices:
        if value not in choices[key]:
            extra = " or None" if key == "reduce" else ""
            raise ValueError(f"{name} must be one of {choices[key]}{extra}, got {value!r}")
    elif key == "cmap":
        if not isinstance(value, str):
            raise TypeError(f"{name} must be the name of a matplotlib colour map (str), got {type(value).__name__}")
    elif key in ("overlay", "alpha_by_map"):
        bool_option(name, value)
    elif key == "alpha":
        if not is_number(value) or not 0 <= value <= 1:
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    elif key == "percentile":
        if not is_number(value) or not 0 < value <= 100:
            raise ValueError(f"{name} must be a number in (0, 100] or None, got {value!r}")
    elif key == "max_rows":
        int_option(name, value, "a positive int")


def _check_overrides(options: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(options) - set(DISPLAY_KEYS))
    if unknown:
        raise TypeError(f"{where}() got unknown display option(s) {unknown}; expected among {DISPLAY_KEYS}")
    for key, value in options.items():
        _check_option(key, value, key)


def resolve_options(display: Mapping[str, Any], where: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Effective display options: the call's `given` (not None / unset) over `display` over the fallbacks; `where`
    names the call in error messages."""
    given = {k: v for k, v in given.items() if not isinstance(v, _UnsetType) and (v is not None or k == "reduce")}
    _check_overrides(given, where)
    out = dict(_FALLBACKS)
    out["reduce"] = display.get("reduce")
    out.update({k: v for k, v in display.items() if v is not None})
    out.update(given)
    return out
