"""evaluate_sae (issue 37, part 3): the identity SAE's reference values and every metric against a computation by
hand on a tiny language model."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from sae_refs import identity_sae
from torch import nn

from hookviz.features import SAE, evaluate_sae

V, D = 11, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.block = Block()
        self.head = nn.Linear(D, V)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        # a causal mixing of positions, so that the zero-ablated layer and the SAE change later positions too
        h = self.block(self.embed(input_ids))
        return self.head(h.cumsum(1) / torch.arange(1, h.shape[1] + 1)[:, None])


def lm() -> tuple[TinyLM, torch.Tensor]:
    torch.manual_seed(0)
    return TinyLM().eval(), torch.randint(0, V, (8, 9))


def test_identity_sae_reference_values() -> None:
    model, ids = lm()
    ev = evaluate_sae(model, "block", identity_sae(D), ids, data_batch_size=3)
    assert ev.rows == 72
    assert ev.fve == 1.0 and ev.mse == 0.0  # x̂ = x bit for bit
    assert ev.l0 == D  # exactly one of relu(x_i), relu(-x_i) fires per coordinate: L0 = the layer's width
    assert ev.loss_recovered == 1.0 and ev.kl == 0.0  # the spliced logits are the original ones exactly
    assert ev.ce_zero != ev.ce_orig
    assert ev.dead == 0 and ev.dense == 2 * D  # every latent fires on about half the tokens
    assert "| CE loss recovered | 1 |" in ev.table()


def test_metrics_by_hand() -> None:
    model, ids = lm()
    torch.manual_seed(3)
    sae = SAE(D, 20, "topk", k=2)
    with torch.no_grad():
        sae.b_enc[5] = -100.0  # latent 5 never fires: dead
        sae.b_enc[7] = 100.0  # latent 7 always in the top 2: dense
        mask = torch.ones_like(ids)
        mask[:2, :3] = 0  # left padding in the first two rows
        ev = evaluate_sae(model, "block", sae, [{"input_ids": ids, "attention_mask": mask}])

        a = model.block(model.embed(ids))
        real = mask.bool()
        x = a[real].double()
        x_hat, f = sae(a)
        x_hat, f = x_hat[real].double(), f[real]
        fve = 1 - (x - x_hat).var(0, correction=0).sum() / x.var(0, correction=0).sum()
        mse = (x - x_hat).square().mean()
        l0 = (f != 0).sum(-1).double().mean()

        def head(h: torch.Tensor) -> torch.Tensor:
            return model.head(h.cumsum(1) / torch.arange(1, h.shape[1] + 1)[:, None])

        pairs = real[:, :-1] & real[:, 1:]

        def ce(logits: torch.Tensor) -> float:
            loss = F.cross_entropy(logits[:, :-1].double().reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none")
            return float(loss[pairs.reshape(-1)].mean())

        lo, ls, lz = head(a), head(sae(a)[0]), head(torch.zeros_like(a))
        kl = F.kl_div(F.log_softmax(ls.double(), -1), F.log_softmax(lo.double(), -1), log_target=True, reduction="none")
    assert ev.rows == int(real.sum())
    # float64 accumulation against float64 arithmetic on the same float32 activations: agreement to ~1e-12
    assert math.isclose(ev.fve, float(fve), rel_tol=1e-9)
    assert math.isclose(ev.mse, float(mse), rel_tol=1e-9)
    assert math.isclose(ev.l0, float(l0), rel_tol=1e-12)
    assert math.isclose(ev.ce_orig, ce(lo), rel_tol=1e-9)
    assert math.isclose(ev.ce_sae, ce(ls), rel_tol=1e-9)
    assert math.isclose(ev.ce_zero, ce(lz), rel_tol=1e-9)
    assert math.isclose(ev.loss_recovered, (ce(lz) - ce(ls)) / (ce(lz) - ce(lo)), rel_tol=1e-9)
    assert math.isclose(ev.kl, float(kl.sum(-1)[real].mean()), rel_tol=1e-9)
    assert ev.frequency[5] == 0 and ev.frequency[7] == 1
    assert ev.dead == int((ev.frequency == 0).sum()) >= 1
    assert ev.dense == int((ev.frequency > 0.1).sum()) >= 1


def test_vision_layer_has_no_language_metrics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    images = torch.randn(6, 3, 5, 5)
    model(images)
    sae = SAE(4, 8, "relu")
    ev = evaluate_sae(model, "0", sae, images, data_batch_size=4)  # a layer of a Sequential model
    assert ev.rows == 6 * 3 * 3 and ev.ce_orig is None and ev.loss_recovered is None
    assert "| CE loss recovered | — |" in ev.table()


def test_scored_positions() -> None:
    model, ids = lm()
    torch.manual_seed(3)
    sae = SAE(D, 20, "topk", k=2)

    def last_prediction(input_ids: torch.Tensor) -> torch.Tensor:
        chosen = torch.zeros_like(input_ids, dtype=torch.bool)
        chosen[:, -2] = True  # the prediction of the last token
        return chosen

    ev = evaluate_sae(model, "block", sae, ids, scored=last_prediction)
    with torch.no_grad():
        a = model.block(model.embed(ids))
        lo = model.head(a.cumsum(1) / torch.arange(1, 10)[:, None])
        ce = F.cross_entropy(lo[:, -2].double(), ids[:, -1])
    assert math.isclose(ev.ce_orig, float(ce), rel_tol=1e-9)
