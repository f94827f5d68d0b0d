"""Steering and ablation with an SAE's decoder directions, as `intervene` edits of the layer the SAE reads.

- ``steer(sae, i, c)``: a -> a + c W_dec[i] (add latent i's decoder direction, Templeton et al. 2024, "Scaling
  Monosemanticity": feature steering);
- ``scale_latent(sae, i, s)``: a -> a + (s - 1) f_i(a) W_dec[i] (latent i's contribution scaled, the rest of the
  activation, the SAE's error included, kept);
- ``ablate_latent(sae, i)``: ``scale_latent(sae, i, 0)``, a -> a - f_i(a) W_dec[i].

Each is a function of the activation for ``hv.intervene(model, {layer: edit})``, so it acts on every forward inside
the block, a generation's included. The feature axis is the last one, or axis 1 of a 4-D (N, C, H, W) activation.
Inside `splice`, the latent sites give the same edits on f itself (e.g. ``zero(channels=[i])`` on
``"{layer}.sae_latents"``).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from .._checks import is_number
from .sae import SAE

__all__ = ["ablate_latent", "scale_latent", "steer"]


def _direction(sae: SAE, latent: int, a: Tensor) -> tuple[Tensor, bool]:
    channels_first = a.dim() == 4
    width = a.shape[1] if channels_first else a.shape[-1]
    if width != sae.d_in:
        raise ValueError(f"the SAE reads width d_in = {sae.d_in}, but the edited activation has shape {tuple(a.shape)}")
    return sae.W_dec[latent].detach().to(a.dtype), channels_first


def _along(d: Tensor, a: Tensor, channels_first: bool) -> Tensor:
    return d.view(-1, 1, 1) if channels_first else d


def steer(sae: SAE, latent: int, coefficient: float) -> Callable[[Tensor], Tensor]:
    """An edit adding ``coefficient * W_dec[latent]`` to the activation at every position."""
    if not isinstance(sae, SAE):
        raise TypeError(f"sae must be a hookviz.features.SAE, got {type(sae).__name__}")
    sae.check_latent(latent)
    if not is_number(coefficient):
        raise TypeError(f"coefficient must be a number, got {coefficient!r}")

    def edit(a: Tensor) -> Tensor:
        d, cf = _direction(sae, latent, a)
        return a + coefficient * _along(d, a, cf)

    return edit


def scale_latent(sae: SAE, latent: int, factor: float) -> Callable[[Tensor], Tensor]:
    """An edit scaling latent `latent`'s contribution f_i W_dec[i] by `factor` (0: ablation)."""
    if not isinstance(sae, SAE):
        raise TypeError(f"sae must be a hookviz.features.SAE, got {type(sae).__name__}")
    sae.check_latent(latent)
    if not is_number(factor):
        raise TypeError(f"factor must be a number, got {factor!r}")

    def edit(a: Tensor) -> Tensor:
        d, cf = _direction(sae, latent, a)
        x = a.movedim(1, -1) if cf else a
        f_i = sae.encode(x.to(sae.W_dec.dtype))[..., latent].to(a.dtype)
        change = (factor - 1) * f_i[..., None] * d
        return a + (change.movedim(-1, 1) if cf else change)

    return edit


def ablate_latent(sae: SAE, latent: int) -> Callable[[Tensor], Tensor]:
    """An edit removing latent `latent`'s contribution f_i W_dec[i] (the error term and the other latents kept)."""
    return scale_latent(sae, latent, 0.0)
