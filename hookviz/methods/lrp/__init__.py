"""Layer-wise Relevance Propagation: rules, composites, run-time canonization, the relevance audit, `LRP`."""

from .audit import AuditEntry, RelevanceAudit
from .composites import COMPOSITES, Composite, composite
from .lrp import LRP
from .rules import RULES, AlphaBeta, Epsilon, Flat, Gamma, Gradient, Norm, Pass, Rule, WSquare, ZBox, ZPlus, stabilize

__all__ = [
    "COMPOSITES",
    "LRP",
    "RULES",
    "AlphaBeta",
    "AuditEntry",
    "Composite",
    "Epsilon",
    "Flat",
    "Gamma",
    "Gradient",
    "Norm",
    "Pass",
    "RelevanceAudit",
    "Rule",
    "WSquare",
    "ZBox",
    "ZPlus",
    "composite",
    "stabilize",
]
