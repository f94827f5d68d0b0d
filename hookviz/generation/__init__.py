"""Explain what a causal language model generates: every generated token back to the prompt and to the tokens
generated before it, from one forward pass over prompt and continuation (`explain_generation`), as a
`GenerationExplanation`."""

from .attribute import METHODS
from .explain import explain_generation
from .explanation import GenerationExplanation
from .scores import SCORES, STEP_SCORES

__all__ = ["METHODS", "SCORES", "STEP_SCORES", "GenerationExplanation", "explain_generation"]
