"""`hv.patching` against one forward per site (through `intervene` + `replace`), `hv.attribution_patching` against
exact patching: equal where the model is linear after the site, rank-correlated (Spearman) on the shapes CNN."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.interventions import replace
from hookviz.zoo import shapes, shapes_model


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation (no ties expected in float data): Pearson correlation of the ranks."""
    ra = a.flatten().argsort().argsort().double()
    rb = b.flatten().argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


@pytest.fixture(scope="module")
def cnn() -> tuple[nn.Module, Tensor, Tensor, Tensor]:
    """The shapes CNN on 32x32 images (it pools globally, so any size runs): a quarter of the cost of 64x64, and
    8x8 maps at the last layers, so that every site of a layer is patched in a few forward passes."""
    data = shapes(4, seed=11, size=32)
    return shapes_model(), data.images[:2], data.images[2:], data.labels[:2]


class LinearAfter(nn.Module):
    """conv -> relu (the patched layer is `act`) -> a linear read-out: linear in the patched activation."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.head = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.act(self.conv(x)).flatten(1))


def test_batched_patching_equals_one_forward_per_site(cnn) -> None:
    model, clean, corrupt, labels = cnn
    metric = lambda out: out.gather(1, labels[:, None])[:, 0]  # noqa: E731  the clean class's logit
    sites = {"features.1": "channel", "relu#1": "spatial", "conv2": "layer", "relu": "layer"}
    result = hv.patching(model, clean, corrupt, metric, sites, batch_size=64)
    assert result["features.1"].shape == (2, 96) and result["relu#1"].shape == (2, 8, 8)
    assert result["conv2"].shape == (2,)
    acts = hv.cache(model, clean, layers=list(sites))
    with torch.no_grad():
        assert torch.allclose(result.clean, metric(model(clean))) and torch.allclose(
            result.corrupt, metric(model(corrupt))
        )
        for c in (0, 17, 95):
            with hv.intervene(model, {"features.1": replace(acts, channels=[c])}):
                assert torch.allclose(result["features.1"][:, c], metric(model(corrupt)), atol=1e-5)
        for y, x in ((0, 0), (3, 5), (7, 7)):
            with hv.intervene(model, {"relu#1": replace(acts, region=(y, y + 1, x, x + 1))}):
                assert torch.allclose(result["relu#1"][:, y, x], metric(model(corrupt)), atol=1e-5)
        with hv.intervene(model, {"conv2": replace(acts)}):
            assert torch.allclose(result["conv2"], metric(model(corrupt)), atol=1e-5)
        # "relu" is the first call of the reused ReLU only (the keys of hookviz.record), not both
        with hv.intervene(model, {"relu#0": replace(acts)}):
            assert torch.allclose(result["relu"], metric(model(corrupt)), atol=1e-5)
    approx = hv.attribution_patching(model, clean, corrupt, metric, {"relu": "channel", "relu#1": "channel"})
    assert approx["relu"].shape == (2, 16) and approx["relu#1"].shape == (2, 64)
    # batch_size only changes how the rows are split into forward passes
    small = hv.patching(model, clean, corrupt, metric, {"relu#1": "spatial"}, batch_size=16)
    assert torch.allclose(small["relu#1"], result["relu#1"], atol=1e-5)
    # everything after relu#1 depends on it alone: patching it whole restores the clean run (normalised 1)
    whole = hv.patching(model, clean, corrupt, metric, "relu#1")
    assert torch.allclose(whole.normalized()["relu#1"], torch.ones(2), atol=1e-4)
    noised = hv.patching(model, clean, corrupt, metric, "relu#1", direction="noise")
    assert torch.allclose(noised["relu#1"], result.corrupt, atol=1e-4)
    rows = result.table()
    assert len(rows) == 96 + 64 + 1 + 1 and rows[96] == {
        "layer": "relu#1", "kind": "spatial", "site": (0, 0), "value": pytest.approx(rows[96]["value"])
    }  # fmt: skip
    assert hook_count(model) == 0 and not model.training


def test_attribution_patching_is_exact_where_the_model_is_linear_after_the_site() -> None:
    model = LinearAfter()
    g = torch.Generator().manual_seed(3)
    clean, corrupt = torch.randn(4, 3, 5, 5, generator=g), torch.randn(4, 3, 5, 5, generator=g)
    metric = lambda out: out[:, 0] - out[:, 2]  # noqa: E731
    sites = {"act": "channel", "conv": "spatial"}
    exact = hv.patching(model, clean, corrupt, metric, {"act": "channel"})
    approx = hv.attribution_patching(model, clean, corrupt, metric, sites)
    assert approx.method == "attribution" and approx["act"].shape == (4, 4) and approx["conv"].shape == (4, 5, 5)
    assert torch.allclose(approx["act"], exact["act"], atol=1e-5)
    assert torch.allclose(approx.corrupt, exact.corrupt) and torch.allclose(approx.clean, exact.clean)
    # float64 reference of the estimate at the conv output: (a_clean - a_corrupt) * dmetric/da, summed per cell
    m64 = LinearAfter().double()
    m64.load_state_dict(model.state_dict())
    a_clean, a_corrupt = m64.conv(clean.double()), m64.conv(corrupt.double()).detach().requires_grad_()
    out = m64.head(m64.act(a_corrupt).flatten(1))
    (grad,) = torch.autograd.grad((out[:, 0] - out[:, 2]).sum(), a_corrupt)
    expected = ((a_clean - a_corrupt) * grad).sum(1) + (out[:, 0] - out[:, 2])[:, None, None]
    assert torch.allclose(approx["conv"].double(), expected.detach(), atol=1e-4)
    assert all(p.grad is None for p in model.parameters()) and all(p.requires_grad for p in model.parameters())


def test_attribution_patching_ranks_like_exact_patching_on_the_shapes_cnn() -> None:
    """At post-activation sites (the output of the reused ReLU, 64 channels) the estimate ranks the channels as exact
    patching does. (At pre-activation sites the
    first-order estimate is much weaker, as the attribution-patching papers warn: see docs/interventions.md.)"""
    model = shapes_model()
    data = shapes(4, seed=11)
    clean, corrupt, labels = data.images[:2], data.images[2:], data.labels[:2]
    metric = lambda out: out.gather(1, labels[:, None])[:, 0]  # noqa: E731
    sites = {"relu#1": "channel"}
    exact = hv.patching(model, clean, corrupt, metric, sites, batch_size=512)
    approx = hv.attribution_patching(model, clean, corrupt, metric, sites)
    effect = {k: (exact[k] - exact.corrupt[:, None], approx[k] - approx.corrupt[:, None]) for k in sites}
    assert spearman(*effect["relu#1"]) > 0.85
    assert hook_count(model) == 0


def test_attribution_patching_reads_the_gradient_before_an_inplace_relu() -> None:
    """features.1 (BatchNorm) is followed by nn.ReLU(inplace=True): the gradient must be w.r.t. the pre-ReLU value."""
    model = shapes_model()
    data = shapes(2, seed=5, size=32)
    clean, corrupt = data.images[:1], data.images[1:]
    metric = lambda out: out[:, 2]  # noqa: E731
    approx = hv.attribution_patching(model, clean, corrupt, metric, {"features.1": "channel"})
    reference = shapes_model()
    reference.features[2].inplace = False
    with torch.no_grad():
        a_clean = reference.features[:2](reference.relu(reference.bn3(reference.conv3(_stem(reference, clean)))))
        stem = reference.relu(reference.bn3(reference.conv3(_stem(reference, corrupt))))
    a_corrupt = reference.features[:2](stem).detach().requires_grad_()
    out = reference.head(reference.features[2:](a_corrupt).mean((2, 3)))
    (grad,) = torch.autograd.grad(out[:, 2].sum(), a_corrupt)
    expected = ((a_clean - a_corrupt) * grad).sum((2, 3)) + out[:, 2:3]
    assert torch.allclose(approx["features.1"], expected.detach(), atol=1e-4)
    assert model.features[2].inplace is True


def _stem(m: nn.Module, x: Tensor) -> Tensor:
    x = (x - m.mean) / m.std
    x = m.pool(m.relu(m.bn1(m.conv1(x))))
    return m.pool(torch.relu(m.bn2(m.conv2(x))))


def test_token_and_head_sites() -> None:
    """Tokens (N, T, D): a site per position, and the feature axis split into heads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Identity(), nn.Flatten(), nn.Linear(5 * 8, 2))
    clean, corrupt = torch.randint(10, (3, 5)), torch.randint(10, (3, 5))
    metric = lambda out: out[:, 1]  # noqa: E731
    result = hv.patching(model, clean, corrupt, metric, {"1": "token", "0": "head"}, heads=4)
    assert result["1"].shape == (3, 5) and result["0"].shape == (3, 4)
    e_clean, e_corrupt = model[0](clean), model[0](corrupt)
    w = model[3].weight[1].reshape(5, 8)
    with torch.no_grad():
        per_token = ((e_clean - e_corrupt) * w).sum(-1)  # linear read-out: the effect of token t alone
        assert torch.allclose(result["1"] - result.corrupt[:, None], per_token, atol=1e-5)
        per_head = ((e_clean - e_corrupt) * w).reshape(3, 5, 4, 2).sum((1, 3))
        assert torch.allclose(result["0"] - result.corrupt[:, None], per_head, atol=1e-5)
    approx = hv.attribution_patching(model, clean, corrupt, metric, {"1": "token", "0": "head"}, heads=4)
    assert torch.allclose(approx["1"], result["1"], atol=1e-5) and torch.allclose(approx["0"], result["0"], atol=1e-5)


def test_bad_input_is_named_before_any_work(cnn) -> None:
    model, clean, corrupt, labels = cnn
    metric = lambda out: out[:, 0]  # noqa: E731
    with pytest.raises(ValueError, match=r"clean and corrupt must have the same shapes.*\(1, 3, 32, 32\)"):
        hv.patching(model, clean, corrupt[:1], metric, "conv1")
    with pytest.raises(ValueError, match=r"metric must return one value per sample, a tensor of shape \(2,\)"):
        hv.patching(model, clean, corrupt, lambda out: out.sum(), "conv1")
    with pytest.raises(ValueError, match=r"metric must return one value per sample"):
        hv.attribution_patching(model, clean, corrupt, lambda out: out, "conv1")
    with pytest.raises(ValueError, match="'pixel' is not a site kind"):
        hv.patching(model, clean, corrupt, metric, {"conv1": "pixel"})
    with pytest.raises(ValueError, match="'token' needs a tokens layout"):
        hv.patching(model, clean, corrupt, metric, {"conv1": "token"})
    with pytest.raises(ValueError, match="'head' needs heads="):
        hv.patching(model, clean, corrupt, metric, {"conv1": "head"})
    with pytest.raises(ValueError, match="closest module names"):
        hv.patching(model, clean, corrupt, metric, "featurs.1")
    with pytest.raises(ValueError, match="'relu#4' never ran"):
        hv.attribution_patching(model, clean, corrupt, metric, "relu#4")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        hv.patching(model, clean, corrupt, metric, "conv1", batch_size=0)
    with pytest.raises(ValueError, match="direction must be"):
        hv.patching(model, clean, corrupt, metric, "conv1", direction="both")
    assert hook_count(model) == 0 and not model.training


class TinyTransformer(nn.Module):
    """The token model of notebooks/05_text.ipynb (untrained here: the mechanics do not need training)."""

    def __init__(self, vocab: int = 16, dim: int = 16, t: int = 8) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(t, dim) * 0.1)
        self.encoder = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, 2)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.encoder(self.embedding(ids) + self.position)
        return self.head(h.mean(dim=1))


def test_token_patching_on_the_tiny_transformer_of_notebook_05() -> None:
    """Token positions at the embedding, at the attention block (a tuple output) and at the encoder layer's output;
    each checked against one forward per token through `intervene`."""
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randint(16, (3, 8), generator=g), torch.randint(16, (3, 8), generator=g)
    metric = lambda out: out[:, 1] - out[:, 0]  # noqa: E731
    sites = {"embedding": "token", "encoder.self_attn": "token", "encoder": "token"}
    result = hv.patching(model, clean, corrupt, metric, sites)
    acts = hv.cache(model, clean, layers=list(sites))
    with torch.no_grad():
        for key in sites:
            assert result[key].shape == (3, 8)
            for t in (0, 5):
                with hv.intervene(model, {key: replace(acts, tokens=[t])}):
                    assert torch.allclose(result[key][:, t], metric(model(corrupt)), atol=1e-5), (key, t)
    # the encoder's output feeds a mean and a linear head: there the estimate is exact
    approx = hv.attribution_patching(model, clean, corrupt, metric, {"encoder": "token"})
    assert torch.allclose(approx["encoder"], result["encoder"], atol=1e-5)
    assert hook_count(model) == 0
