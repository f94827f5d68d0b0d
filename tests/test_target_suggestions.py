"""Every suggested fix of a target error is right on the case that triggered it (issue 27, point 3): the code in the
message is taken out of it, run as the target on the same model and input, and checked against what it claims to
score. Tiny models from configs (random weights, fixed seed): GPT-2 (logits (N, T, V)), BERT (a masked LM and a bare
encoder without logits), a CNN classifier and a segmentation CNN.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

import hookviz as hv

transformers = pytest.importorskip("transformers")

VOCAB = 40


def _tiny_gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def _bert_config() -> object:
    return transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=16,
    )


def _tiny_bert_mlm() -> nn.Module:
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(_bert_config()).eval()


def _tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    return transformers.BertModel(_bert_config()).eval()


class Seg(nn.Module):
    """A segmentation CNN: (N, 3, 8, 8) -> (N, 4, 8, 8) class maps."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class CNN(nn.Module):
    """A classifier CNN: (N, 3, 8, 8) -> (N, 5)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def _suggestion(message: str) -> Callable:
    """The callable a message suggests, compiled from its text."""
    found = re.findall(r"target=(lambda out: [^;]+?)(?:;|$)", message)
    assert len(found) == 1, message
    return eval(found[0], {"torch": torch})  # the message's own code, run as a user would paste it


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))


def _image() -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))


# (name, model factory, method factory, inputs, target that triggers the error, expected score of the suggestion)
CASES = [
    (
        "gpt2-int",
        _tiny_gpt2,
        lambda m: hv.Saliency(m, layer="transformer.wte"),
        _ids,
        3,
        lambda out: out.logits[:, -1, 3],
    ),
    (
        "gpt2-top",
        _tiny_gpt2,
        lambda m: hv.Saliency(m, layer="transformer.wte"),
        _ids,
        None,
        lambda out: out.logits[:, -1].max(-1).values,
    ),
    (
        "bert-mlm-int",
        _tiny_bert_mlm,
        lambda m: hv.Saliency(m, layer="bert.embeddings.word_embeddings"),
        _ids,
        7,
        lambda out: out.logits[:, -1, 7],
    ),
    (
        "bert-encoder-int",
        _tiny_bert,
        lambda m: hv.Saliency(m, layer="embeddings.word_embeddings"),
        _ids,
        3,
        lambda out: out.pooler_output[:, 3],
    ),
    ("seg-int", Seg, lambda m: hv.Saliency(m), _image, 2, lambda out: out[:, 2].sum((1, 2))),
    (
        "seg-gradcam",
        Seg,
        lambda m: hv.GradCAM(m, layer="body.1"),
        _image,
        1,
        lambda out: out[:, 1].sum((1, 2)),
    ),
]


@pytest.mark.parametrize(
    ("name", "model_fn", "method_fn", "inputs", "target", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_class_target_refusal_suggests_a_callable_that_works(
    name, model_fn, method_fn, inputs, target, expected
) -> None:
    """On today's main the GPT-2 suggestion is ``out['logits'][:, 3]``: position 3's whole vocabulary."""
    model, x = model_fn(), inputs()
    with pytest.raises(ValueError, match="class targets need a model output of shape") as info:
        method_fn(model).attribute(x, target=target)
    fn = _suggestion(str(info.value))
    with torch.no_grad():
        out = model(x)
        torch.testing.assert_close(fn(out), expected(out), rtol=0, atol=0)  # the same indexing: exact
    assert fn(out).shape == (2,)
    attribution = method_fn(model).attribute(x, target=fn)
    assert torch.isfinite(attribution).all() and attribution.abs().sum() > 0


def test_a_whole_vocabulary_row_from_a_callable_is_refused_with_fixes_that_work() -> None:
    """The issue's callable ``out['logits'][:, 3]`` on (N, T, V) logits returns (N, V): refused, not read as V
    targets; both fixes in the message run (one token's score, (N,), and two named tokens, (N, 2))."""
    model, x = _tiny_gpt2(), _ids()
    method = hv.Saliency(model, layer="transformer.wte")
    with pytest.raises(ValueError, match=r"returned shape \(2, 40\): one score per vocabulary entry") as info:
        method.attribute(x, target=lambda out: out["logits"][:, 3])
    codes = re.findall(r"target=(lambda out: [^;]+?)(?:;|$)", str(info.value))
    assert codes == ["lambda out: out.logits[:, -1].max(dim=-1).values", "lambda out: out.logits[:, -1, [0, 1]]"]
    one, two = (eval(code, {"torch": torch}) for code in codes)  # the message's own code
    assert method.attribute(x, target=one).shape == (2, 6, 32)
    assert method.attribute(x, target=two).shape == (2, 2, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(two(model(x)), model(x).logits[:, -1, :2], rtol=0, atol=0)


def test_whole_class_row_of_a_classifier_is_refused() -> None:
    model, x = CNN(), _image()
    with pytest.raises(ValueError, match=r"one score per class of the logits \(2, 5\)") as info:
        hv.Saliency(model).attribute(x, target=lambda out: out)
    message = str(info.value)
    by_fn = hv.Saliency(model).attribute(x, target=_suggestion(message))
    torch.testing.assert_close(by_fn, hv.Saliency(model).attribute(x, target=0), rtol=0, atol=0)  # class 0's score
    every = eval(re.findall(r"(torch\.arange\(\d+\)\.repeat\(\d+, 1\))", message)[0], {"torch": torch})
    assert hv.Saliency(model).attribute(x, target=every).shape == (2, 5, 3, 8, 8)


def test_callable_of_wrong_shape_gets_a_suggestion_that_works() -> None:
    model, x = _tiny_gpt2(), _ids()
    method = hv.Saliency(model, layer="transformer.wte")
    with pytest.raises(ValueError, match=r"with N = 2 \(one score per input\); got shape \(\)") as info:
        method.attribute(x, target=lambda out: out.logits.sum())
    fn = _suggestion(str(info.value))
    with torch.no_grad():
        out = model(x)
        torch.testing.assert_close(fn(out), out.logits[:, -1].max(-1).values, rtol=0, atol=0)
    assert torch.isfinite(method.attribute(x, target=fn)).all()


@pytest.mark.parametrize(
    ("output", "code"),
    [
        ({"logits": torch.zeros(2, 3, 4)}, "lambda out: out['logits'][:, -1, 1]"),
        ((torch.zeros(2, 3, 4),), "lambda out: out[0][:, -1, 1]"),
        (torch.zeros(2, 4, 5, 5), "lambda out: out[:, 1].flatten(1).sum(1)"),
        (torch.zeros(2), "lambda out: out"),
        ({"hidden": torch.zeros(2, 3, 4), "pooled": torch.zeros(2, 4)}, "lambda out: out['pooled'][:, 1]"),
    ],
)
def test_suggestion_reaches_the_scores_the_way_the_output_holds_them(output, code) -> None:
    """dicts by key, tuples by position, plain tensors directly; the suggestion returns (N,) on that output."""
    with pytest.raises(ValueError) as info:
        hv.targets.class_logits(output, cls=1)
    fn = _suggestion(str(info.value))
    assert re.findall(r"target=(lambda out: [^;]+?)(?:;|$)", str(info.value)) == [code]
    assert fn(output).shape == (2,)
