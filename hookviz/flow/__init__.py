"""GradientFlow as a package (being split: see monitor.py)."""

from .monitor import *  # noqa: F403
from .monitor import _COMPILED, _compiled, _grad_stats, _Scratch, __all__  # noqa: F401
