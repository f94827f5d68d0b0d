"""Command line: ``hookviz demo`` explains fresh shapes images with the embedded trained model; ``hookviz explain``
writes a grid figure; ``hookviz explain-dataset`` stores the maps of a data set; ``hookviz evaluate`` prints a
methods x metrics table.

Mistakes on the command line (an unknown method or model, a missing file, a bad target) end with exit code 2 and
one line on stderr, ``hookviz explain: error: ...``, never a traceback.

One file per concern: ``app.py`` (the parser and ``main``), ``models.py`` (loading ``--model``), one file per
command (``demo.py``, ``explain.py``, ``dataset.py`` for explain-dataset, ``evaluate.py``) and ``common.py`` (what
they share). The console script is ``hookviz = hookviz.cli:main``; ``python -m hookviz.cli`` runs the same.
"""

from .app import main
from .common import UsageError

__all__ = ["UsageError", "main"]
