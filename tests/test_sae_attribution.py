"""latent_attribution (issue 37, part 5): with the metric linear after the SAE, the latents' and error's effects add
up to the metric's change exactly, and attribution patching equals exact activation patching."""

from __future__ import annotations

import pytest
import torch
from test_sae_splice import setup

import hookviz as hv
from hookviz.features import SAE, latent_attribution, splice


def metric(out: torch.Tensor) -> torch.Tensor:
    """A logit difference at the last position: linear in the block's output (the head is linear on it)."""
    return out[:, -1, 2] - out[:, -1, 0]


# float32: metrics of size ~1 summed over 7 positions x 16 latents; rounding measured ~1e-6
TOL = 1e-5


def test_attribution_patching_is_exact_for_a_linear_metric() -> None:
    model, sae, clean = setup()
    corrupted = torch.randn_like(clean)
    res = latent_attribution(model, clean, {"block": sae}, metric, method="patching", corrupted=corrupted)
    with torch.no_grad():
        m_clean, m_corr = metric(model(clean)), metric(model(corrupted))
    assert torch.allclose(res.metric, m_clean, atol=TOL, rtol=0)
    assert torch.allclose(res.baseline, m_corr, atol=TOL, rtol=0)
    assert res.latents["block"].shape == (5, 7, 16) and res.errors["block"].shape == (5, 7)
    # the latents' effects plus the error's: m(corrupted) - m(clean)
    assert torch.allclose(res.total("block"), m_corr - m_clean, atol=TOL, rtol=0)
    # each latent patched alone (at every position) from the corrupted run: the exact change equals its effect
    with torch.no_grad(), splice(model, {"block": sae}) as spliced:
        model(corrupted)
        f_corr = spliced.latents["block"].clone()
        e_corr = spliced.errors["block"].clone()
        site = spliced.latent_site("block")
        for i in range(16):
            # (a function of one argument: intervene passes the call index to a second positional parameter)
            patch = _patcher(f_corr, i)
            with hv.intervene(model, {site: patch}):
                exact = metric(model(clean)) - m_clean
            assert torch.allclose(res.latents["block"][..., i].sum(1), exact, atol=TOL, rtol=0), i
        # the error node patched alone
        with hv.intervene(model, {spliced.error_site("block"): lambda e: e_corr}):
            exact = metric(model(clean)) - m_clean
        assert torch.allclose(res.errors["block"].sum(1), exact, atol=TOL, rtol=0)


def _patcher(source: torch.Tensor, i: int):
    def patch(f: torch.Tensor) -> torch.Tensor:
        f = f.clone()
        f[..., i] = source[..., i]
        return f

    return patch


def test_integrated_gradients_and_gradient_x_activation_complete() -> None:
    model, sae, clean = setup(act="topk")
    corrupted = torch.randn_like(clean)
    with torch.no_grad():
        m_clean, m_corr = metric(model(clean)), metric(model(corrupted))
    ig = latent_attribution(model, clean, {"block": sae}, metric, method="integrated_gradients", corrupted=corrupted)
    assert torch.allclose(ig.total("block"), m_clean - m_corr, atol=TOL, rtol=0)
    ap = latent_attribution(model, clean, {"block": sae}, metric, method="patching", corrupted=corrupted)
    # a constant gradient: IG (clean - baseline) is minus attribution patching (corrupted - clean), latent by latent
    assert torch.allclose(ig.latents["block"], -ap.latents["block"], atol=1e-6, rtol=0)
    gx = latent_attribution(model, clean, {"block": sae}, metric, method="gradient")
    # against the zero baseline f = 0, e = 0, where the block's output is decode(0) = b_dec
    with torch.no_grad():
        h0 = sae.b_dec.expand(5, 7, 6)
        m_zero = metric(model.head(h0))
    assert torch.allclose(gx.total("block"), m_clean - m_zero, atol=TOL, rtol=0)
    ig0 = latent_attribution(model, clean, {"block": sae}, metric, method="integrated_gradients", steps=4)
    assert torch.allclose(ig0.latents["block"], gx.latents["block"], atol=1e-6, rtol=0)


def test_two_layers_gradient_reaches_the_lower_latents_as_in_the_original_model() -> None:
    """∂m/∂f at the lower layer (embed) equals W_dec times ∂m/∂(embed output) of the original model: the upper
    splice passes gradients as the original layer does."""
    model, sae, clean = setup()
    low = SAE(6, 10, "relu")
    with torch.no_grad():
        for p in low.parameters():
            p.normal_(0, 0.5)
    res = latent_attribution(model, clean, {"embed": low, "block": sae}, metric, method="gradient")
    h = model.embed(clean).detach().requires_grad_()
    (g,) = torch.autograd.grad(metric(model.head(model.block(h))).sum(), h)
    with torch.no_grad():
        f_low = low.encode(h)
    expected = f_low * (g @ low.W_dec.T)
    assert torch.allclose(res.latents["embed"], expected, atol=1e-6, rtol=0)


def test_refusals() -> None:
    model, sae, clean = setup()
    with pytest.raises(ValueError, match="needs corrupted"):
        latent_attribution(model, clean, {"block": sae}, metric, method="patching")
    with pytest.raises(ValueError, match="one score per input"):
        latent_attribution(model, clean, {"block": sae}, lambda out: out.sum())
    with pytest.raises(ValueError, match="method must be one of"):
        latent_attribution(model, clean, {"block": sae}, metric, method="ig")
