"""Concepts: which human concepts a model uses, and where.

`TCAV` (Kim et al., ICML 2018): concept activation vectors trained in torch (`cav`), TCAV scores with a
significance test against random concepts (`stats`), results as a table, a dict and a figure (`result`); examples
in every form the library takes (`examples`).

`CRP` (Achtibat et al., Nature Machine Intelligence 2023): relevance conditioned on channels, neurons or heads on the
LRP engine, a concept's children, RelMax / ActMax reference examples (`crp`).
"""

from .crp import CRP, Children, Heads
from .result import ScoreStats, TCAVResult, TCAVRow
from .tcav import TCAV

__all__ = ["CRP", "Children", "Heads", "TCAV", "ScoreStats", "TCAVResult", "TCAVRow"]
