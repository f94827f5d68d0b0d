"""TokenExplanation: token scores, highlighted HTML on one shared signed scale, vocab as list or callable, saving."""

from __future__ import annotations

import re

import pytest
import torch

from hookviz import TokenExplanation
from hookviz.text import token_colour


def explanation(**kwargs) -> TokenExplanation:
    attribution = torch.zeros(2, 3, 4)
    attribution[0, 0] = 0.5  # token score 2.0
    attribution[0, 1] = -0.25  # -1.0
    attribution[1, 2, :2] = 0.5  # 1.0; the rest 0
    defaults = {
        "attribution": attribution,
        "tokens": torch.tensor([[1, 2, 3], [3, 0, 2]]),
        "targets": torch.tensor([[1], [0]]),
        "scores": torch.tensor([[0.7], [0.1]]),
        "method": "IntegratedGradients",
        "vocab": ["<pad>", "a<b", "cat", "dog"],
        "labels": ["negative", "positive"],
    }
    return TokenExplanation(**{**defaults, **kwargs})


def backgrounds(html: str) -> list[tuple[int, int, int, float]]:
    return [
        (int(r), int(g), int(b), float(a))
        for r, g, b, a in re.findall(r"background-color: rgba\((\d+), (\d+), (\d+), ([\d.]+)\)", html)
    ]


def test_token_scores_sum_over_the_embedding_dimension() -> None:
    exp = explanation()
    assert exp.token_scores.shape == (2, 1, 3)
    assert exp.token_scores[:, 0].tolist() == [[2.0, -1.0, 0.0], [0.0, 0.0, 1.0]]


def test_html_highlights_tokens_on_one_shared_signed_scale() -> None:
    html = explanation().to_html()
    assert "a&lt;b" in html and "<b>positive (class 1)</b>" in html and "<b>negative (class 0)</b>" in html
    colours = backgrounds(html)
    assert len(colours) == 6
    red, blue = (214, 39, 40), (31, 119, 180)
    # shared scale: the largest |score| (2.0) over both rows is full colour
    assert colours[0] == (*red, 1.0) and colours[1] == (*blue, 0.5) and colours[2][3] == 0.0
    assert colours[5] == (*red, 0.5)  # 1.0 in the second row is half the shared scale, not full colour
    assert "&plusmn;2" in html
    assert 'title="+2"' in html and 'title="-1"' in html
    assert backgrounds(explanation().to_html(scale=4.0))[0] == (*red, 0.5)


def test_vocab_as_callable_or_none_and_max_rows() -> None:
    assert explanation(vocab=lambda i: f"w{i}").token_strings() == [["w1", "w2", "w3"], ["w3", "w0", "w2"]]
    assert explanation(vocab=None).token_strings()[1] == ["3", "0", "2"]
    html = explanation().to_html(max_rows=1)
    assert len(backgrounds(html)) == 3 and "showing 1 of 2 rows" in html
    assert explanation()._repr_html_() == explanation().to_html()


def test_k_targets_give_one_line_per_target() -> None:
    exp = explanation(
        attribution=torch.randn(2, 2, 3, 4), targets=torch.tensor([[0, 1], [0, 1]]), scores=torch.zeros(2, 2),
        multi_target=True,
    )  # fmt: skip
    assert exp.token_scores.shape == (2, 2, 3)
    assert exp.to_html().count("target 1:") == 2


@pytest.mark.parametrize("suffix", [".html", ".png", ".pdf", ".svg"])
def test_save(tmp_path, suffix: str) -> None:
    path = explanation().save(tmp_path / f"tokens{suffix}")
    data = path.read_bytes()
    assert len(data) > 200
    magic = {".html": b"<!DOCTYPE html>", ".png": b"\x89PNG", ".pdf": b"%PDF", ".svg": b"<?xml"}[suffix]
    assert data.startswith(magic)


def test_token_colour() -> None:
    assert token_colour(-3.0, 2.0) == (31, 119, 180, 1.0)  # clipped at full colour
    assert token_colour(0.5, 0.0) == (214, 39, 40, 0.0)  # an all-zero explanation is blank, not NaN


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"attribution must be \(N, T, ...\) with N = 2, T = 3 .* got \(2, 4, 4\)"):
        explanation(attribution=torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match=r"tokens must be an \(N, T\) tensor of token ids, got \(6,\)"):
        explanation(tokens=torch.arange(6))
    with pytest.raises(TypeError, match="vocab must be a sequence of token strings .* got str"):
        explanation(vocab="abc")
    with pytest.raises(ValueError, match="token id 3 is out of range for a vocab of 2 entries"):
        explanation(vocab=["a", "b"]).to_html()
    with pytest.raises(ValueError, match=r"path must end with .html or one of .* got suffix '.txt'"):
        explanation().save("tokens.txt")
    with pytest.raises(ValueError, match="scale must be None .* or a number > 0, got 0"):
        explanation().to_html(scale=0)


def test_saliency_token_scores_are_the_gradient_norm_not_its_sum() -> None:
    # Behind a LayerNorm the embedding gradient sums to zero over the embedding (the LayerNorm ignores a constant
    # added to its input), so a signed sum is rounding noise; Saliency's token score is the gradient's L2 norm.
    import hookviz as hv

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(20, 16), torch.nn.LayerNorm(16), torch.nn.Flatten(), torch.nn.Linear(5 * 16, 3)
    ).double()
    ids = torch.tensor([[1, 4, 7, 2, 9], [3, 3, 8, 0, 5]])
    exp = hv.Saliency(model, layer=model[0]).visualize(ids, target=1)
    x = model[0](ids).detach().requires_grad_(True)
    grad = torch.autograd.grad(model[1:](x)[:, 1].sum(), x)[0]
    assert grad.sum(-1).abs().max() < 1e-12 * grad.norm(dim=-1).max()  # the premise: the signed sum is noise
    assert exp.reduction == "norm"
    assert torch.allclose(exp.token_scores[:, 0], grad.norm(dim=-1), rtol=1e-12, atol=0)
    # the signed methods still sum: Input x Gradient's token scores add up to its attribution's total
    ixg = hv.InputXGradient(model, layer=model[0]).visualize(ids, target=1)
    assert ixg.reduction == "sum"
    assert torch.allclose(ixg.token_scores[:, 0], (x * grad).sum(-1), rtol=1e-12, atol=1e-15)


def test_reduction_is_checked() -> None:
    with pytest.raises(ValueError, match="reduction must be 'sum' or 'norm'"):
        explanation(reduction="max")
    assert explanation(reduction="norm").token_scores[0, 0].tolist() == pytest.approx([1.0, 0.5, 0.0])
