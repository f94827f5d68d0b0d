"""`explain_generation`: a causal language model's continuation explained token by token.

Tiny Hugging Face models from configs (GPT-2 and LLaMA: 2 layers, hidden 32, vocabulary 64, random weights with a
fixed seed) and a word-level tokenizer built in the test (no download). The reference is a float64 loop written from
the papers with torch.autograd only: per generated token, one forward pass over the prompt and the tokens before it
and one backward pass. Comparisons are float64 against float64; the tolerance `TOL` covers float64 rounding (a few
hundred operations of relative error 2**-53 each, on values of order 1) whatever the thread count or vector unit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from refs import require
from torch import nn

import hookviz as hv
from hookviz.methods.scope import current_call

transformers = require("transformers")
tokenizers = require("tokenizers")

# Integrated Gradients with a few steps warns that its sum misses f(x) - f(baseline) by more than 1%: the quadrature's
# own error (its warning is tested in test_gradient_family.py); the reference integrates with the same nodes
pytestmark = pytest.mark.filterwarnings("ignore:IntegratedGradients.*increase steps:UserWarning")

TOL = 1e-10  # float64 rounding through a 2-layer model, relative to the largest |score| (see the module docstring)
WORDS = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(60)]


def make_tokenizer(bos: bool = False) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer over `WORDS`; with `bos`, LLaMA's habit of starting every text with <bos>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg).double().eval()


def llama() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).double().eval()


MODELS = {"gpt2": gpt2, "llama": llama}


@pytest.fixture(scope="module")
def tok() -> transformers.PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request) -> nn.Module:
    return MODELS[request.param]()


# -- the reference: one forward and one backward per generated token, float64, torch.autograd only -----------------
def ref_score(logits: torch.Tensor, token: int, kind: str, contrast: int | None = None) -> torch.Tensor:
    def one(t: int) -> torch.Tensor:
        if kind == "logit":
            return logits[t]
        logp = torch.log_softmax(logits, -1)[t]
        return logp if kind == "log-probability" else logp.exp()

    return one(token) - (one(contrast) if contrast is not None else 0)


def reference(
    model: nn.Module,
    prompt: list[int],
    cont: list[int],
    method: str,
    *,
    kind: str = "logit",
    contrast: list[int] | None = None,
    steps: int = 5,
    baseline: int = 3,
) -> torch.Tensor:
    """(G, P + G) scores: row g from a forward pass over prompt + cont[:g] alone and one backward pass."""
    emb = model.get_input_embeddings()
    seq = torch.tensor([prompt + cont])
    p, g_total = len(prompt), len(cont)
    out = torch.zeros(g_total, p + g_total, dtype=torch.float64)
    for g in range(g_total):
        ids = seq[:, : p + g]
        c = None if contrast is None else contrast[g]

        def score(x: torch.Tensor, ids=ids, g=g, c=c) -> torch.Tensor:
            return ref_score(model(inputs_embeds=x).logits[0, -1], cont[g], kind, c)

        e = emb(ids).detach()
        if method == "occlusion":
            with torch.no_grad():
                clean = score(e)
                for s in range(p + g):
                    occluded = ids.clone()
                    occluded[0, s] = baseline
                    out[g, s] = clean - score(emb(occluded))
            continue
        if method == "integrated-gradients":  # Gauss-Legendre nodes on [0, 1], from the embedding of `baseline`
            base = emb(torch.full_like(ids, baseline)).detach()
            nodes, weights = np.polynomial.legendre.leggauss(steps)
            total = torch.zeros_like(e)
            for a, w in zip((nodes + 1) / 2, weights / 2, strict=True):
                x = (base + float(a) * (e - base)).requires_grad_(True)
                total += float(w) * torch.autograd.grad(score(x), x)[0]
            out[g, : p + g] = ((e - base) * total).sum(-1)[0]
            continue
        x = e.clone().requires_grad_(True)
        grad = torch.autograd.grad(score(x), x)[0]
        out[g, : p + g] = (grad.norm(dim=-1) if method == "saliency" else (x * grad).sum(-1))[0]
    return out


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> bool:
    a, b = a.detach().double(), b.detach().double()
    scale = max(float(b.abs().max()), 1e-30)
    return a.shape == b.shape and float((a - b).abs().max()) <= tol * scale


def ids_of(tok, text: str, special: bool = True) -> list[int]:
    return tok.encode(text, add_special_tokens=special)


# -- equal to the reference -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["saliency", "input-x-gradient", "integrated-gradients", "occlusion"])
def test_scores_equal_the_float64_reference(model, tok, method: str) -> None:
    prompt, target = "w1 w2 w3 w4", "w5 w6 w7"
    kw = {"steps": 5} if method == "integrated-gradients" else None
    exp = hv.explain_generation(model, tok, prompt, method=method, target=target, method_kwargs=kw)
    want = reference(model, ids_of(tok, prompt), ids_of(tok, target, False), method)
    assert exp.scores[0].dtype == torch.float64
    assert close(exp.scores[0], want), (exp.scores[0], want)
    # each token's text as it reads in the sequence: the word-level tokenizer joins words with a space
    assert exp.source_tokens == [["w1", " w2", " w3", " w4", " w5", " w6", " w7"]]
    assert exp.generated_tokens == [[" w5", " w6", " w7"]]
    assert exp.prompt_lengths == [4]


@pytest.mark.parametrize("kind", ["probability", "log-probability"])
def test_explained_score_kinds(tok, kind: str) -> None:
    m = gpt2()
    exp = hv.explain_generation(m, tok, "w1 w2 w3", target="w4 w5", score=kind)
    want = reference(m, ids_of(tok, "w1 w2 w3"), ids_of(tok, "w4 w5", False), "input-x-gradient", kind=kind)
    assert close(exp.scores[0], want)
    assert exp.score == kind


def test_the_relevance_methods_run_and_are_causal(model, tok) -> None:
    # AttnLRP / CP-LRP themselves are checked against lxt in test_attnlrp.py; here: the generation plumbing
    for method in ("attn-lrp", "cp-lrp"):
        exp = hv.explain_generation(model, tok, "w1 w2 w3", target="w4 w5 w6", method=method)
        s = exp.scores[0]
        assert s.shape == (3, 6) and torch.isfinite(s).all()
        assert (s[0, 3:] == 0).all() and (s[1, 4:] == 0).all() and (s[2, 5:] == 0).all()
        assert (s[:, :3].abs().sum(1) > 0).all()


@pytest.mark.parametrize("method", ["attention-rollout", "gradient-rollout"])
def test_rollouts_equal_the_method_read_one_step_at_a_time(model, tok, method: str) -> None:
    # the rollouts themselves are checked against their references in test_attention_rollout.py; here: each step's
    # row equals the method run alone on the prefix, read at its last token, explaining the step's logit
    exp = hv.explain_generation(model, tok, "w4 w5", target="w6 w7 w8", method=method)
    ids = torch.tensor([ids_of(tok, "w4 w5 w6 w7 w8")])
    cls = hv.AttentionRollout if method == "attention-rollout" else hv.GradientRollout
    for g in range(3):
        want = cls(model, token=-1).attribute(ids[:, : 2 + g], target=lambda out, g=g: out.logits[:, -1, ids[0, 2 + g]])
        assert close(exp.scores[0][g, : 2 + g], want[0])
        assert (exp.scores[0][g, 2 + g :] == 0).all()


def test_rollout_rows_per_target_are_checked() -> None:
    model = gpt2()
    with pytest.raises(TypeError, match=r"\(N, K\) integer tensor"):
        hv.AttentionRollout(model, token=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="one row in -3..2 per input and target"):
        hv.AttentionRollout(model, token=torch.tensor([[0, 3]])).attribute(
            torch.tensor([[5, 6, 7]]), target=lambda out: out.logits[:, -1, :2]
        )


# -- peers ----------------------------------------------------------------------------------------------------------
def test_input_x_gradient_equals_captum_llm_gradient_attribution() -> None:
    attr = require("captum.attr")
    LayerGradientXActivation, LLMGradientAttribution, TextTokenInput = (
        attr.LayerGradientXActivation,
        attr.LLMGradientAttribution,
        attr.TextTokenInput,
    )

    tok = make_tokenizer(bos=True)
    m = llama()
    prompt, target = "w1 w2 w3 w4", "w5 w6 w7"
    captum_attr = LLMGradientAttribution(LayerGradientXActivation(m, m.get_input_embeddings()), tok)
    theirs = captum_attr.attribute(TextTokenInput(prompt, tok), target=target).token_attr
    # captum: the log-probability of each target token, the prompt's tokens (with <bos>) as features
    exp = hv.explain_generation(m, tok, prompt, target=target, score="log-probability", skip_special_tokens=False)
    ours = exp.scores[0][:, : exp.prompt_lengths[0]]
    assert exp.source_tokens[0][0] == "<bos>"
    # both float64, the same gradients by another route (captum: one forward per token): float64 rounding
    assert close(ours, theirs)


def test_occlusion_equals_captum_llm_attribution_feature_ablation() -> None:
    attr = require("captum.attr")
    FeatureAblation, LLMAttribution, TextTokenInput = attr.FeatureAblation, attr.LLMAttribution, attr.TextTokenInput

    tok = make_tokenizer()
    m = gpt2()
    prompt, target = "w1 w2 w3 w4", "w5 w6 w7"
    captum_attr = LLMAttribution(FeatureAblation(m), tok)
    # use_cached_outputs=False: captum's default decodes the target with a key/value cache, and under transformers
    # 5.x that path gives other logits from the second target token on (0.0020 against the uncached 0.00097 here:
    # the uncached teacher-forced pass is what both libraries define)
    theirs = captum_attr.attribute(
        TextTokenInput(prompt, tok, baselines=3), target=target, use_cached_outputs=False
    ).token_attr
    exp = hv.explain_generation(
        m, tok, prompt, target=target, method="occlusion", score="log-probability", method_kwargs={"baseline": 3}
    )
    # captum returns float32 (its attribution buffers) from float64 log-probabilities: float32 rounding, 2**-24
    # relative to each value, below 1e-6 of the largest
    assert theirs.dtype == torch.float32
    assert close(exp.scores[0][:, :4], theirs, tol=1e-6)


# -- batching, generation, forced targets ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method",
    ["saliency", "input-x-gradient", "integrated-gradients", "attn-lrp", "occlusion", "attention-rollout",
     "gradient-rollout"],
)  # fmt: skip
def test_a_prompt_alone_equals_the_same_prompt_batched_with_a_longer_one(model, tok, method: str) -> None:
    kw = {"steps": 3} if method == "integrated-gradients" else None
    alone = hv.explain_generation(model, tok, "w4 w5", method=method, max_new_tokens=4, method_kwargs=kw)
    batched = hv.explain_generation(
        model, tok, ["w1 w2 w3 w7 w8 w9", "w4 w5"], method=method, max_new_tokens=4, method_kwargs=kw
    )
    assert alone.generated_tokens[0] == batched.generated_tokens[1]
    assert close(batched.scores[1], alone.scores[0])
    one_by_one = hv.explain_generation(
        model, tok, ["w1 w2 w3 w7 w8 w9", "w4 w5"], method=method, max_new_tokens=4, method_kwargs=kw, batch_size=1
    ) if method != "integrated-gradients" else batched  # fmt: skip
    assert close(batched.scores[0], one_by_one.scores[0])


@pytest.mark.parametrize("method", ["input-x-gradient", "integrated-gradients", "gradient-rollout"])
def test_steps_in_chunks_give_the_same_scores(monkeypatch, tok, method: str) -> None:
    # a memory bound of one byte: one step per chunk (one forward pass each), the same numbers
    from hookviz.generation import attribute

    m = gpt2()
    kw = {"steps": 3} if method == "integrated-gradients" else None
    args = (m, tok, ["w1 w2 w3", "w4"])
    whole = hv.explain_generation(*args, target=["w5 w6 w7", "w8 w9"], method=method, method_kwargs=kw)
    monkeypatch.setattr(attribute, "CHUNK_BYTES", 1)
    assert attribute.chunk_size(2, 6, 32, 8, 3) == 1
    chunked = hv.explain_generation(*args, target=["w5 w6 w7", "w8 w9"], method=method, method_kwargs=kw)
    for a, b in zip(chunked.scores, whole.scores, strict=True):
        assert close(a, b)


def test_generation_is_greedy_and_forcing_it_gives_the_same_scores(model, tok) -> None:
    exp = hv.explain_generation(model, tok, ["w1 w2 w3", "w9"], max_new_tokens=5)
    for i, prompt in enumerate(["w1 w2 w3", "w9"]):
        ids = ids_of(tok, prompt)
        with torch.no_grad():  # greedy by hand: the argmax of the last position, one token at a time
            for _ in range(5):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        want = [WORDS[t] for t in ids[-5:]]
        got = [t.strip() for t in exp.generated_tokens[i]]
        assert got == want[: len(got)]
        forced = hv.explain_generation(model, tok, prompt, target=" ".join(got))
        assert close(forced.scores[0], exp.scores[i])


def test_step_scores_by_hand(tok) -> None:
    m = gpt2()
    names = ("probability", "log-probability", "entropy")
    exp = hv.explain_generation(m, tok, "w1 w2 w3", target="w4 w5 w6", step_scores=names)
    seq = ids_of(tok, "w1 w2 w3 w4 w5 w6")
    with torch.no_grad():
        logp = torch.log_softmax(m(torch.tensor([seq])).logits[0, 2:5], -1)
    tokens = torch.tensor(seq[3:])
    lp = logp.gather(1, tokens[:, None])[:, 0]
    assert torch.allclose(exp.step_scores["log-probability"][0], lp, rtol=0, atol=1e-12)
    assert torch.allclose(exp.step_scores["probability"][0], lp.exp(), rtol=0, atol=1e-12)
    assert torch.allclose(exp.step_scores["entropy"][0], -(logp.exp() * logp).sum(-1), rtol=0, atol=1e-12)


def test_contrast_explains_the_probability_difference(tok) -> None:
    m = gpt2()
    exp = hv.explain_generation(m, tok, "w1 w2 w3", target="w4 w5", contrast="w8 w9")
    want = reference(
        m, ids_of(tok, "w1 w2 w3"), ids_of(tok, "w4 w5", False), "input-x-gradient", kind="probability",
        contrast=ids_of(tok, "w8 w9", False),
    )  # fmt: skip
    assert exp.score == "probability" and exp.contrast_tokens == [[" w8", " w9"]]
    assert close(exp.scores[0], want)


@pytest.mark.parametrize("method", ["attn-lrp", "cp-lrp"])
def test_contrast_of_relevance_is_the_difference_of_relevances(tok, method: str) -> None:
    """LRP of score(target) - score(contrast) is the target's relevance minus the contrast's (LRP-0 through the
    difference): each relevance starts at its own logit, not at +/- the difference."""
    m = gpt2()
    # one step: the contrast token is scored over the same prefix as the target's (later steps: the target's prefix)
    both = hv.explain_generation(m, tok, "w1 w2 w3", method=method, target="w4", contrast="w8", score="logit")
    one = hv.explain_generation(m, tok, "w1 w2 w3", method=method, target="w4", score="logit")
    other = hv.explain_generation(m, tok, "w1 w2 w3", method=method, target="w8", score="logit")
    # the same relevance passes on the same numbers, subtracted: float32 rounding of one subtraction
    torch.testing.assert_close(both.scores[0], one.scores[0] - other.scores[0], rtol=0, atol=1e-6)
    assert float((one.scores[0] - other.scores[0]).abs().max()) > 0


def test_special_tokens_are_left_out_unless_asked() -> None:
    tok = make_tokenizer(bos=True)
    m = llama()
    kept = hv.explain_generation(m, tok, "w1 w2", target="w3 <eos>", skip_special_tokens=False)
    dropped = hv.explain_generation(m, tok, "w1 w2", target="w3 <eos>")
    assert kept.source_tokens[0] == ["<bos>", " w1", " w2", " w3", " <eos>"]
    assert dropped.source_tokens[0] == [" w1", " w2", " w3"] and dropped.generated_tokens[0] == [" w3"]
    # the same numbers: rows of special tokens (<eos>) and their columns (<bos>) are only left out
    assert torch.equal(dropped.scores[0], kept.scores[0][:1, 1:4])
    assert dropped.step_scores["probability"][0].shape == (1,)


def test_chat_template_is_applied() -> None:
    tok = make_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}w50 {{ m['content'] }} w51 {% endfor %}{% if add_generation_prompt %}w52{% endif %}"
    )
    m = gpt2()
    exp = hv.explain_generation(m, tok, "w1 w2", target="w3", chat_template=True)
    assert exp.source_tokens[0] == ["w50", " w1", " w2", " w51", " w52", " w3"]
    want = reference(m, ids_of(tok, "w50 w1 w2 w51 w52"), ids_of(tok, "w3", False), "input-x-gradient")
    assert close(exp.scores[0], want)


class TinyLM(nn.Module):
    """Not a Hugging Face model: token ids -> logits tensor through an embedding, a causal mix and a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.emb = nn.Embedding(64, 16)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 64)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        # causal: each position sees the running mean of the positions up to it
        mean = x.cumsum(1) / torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return self.head(torch.tanh(self.mix(mean)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.body(self.emb(ids))


def test_any_model_mapping_ids_to_logits(tok) -> None:
    m = TinyLM().double()
    # random weights may generate special tokens (<unk>): kept here, so the rows are the greedy steps one for one
    exp = hv.explain_generation(m, tok, ["w1 w2 w3", "w4"], max_new_tokens=3, skip_special_tokens=False)
    for i, prompt in enumerate(["w1 w2 w3", "w4"]):
        ids = ids_of(tok, prompt)
        cont = [WORDS.index(t.strip()) for t in exp.generated_tokens[i]]
        with torch.no_grad():
            greedy = list(ids)
            for _ in range(3):
                greedy.append(int(m(torch.tensor([greedy]))[0, -1].argmax()))
        assert cont == greedy[len(ids) :]
        want = torch.zeros(3, len(ids) + 3, dtype=torch.float64)
        for g in range(3):
            x = m.emb(torch.tensor([ids + cont[:g]])).detach().requires_grad_(True)
            grad = torch.autograd.grad(m.body(x)[0, -1, cont[g]], x)[0]
            want[g, : len(ids) + g] = (x * grad).sum(-1)[0]
        assert close(exp.scores[i], want)


# -- bad input: a clear error before the model runs -----------------------------------------------------------------
class Counting:
    """Counts the model's forward calls during the block (the hook is removed after it)."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.calls = model, 0

    def __enter__(self) -> Counting:
        self.handle = self.model.register_forward_pre_hook(lambda *a: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


BAD = {
    "vocabulary larger than the embeddings": (dict(tokenizer="big"), ValueError, "does not belong to this model"),
    "prompt longer than the positions": (dict(prompts=" ".join(["w1"] * 70)), ValueError, "positions"),
    "target that tokenizes to nothing": (dict(target=""), ValueError, "tokenizes to nothing"),
    "chat template missing": (dict(chat_template=True), ValueError, "no chat template"),
    "model without next-token logits": (dict(model="base"), ValueError, "no next-token logits"),
    "method that cannot run at the embeddings": (dict(method="gradcam"), ValueError, "cannot explain a generation"),
    "unknown step score": (dict(step_scores=("perplexity",)), ValueError, "step_scores"),
    "unknown score": (dict(score="odds"), ValueError, "score must be one of"),
    "contrast of another length": (dict(target="w4 w5", contrast="w6"), ValueError, "contrast\\[0\\] has 1 tokens"),
    "targets not one per prompt": (dict(prompts=["w1", "w2"], target=["w3"]), ValueError, "one per prompt"),
    "max_new_tokens zero": (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    "prompts not text": (dict(prompts=[1, 2]), TypeError, "prompts must be"),
    "unknown method option": (dict(method_kwargs={"stepz": 3}), TypeError, "stepz"),
    "bad method option": (dict(method="integrated-gradients", method_kwargs={"steps": 0}), ValueError, "steps"),
    "baseline not a token id": (dict(method="occlusion", method_kwargs={"baseline": 0.5}), TypeError, "baseline"),
    "baseline out of the vocabulary": (
        dict(method="integrated-gradients", method_kwargs={"baseline": 99}),
        ValueError,
        "token embedding has 64",
    ),
    "not a tokenizer": (dict(tokenizer="none"), TypeError, "Hugging Face tokenizer interface"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_before_the_model_runs(tok, case: str) -> None:
    m = gpt2()
    changes, error, match = BAD[case]
    kwargs = dict(prompts="w1 w2", tokenizer=tok, model=m)
    kwargs.update(changes)
    if kwargs["tokenizer"] == "big":
        big = dict.fromkeys(WORDS + [f"x{i}" for i in range(10)])
        kwargs["tokenizer"] = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer(
                tokenizers.models.WordLevel({w: i for i, w in enumerate(big)}, "<unk>")
            )
        )
    elif kwargs["tokenizer"] == "none":
        kwargs["tokenizer"] = object()
    if kwargs["model"] == "base":
        kwargs["model"] = transformers.GPT2Model(m.config)
    model, tokenizer, prompts = kwargs.pop("model"), kwargs.pop("tokenizer"), kwargs.pop("prompts")
    with Counting(model) as counting, pytest.raises(error, match=match):
        hv.explain_generation(model, tokenizer, prompts, **kwargs)
    assert counting.calls == 0


def test_a_model_whose_output_is_not_logits_is_refused(tok) -> None:
    class Hidden(nn.Module):  # maps ids to (N, T, D) hidden states of the wrong width, no logits
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(64, 8)

        def forward(self, ids):
            return {"hidden": self.emb(ids)}

    with pytest.raises(ValueError, match="no next-token logits"):
        hv.explain_generation(Hidden(), tok, "w1 w2", max_new_tokens=2)

    class States(Hidden):  # (N, T, 8) hidden states: a tensor of the right rank, too narrow for 64 token ids
        def forward(self, ids):
            return self.emb(ids)

    for target in (None, "w3"):  # while generating, and while attributing a forced target
        with pytest.raises(ValueError, match="no next-token logits over the tokenizer's 64 ids"):
            hv.explain_generation(States(), tok, "w1 w2", target=target, max_new_tokens=2)


# -- the result object ----------------------------------------------------------------------------------------------
def hand_made() -> hv.GenerationExplanation:
    s = torch.tensor([[1.0, 2.0, 4.0, 0.0, 0.0], [8.0, 16.0, 32.0, 64.0, 0.0]])
    return hv.GenerationExplanation(
        scores=[s],
        source_tokens=[["un", "believ", " able", " to", "o"]],
        generated_tokens=[[" to", "o"]],
        prompt_lengths=[3],
        step_scores={"probability": [torch.tensor([0.5, 0.25])], "log-probability": [torch.tensor([-1.0, -2.0])]},
        method="input-x-gradient",
        word_starts=[[True, False, True, True, False]],
    )


def test_aggregate_words_sums_the_pieces_by_hand() -> None:
    w = hand_made().aggregate("words")
    assert w.source_tokens == [["unbeliev", " able", " too"]] and w.generated_tokens == [[" too"]]
    assert w.prompt_lengths == [2]
    # the word " too" is rows 0 + 1; columns {un, believ} and {able}; its own columns are zero
    assert torch.equal(w.scores[0], torch.tensor([[1.0 + 2 + 8 + 16, 4.0 + 32, 0.0]]))
    assert torch.allclose(w.step_scores["probability"][0], torch.tensor([0.125]))
    assert torch.allclose(w.step_scores["log-probability"][0], torch.tensor([-3.0]))


def test_aggregate_spans_and_errors() -> None:
    exp = hand_made()
    a = exp.aggregate(spans=[(0, 3)])
    assert a.source_tokens == [["unbeliev able", " to", "o"]]
    assert torch.equal(a.scores[0], torch.tensor([[7.0, 0.0, 0.0], [56.0, 64.0, 0.0]]))
    with pytest.raises(ValueError, match="overlap"):
        exp.aggregate(spans=[(0, 2), (1, 3)])
    with pytest.raises(ValueError, match="start < stop"):
        exp.aggregate(spans=[(0, 9)])
    with pytest.raises(ValueError, match="either 'words' or spans"):
        exp.aggregate()


def test_word_starts_from_the_tokenizer(tok) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from hookviz.generation.tokens import token_texts, word_starts

    vocab = {"[UNK]": 0, "un": 1, "##believ": 2, "##able": 3, "cat": 4}
    wp = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wp.decoder = decoders.WordPiece()
    piece = transformers.PreTrainedTokenizerFast(tokenizer_object=wp, unk_token="[UNK]")
    ids = piece.encode("unbelievable cat", add_special_tokens=False)
    assert ids == [1, 2, 3, 4]
    assert word_starts(piece, ids, set()) == [True, False, False, True]
    assert word_starts(tok, ids_of(tok, "w1 w2"), set()) == [True, True]
    assert token_texts(piece, ids) == ["un", "believ", "able", " cat"]
    assert token_texts(tok, ids_of(tok, "w1 w2")) == ["w1", " w2"]


def test_views_html_figure_save_and_dict(tmp_path, tok) -> None:
    exp = hv.explain_generation(gpt2(), tok, ["w1 w2 w3", "w4"], target=["w5 w6", "w7 w8 w9"])
    page = exp.to_html()
    assert "<script" not in page and "http" not in page  # self-contained: no script, nothing fetched
    assert page.count("outline: 2px") == 5  # one line per generated token
    assert f'title="w1: {float(exp.scores[0][0, 0]):+.4g}"' in page  # the hover shows the score
    assert exp._repr_html_() == page
    fig = exp.figure()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == exp.source_tokens[0]
    for suffix in (".html", ".png", ".svg"):
        path = exp.save(tmp_path / f"gen{suffix}")
        assert path.stat().st_size > 0
    with pytest.raises(ValueError, match="suffix"):
        exp.save(tmp_path / "gen.txt")
    data = json.loads(json.dumps(exp.to_dict()))
    assert data["method"] == "input-x-gradient" and len(data["explanations"]) == 2
    assert data["explanations"][1]["generated_tokens"] == [" w7", " w8", " w9"]
    assert np.allclose(data["explanations"][1]["scores"], exp.scores[1].numpy())


def test_figure_stays_readable_at_100_source_tokens(tok) -> None:
    prompt = " ".join(f"w{i % 60}" for i in range(97))
    m = gpt2()
    m.config.n_positions = 64  # the check reads the config: raise it with the model's real capacity
    big = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=128)
    ).double()
    exp = hv.explain_generation(big, tok, prompt, target="w1 w2 w3")
    fig = exp.figure()
    ax = fig.axes[0]
    assert len(ax.get_xticklabels()) == 100
    width_in = fig.get_size_inches()[0]
    assert width_in / 100 >= 0.15  # at least 0.15 inch per 7-point label: labels do not overlap


# -- the model left as it came --------------------------------------------------------------------------------------
def snapshot(model: nn.Module) -> dict:
    return {
        "hooks": hv.hook_counts(model),
        "training": [(n, m.training) for n, m in model.named_modules()],
        "requires_grad": [(n, p.requires_grad) for n, p in model.named_parameters()],
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [(n, id(p.grad), None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()],
        "config": model.config.to_dict() if hasattr(model, "config") else None,
    }


def assert_same(before: dict, model: nn.Module) -> None:
    after = snapshot(model)
    for key in ("hooks", "training", "requires_grad", "config"):
        assert after[key] == before[key], key
    for k, v in before["state"].items():
        assert torch.equal(v, after["state"][k]), k
    for (n, i, g), (_, j, h) in zip(before["grads"], after["grads"], strict=True):
        assert i == j and (g is None) == (h is None) and (g is None or torch.equal(g, h)), n
    assert torch.overrides._get_current_function_mode_stack() == []


def mid_training(build, arch: str) -> nn.Module:
    model = build().train()
    model.get_input_embeddings().requires_grad_(False)
    ids = torch.tensor([[5, 6, 7, 8]])
    model(ids).logits.sum().backward()
    next(p for p in model.parameters() if p.requires_grad).grad = None  # some .grad None, some set
    (model.transformer.h[0] if arch == "gpt2" else model.model.layers[0]).eval()  # mixed modes come back mixed
    return model


LAYER = {"gpt2": lambda m: m.transformer.h[1], "llama": lambda m: m.model.layers[1]}


@pytest.mark.parametrize("stage", ["generating", "attributing"])
@pytest.mark.parametrize("scenario", ["normal", "error-inside", "interrupt"])
@pytest.mark.parametrize(
    "method", ["input-x-gradient", "integrated-gradients", "attn-lrp", "gradient-rollout", "occlusion"]
)
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_model_left_exactly_as_it_came(tok, arch: str, method: str, scenario: str, stage: str) -> None:
    # mid-training: train mode with one block in eval mode, a frozen embedding, .grad on some parameters; the user's
    # forward hook in the middle raises while generating (target None) or while attributing (a forced target)
    model = mid_training(MODELS[arch], arch)
    handle = None
    exc: BaseException | None = None
    if scenario != "normal":
        exc = ZeroDivisionError("boom") if scenario == "error-inside" else KeyboardInterrupt()

        def raise_it(module, args, out):
            raise exc

        handle = LAYER[arch](model).register_forward_hook(raise_it)
    before = snapshot(model)
    kw = {"steps": 2} if method == "integrated-gradients" else None
    target = None if stage == "generating" else ["w4 w5", "w6"]
    try:
        if exc is None:
            hv.explain_generation(
                model, tok, ["w1 w2", "w3"], method=method, target=target, max_new_tokens=3, method_kwargs=kw
            )
        else:
            with pytest.raises(type(exc)):
                hv.explain_generation(
                    model, tok, ["w1 w2", "w3"], method=method, target=target, max_new_tokens=3, method_kwargs=kw
                )
        assert_same(before, model)
        assert current_call() is None  # no hookviz call left active
    finally:
        if handle is not None:
            handle.remove()


def test_works_under_no_grad(tok) -> None:
    m = gpt2()
    with torch.no_grad():
        exp = hv.explain_generation(m, tok, "w1 w2", target="w3 w4")
        assert not torch.is_grad_enabled()  # switched on for the call only
    assert close(exp.scores[0], reference(m, ids_of(tok, "w1 w2"), ids_of(tok, "w3 w4", False), "input-x-gradient"))


# -- the command line -----------------------------------------------------------------------------------------------
def test_cli_explains_a_local_model_folder(tmp_path, capsys, tok) -> None:
    from hookviz.cli import main

    folder = tmp_path / "lm"
    gpt2().float().save_pretrained(folder)
    tok.save_pretrained(folder)
    (tmp_path / "prompts.txt").write_text("w1 w2 w3\n\nw4\n")
    out = tmp_path / "gen.html"
    args = ["explain-generation", "--model", str(folder), "--prompt-file", str(tmp_path / "prompts.txt")]
    assert main([*args, "--max-new-tokens", "3", "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count("prompt 0:") == 1 and page.count("prompt 1:") == 1 and "<script" not in page
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--model", "MISSING", "--prompt", "w1"], "not a Hugging Face model folder"),
        (["--model", "FOLDER"], "give a prompt"),
        (["--model", "FOLDER", "--prompt", "w1", "--out", "x.gif"], "--out must end with"),
        (["--model", "FOLDER", "--prompt", "w1", "--target", ""], "tokenizes to nothing"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, tok, extra: list[str], match: str) -> None:
    from hookviz.cli import main

    folder = tmp_path / "lm"
    gpt2().float().save_pretrained(folder)
    tok.save_pretrained(folder)
    argv = ["explain-generation", *[str(folder) if a == "FOLDER" else str(tmp_path / a) if a == "MISSING" else a
                                    for a in extra]]  # fmt: skip
    capsys.readouterr()  # save_pretrained's progress bars
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    # one error line (transformers' own loading progress bars may precede it), no traceback
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith("hookviz explain-generation: error:") and match in lines[0]


def test_row_target_follows_the_rows_of_an_expanded_batch() -> None:
    # a RowTarget scores each row at its own input's class, whatever rows a method evaluates: equal to class targets
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    classes = torch.tensor([2, 0, 1])
    row_target = hv.RowTarget(lambda out, rows: out[torch.arange(out.shape[0]), classes[rows]])
    for method in (
        hv.IntegratedGradients(net, steps=4, batch_size=2),  # chunks cut across inputs and path points
        hv.SmoothGrad(hv.Saliency(net), n=3, batch_size=2, generator=torch.Generator().manual_seed(0)),
        hv.Occlusion(net, window=(2,), batch_size=2),
    ):
        if isinstance(method, hv.SmoothGrad):
            want = hv.SmoothGrad(hv.Saliency(net), n=3, batch_size=2, generator=torch.Generator().manual_seed(0))
            want = want.attribute(x, target=classes)
        else:
            want = method.attribute(x, target=classes)
        assert torch.allclose(method.attribute(x, target=row_target), want, rtol=0, atol=1e-12), type(method)
    with pytest.raises(TypeError, match="RowTarget needs a callable"):
        hv.RowTarget(3)
