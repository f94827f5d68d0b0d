"""A static HTML report over a data set's explanations (no server, no CDN): `report`.

``stores``: reading and checking the stores; ``sources``: the items' images, labels and files; ``scores``:
per-item metrics and the summary; ``thumbnails`` and ``mapdata``: the files the pages show; ``pages``: the HTML;
``output``: the output folder; ``build``: `report` itself. The page's own script and style are in ``assets/``.
"""

from .build import report

__all__ = ["report"]
