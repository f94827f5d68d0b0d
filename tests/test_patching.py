"""`hv.patching` against one forward per site (through `intervene` + `replace`), `hv.attribution_patching` against
exact patching: equal where the model is linear after the site, rank-correlated (Spearman) on the shapes CNN."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.interventions import replace
from hookviz.interventions.patching import one_call
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


class Position(nn.Module):
    """A learnt (1, C, h, w) map added to every sample: an output without the batch axis."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, 8, 8, 8) * 0.1)

    def forward(self) -> Tensor:
        return self.weight


class Split(nn.Module):
    """Two halves of the channels: a tuple output."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[:, :4], x[:, 4:]


class ResidualBranch(nn.Module):
    """A stem, two branches that meet again (the second computed after the first), a residual that skips past them,
    one ReLU module called before the branches, inside branch ``a`` and after them, an in-place add on a branch's
    output, a tuple output and an output without batch axis: what sharing the prefix must get right beyond a chain."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.relu = nn.ReLU()
        self.pos = Position()
        self.split = Split()
        self.a = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), self.relu, nn.Conv2d(8, 8, 1))
        self.b = nn.Conv2d(4, 8, 3, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.relu(self.stem(x)) + self.pos()
        u, v = self.split(h)
        y = self.a(u)
        y += self.b(v)
        return self.head((self.relu(y) + h).mean((2, 3)))


SHARED_SITES = {
    "shapes": {"conv2": "channel", "relu#1": "spatial", "features.1": "channel", "features.4": "channel"},
    # "relu#2" is the ReLU's third call, after one inside the skipped branch `a`: its key must still count right
    "residual": {"a.2": "channel", "a": "spatial", "b": "channel", "relu#2": "channel", "split": "channel"},
}


def one_forward_per_site(model: nn.Module, clean, corrupt, metric, key: str, kind: str, shape) -> Tensor:
    """The loop a user writes: every site patched in its own forward of the N pairs, through `intervene`."""
    acts = hv.cache(model, clean, layers=[key])
    out = torch.empty(shape)
    with torch.no_grad():
        for site in range(shape[1] * (shape[2] if kind == "spatial" else 1)):
            if kind == "channel":
                edit, where = replace(acts, channels=[site]), (slice(None), site)
            else:
                (y, x), where = divmod(site, shape[2]), (slice(None), *divmod(site, shape[2]))
                edit = replace(acts, region=(y, y + 1, x, x + 1))
            with hv.intervene(model, {one_call(key): edit}):
                out[where] = metric(model(corrupt))
    return out


@pytest.fixture
def always_share(monkeypatch) -> list:
    """Sharing on wherever it is possible (not only where it pays, which the timing decides), and the plans made."""
    module = sys.modules["hookviz.interventions.patching"]
    monkeypatch.setattr(module, "SHARE_MIN_SAVING", 0.0)
    plans: list = []
    real = module._shared_plan

    def spy(*args):
        plans.append(real(*args))
        return plans[-1]

    monkeypatch.setattr(module, "_shared_plan", spy)
    return plans


@pytest.mark.parametrize("arch", sorted(SHARED_SITES))
def test_shared_prefix_gives_the_values_of_one_forward_per_site(arch, cnn, always_share) -> None:
    """Sharing the prefix gives the loop's values (to the rounding of the layers after the site, which run at another
    batch size), every site of every layer, at several depths, over several chunks (batch_size=16: 8 sites per
    forward), and the whole-forward path's (`share_prefix=False`) where that one runs at the loop's batch
    (batch_size=N), in both directions. (At batch_size=16 the whole-forward path runs the layers before the site at
    batch 16 too, which the CPU's convolutions round differently on the residual model; sharing the prefix runs them
    at N, as the loop does.)"""
    if arch == "shapes":
        model, clean, corrupt, labels = cnn
    else:
        model = ResidualBranch().eval()
        g = torch.Generator().manual_seed(2)
        clean, corrupt, labels = torch.rand(2, 3, 8, 8, generator=g), torch.rand(2, 3, 8, 8, generator=g), None
    labels = torch.tensor([0, 2]) if labels is None else labels
    metric = lambda out: out.gather(1, labels[:, None])[:, 0]  # noqa: E731
    sites = SHARED_SITES[arch]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every layer here shares its prefix: no fallback warning
        shared = hv.patching(model, clean, corrupt, metric, sites, batch_size=16)
    assert len(always_share) == len(sites) and all(p is not None and (p.skip or p.site_cached) for p in always_share)
    for key, kind in sites.items():
        loop = one_forward_per_site(model, clean, corrupt, metric, key, kind, shared[key].shape)
        # the loop runs the prefix at batch N as sharing does, and what follows the site at N where sharing runs 16
        # rows. Some CPUs compute a row alike at both batch sizes (difference 0, on the AMD EPYC machines); others
        # block a convolution's sums by the batch (AVX-512 Xeons: 1.9e-6 at values near 8): each output of the few
        # layers after a site is a sum whose order may change, by at most about (terms - 1) u of the sum of their
        # magnitudes, u = 2^-24; 64 u of the largest metric covers the suffixes here (at most 3 layers, fan-in 72)
        tol = 64 * 2.0**-24 * float(loop.abs().max())
        assert float((shared[key] - loop).abs().max()) <= tol, (key, (shared[key] - loop).abs().max(), tol)
    for direction in ("denoise", "noise"):
        shared = hv.patching(model, clean, corrupt, metric, sites, batch_size=16, direction=direction)
        whole = hv.patching(model, clean, corrupt, metric, sites, batch_size=2, direction=direction,
                            share_prefix=False)  # fmt: skip
        for key in sites:  # the whole forward runs the layers after the site at N rows too: the same rounding
            tol = 64 * 2.0**-24 * float(whole[key].abs().max())
            assert float((shared[key] - whole[key]).abs().max()) <= tol, (key, direction)
        assert torch.equal(shared.clean, whole.clean) and torch.equal(shared.corrupt, whole.corrupt)
    assert hook_count(model) == 0 and not any("forward" in m.__dict__ for m in model.modules())


class Stash(nn.Module):
    """Keeps its input on itself, for the parent to read later: a side effect a skipped call would not have."""

    def forward(self, x: Tensor) -> Tensor:
        self.last = x * 2
        return x


class SideEffect(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stash, self.mid, self.head = Stash(), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.mid(self.stash(x)) + self.stash.last)


def test_a_prefix_with_side_effects_is_not_shared_and_says_so(always_share) -> None:
    model = SideEffect().eval()
    g = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    metric = lambda out: out[:, 0]  # noqa: E731
    with pytest.warns(UserWarning, match=r"patching 'mid': the prefix is not shared.*raised RuntimeError"):
        shared = hv.patching(model, clean, corrupt, metric, {"mid": "channel"})
    whole = hv.patching(model, clean, corrupt, metric, {"mid": "channel"}, share_prefix=False)
    assert torch.equal(shared["mid"], whole["mid"])
    loop = one_forward_per_site(model, clean, corrupt, metric, "mid", "channel", (3, 4))
    assert torch.equal(shared["mid"], loop)
    assert not any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(TypeError, match="share_prefix must be True or False, got 'yes'"):
        hv.patching(model, clean, corrupt, metric, {"mid": "channel"}, share_prefix="yes")


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_interrupt_in_a_shared_prefix_run_leaves_the_model_as_it_was(exc, cnn, always_share) -> None:
    """Raised by the user's hook after the site, in the third patched chunk: every ``forward`` the sharing set and
    every hook is gone, the modes are back."""
    model, clean, corrupt, labels = cnn
    model.features[1].train()  # a mixed mode must come back mixed
    seen = []

    def boom(module, args, out):
        seen.append(out.shape[0])
        if sum(rows > 2 for rows in seen) == 3:  # the third forward of more than N rows: a patched chunk
            raise exc("stop")

    handle = model.head.register_forward_hook(boom)
    try:
        with pytest.raises(exc, match="stop"):
            hv.patching(model, clean, corrupt, lambda out: out[:, 0], {"features.4": "channel"}, batch_size=16)
    finally:
        handle.remove()
    assert not any("forward" in m.__dict__ for m in model.modules()) and hook_count(model) == 0
    assert model.features[1].training and not model.features[0].training
    model.features[1].eval()


def test_sharing_is_skipped_where_it_would_not_pay() -> None:
    """`skippable_share`: the time of the outermost calls that finish before the site, plus the site's, over the whole
    forward's, from the recorded times (set by hand here: a stem of 1 s holding a conv of 0.6 s, a 2 s block, the
    site of 0.5 s, a head of 1.5 s after it; the forward 5 s)."""
    from hookviz.interventions.prefix import Call, skippable_share

    def call(name, start, end, seconds):
        return Call(name, start, end, seconds, output=torch.zeros(1), supported=True)

    calls = {
        "stem": call("stem", 0, 3, 1.0),
        "stem.conv": call("stem.conv", 1, 2, 0.6),  # inside the stem: counted with it, not again
        "block": call("block", 4, 5, 2.0),
        "site": call("site", 6, 7, 0.5),
        "head": call("head", 8, 9, 1.5),  # after the site: computed in every patched run
        "": Call("", -1, 10, 5.0),
    }
    assert skippable_share(calls, "site") == pytest.approx((1.0 + 2.0 + 0.5) / 5.0)
    assert skippable_share(calls, "stem") == pytest.approx(1.0 / 5.0)  # only the site itself
    calls["block"].supported = False  # an output that cannot be cached (an object holding tensors): not skipped
    assert skippable_share(calls, "site") == pytest.approx((1.0 + 0.5) / 5.0)


def test_shared_prefix_on_a_hugging_face_gpt2(always_share) -> None:
    """A Hugging Face causal LM (tiny GPT-2 from a config, random weights): a `ModelOutput` (not a plain dict), blocks
    returning tuples, sites at a block, inside an attention and at an MLP; the values equal whole forwards at the
    loop's batch. (With ``use_cache=True`` the output holds a `DynamicCache`, which patching cannot split per site,
    with or without the shared prefix.)"""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=50, n_positions=16, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randint(50, (2, 8), generator=g), torch.randint(50, (2, 8), generator=g)
    metric = lambda out: out.logits[:, -1, 3] - out.logits[:, -1, 5]  # noqa: E731
    sites = {"transformer.h.1": "token", "transformer.h.2.attn.c_proj": "token", "transformer.h.1.mlp": "token"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        shared = hv.patching(model, clean, corrupt, metric, sites, batch_size=16)
    assert all(p is not None and p.skip for p in always_share)
    whole = hv.patching(model, clean, corrupt, metric, sites, batch_size=2, share_prefix=False)
    for key in sites:
        assert torch.equal(shared[key], whole[key]), key
    assert not any("forward" in m.__dict__ for m in model.modules()) and hook_count(model) == 0
