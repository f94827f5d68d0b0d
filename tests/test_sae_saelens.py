"""hookviz.features.SAE against SAELens 6.54 itself (issue 37): SAEs built and saved by SAELens (``save_model``) load
with `SAE.load`, and on the same weights and the same batch our encode / decode and `evaluate_sae`'s metrics equal
SAELens's (``encode``, ``decode``, ``sae_lens.evals.get_sparsity_and_variance_metrics``).

SAELens pins its own torch / transformers / transformer-lens stack, so it runs in its own virtual environment as a
subprocess (tests/saelens_dump.py): ``$HOOKVIZ_SAELENS_PYTHON``, else ``../venv-saelens`` or ``.venv-saelens`` next
to the repository (how to make it: docs/features.md, "Against SAELens"). Without it these tests skip and say so (CI
does not make it; SAELens is not a library of the dev extra, so HOOKVIZ_REQUIRE_REFS does not cover it).

Tolerances: both sides compute the same float32 operations in the same order, so encode / decode agree bit for bit
(asserted exactly) except for ``apply_b_dec_to_input`` false, which we load as a folded encoder bias
b_enc + b_dec @ W_enc (other float32 roundings: 1e-5 absolute on values of order 1). The metrics are averages of
float32 per-row values on SAELens's side and float64 sums on ours: 1e-5 relative.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hookviz.features import SAE, evaluate_sae

ROOT = Path(__file__).resolve().parents[1]
DUMP = ROOT / "tests" / "saelens_dump.py"
NAMES = ("standard", "standard_no_b_dec_in", "topk", "jumprelu")
FOLDED_ATOL = 1e-5  # float32 roundings of the folded encoder bias, on latents / reconstructions of order 1
METRIC_RTOL = 1e-5  # float32 means (SAELens) against float64 sums (ours)


def _saelens_python() -> Path | None:
    candidates = [os.environ.get("HOOKVIZ_SAELENS_PYTHON")]
    candidates += [str(ROOT.parent / "venv-saelens" / "bin" / "python"), str(ROOT / ".venv-saelens" / "bin" / "python")]
    return next((Path(c) for c in candidates if c and Path(c).exists()), None)


@pytest.fixture(scope="module")
def dumped(tmp_path_factory) -> tuple[Path, dict]:
    python = _saelens_python()
    if python is None:
        pytest.skip("SAELens's environment not found (set HOOKVIZ_SAELENS_PYTHON or make ../venv-saelens)")
    out = tmp_path_factory.mktemp("saelens")
    # PYTHONPATH cleared: hookviz is not imported there; SAELens's environment only
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(python), str(DUMP), str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["sae_lens"].startswith("6."), results["sae_lens"]
    return out, results


def _load(dumped, name: str) -> tuple[SAE, torch.Tensor, dict]:
    out, results = dumped
    return SAE.load(out / name), torch.tensor(results["x"], dtype=torch.float32), results[name]


@pytest.mark.parametrize("name", NAMES)
def test_saelens_saved_sae_loads_as_its_architecture(dumped, name: str) -> None:
    sae, _, _ = _load(dumped, name)
    assert (sae.d_in, sae.d_sae) == (16, 48)
    assert sae.act == {"standard": "relu", "standard_no_b_dec_in": "relu", "topk": "topk", "jumprelu": "jumprelu"}[name]
    assert sae.k == (5 if name == "topk" else None)
    assert sae.W_enc.dtype == torch.float32


@pytest.mark.parametrize("name", NAMES)
def test_encode_decode_equal_saelens(dumped, name: str) -> None:
    sae, x, ref = _load(dumped, name)
    f_ref = torch.tensor(ref["latents"], dtype=torch.float32)
    x_hat_ref = torch.tensor(ref["reconstruction"], dtype=torch.float32)
    with torch.no_grad():
        f = sae.encode(x)
        x_hat_of_ref = sae.decode(f_ref)  # our decoder on SAELens's latents
        x_hat = sae.decode(f)
    if name == "standard_no_b_dec_in":
        assert ((f != 0) == (f_ref != 0)).all()  # the same latents fire
        torch.testing.assert_close(f, f_ref, rtol=0, atol=FOLDED_ATOL)
        torch.testing.assert_close(x_hat, x_hat_ref, rtol=0, atol=FOLDED_ATOL)
    else:
        assert torch.equal(f, f_ref)
        assert torch.equal(x_hat, x_hat_ref)
    assert torch.equal(x_hat_of_ref, x_hat_ref)  # the decoder is the same map in every case


@pytest.mark.parametrize("name", NAMES)
def test_evaluation_metrics_equal_saelens(dumped, name: str) -> None:
    sae, x, ref = _load(dumped, name)
    m = ref["metrics"]
    model = nn.Sequential(nn.Identity())  # layer "0" outputs the batch itself: the rows SAELens evaluated
    ev = evaluate_sae(model, "0", sae, x, data_batch_size=len(x))
    rows = x.reshape(-1, sae.d_in).double()
    assert ev.rows == rows.shape[0] == 32
    # L0: mean number of latents != 0 per row (both)
    assert ev.l0 == pytest.approx(m["l0"], rel=METRIC_RTOL)
    # MSE: ours is the mean over all elements, SAELens's the mean over rows of ||x - x̂||² (sum over d_in)
    assert ev.mse * sae.d_in == pytest.approx(m["mse"], rel=METRIC_RTOL)
    # variance explained: SAELens's is 1 - E||x - x̂||² / sum_d Var(x_d); ours 1 - sum_d Var(x_d - x̂_d) / sum_d
    # Var(x_d), the residual centred: the two differ by ||E[x - x̂]||² / sum_d Var(x_d), an SAE's mean error
    with torch.no_grad():
        r = rows - sae(x.reshape(-1, sae.d_in))[0].double()
    var_x = rows.var(0, unbiased=False).sum()
    bias_term = float(r.mean(0).square().sum() / var_x)
    assert bias_term > 1e-2  # the mean errors of these random SAEs are large enough for the difference to show
    assert ev.fve - bias_term == pytest.approx(m["explained_variance"], rel=METRIC_RTOL)
    # per-latent firing rates (SAELens's feature density)
    np.testing.assert_allclose(ev.frequency.double().numpy(), ref["feature_density"], rtol=0, atol=1e-7)
