"""explain_generation_latents (issue 37, part 5): a generation of the zoo's retrieval LM scored against the latents
of its shipped SAE: each step equals latent_attribution with that step's score, the future is exactly 0, and the
answer's step rests on a latent at the query that prefers the answer."""

from __future__ import annotations

import pytest
import torch

import hookviz as hv
from hookviz.features import latent_attribution
from hookviz.generation.latents import explain_generation_latents
from hookviz.zoo import retrieval_lm
from hookviz.zoo.sae import SAE_LAYER, retrieval_sae

PROMPT = "k3 v7 k1 v2 k9 v4 ? k1"


@pytest.mark.parametrize("method", ["gradient", "integrated_gradients"])
def test_each_step_is_latent_attribution_of_its_score(method: str) -> None:
    model, tok = retrieval_lm()
    sae = retrieval_sae()
    exp = explain_generation_latents(model, tok, PROMPT, {SAE_LAYER: sae}, method=method, steps=8)
    assert [t.strip() for t in exp.generated_tokens] == ["v2", "<eos>"]
    p, g = exp.prompt_length, 2
    lat, err = exp.latents[SAE_LAYER], exp.errors[SAE_LAYER]
    assert lat.shape == (g, p + g, 512) and err.shape == (g, p + g)
    ids = torch.tensor([tok.encode(PROMPT) + [tok.convert_tokens_to_ids("v2"), tok.eos_token_id]])
    for k, token in enumerate(ids[0, p:].tolist()):
        one = latent_attribution(
            model, ids, {SAE_LAYER: sae}, lambda out, k=k, t=token: out[:, p - 1 + k, t], method=method, steps=8
        )
        torch.testing.assert_close(lat[k, : p + k], one.latents[SAE_LAYER][0, : p + k], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(err[k, : p + k], one.errors[SAE_LAYER][0, : p + k], atol=1e-5, rtol=1e-4)
        assert float(exp.scores[k]) == pytest.approx(float(one.metric[0]), abs=1e-4)
        assert (lat[k, p + k :] == 0).all() and (err[k, p + k :] == 0).all()


def test_the_answer_rests_on_the_query() -> None:
    model, tok = retrieval_lm()
    exp = explain_generation_latents(model, tok, PROMPT, {SAE_LAYER: retrieval_sae()}, target="v2")
    position, token, latent, effect = exp.top(0, SAE_LAYER, 1)[0]
    # block 0 has already copied the answer to the query (docs/features.md, Ground truth)
    assert position == exp.prompt_length - 1 and token.strip() == "k1" and effect > 0
    assert hv.explain_generation_latents is explain_generation_latents


def test_bad_arguments() -> None:
    model, tok = retrieval_lm()
    with pytest.raises(ValueError, match="method"):
        explain_generation_latents(model, tok, PROMPT, {SAE_LAYER: retrieval_sae()}, method="patching")
    with pytest.raises(ValueError, match="score"):
        explain_generation_latents(model, tok, PROMPT, {SAE_LAYER: retrieval_sae()}, score="odds")
