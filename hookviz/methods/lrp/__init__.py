"""Layer-wise Relevance Propagation: rules, composites, run-time canonization, the relevance audit, `LRP`."""

from .audit import AuditEntry, RelevanceAudit
from .composites import COMPOSITES, TRANSFORMER_COMPOSITES, Composite, composite
from .lrp import LRP
from .rules import RULES, AlphaBeta, Epsilon, Flat, Gamma, Gradient, Norm, Pass, Rule, WSquare, ZBox, ZPlus, stabilize
from .transformer import Attention, NormIdentity, Softmax, Uniform

__all__ = [
    "COMPOSITES",
    "LRP",
    "RULES",
    "TRANSFORMER_COMPOSITES",
    "AlphaBeta",
    "Attention",
    "AuditEntry",
    "Composite",
    "Epsilon",
    "Flat",
    "Gamma",
    "Gradient",
    "Norm",
    "NormIdentity",
    "Pass",
    "RelevanceAudit",
    "Rule",
    "Softmax",
    "Uniform",
    "WSquare",
    "ZBox",
    "ZPlus",
    "composite",
    "stabilize",
]
