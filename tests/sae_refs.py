"""Reference SAEs for the tests of hookviz.features (issue 37)."""

from __future__ import annotations

import torch

from hookviz.features import SAE


def identity_sae(d_in: int) -> SAE:
    """x̂ = x exactly: W_enc = [I, -I] (d_in, 2 d_in), W_dec = [I; -I] (2 d_in, d_in), zero biases, ReLU. Latent i
    reads relu(x_i), latent d_in + i reads relu(-x_i), and x̂_i = relu(x_i) - relu(-x_i) = x_i: the sum adds exact
    zeros, so the reconstruction is bit for bit x."""
    sae = SAE(d_in, 2 * d_in, "relu")
    eye = torch.eye(d_in)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae
