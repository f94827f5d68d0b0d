"""Sparse autoencoders (`SAE`) on any layer: training on activations streamed through hooks (`train_sae`),
evaluation (`evaluate_sae`), splicing into the model with the error term (`splice`), attribution to latents
(`latent_attribution`), edges between the latents of two spliced layers (`latent_edges`) and steering (`steer`,
`ablate_latent`, `scale_latent`)."""

from .attribution import LatentAttribution, latent_attribution
from .circuit import LatentEdges, latent_edges
from .evaluate import SAEEvaluation, evaluate_sae
from .sae import ACTIVATIONS, SAE, SAEConfigError
from .splice import SAESite, Spliced, splice
from .steer import ablate_latent, scale_latent, steer
from .train import SAETraining, train_sae

__all__ = [
    "ACTIVATIONS",
    "LatentAttribution",
    "LatentEdges",
    "SAE",
    "SAEConfigError",
    "SAEEvaluation",
    "SAESite",
    "SAETraining",
    "Spliced",
    "ablate_latent",
    "evaluate_sae",
    "latent_attribution",
    "latent_edges",
    "scale_latent",
    "splice",
    "steer",
    "train_sae",
]
