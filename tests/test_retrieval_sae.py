"""The zoo's shipped SAE of the retrieval LM (issue 37, part 8): it loads, its evaluation on the check prompts
reproduces the shipped metrics, and the ground-truth study (benchmarks/sae_retrieval_study.py) runs on a few
prompts."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import torch

import hookviz as hv
from hookviz.features import SAE
from hookviz.zoo import retrieval, retrieval_lm
from hookviz.zoo.sae import SAE_LAYER, answer_positions, retrieval_sae, retrieval_sae_metrics, token_batches

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "sae_retrieval_study.py"
_spec = importlib.util.spec_from_file_location("sae_retrieval_study", _PATH)
study_module = importlib.util.module_from_spec(_spec)
sys.modules["sae_retrieval_study"] = study_module  # its dataclass looks its module up while being defined
_spec.loader.exec_module(study_module)


def test_the_shipped_sae_loads() -> None:
    sae = retrieval_sae()
    assert isinstance(sae, SAE)
    assert (sae.d_in, sae.d_sae, sae.act, sae.k) == (64, 512, "topk", 16)
    assert not sae.training


def test_its_evaluation_reproduces_the_shipped_metrics() -> None:
    shipped = retrieval_sae_metrics()
    check = shipped["check"]
    model, _ = retrieval_lm()
    batches = token_batches(2_000, seed=check["seed_data"])[:1]
    assert batches[0]["input_ids"].shape[0] == check["prompts"]
    ev = hv.evaluate_sae(model, SAE_LAYER, retrieval_sae(), batches, scored=answer_positions).as_dict()
    assert ev["rows"] == check["rows"] and ev["dead"] == check["dead"] and ev["dense"] == check["dense"]
    for key in ("l0", "fve", "mse", "ce_orig", "ce_sae", "ce_zero", "loss_recovered", "kl"):
        # other thread counts and CPUs round the sums differently: relative 1e-4, absolute 1e-7 for the tiny KL
        assert math.isclose(ev[key], check[key], rel_tol=1e-4, abs_tol=1e-7), (key, ev[key], check[key])
    full = shipped["evaluation"]
    assert full["l0"] == 16 and full["fve"] > 0.98 and full["loss_recovered"] > 0.99


def test_the_study_runs_on_a_few_prompts() -> None:
    model, _ = retrieval_lm()
    data = retrieval(3, seed=3)
    s = study_module.study(model, retrieval_sae(), data)
    assert s.role_means.shape == (5, 512) and s.answer_means.shape == (16, 512)
    assert set(s.attribution) == {"gradient", "patching"}
    for got in s.attribution.values():
        assert all(v.shape == (3,) for v in got.values())
        # the shipped model retrieves the answer in block 0: the top node of both methods is at the query position
        assert got["node_at_query"].all()
        assert (got["share_query"] > 0.5).all()
    assert "| gradient |" in study_module.report(s, 3, 0.0)


def test_corrupt_writes_a_value_not_in_the_list_at_the_answer() -> None:
    data = retrieval(20, seed=5)
    for part in study_module.groups(data):
        clean, bad, alt = study_module.corrupt(part)
        rows = torch.arange(len(part))
        at = part.value_positions + 1
        assert torch.equal(clean[rows, at], part.answers)
        assert torch.equal(bad[rows, at], alt)
        assert ((clean != bad).sum(1) == 1).all()
        assert not (clean[:, 2:-2:2] == alt[:, None]).any()
