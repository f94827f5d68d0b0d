"""Explain what a causal language model generates: every generated token back to the prompt and to the tokens
generated before it, from one forward pass over prompt and continuation (`explain_generation`), as a
`GenerationExplanation`; or against SAE latents (`explain_generation_latents`)."""

from .attribute import METHODS
from .explain import explain_generation
from .explanation import GenerationExplanation
from .latents import GenerationLatents, explain_generation_latents
from .scores import SCORES, STEP_SCORES

__all__ = [
    "METHODS",
    "SCORES",
    "STEP_SCORES",
    "GenerationExplanation",
    "GenerationLatents",
    "explain_generation",
    "explain_generation_latents",
]
