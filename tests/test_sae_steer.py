"""Steering and ablation through intervene (issue 37, part 6): the output changes by exactly the decoder direction
times the coefficient, carried through a linear head."""

from __future__ import annotations

import pytest
import torch
from test_sae_splice import setup

import hookviz as hv
from hookviz.features import ablate_latent, scale_latent, splice, steer
from hookviz.interventions import zero

# float32: logits of size ~1 and 6-term dot products, rounding ~1e-6
TOL = 1e-5


def test_steer_adds_the_decoder_direction() -> None:
    model, sae, x = setup()
    with torch.no_grad():
        ref = model(x)
        with hv.intervene(model, {"block": steer(sae, 3, 2.5)}):
            out = model(x)
        expected = ref + 2.5 * (sae.W_dec[3] @ model.head.weight.T)
    assert torch.allclose(out, expected, atol=TOL, rtol=0)


def test_scale_and_ablate_a_latent() -> None:
    model, sae, x = setup()
    with torch.no_grad():
        ref = model(x)
        f3 = sae.encode(model.block(model.embed(x)))[..., 3]
        direction = sae.W_dec[3] @ model.head.weight.T
        with hv.intervene(model, {"block": scale_latent(sae, 3, 3.0)}):
            scaled = model(x)
        with hv.intervene(model, {"block": ablate_latent(sae, 3)}):
            ablated = model(x)
        # the same ablation on the latents of the spliced SAE (error term kept)
        with (
            splice(model, {"block": sae}) as spliced,
            hv.intervene(model, {spliced.latent_site("block"): zero(channels=[3])}),
        ):
            ablated_in_splice = model(x)
    assert torch.allclose(scaled, ref + 2.0 * f3[..., None] * direction, atol=TOL, rtol=0)
    assert torch.allclose(ablated, ref - f3[..., None] * direction, atol=TOL, rtol=0)
    assert torch.allclose(ablated, ablated_in_splice, atol=TOL, rtol=0)
    assert bool((f3 != 0).any())  # the latent fires somewhere: the check is not vacuous


def test_refusals() -> None:
    model, sae, x = setup()
    with pytest.raises(IndexError, match="out of range"):
        steer(sae, 16, 1.0)
    with pytest.raises(IndexError, match="out of range"):
        ablate_latent(sae, -1)
    with pytest.raises(ValueError, match="d_in = 6"), hv.intervene(model, {"head": steer(sae, 0, 1.0)}):
        model(x)
