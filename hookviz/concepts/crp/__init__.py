"""CRP, Concept Relevance Propagation (Achtibat et al., 2023, Nature Machine Intelligence 5): relevance conditioned on
channels, neurons or heads (`crp`, `conditions`), a concept's children (`graph`), RelMax / ActMax reference examples
over a data set (`relmax`), their figures (`figures`)."""

from .conditions import Heads
from .crp import CRP
from .figures import concept_relevance_figure, conditional_figure
from .graph import Children
from .relmax import ReferenceExamples, TopK, relmax

__all__ = [
    "CRP",
    "Children",
    "Heads",
    "ReferenceExamples",
    "TopK",
    "concept_relevance_figure",
    "conditional_figure",
    "relmax",
]
