"""train_sae (issue 37, part 2): a planted sparse dictionary is recovered, resuming equals an uninterrupted run, the
activation rows of tokens and of CNN channels, and the model comes back as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hookviz.features import train_sae
from hookviz.features._acts import rows_of
from hookviz.hooks import hook_counts

D_IN, N_FEAT, ACTIVE, N = 16, 32, 3, 4096


def planted() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Synthetic activations x = codes @ D: each row of codes has exactly 3 of 32 features on, with magnitudes in
    [0.5, 1.5); D holds 32 random unit directions in 16 dimensions. A tiny linear "model" whose weight is D^T
    produces them from the codes, so they reach the SAE through the model's hooks as real activations do."""
    g = torch.Generator().manual_seed(0)
    directions = torch.randn(N_FEAT, D_IN, generator=g)
    directions /= directions.norm(dim=1, keepdim=True)
    idx = torch.rand(N, N_FEAT, generator=g).argsort(-1)[:, :ACTIVE]
    codes = torch.zeros(N, N_FEAT).scatter(1, idx, 0.5 + torch.rand(N, ACTIVE, generator=g))
    model = nn.Sequential(nn.Linear(N_FEAT, D_IN, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(directions.T)
    return model, codes, directions


@pytest.mark.parametrize(
    ("act", "extra", "bound"),
    [
        ("topk", {"k": ACTIVE}, 0.95),
        ("relu", {"l1_coeff": 0.2}, 0.85),
        ("jumprelu", {}, 0.85),
    ],
)
def test_recovers_planted_dictionary(act, extra, bound) -> None:
    model, codes, directions = planted()
    result = train_sae(
        model, "0", codes, d_sae=64, act=act, steps=300, batch_size=256, lr=3e-3, dead_after=2000,
        progress=False, **extra,
    )  # fmt: skip
    loss = result.loss
    assert loss.shape == (300,)
    assert loss[-20:].mean() < 0.3 * loss[:20].mean()
    # Max cosine between each planted direction and the learned decoder rows. Chance level: 32 random unit vectors
    # against 64 random unit rows in 16 dimensions give a mean max cosine of about 0.55 (printed below, measured on
    # a random decoder); a planted direction counts as found above `bound`, which is far above chance and below what
    # 300 steps reach on this problem (TopK: min 0.98; ReLU and JumpReLU: min 0.88 to 0.92, their L1 / L0 penalty
    # shrinks and mixes the directions a little).
    best = (directions @ result.sae.W_dec.detach().T).max(1).values
    rand = torch.randn(64, D_IN, generator=torch.Generator().manual_seed(1))
    chance = (directions @ (rand / rand.norm(dim=1, keepdim=True)).T).max(1).values.mean()
    assert chance < 0.7
    assert best.min() > bound, (best.min(), chance)
    # decoder rows at unit norm (float32 rounding of a 16-term sum of squares)
    norms = result.sae.W_dec.detach().norm(dim=1)
    assert torch.allclose(norms, torch.ones(64), atol=1e-6, rtol=0)
    if act == "topk":
        assert bool((result.l0 <= ACTIVE).all())


@pytest.mark.parametrize(
    ("act", "extra"), [("topk", {"k": ACTIVE, "dead_after": 300}), ("relu", {"resample_every": 7})]
)
def test_resume_equals_uninterrupted(tmp_path, act, extra) -> None:
    model, codes, _ = planted()
    kw = dict(d_sae=64, act=act, batch_size=128, buffer_size=512, lr=3e-3, progress=False, **extra)
    whole = train_sae(model, "0", codes, steps=30, **kw)
    first = train_sae(model, "0", codes, steps=13, checkpoint_dir=tmp_path / "ck", checkpoint_every=5, **kw)
    assert first.steps == 13
    resumed = train_sae(model, "0", codes, steps=30, checkpoint_dir=tmp_path / "ck", **kw)
    for name, p in whole.sae.named_parameters():
        assert torch.equal(p, getattr(resumed.sae, name)), name
    assert torch.equal(whole.loss, resumed.loss)
    assert resumed.rows == 17 * 128  # the resumed call trained only the steps left
    with pytest.raises(ValueError, match="other settings"):
        train_sae(model, "0", codes, steps=40, checkpoint_dir=tmp_path / "ck", **{**kw, "lr": 1e-3})


class _TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.bn = nn.BatchNorm2d(5)
        self.head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)).mean((2, 3)))


def test_cnn_channels_and_model_left_as_it_was() -> None:
    torch.manual_seed(0)
    model = _TinyCNN().train()
    model.head.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images = torch.randn(12, 3, 6, 6)
    a = model.conv(images)
    rows = rows_of(a, None, None, "conv")
    assert rows.shape == (12 * 36, 5)
    assert torch.equal(rows[37], a[1, :, 0, 1])  # image 1, pixel (0, 1): its 5 channels
    result = train_sae(model, "bn", images, d_sae=10, k=2, steps=5, batch_size=64, data_batch_size=4, progress=False)
    assert result.sae.d_in == 5
    assert model.training and model.bn.training  # modes restored
    assert not model.head.weight.requires_grad and model.conv.weight.requires_grad
    assert all(v == 0 for v in hook_counts(model).values())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # BatchNorm statistics untouched: run in eval mode


def test_token_rows_skip_padding() -> None:
    acts = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    rows = rows_of(acts, None, mask, "x")
    assert torch.equal(rows, acts.view(-1, 2)[1:])


def test_bad_arguments() -> None:
    model, codes, _ = planted()
    with pytest.raises(ValueError, match="matches no module"):
        train_sae(model, "nope", codes, d_sae=8, k=2, progress=False)
    with pytest.raises(ValueError, match="buffer_size must be >= 2"):
        train_sae(model, "0", codes, d_sae=8, k=2, batch_size=64, buffer_size=100, progress=False)
    gen = (codes[i : i + 32] for i in range(0, 64, 32))
    with pytest.raises(ValueError, match="one-shot iterator"):
        train_sae(model, "0", gen, d_sae=8, k=2, steps=50, batch_size=32, buffer_size=64, progress=False)
