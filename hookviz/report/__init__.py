"""Static HTML reports (no server, no CDN): `report` over a data set's explanations, `report_generation` over the
explanations of a file of prompts (``gendata``: its data; ``generation``: the function).

``stores``: reading and checking the stores; ``sources``: the items' images, labels and files; ``scores``:
per-item metrics and the summary; ``thumbnails`` and ``mapdata``: the files the pages show; ``pages``: the HTML;
``output``: the output folder; ``build``: `report` itself; ``concepts``: `report_concepts`, the pages of
concept-based results (TCAV, CRP); ``features``: `report_features`, the pages of an SAE's latents over a data
set. The page's own script and style are in ``assets/``.
"""

from .build import report
from .concepts import CRPConcept, report_concepts
from .features import report_features
from .generation import report_generation

__all__ = ["CRPConcept", "report", "report_concepts", "report_features", "report_generation"]
