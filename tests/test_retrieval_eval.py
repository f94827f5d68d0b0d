"""The retrieval language model's faithfulness evaluation (`hookviz.zoo.retrieval_eval`): how a generation
explanation is scored against the known evidence, with explanations made by hand, and its command."""

from __future__ import annotations

import types

import pytest
import torch

import hookviz as hv
from hookviz import zoo
from hookviz.zoo import retrieval_eval as ev


def _explanation(
    data: zoo.Retrieval, pick, *, bos: bool = False, eos: bool = False, all_generated: bool = False
) -> types.SimpleNamespace:
    """A generation explanation of `data`'s prompts with their answers (and <eos> when `eos`): per prompt a (G, S)
    matrix over the prompt's tokens then the generated ones (all of them when `all_generated`, as
    `hv.GenerationExplanation` lays them out, else those before the last), tokens with a leading space; the first
    row's top score on the prompt word `pick(i, words)` (None: all zeros)."""
    scores, sources, generated = [], [], []
    for i, prompt in enumerate(data.prompts):
        words = prompt.split()
        answer = zoo.retrieval_eval.VOCAB[int(data.answers[i])]
        gen = [answer, "<eos>"] if eos else [answer]
        src = (["<bos>"] if bos else []) + [f" {w}" for w in words] + (gen if all_generated else gen[:-1])
        s = torch.zeros(len(gen), len(src))
        j = pick(i, words)
        if j is not None:
            s[0, j + bos] = 1.0
            s[0, :] -= 0.5  # negative elsewhere: the top is the highest, not the largest magnitude
            s[0, j + bos] = 1.0
        if eos or all_generated:
            s[0, -1] = 5.0  # a generated token is no source of the first row: beyond the prompt, never picked
        scores.append(s)
        sources.append(src)
        generated.append(gen)
    return types.SimpleNamespace(scores=scores, source_tokens=sources, generated_tokens=generated)


@pytest.fixture(scope="module")
def data() -> zoo.Retrieval:
    return zoo.retrieval(40, seed=5)


def test_scores_count_the_evidence(data) -> None:
    chance = sum(1 / (2 * k + 2) for k in data.pairs.tolist()) / len(data)  # a uniform pick among the prompt words
    key = ev.score_explanation(_explanation(data, lambda i, w: int(data.key_positions[i])), data)
    assert key == {"key": 1.0, "value": 0.0, "either": 1.0, "query": 0.0, "random": pytest.approx(chance)}
    value = ev.score_explanation(
        _explanation(data, lambda i, w: int(data.value_positions[i]), bos=True, all_generated=True), data
    )
    assert (value["key"], value["value"], value["either"], value["query"]) == (0.0, 1.0, 1.0, 0.0)
    # the query after "?" is the same token as the key in the list: told apart by place
    query = ev.score_explanation(
        _explanation(data, lambda i, w: int(data.query_positions[i]), eos=True, all_generated=True), data
    )
    assert (query["key"], query["value"], query["query"]) == (0.0, 0.0, 1.0)
    # the first listed key: right exactly when the first pair is asked for
    first = ev.score_explanation(_explanation(data, lambda i, w: 0), data)
    assert first["key"] == pytest.approx((data.key_positions == 0).float().mean().item())
    last = ev.score_explanation(_explanation(data, lambda i, w: len(w) - 2), data)  # always "?"
    assert last["either"] == last["query"] == 0.0
    # all zeros: the first prompt token wins the tie (argmax), counted as such
    flat = ev.score_explanation(_explanation(data, lambda i, w: None, bos=True), data)
    assert flat["either"] == pytest.approx(0.0)  # with <bos> kept, the tie goes to <bos>


def test_bad_explanations_are_refused(data) -> None:
    exp = _explanation(data, lambda i, w: 0)
    with pytest.raises(ValueError, match="the explanation holds 39 prompts, the data 40"):
        ev.score_explanation(types.SimpleNamespace(**{**vars(exp), "scores": exp.scores[1:]}), data)
    with pytest.raises(ValueError, match=r"scores must be \(G, S\) with S >= 5 \(the prompt's tokens\), got \(1, 4\)"):
        ev.top_prompt_token(torch.zeros(1, 4), 5)
    assert ev.prompt_length([" a", " b", " x"], [" x"]) == 2 and ev.prompt_length(["a", "b"], ["x"]) == 2
    assert ev.prompt_length(["a", "b", "x"], ["x", "y"]) == 2 and ev.prompt_length(["a", "x", "y"], ["x", "y"]) == 1
    with pytest.raises(ValueError, match="do not end with the generated"):
        ev.prompt_length(["a", "b", "z"], ["x", "y"])
    other = zoo.retrieval(40, seed=6)
    with pytest.raises(ValueError, match="prompt 0: the source tokens .* not a prompt of the retrieval task"):
        ev.score_explanation(_explanation(other, lambda i, w: 0), data)


def _fake_api(pick):
    def explain_generation(model, tokenizer, prompts, *, method, target, batch_size):
        if method == "attention-rollout":
            raise ValueError(f"method must be one of ..., got {method!r}")
        d = zoo.retrieval(len(prompts), seed=ev.EVAL_SEED)
        assert d.prompts == list(prompts) and d.answer_texts == list(target)
        return _explanation(d, pick)

    return explain_generation


def test_evaluate_and_the_table_with_an_api_by_hand(monkeypatch, tmp_path, capsys) -> None:
    d = zoo.retrieval(12, seed=ev.EVAL_SEED)
    monkeypatch.setattr(hv, "explain_generation", _fake_api(lambda i, w: int(d.value_positions[i])), raising=False)
    rows = ev.evaluate_retrieval(["input-x-gradient", "attention-rollout"], n=12)
    assert [r.method for r in rows] == ["input-x-gradient", "attention-rollout"]
    assert (rows[0].key, rows[0].value, rows[0].either, rows[0].error) == (0.0, 1.0, 1.0, None)
    assert rows[1].error == "method must be one of ..., got 'attention-rollout'"
    table = ev.markdown(rows, accuracy=1.0)
    assert "| input-x-gradient | 0.0 % | 100.0 % | 100.0 % | 0.0 % |" in table
    assert "| attention-rollout | - | - |" in table and "- attention-rollout: method must be" in table
    assert "12 fresh prompts (seed 20260); the model answers 100.0 % of them exactly." in table
    out = tmp_path / "t.md"
    assert ev.main(["--n", "12", "--methods", "saliency", "--out", str(out)]) == 0
    assert "| saliency | 0.0 % | 100.0 % |" in out.read_text() and "wrote" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"methods must be among saliency, .*, got \['lime'\]"):
        ev.evaluate_retrieval(["lime"], n=2)


def test_the_real_api_on_a_few_prompts() -> None:
    rows = ev.evaluate_retrieval(["input-x-gradient", "occlusion"], n=8)
    pairs = zoo.retrieval(8, seed=ev.EVAL_SEED).pairs.tolist()
    for r in rows:
        assert r.error is None and r.n == 8
        assert 0 <= r.key <= r.either <= 1 and 0 <= r.value <= r.either and r.either <= r.key + r.value
        assert r.random == pytest.approx(sum(1 / (2 * k + 2) for k in pairs) / 8)
