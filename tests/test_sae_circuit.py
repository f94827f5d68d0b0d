"""latent_edges (issue 37, part 5): edges between the latents of two spliced layers on a linear toy, where every
edge is known by hand (Marks et al. 2024, §2: ∂m/∂f_b · ∂f_b/∂f_a · f_a)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookviz as hv
from hookviz.features import SAE, latent_edges


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 5), nn.Linear(5, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)))


def _setup() -> tuple[Toy, SAE, SAE]:
    torch.manual_seed(0)
    model = Toy().eval()
    up, down = SAE(5, 6, "relu"), SAE(4, 7, "relu")
    with torch.no_grad():
        for sae in (up, down):
            # positive pre-activations everywhere: the ReLU is the identity here, so everything is linear
            sae.b_enc.fill_(20.0)
            sae.b_dec.normal_()
    return model, up, down


def metric(out: torch.Tensor) -> torch.Tensor:
    return out[..., 2].reshape(out.shape[0], -1).sum(1)


@pytest.mark.parametrize("shape", [(1, 4), (1, 3, 4)])
def test_edges_equal_the_hand_computed_ones(shape: tuple[int, ...]) -> None:
    model, up, down = _setup()
    x = torch.randn(shape)
    got = latent_edges(model, {"a": up, "b": down}, x, metric, "a", "b")
    with torch.no_grad():
        x_a = model.a(x)
        f_a = up.encode(x_a)
        e_a = x_a - up.decode(f_a)
        f_b = down.encode(model.b(x_a))
        assert (f_a > 0).all() and (f_b > 0).all()
        g = down.W_dec @ model.head.weight[2]  # ∂m/∂f_b[j] at every position: (7,)
        through = model.b.weight.T @ down.W_enc  # ∂f_b/∂x_a: (5, 7)
        jac = up.W_dec @ through  # ∂f_b[j]/∂f_a[i]: (6, 7)
        rows = f_a.reshape(-1, 6)  # positions (and inputs) on one axis
        want = (rows.sum(0)[:, None] * jac) * g[None, :]
        want_err = (e_a.reshape(-1, 5).sum(0) @ through) * g
        nodes = (f_b.reshape(-1, 7).sum(0)) * g
    assert torch.equal(got.kept, torch.arange(7))
    assert got.edges.shape == (6, 7) and got.error_edges.shape == (7,)
    torch.testing.assert_close(got.edges, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.error_edges, want_err, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.nodes, nodes, atol=1e-5, rtol=1e-5)
    # the edges into a latent plus its error edge: its effect less what the biases carry (linear: exact)
    bias = ((up.b_dec - 0) @ through) * g * (x_a.numel() // 5)
    torch.testing.assert_close(got.edges.sum(0) + got.error_edges + bias, nodes - _const(model, up, down, g, x_a))
    top = got.top(3)
    assert len(top) == 3 and abs(top[0][2]) == float(got.edges.abs().max())


def _const(model: Toy, up: SAE, down: SAE, g: torch.Tensor, x_a: torch.Tensor) -> torch.Tensor:
    """The part of each downstream node's effect that no upstream node carries: b's bias and the SAE's biases."""
    positions = x_a.numel() // 5
    with torch.no_grad():
        c = (model.b.bias - down.b_dec) @ down.W_enc + down.b_enc
        return c * g * positions


def test_kept_latents_and_bad_layers() -> None:
    model, up, down = _setup()
    x = torch.randn(1, 4)
    full = latent_edges(model, {"a": up, "b": down}, x, metric, "a", "b")
    some = latent_edges(model, {"a": up, "b": down}, x, metric, "a", "b", downstream_latents=[5, 1])
    torch.testing.assert_close(some.edges, full.edges[:, [5, 1]])
    assert torch.equal(some.kept, torch.tensor([5, 1]))
    with pytest.raises(KeyError, match="not in saes"):
        latent_edges(model, {"a": up, "b": down}, x, metric, "a", "c")
    with pytest.raises(IndexError, match="out of range"):
        latent_edges(model, {"a": up, "b": down}, x, metric, "a", "b", downstream_latents=[7])
    # the model comes back as it was
    assert not any(n.endswith("sae_latents") for n, _ in model.named_modules())
    assert all(p.requires_grad for p in model.parameters())
    assert hv.latent_edges is latent_edges
