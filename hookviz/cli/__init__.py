"""The ``hookviz`` command line (the console script ``hookviz = hookviz.cli:main``)."""

from .main import main

__all__ = ["main"]
