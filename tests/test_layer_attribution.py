"""layer= on Saliency, InputXGradient and IntegratedGradients: captum's LayerGradientXActivation and
LayerIntegratedGradients on a text model's embedding (token ids in), layer inputs, errors before any work."""

from __future__ import annotations

import pytest
import torch
from refs import reference
from torch import nn

import hookviz as hv

captum_attr = reference("captum.attr")  # only the captum comparisons depend on it

from test_invariants import assert_same, snapshot  # noqa: E402

# few quadrature steps on purpose (the comparisons are at equal steps): the completeness warning is expected
pytestmark = pytest.mark.filterwarnings("ignore:IntegratedGradients. attributions:UserWarning")


class TinyText(nn.Module):
    """Token ids (N, T) and a (N, T) padding mask -> 2 classes: embedding, one encoder layer, masked mean, linear."""

    def __init__(self, vocab: int = 12, dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(vocab, dim)
        self.encoder = nn.TransformerEncoderLayer(dim, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.encoder(self.embedding(ids)))
        h = h * mask[..., None]
        return self.head(h.sum(1) / mask.sum(1, keepdim=True))


def tokens() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 12, (3, 6), generator=g)
    mask = torch.ones(3, 6)
    mask[1, 4:] = 0
    return ids, mask


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_left", "riemann_middle"])
def test_layer_integrated_gradients_on_the_embedding_equal_captum(method: str) -> None:
    model = TinyText()
    ids, mask = tokens()
    before = snapshot(model)
    ig = hv.IntegratedGradients(model, steps=20, method=method, layer="embedding", batch_size=13)
    got = ig.attribute(ids, target=[0, 1, 1], additional_forward_args=mask)
    want = captum_attr.LayerIntegratedGradients(model, model.embedding).attribute(
        ids, baselines=torch.zeros_like(ids), target=[0, 1, 1], additional_forward_args=(mask,), n_steps=20,
        method=method,
    )  # fmt: skip
    assert got.shape == (3, 6, 8)
    assert err(got, want) < 1e-6
    assert_same(before, model)
    assert ig.layer == "embedding" and "layer='embedding'" in repr(ig)


def test_layer_integrated_gradients_with_baseline_ids_and_k_targets() -> None:
    model = TinyText()
    ids, mask = tokens()
    base = torch.full_like(ids, 3)
    ig = hv.IntegratedGradients(model, steps=128, baseline=base, layer=model.embedding)
    got = ig.attribute(ids, target=torch.tensor([[0, 1]] * 3), additional_forward_args=mask)
    assert got.shape == (3, 2, 6, 8)
    layer_ig = captum_attr.LayerIntegratedGradients(model, model.embedding)
    for k in range(2):
        want = layer_ig.attribute(ids, baselines=base, target=k, additional_forward_args=(mask,), n_steps=128)
        assert err(got[:, k], want) < 1e-6
    # completeness: the embedding is a cut of the model, so attributions sum to f(x) - f(x')
    with torch.no_grad():
        expected = model(ids, mask) - model(base, mask)
    assert torch.allclose(got.flatten(2).sum(2), expected, atol=2e-3)
    assert torch.allclose(ig.last_delta, got.flatten(2).sum(2) - expected, atol=1e-6)


def test_layer_integrated_gradients_to_a_layer_input_equal_captum() -> None:
    model = TinyText()
    ids, mask = tokens()
    got = hv.IntegratedGradients(model, steps=12, layer="head", layer_input=True).attribute(
        ids, target=1, additional_forward_args=mask
    )
    want = captum_attr.LayerIntegratedGradients(model, model.head).attribute(
        ids, baselines=torch.zeros_like(ids), target=1, additional_forward_args=(mask,), n_steps=12,
        attribute_to_layer_input=True,
    )  # fmt: skip
    assert got.shape == (3, 8) and err(got, want) < 1e-6


@pytest.mark.parametrize("layer_input", [False, True])
def test_layer_gradient_x_activation_and_layer_gradient_equal_captum(layer_input: bool) -> None:
    model = TinyText()
    ids, mask = tokens()
    kwargs = {"target": [1, 0, 1], "additional_forward_args": mask}
    ixg = hv.InputXGradient(model, layer="norm", layer_input=layer_input).attribute(ids, **kwargs)
    sal = hv.Saliency(model, layer="norm", layer_input=layer_input).attribute(ids, **kwargs)
    ref = {"target": [1, 0, 1], "additional_forward_args": (mask,), "attribute_to_layer_input": layer_input}
    want_ixg = captum_attr.LayerGradientXActivation(model, model.norm).attribute(ids, **ref)
    want_sal = captum_attr.LayerGradientXActivation(model, model.norm, multiply_by_inputs=False).attribute(ids, **ref)
    assert ixg.shape == (3, 6, 8)
    assert err(ixg, want_ixg) < 1e-6 and err(sal, want_sal) < 1e-6


def test_layer_on_float_inputs_image_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.Linear(16, 3))
    x = torch.randn(2, 3, 6, 6)
    got = hv.IntegratedGradients(model, steps=10, layer="1").attribute(x, target=2)
    want = captum_attr.LayerIntegratedGradients(model, model[1]).attribute(x, target=2, n_steps=10)
    assert got.shape == (2, 4, 4, 4) and err(got, want) < 1e-6
    got = hv.InputXGradient(model, layer=lambda name, m: name == "2").attribute(x, target=0)
    want = captum_attr.LayerGradientXActivation(model, model[2]).attribute(x, target=0)
    assert err(got, want) < 1e-6


def test_smoothgrad_and_vargrad_over_a_layer_method() -> None:
    """Noise on the (float) inputs, attribution at the layer: the mean over copies of the layer attribution."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.randn(3, 5)
    smooth = hv.SmoothGrad(hv.Saliency(model, layer="1"), n=6, sigma=0.3, generator=torch.Generator().manual_seed(4))
    got = smooth.attribute(x, target=1)
    g = torch.Generator().manual_seed(4)
    scale = 0.3 * (x.amax(1, keepdim=True) - x.amin(1, keepdim=True))
    copies = [x + scale * torch.randn(x.shape, generator=g) for _ in range(6)]
    per_copy = [hv.Saliency(model, layer="1").attribute(c, target=1) for c in copies]
    assert got.shape == (3, 6)
    assert torch.allclose(got, torch.stack(per_copy).mean(0), atol=1e-6)


def test_visualize_on_token_ids_returns_a_token_explanation() -> None:
    model = TinyText()
    ids, mask = tokens()
    exp = hv.IntegratedGradients(model, steps=8, layer="embedding").visualize(
        ids, target=1, additional_forward_args=mask, vocab=[f"t{i}" for i in range(12)]
    )
    assert isinstance(exp, hv.TokenExplanation)
    assert exp.token_scores.shape == (3, 1, 6)
    want = hv.IntegratedGradients(model, steps=8, layer="embedding").attribute(ids, 1, additional_forward_args=mask)
    assert torch.allclose(exp.token_scores[:, 0], want.sum(-1))


# -- errors, before any work ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layer", "exc", "match"),
    [
        ("embeding", ValueError, r"layer: selector 'embeding' matches no module of TinyText"),
        (nn.Linear, ValueError, r"layer must name one module of TinyText, but the selector matches \d+: 'encoder"),
        ("encoder.*", ValueError, r"layer must name one module .* matches \d+"),
        (3, TypeError, "layer: selector must be a module name"),
    ],
    ids=["none", "several-by-type", "several-by-glob", "wrong-type"],
)
@pytest.mark.parametrize("cls", [hv.Saliency, hv.InputXGradient, hv.IntegratedGradients])
def test_layer_selector_errors(cls, layer, exc, match) -> None:
    with pytest.raises(exc, match=match):
        cls(TinyText(), layer=layer)


def test_layer_options_that_do_not_apply_raise() -> None:
    with pytest.raises(TypeError, match="GuidedBackprop does not take layer="):
        hv.GuidedBackprop(TinyText(), layer="embedding")
    with pytest.raises(ValueError, match="layer_input=True needs layer="):
        hv.Saliency(TinyText(), layer_input=True)
    with pytest.raises(TypeError, match="layer_input must be a bool"):
        hv.Saliency(TinyText(), layer="head", layer_input="yes")


def test_token_ids_without_layer_raise_before_any_work() -> None:
    model = TinyText()
    ids, mask = tokens()
    before = snapshot(model)
    with pytest.raises(TypeError, match=r"inputs is an integer tensor \(torch.int64\); .* pass layer="):
        hv.IntegratedGradients(model).attribute(ids, additional_forward_args=mask)
    with pytest.raises(TypeError, match="visualize got integer token ids .* has no layer="):
        hv.GradCAM(model, layer="norm").visualize(ids, additional_forward_args=mask)
    with pytest.raises(TypeError, match="SmoothGrad differentiates its inputs"):
        hv.SmoothGrad(hv.Saliency(model, layer="embedding"), n=2).attribute(ids, additional_forward_args=mask)
    assert_same(before, model)


def test_a_layer_that_runs_twice_or_returns_integers_raises_and_restores() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.ids = nn.Identity()

        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            self.ids(ids)
            return self.lin(self.lin(x))

    model = Twice()
    before = snapshot(model)
    x, ids = torch.randn(2, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="layer 'lin' ran 2 times in the forward pass"):
        hv.Saliency(model, layer="lin").attribute(x, target=0, additional_forward_args=ids)
    with pytest.raises(hv.HookError, match=r"the output of layer 'ids' is a torch.int64 tensor"):
        hv.IntegratedGradients(model, layer="ids", steps=2).attribute(x, target=0, additional_forward_args=ids)
    assert_same(before, model)
