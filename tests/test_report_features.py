"""The features report (`hookviz.report.report_features`, issue 37 part 7) on the retrieval LM and its shipped SAE:
the streamed running statistics equal brute-force ones over every activation, the promoted / suppressed tokens equal
W_dec[i] @ W_U computed directly, the pages exist and escape their text; image data gives crops."""

from __future__ import annotations

import html
import json

import pytest
import torch

from hookviz.features import SAE
from hookviz.report import report_features
from hookviz.report.features import collect_features, logit_effects, unembedding
from hookviz.zoo import retrieval_lm
from hookviz.zoo.sae import SAE_LAYER, retrieval_sae, token_batches

LATENTS = [0, 5, 17, 411, 234, 200, 14, 307]  # three rare or dead, five among the densest


@pytest.fixture(scope="module")
def lm():
    model, tok = retrieval_lm()
    return model, tok, retrieval_sae(), token_batches(48, seed=7, size=16)


def brute(model, sae, data):
    """Every (row, position, latent activation) of the real tokens, in one list."""
    rows, acts = [], []
    offset = 0
    got = {}
    h = model.get_submodule(SAE_LAYER).register_forward_hook(lambda m, a, o: got.update(x=o))
    for b in data:
        with torch.no_grad():
            model(**b)
            f = sae.encode(got["x"])[..., LATENTS]
        real = b["attention_mask"].bool()
        r, p = real.nonzero(as_tuple=True)
        rows.append(torch.stack((r + offset, p), 1))
        acts.append(f[real])
        offset += len(b["input_ids"])
    h.remove()
    return torch.cat(rows), torch.cat(acts)


def test_running_statistics_equal_brute_force(lm) -> None:
    model, _, sae, data = lm
    stats = collect_features(model, SAE_LAYER, sae, data, latents=LATENTS, top=6, bins=8, batch_size=16)
    where, acts = brute(model, sae, data)
    ids = torch.cat([b["input_ids"] for b in data])
    checked = 0
    n = sum(int(b["attention_mask"].sum()) for b in data)
    assert stats.positions == n == len(acts) and stats.rows == 48
    top = acts.topk(6, dim=0)
    torch.testing.assert_close(stats.top_values, top.values, rtol=0, atol=1e-5)
    for j in range(len(LATENTS)):
        for r in range(6):
            v = float(top.values[r, j])
            if v > 0 and (acts[:, j] == v).sum() == 1:  # a unique value: its place too
                assert (int(stats.top_rows[r, j]), int(stats.top_positions[r, j])) == tuple(where[top.indices[r, j]])
                # the centre of the window is the position itself
                assert abs(float(stats.top_window[r, j, stats.before]) - v) < 1e-5
                assert int(stats.top_tokens[r, j, stats.before]) == int(ids[tuple(where[top.indices[r, j]])])
                checked += 1
    assert checked >= 20
    assert torch.equal(stats.hist.sum(1), torch.full((len(LATENTS),), n))
    assert torch.equal(stats.fired, (acts > 0).sum(0))
    torch.testing.assert_close(stats.max, acts.amax(0), rtol=0, atol=1e-5)
    # the bins: the first batch's edges, recounted here
    e = stats.hist_max
    inside = (acts > 0) & (acts <= e)
    assert torch.equal(stats.hist[:, 0], (acts <= 0).sum(0))
    assert torch.equal(stats.hist[:, -1], (acts > e).sum(0))
    assert torch.equal(stats.hist[:, 1:-1].sum(1), inside.sum(0))


def test_pages_logits_and_escaping(lm, tmp_path) -> None:
    model, tok, sae, data = lm
    evil = "<b>&"
    names = {i: tok.convert_ids_to_tokens(i) for i in range(tok.vocab_size)}
    names[int(data[0]["input_ids"][0, 1])] = evil  # one token's name needs escaping

    def metric(out):
        return out[:, -1].logsumexp(-1)

    index = report_features(model, SAE_LAYER, sae, data[:2], tmp_path / "rep", latents=LATENTS, top=4,
                            tokenizer=names.__getitem__, unembed=model.head, metric=metric, logits=5)  # fmt: skip
    root = tmp_path / "rep"
    assert index == root / "index.html" and index.is_file()
    page = index.read_text(encoding="utf-8")
    for lat in LATENTS:
        assert f'href="latent/{lat}.html"' in page
        assert (root / "latent" / f"{lat}.html").is_file()
    assert json.loads((root / ".hookviz-report.json").read_text())["complete"] is True
    w_u = unembedding(model, model.head)
    torch.testing.assert_close(w_u, model.head.weight.T)
    texts = [(root / "latent" / f"{lat}.html").read_text(encoding="utf-8") for lat in LATENTS]
    assert evil not in "".join(texts) and html.escape(evil) in "".join(texts)
    for lat, text in zip(LATENTS, texts, strict=True):
        assert "<svg" in text and "mean over 32 rows" in text and "cdn" not in text.lower()
        direct = sae.W_dec[lat].detach() @ model.head.weight.detach().T
        torch.testing.assert_close(logit_effects(sae, w_u, lat), direct)
        promoted = torch.sort(direct, descending=True, stable=True).indices[:5].tolist()
        suppressed = torch.sort(direct, stable=True).indices[:5].tolist()
        block = text.split('class="logits promotes">')[1].split("</ol>")[0]
        assert [html.escape(names[i]) for i in promoted] == [
            s.split("</span>")[0] for s in block.split('<span class="tok">')[1:]
        ]
        block = text.split('class="logits suppresses">')[1].split("</ol>")[0]
        assert [html.escape(names[i]) for i in suppressed] == [
            s.split("</span>")[0] for s in block.split('<span class="tok">')[1:]
        ]
    # without an unembedding (the LM declares no output embeddings) that section is left out
    report_features(model, SAE_LAYER, sae, data[:1], tmp_path / "rep", latents=[0], tokenizer=tok)
    assert "W_dec @ W_U" not in (root / "latent" / "0.html").read_text(encoding="utf-8")
    assert not (root / "latent" / "5.html").exists()


def test_image_data_gives_crops(tmp_path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.ReLU())
    sae = SAE(8, 16, "relu")
    images = torch.rand(10, 3, 32, 32)
    report_features(model, "1", sae, images, tmp_path / "img", top=3, batch_size=4)
    crops = sorted((tmp_path / "img" / "latent").glob("*.png"))
    pages = {c: c.parent / (c.name.split("-")[0] + ".html") for c in crops}
    assert crops and all(f'src="{c.name}"' in page.read_text(encoding="utf-8") for c, page in pages.items())
    stats = collect_features(model, "1", sae, images, top=3, batch_size=4)
    assert stats.positions == 10 * 8 * 8 and torch.equal(stats.hist.sum(1), torch.full((16,), 640))
