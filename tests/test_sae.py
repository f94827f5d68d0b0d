"""hv.SAE (issue 37, part 1): the three activation forms on hand values, the files (ours and SAELens's layout), and
the refusals (a missing or inconsistent config, a pickle)."""

from __future__ import annotations

import json

import pytest
import torch
from sae_refs import identity_sae
from safetensors.torch import save_file

from hookviz.features import SAE, SAEConfigError


def test_identity_sae_reconstructs_exactly_and_half_its_latents_fire() -> None:
    torch.manual_seed(0)
    sae = identity_sae(6)
    x = torch.randn(4, 7, 6)
    x_hat, f = sae(x)
    assert f.shape == (4, 7, 12)
    assert torch.equal(x_hat, x)  # MSE 0 and variance explained 1, exactly
    # The issue says "L0 equal to the width": for generic x (no exact zeros) exactly one of relu(x_i), relu(-x_i)
    # is non-zero, so L0 = d_in, the width of the layer, which is half the SAE's width d_sae = 2 d_in.
    assert torch.equal((f != 0).sum(-1), torch.full((4, 7), 6))


def test_relu_hand_values() -> None:
    sae = SAE(2, 3, "relu")
    with torch.no_grad():
        sae.W_enc.copy_(torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, -1.0]]))
        sae.b_enc.copy_(torch.tensor([0.0, -1.0, 0.5]))
        sae.b_dec.copy_(torch.tensor([1.0, 1.0]))
        sae.W_dec.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]))
    x = torch.tensor([[3.0, 2.0]])
    # x - b_dec = (2, 1); z = (2, 1 - 1, 2 - 1 + 0.5) = (2, 0, 1.5); f = relu(z)
    f = sae.encode(x)
    assert torch.equal(f, torch.tensor([[2.0, 0.0, 1.5]]))
    # x̂ = 2 (1, 0) + 1.5 (0.6, 0.8) + (1, 1) = (3.9, 2.2)
    assert torch.allclose(sae.decode(f), torch.tensor([[3.9, 2.2]]), atol=1e-6, rtol=0)


def test_topk_keeps_exactly_k() -> None:
    torch.manual_seed(0)
    sae = SAE(8, 32, "topk", k=5)
    with torch.no_grad():
        sae.b_enc.fill_(100.0)  # every pre-activation positive: the ReLU after TopK zeroes none of the k
    x = torch.randn(64, 8)
    f = sae.encode(x)
    assert torch.equal((f != 0).sum(-1), torch.full((64,), 5))
    z = sae.pre_activations(x)
    kept = f != 0
    # the kept ones are the k largest pre-activations, unchanged
    assert torch.equal(f[kept], z[kept])
    assert bool((z[kept].view(64, 5).min(-1).values >= z.masked_fill(kept, -1e9).max(-1).values).all())


def test_topk_with_negative_preactivations_keeps_at_most_k() -> None:
    sae = SAE(2, 4, "topk", k=3)
    with torch.no_grad():
        sae.W_enc.zero_()
        sae.b_enc.copy_(torch.tensor([2.0, -1.0, 1.0, -3.0]))
    f = sae.encode(torch.zeros(1, 2))
    # top 3 pre-activations: 2, 1, -1; ReLU zeroes the -1 (Gao et al.'s ReLU after TopK)
    assert torch.equal(f, torch.tensor([[2.0, 0.0, 1.0, 0.0]]))


def test_jumprelu_hand_values() -> None:
    sae = SAE(1, 3, "jumprelu")
    with torch.no_grad():
        sae.W_enc.copy_(torch.tensor([[1.0, 1.0, 1.0]]))
        sae.threshold.copy_(torch.tensor([0.5, 1.5, 2.0]))
    f = sae.encode(torch.tensor([[1.0], [2.0]]))
    # z = x; kept where z > threshold, with its value (not z - threshold); z = threshold is not kept
    assert torch.equal(f, torch.tensor([[1.0, 0.0, 0.0], [2.0, 2.0, 0.0]]))


@pytest.mark.parametrize(("act", "k"), [("relu", None), ("topk", 3), ("jumprelu", None)])
def test_save_load_round_trip(tmp_path, act, k) -> None:
    torch.manual_seed(1)
    sae = SAE(5, 12, act, k=k)
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_()
    sae.save(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["architecture"] == {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}[act]
    back = SAE.load(tmp_path / "s")
    assert (back.act, back.k, back.d_in, back.d_sae) == (act, k, 5, 12)
    for name, p in sae.named_parameters():
        assert torch.equal(p, getattr(back, name))
    x = torch.randn(10, 5)
    assert torch.equal(back.encode(x), sae.encode(x))


def _saelens_folder(path, cfg: dict, tensors: dict) -> None:
    path.mkdir()
    (path / "cfg.json").write_text(json.dumps(cfg))
    save_file(tensors, str(path / "sae_weights.safetensors"))


def test_loads_saelens_layout(tmp_path) -> None:
    """A folder as SAELens's ``save_model`` writes it (keys and shapes from sae_lens/saes/*.py), including the old
    ``activation_fn_str`` + ``activation_fn_kwargs`` form of a TopK SAE and ``apply_b_dec_to_input`` false."""
    g = torch.Generator().manual_seed(0)
    d_in, d_sae = 4, 10
    t = {
        "W_enc": torch.randn(d_in, d_sae, generator=g),
        "W_dec": torch.randn(d_sae, d_in, generator=g),
        "b_enc": torch.randn(d_sae, generator=g),
        "b_dec": torch.randn(d_in, generator=g),
    }
    x = torch.randn(6, d_in, generator=g)
    base = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "hook_name": "blocks.0.hook_resid_post"}

    _saelens_folder(tmp_path / "topk", {**base, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 3}}, t)
    sae = SAE.load(tmp_path / "topk")
    assert (sae.act, sae.k) == ("topk", 3)
    z = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
    top = z.topk(3, dim=-1)
    expected = torch.zeros_like(z).scatter(-1, top.indices, top.values.relu())
    assert torch.equal(sae.encode(x), expected)

    jump = {**t, "threshold": torch.rand(d_sae, generator=g)}
    _saelens_folder(tmp_path / "jump", {**base, "architecture": "jumprelu", "apply_b_dec_to_input": False}, jump)
    sae = SAE.load(tmp_path / "jump")
    z = x @ t["W_enc"] + t["b_enc"]  # SAELens: no b_dec subtracted when apply_b_dec_to_input is false
    expected = z * (z > jump["threshold"])
    # b_dec @ W_enc folded into b_enc: float32 rounding of a 4-term sum, a few ulps of |z| <~ 10
    assert torch.allclose(sae.encode(x), expected, atol=1e-5, rtol=0)
    assert torch.equal(sae.decode(expected), expected @ t["W_dec"] + t["b_dec"])


def test_refuses_missing_or_inconsistent_config(tmp_path) -> None:
    sae = SAE(3, 6)
    folder = sae.save(tmp_path / "s")
    (folder / "cfg.json").unlink()
    with pytest.raises(SAEConfigError, match="no cfg.json"):
        SAE.load(folder)
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": 4, "d_sae": 6}))
    with pytest.raises(SAEConfigError, match=r"W_enc has shape \(3, 6\) but the config"):
        SAE.load(folder)
    (folder / "cfg.json").write_text(json.dumps({"architecture": "gated", "d_in": 3, "d_sae": 6}))
    with pytest.raises(SAEConfigError, match="architecture 'gated' is not supported"):
        SAE.load(folder)
    (folder / "cfg.json").write_text(json.dumps({"architecture": "topk", "d_in": 3, "d_sae": 6}))
    with pytest.raises(SAEConfigError, match="needs an int k"):
        SAE.load(folder)
    # SAELens's TopK with latents scaled by the decoder norms: another map than a plain TopK, refused
    cfg = {"architecture": "topk", "d_in": 3, "d_sae": 6, "k": 2, "rescale_acts_by_decoder_norm": True}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEConfigError, match="rescale_acts_by_decoder_norm = true is not supported"):
        SAE.load(folder)
    (folder / "cfg.json").write_text("{not json")
    with pytest.raises(SAEConfigError, match="not valid JSON"):
        SAE.load(folder)


def test_refuses_pickles_unless_allowed(tmp_path) -> None:
    sae = SAE(3, 6)
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "cfg.json").write_text(json.dumps(sae.config()))
    torch.save(dict(sae.state_dict()), folder / "sae.pt")
    with pytest.raises(ValueError, match="a pickle"):
        SAE.load(folder)
    back = SAE.load(folder, allow_pickle=True)  # weights_only=True even then: tensors only
    assert torch.equal(back.W_dec, sae.W_dec)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="needs k"):
        SAE(4, 8, "topk")
    with pytest.raises(ValueError, match="act must be one of"):
        SAE(4, 8, "gelu")
    with pytest.raises(ValueError, match="width d_in = 4"):
        SAE(4, 8).encode(torch.zeros(2, 5))
    with pytest.raises(IndexError, match="out of range"):
        SAE(4, 8).check_latent(8)
