"""hv.splice (issue 37, part 4): outputs equal the original's with the error term, the identity SAE, latents read,
edited through `intervene`, used as an attribution layer; the model left as it was; the refusals."""

from __future__ import annotations

import pytest
import torch
from sae_refs import identity_sae
from torch import nn

import hookviz as hv
from hookviz.features import SAE, splice
from hookviz.hooks import hook_counts
from hookviz.interventions import zero


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Tiny(nn.Module):
    """tokens (N, T, 4) -> embed (6) -> block (residual) -> head (3): the head is linear on the block's output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.block = Block(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)))


def setup(seed: int = 0, act: str = "relu") -> tuple[Tiny, SAE, torch.Tensor]:
    torch.manual_seed(seed)
    model = Tiny().eval()
    sae = SAE(6, 16, act, k=4 if act == "topk" else None)
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.5)
    return model, sae, torch.randn(5, 7, 4)


def _structure(model: nn.Module) -> list:
    return [(n, type(m).__name__) for n, m in model.named_modules()]


@pytest.mark.parametrize("act", ["relu", "topk", "jumprelu"])
@pytest.mark.parametrize("grad", [False, True])
def test_error_term_gives_the_original_outputs_bit_for_bit(act, grad) -> None:
    model, sae, x = setup(act=act)
    with torch.no_grad():
        ref = model(x)
    with torch.set_grad_enabled(grad), splice(model, {"block": sae}) as spliced:
        out = model(x)
    # exact: the output is x + (decode(f) - decode(f)) + (e - e), and each difference is exactly zero (module
    # docstring of hookviz.features.splice); no float tolerance needed
    assert torch.equal(out, ref)
    assert spliced.latents["block"].shape == (5, 7, 16)
    with torch.no_grad():
        a = model.block(model.embed(x))
        assert torch.equal(spliced.latents["block"], sae.encode(a))
        assert torch.equal(spliced.errors["block"], a - sae.decode(sae.encode(a)))


def test_without_error_term_the_reconstruction_replaces_the_layer() -> None:
    model, sae, x = setup()
    with torch.no_grad():
        a = model.block(model.embed(x))
        ref = model.head(sae(a)[0])
        with splice(model, {"block": sae}, error_term=False):
            out = model(x)
    assert torch.equal(out, ref)


def test_identity_sae_splice_changes_nothing() -> None:
    model, _, x = setup()
    with torch.no_grad():
        ref = model(x)
        with splice(model, {"block": identity_sae(6)}, error_term=False) as spliced:
            out = model(x)
    assert torch.equal(out, ref)  # x̂ = x bit for bit (see identity_sae)
    assert torch.equal((spliced.latents["block"] != 0).sum(-1), torch.full((5, 7), 6))


def test_upstream_gradients_unchanged() -> None:
    model, sae, x = setup()
    x = x.requires_grad_()
    (g_ref,) = torch.autograd.grad(model(x).sum(), x)
    with splice(model, {"block": sae}):
        (g,) = torch.autograd.grad(model(x).sum(), x)
    # the two paths through the SAE (decode(f') and -decode(f)) cancel: equal up to float32 rounding of the sums of
    # their contributions (measured max |diff| ~1e-7 on gradients of size ~1)
    assert torch.allclose(g, g_ref, atol=1e-6, rtol=0)


def test_latents_edited_through_intervene() -> None:
    """Zeroing latent 3 changes the logits by exactly -f_3 W_dec[3] through the linear head."""
    model, sae, x = setup()
    with torch.no_grad(), splice(model, {"block": sae}) as spliced:
        site = spliced.latent_site("block")
        assert site == "block.sae_latents"
        ref = model(x)
        f3 = spliced.latents["block"][..., 3].clone()
        with hv.intervene(model, {site: zero(channels=[3])}) as done:
            out = model(x)
        assert done.fired[site] == 1
        assert torch.equal(spliced.latents["block"][..., 3], torch.zeros(5, 7))
    expected = ref - f3[..., None] * (sae.W_dec[3] @ model.head.weight.T)
    # float32: a 6-term dot product and a sum of terms of size ~1, rounding ~1e-6
    assert torch.allclose(out, expected, atol=1e-5, rtol=0)


def test_error_node_edited_through_intervene() -> None:
    model, sae, x = setup()
    with torch.no_grad():
        a = model.block(model.embed(x))
        ref = model.head(sae(a)[0])
        with splice(model, {"block": sae}) as spliced:
            with hv.intervene(model, {spliced.error_site("block"): lambda e: torch.zeros_like(e)}):
                out = model(x)
    # x + (x̂ - x̂) + (0 - e) = x - e = x̂ up to float32 rounding of |x| ~ 1
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)


def test_latents_as_an_attribution_layer() -> None:
    """Saliency at the latents: for a logit linear in the latents (head after the layer), the gradient is
    head.weight[target] @ W_dec^T at every position, whatever the input."""
    model, sae, x = setup()
    with splice(model, {"block": sae}) as spliced:
        method = hv.Saliency(model, layer=spliced.latent_site("block"))
        attr = method.attribute(x, target=lambda out: out[:, -1, 2])  # the last position's logit 2
    expected = (sae.W_dec @ model.head.weight[2]).detach()
    assert attr.shape == (5, 7, 16)
    # the gradient at a layer (signed): W_dec head.weight[2] at the last position, zero at the others (the head
    # does not mix positions); float32 rounding of 6-term dot products
    assert torch.allclose(attr[:, -1], expected.expand(5, 16), atol=1e-6, rtol=0)
    assert torch.equal(attr[:, :-1], torch.zeros(5, 6, 16))


def test_model_left_as_it_was_also_on_error() -> None:
    model, sae, x = setup()
    before = _structure(model)
    with torch.no_grad():
        ref = model(x)
    with pytest.raises(RuntimeError, match="boom"), splice(model, {"block": sae}):
        assert any(n == "block.sae_latents" for n, _ in model.named_modules())
        raise RuntimeError("boom")
    assert _structure(model) == before
    assert all(v == 0 for v in hook_counts(model).values())
    assert all(p.requires_grad for p in sae.parameters())
    with torch.no_grad():
        assert torch.equal(model(x), ref)


def test_cnn_layer_channels_first() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.Conv2d(5, 2, 1))
    holder = nn.Module()  # a module of one's own above the Sequential: the sites need a non-Sequential owner
    holder.net = model
    holder.forward = lambda x: model(x)  # type: ignore[method-assign]
    sae = SAE(5, 12, "topk", k=3)
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        ref = model(x)
        with splice(holder, {"net.1": sae}) as spliced:
            out = model(x)
            assert spliced.latent_site("net.1") == "net.1.sae_latents"
        assert torch.equal(out, ref)
        assert spliced.latents["net.1"].shape == (2, 12, 4, 4)  # latents in the layer's layout (N, d_sae, H, W)
        # a Sequential's forward runs every child: its sites hang on the closest module above that is not one
        with splice(holder, {"net": SAE(2, 4)}) as spliced:
            assert torch.equal(holder(x), ref)
            assert spliced.latent_site("net") == "net_sae_latents"
        assert [n for n, _ in holder.named_modules()] == ["", "net", "net.0", "net.1", "net.2"]


def test_refusals() -> None:
    model, sae, x = setup()
    with pytest.raises(ValueError, match="matches no module"), splice(model, {"blok": sae}):
        pass
    with (
        pytest.raises(ValueError, match=r"d_in = 6, but 'head' \(Linear\) outputs width 3"),
        splice(model, {"head": sae}),
    ):
        pass
    wide = SAE(7, 8)
    # the block's width is unknown before a forward: refused at the first forward, before its output changes
    with pytest.raises(ValueError, match="d_in = 7"), splice(model, {"block": wide}):
        model(x)
    assert all(v == 0 for v in hook_counts(model).values())
    with torch.no_grad(), splice(model, {"block": sae}) as spliced:
        with (
            pytest.raises(ValueError, match="index 16 is out of range"),
            hv.intervene(model, {spliced.latent_site("block"): zero(channels=[16])}),
        ):
            model(x)
    with pytest.raises(IndexError, match="out of range"):
        sae.check_latent(16)
    with pytest.raises(TypeError, match="must be a hookviz.features.SAE"), splice(model, {"block": nn.Linear(6, 6)}):
        pass
