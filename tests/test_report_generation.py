"""hookviz.report_generation: the static report of a prompt file's generation explanations (files, the index's
numbers, scores stored exactly and read back into a GenerationExplanation, bad input, the output folder, the CLI).
The page itself, in Chromium: tests/test_report_generation_browser.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from refs import require
from torch import nn

import hookviz as hv
from hookviz.cli import main
from hookviz.report import gendata
from hookviz.report.output import MARKER
from hookviz.zoo import retrieval_lm
from hookviz.zoo.retrieval import retrieval

require("transformers")
from test_generation import gpt2, make_tokenizer  # noqa: E402

N = 20  # more than one block of prompts (gendata.BLOCK = 16)
METHODS = ("input-x-gradient", "attn-lrp", "occlusion")
STEPS = ("probability", "log-probability", "entropy")


def script_data(path: Path, call: str) -> object:
    """The JSON argument(s) of a data file ``call=...;`` or ``call(...);``."""
    text = path.read_text(encoding="utf-8").rstrip()
    assert text.startswith(call) and text.endswith(";")
    inner = text[len(call) + 1 : -1]
    return json.loads(inner if call.startswith("window.") else "[" + inner[:-1] + "]")


def read_back(out: Path) -> dict[str, hv.GenerationExplanation]:
    """The explanations rebuilt from the report's files alone (what the page reads)."""
    index = script_data(out / "data" / "items.js", "window.HV_DATA")
    items = []
    for b in range(math.ceil(index["n"] / index["block"])):
        block, data = script_data(out / "data" / "g" / f"{b:05d}.js", "HV.gen")
        assert block == b
        items += data
    exps = {}
    for j, m in enumerate(index["methods"]):
        exps[m["name"]] = hv.GenerationExplanation(
            scores=[gendata.decode(it["m"][j], (len(it["gen"]), len(it["src"]))) for it in items],
            source_tokens=[it["src"] for it in items],
            generated_tokens=[it["gen"] for it in items],
            prompt_lengths=[it["p"] for it in items],
            step_scores={
                k: [torch.tensor(it["steps"][k], dtype=torch.float64) for it in items] for k in index["steps"]
            },
            method=m["method"],
            score=m["score"],
            contrast_tokens=[it["m"][j]["contrast"] for it in items] if m["contrast"] else None,
            word_starts=[[c == "1" for c in it["starts"]] for it in items],
            prompts=[it["prompt"] for it in items],
        )
    return exps


def assert_same_explanation(
    got: hv.GenerationExplanation, want: hv.GenerationExplanation, steps: hv.GenerationExplanation | None = None
) -> None:
    """`got` is `want` (its step scores those of `steps`, the report's first method, if given: they are stored once)."""
    for i, (a, b) in enumerate(zip(got.scores, want.scores, strict=True)):
        # bit for bit: the same dtype and every value's bytes (NaN and -0.0 included)
        assert a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), i
    for k, v in (steps or want).step_scores.items():
        for a, b in zip(got.step_scores[k], v, strict=True):
            assert torch.equal(a, b.double()), k  # the same values (read back in float64)
    for field in ("source_tokens", "generated_tokens", "prompt_lengths", "method", "score", "contrast_tokens",
                  "word_starts", "prompts"):  # fmt: skip
        assert getattr(got, field) == getattr(want, field), field


@pytest.fixture(scope="module")
def zoo_lm():
    return retrieval_lm()


def explain_retrieval(n: int, seed: int, methods: tuple[str, ...] = METHODS) -> tuple[list[str], dict]:
    """`n` retrieval prompts explained by each method: the first generates, the others explain its continuation."""
    model, tokenizer = retrieval_lm()
    prompts = retrieval(n, seed=seed).prompts
    first = hv.explain_generation(model, tokenizer, prompts, method=methods[0], max_new_tokens=2, step_scores=STEPS)
    continuation = ["".join(t) for t in first.generated_tokens]
    exps = {methods[0]: first}
    for m in methods[1:]:
        exps[m] = hv.explain_generation(model, tokenizer, prompts, method=m, target=continuation, step_scores=STEPS)
    return prompts, exps


@pytest.fixture(scope="module")
def explained():
    return explain_retrieval(N, seed=3)


@pytest.fixture(scope="module")
def built(tmp_path_factory, explained):
    out = tmp_path_factory.mktemp("genreport") / "r"
    return out, hv.report_generation(explained[1], out, title="retrieval")


def test_files_and_index(built, explained):
    out, index = built
    prompts, exps = explained
    first = exps[METHODS[0]]
    assert index == out / "index.html"
    assert {p.name for p in out.iterdir()} == {"index.html", "report.css", "site.js", "generation.js", "data", MARKER}
    assert sorted(p.name for p in (out / "data" / "g").iterdir()) == ["00000.js", "00001.js"]  # 20 prompts, 16 a block
    mark = json.loads((out / MARKER).read_text())
    assert mark["complete"] is True and mark["kind"] == "generation" and mark["items"] == N
    assert mark["methods"] == list(METHODS)
    data = script_data(out / "data" / "items.js", "window.HV_DATA")
    assert data["n"] == N and data["title"] == "retrieval" and data["steps"] == list(STEPS)
    assert [m["name"] for m in data["methods"]] == list(METHODS) and data["prompts"] == prompts
    assert data["continuations"] == ["".join(t) for t in first.generated_tokens]
    assert data["p"] == first.prompt_lengths and data["g"] == [len(t) for t in first.generated_tokens]
    for k in STEPS:  # the mean of each step score over the continuation, in float64
        assert data["means"][k] == [float(v.double().mean()) for v in first.step_scores[k]]
    assert data["pieces"] is False  # the retrieval tokenizer has one token a word
    page = index.read_text()
    assert '<script src="generation.js" defer></script>' in page and "<title>retrieval</title>" in page


def test_scores_round_trip_exactly(built, explained):
    """Every method's scores, step scores and tokens read back from the files are the explanation's, bit for bit."""
    out, _ = built
    back = read_back(out)
    assert list(back) == list(METHODS)
    for m in METHODS:
        # the step scores are stored once, the first method's: the same continuation's, up to float32 rounding of
        # the logits in another batch layout (the first run's sequences also held the <eos> it generated)
        assert_same_explanation(back[m], explained[1][m], steps=explained[1][METHODS[0]])


def test_float64_contrast_and_word_pieces_round_trip(tmp_path):
    """A float64 explanation (the tiny GPT-2 in double) with a contrast, and a hand-made one with word pieces, NaN,
    infinities and -0.0 in float32: stored and read back bit for bit."""
    tok = make_tokenizer()
    exp = hv.explain_generation(gpt2(), tok, ["w1 w2 w3", "w4"], target=["w5 w6", "w7"], contrast=["w8 w9", "w10"])
    assert exp.scores[0].dtype == torch.float64 and exp.contrast_tokens == [[" w8", " w9"], [" w10"]]
    hv.report_generation({"ixg": exp}, tmp_path / "a")
    assert_same_explanation(read_back(tmp_path / "a")["ixg"], exp)

    odd = handmade()
    hv.report_generation(odd, tmp_path / "b")
    back = read_back(tmp_path / "b")["saliency"]
    assert_same_explanation(back, odd)
    assert torch.isnan(back.scores[0][1, 0]) and back.scores[0][1, 1] == -math.inf
    assert math.copysign(1, float(back.scores[0][1, 2])) == -1  # -0.0 kept


def handmade(prompt: str = "the cat sat", dtype: torch.dtype = torch.float32) -> hv.GenerationExplanation:
    """Two prompts, word pieces in prompt and continuation ("sat" = "s" + "at", generated "on" = "o" + "n")."""
    g = torch.Generator().manual_seed(0)
    src = [["the", " cat", " s", "at", " o", "n", " a"], ["hi", " there", "!"]]
    p = [4, 2]
    starts = [[True, True, True, False, True, False, True], [True, True, False]]
    scores = []
    for s, pl in zip(src, p, strict=True):
        gn = len(s) - pl
        m = torch.randn(gn, len(s), generator=g, dtype=torch.float64).to(dtype)
        m = m.masked_fill(torch.arange(len(s))[None] >= (pl + torch.arange(gn))[:, None], 0.0)
        scores.append(m)
    scores[0][1, 0], scores[0][1, 1], scores[0][1, 2] = math.nan, -math.inf, -0.0
    steps = {"probability": [torch.rand(len(s) - pl, generator=g) for s, pl in zip(src, p, strict=True)]}
    return hv.GenerationExplanation(
        scores=scores,
        source_tokens=src,
        generated_tokens=[s[pl:] for s, pl in zip(src, p, strict=True)],
        prompt_lengths=p,
        step_scores=steps,
        method="saliency",
        word_starts=starts,
        prompts=[prompt, "hi there"],
    )


def test_encode_widens_half_precision_exactly():
    for dtype in (torch.float16, torch.bfloat16):
        t = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(dtype)
        back = gendata.decode(gendata.encode(t), (3, 5))
        assert back.dtype == torch.float32 and torch.equal(back, t.float())


def _other(exp: hv.GenerationExplanation, **change) -> hv.GenerationExplanation:
    fields = {f: getattr(exp, f) for f in ("scores", "source_tokens", "generated_tokens", "prompt_lengths",
                                           "step_scores", "method", "score", "word_starts", "prompts")}  # fmt: skip
    return hv.GenerationExplanation(**{**fields, **change})


def _bad_cases():
    exp = handmade()
    gen = [list(t) for t in exp.generated_tokens]
    gen[1] = ["?"]
    src = [list(t) for t in exp.source_tokens]
    src[1] = ["hi", " there", "?"]
    src_p = [list(t) for t in exp.source_tokens]
    src_p[0][0] = "a"
    return {
        "not an explanation": (torch.zeros(2, 3), TypeError, "must be a GenerationExplanation"),
        "empty mapping": ({}, ValueError, "empty mapping"),
        "key not a str": ({1: exp}, TypeError, "map names"),
        "value not an explanation": ({"a": exp, "b": "x"}, TypeError, r"'b': str"),
        "different generated tokens": (
            {"a": exp, "b": _other(exp, source_tokens=src, generated_tokens=gen)},
            ValueError,
            r"differ at prompt 1: generated tokens \['\?'\] against \['!'\]",
        ),
        "different prompt tokens": (
            {"a": exp, "b": _other(exp, source_tokens=src_p)},
            ValueError,
            "differ at prompt 0: prompt tokens",
        ),
        "different prompt text": (
            {"a": exp, "b": _other(exp, prompts=["the dog sat", "hi there"])},
            ValueError,
            "differ at prompt 0: prompt",
        ),
        "fewer prompts": (
            {
                "a": exp,
                "b": _other(
                    exp,
                    **{
                        f: getattr(exp, f)[:1]
                        for f in (
                            "scores",
                            "source_tokens",
                            "generated_tokens",
                            "prompt_lengths",
                            "word_starts",
                            "prompts",
                        )
                    },
                    step_scores={"probability": exp.step_scores["probability"][:1]},
                ),
            },
            ValueError,
            r"explains 1 prompts and explanations\['a'\] 2",
        ),  # fmt: skip
        "integer scores": (
            _other(exp, scores=[s.long() for s in exp.scores]),
            TypeError,
            "must be floating point, got torch.int64",
        ),
        "no prompt": (hv.GenerationExplanation([], [], [], [], {}, "saliency"), ValueError, "explains no prompt"),
    }


@pytest.mark.parametrize("case", sorted(_bad_cases()))
def test_bad_input_raises_before_anything_is_written(tmp_path, case):
    explanations, error, match = _bad_cases()[case]
    with pytest.raises(error, match=match):
        hv.report_generation(explanations, tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_bad_options(tmp_path):
    with pytest.raises(TypeError, match="title must be a str or None, got int"):
        hv.report_generation(handmade(), tmp_path / "r", title=3)
    with pytest.raises(TypeError, match="overwrite must be a bool"):
        hv.report_generation(handmade(), tmp_path / "r", overwrite="yes")
    assert not (tmp_path / "r").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        hv.report_generation(handmade(), tmp_path / "f")
    # the image report refuses generation explanations and says where they go
    with pytest.raises(TypeError, match=r"hookviz.report_generation\(explanations, out\)"):
        hv.report({"saliency": handmade()}, tmp_path / "r")
    with pytest.raises(TypeError, match="report_generation"):
        hv.report(handmade(), tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_output_folder(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not a hookviz report; pass overwrite=True"):
        hv.report_generation(handmade(), out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # a folder of another kind: untouched
    hv.report_generation(handmade(), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "keep me" and (out / "index.html").is_file()
    # a previous report of either kind is replaced whole: an image report's files go
    old = tmp_path / "old"
    for d in ("img", "maps", "m", "data"):
        (old / d).mkdir(parents=True)
        (old / d / "0.js").write_text("stale")
    (old / "summary.html").write_text("stale")
    (old / "report.js").write_text("stale")
    (old / MARKER).write_text(json.dumps({"format": "hookviz-report", "version": 2, "complete": True}))
    hv.report_generation(handmade(), old, title="again")
    assert sorted(p.name for p in old.iterdir()) == sorted(
        ["index.html", "report.css", "site.js", "generation.js", "data", MARKER]
    )
    assert sorted(p.name for p in (old / "data").iterdir()) == ["g", "items.js"]


def test_title_and_text_escaped(tmp_path):
    evil = "<script>window.__pwned = 1</script>"
    hv.report_generation(handmade(prompt=f"{evil} the cat sat"), tmp_path / "r", title=f"t {evil}")
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<script>window" not in page and "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    data = script_data(tmp_path / "r" / "data" / "items.js", "window.HV_DATA")
    assert data["prompts"][0].startswith(evil)  # data, set with textContent by the page (the browser test)
    assert "</script>" in (tmp_path / "r" / "data" / "items.js").read_text()  # JSON in a script file: inert data


def test_default_title_and_single_explanation(tmp_path):
    index = hv.report_generation(handmade(), tmp_path / "r")
    data = script_data(index.parent / "data" / "items.js", "window.HV_DATA")
    assert data["title"] == "saliency on 2 prompts" and [m["name"] for m in data["methods"]] == ["saliency"]
    assert data["pieces"] is True and data["means"]["probability"][1] == float(handmade().step_scores["probability"][1]
                                                                               .double().mean())  # fmt: skip


# -- the command line ------------------------------------------------------------------------------------------------
def test_cli_report_of_the_zoo_model(tmp_path, capsys, monkeypatch, zoo_lm):
    monkeypatch.chdir(tmp_path)
    prompts = retrieval(5, seed=8).prompts
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n\n")
    out = tmp_path / "report"
    argv = ["explain-generation", "--model", "retrieval-lm", "--prompt-file", str(tmp_path / "prompts.txt"),
            "--method", "input-x-gradient,attn-lrp", "--report", str(out), "--title", "zoo"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'index.html'}: input-x-gradient, attn-lrp, 5 prompt(s)" in printed
    assert not (tmp_path / "generation.html").exists()  # --report without --out: no single view written
    back = read_back(out)
    model, tokenizer = zoo_lm
    first = hv.explain_generation(model, tokenizer, prompts, max_new_tokens=4, step_scores=STEPS)
    assert_same_explanation(back["input-x-gradient"], first)
    forced = ["".join(t) for t in first.generated_tokens]
    assert_same_explanation(
        back["attn-lrp"],
        hv.explain_generation(model, tokenizer, prompts, method="attn-lrp", target=forced, step_scores=STEPS),
        steps=first,
    )
    assert script_data(out / "data" / "items.js", "window.HV_DATA")["title"] == "zoo"


class Bigram(nn.Module):
    """Next-token logits from the current token alone: after w1 comes <eos> at once (nothing generated), after w3
    comes w5, after w5 <eos>."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(64, 64)
        with torch.no_grad():
            self.table.weight.zero_()
            self.table.weight[:, 2] = 1.0  # <eos> by default
            self.table.weight[7, 9], self.table.weight[7, 2] = 3.0, 0.0  # w3 (id 7) -> w5 (id 9)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def test_cli_other_methods_force_the_first_ones_continuation(tmp_path, monkeypatch, capsys):
    """The first method generates; the others explain that continuation; a prompt whose continuation is empty (only
    <eos> came) keeps its empty entry in every method."""
    from hookviz.cli import generation as cli

    monkeypatch.setattr(cli, "_load", lambda spec, device: (Bigram(), make_tokenizer()))
    (tmp_path / "p.txt").write_text("w2 w3\nw2 w1\n")
    out = tmp_path / "r"
    argv = ["explain-generation", "--model", "any", "--prompt-file", str(tmp_path / "p.txt"), "--method",
            "input-x-gradient,occlusion", "--report", str(out), "--out", str(tmp_path / "first.html")]  # fmt: skip
    assert main(argv) == 0
    assert "prompt 0: ' w5'\nprompt 1: ''" in capsys.readouterr().out
    back = read_back(out)
    assert back["occlusion"].generated_tokens == back["input-x-gradient"].generated_tokens == [[" w5"], []]
    assert back["occlusion"].scores[1].shape == (0, 2) and back["occlusion"].method == "occlusion"
    # occluding w3 (the only token the bigram reads) removes the w5 logit's 3: the score 3 - 0
    assert back["occlusion"].scores[0].tolist() == [[0.0, 3.0, 0.0]]
    assert (tmp_path / "first.html").is_file()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--method", "saliency,attn-lrp"], "several methods are shown together in the report: add --report DIR"),
        (["--method", "saliency,gradcam", "--report", "R"], "unknown method 'gradcam'; available: saliency, input-x"),
        (["--method", "saliency,saliency", "--report", "R"], "a method is named twice"),
        (["--title", "t"], "--title and --overwrite apply to --report DIR"),
        (["--model", "nothing-here"], "nor one of the zoo's models (retrieval-lm)"),
    ],
)
def test_cli_errors(tmp_path, capsys, extra, match):
    argv = ["explain-generation", "--model", "retrieval-lm", "--prompt", "k1 v2 ? k1", *extra]
    argv = [str(tmp_path / a) if a == "R" else a for a in argv]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hookviz explain-generation: error: ") and match in err and len(err.splitlines()) == 1
    assert not (tmp_path / "R").exists()
