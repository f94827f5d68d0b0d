"""Run in SAELens's own virtual environment (tests/test_sae_saelens.py starts it as a subprocess; issue 37).

    python tests/saelens_dump.py OUT_DIR

Builds SAELens SAEs with fixed random weights (torch seed 0; small d_in / d_sae), saves each with SAELens's own
``SAE.save_model`` into OUT_DIR/<name>/, encodes and decodes a fixed batch with SAELens, runs SAELens's evaluation
(``sae_lens.evals.get_sparsity_and_variance_metrics``) on the same batch, and writes everything to
OUT_DIR/results.json. The evaluation reads its activations through a stand-in model and activation store (the batch
as the cached activations of one hook): SAELens's own metric code, no model download.

Imports nothing of hookviz: this environment holds SAELens and its pins only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import sae_lens
import torch
from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.evals import get_sparsity_and_variance_metrics
from sae_lens.training.activation_scaler import ActivationScaler

D_IN, D_SAE, K = 16, 48, 5
BATCH, CTX = 4, 8  # 32 activation rows
HOOK = "blocks.0.hook_resid_pre"


def _weights(sae: torch.nn.Module, g: torch.Generator, *, threshold: bool) -> None:
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(D_IN, D_SAE, generator=g) / D_IN**0.5)
        sae.W_dec.copy_(torch.randn(D_SAE, D_IN, generator=g) / D_SAE**0.5)
        sae.b_enc.copy_(torch.randn(D_SAE, generator=g) * 0.1)
        sae.b_dec.copy_(torch.randn(D_IN, generator=g) * 0.1)
        if threshold:
            sae.threshold.copy_(torch.rand(D_SAE, generator=g) * 0.3)


def make_saes() -> dict[str, torch.nn.Module]:
    g = torch.Generator().manual_seed(0)
    saes: dict[str, torch.nn.Module] = {
        "standard": StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE)),
        # SAELens's encoder reads x, not x - b_dec: hookviz folds b_dec @ W_enc into b_enc when loading
        "standard_no_b_dec_in": StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=False)),
        "topk": TopKSAE(TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K)),
        "jumprelu": JumpReLUSAE(JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE)),
    }
    for name, sae in saes.items():
        sae.cfg.metadata.hook_name = HOOK
        _weights(sae, g, threshold=name == "jumprelu")
    return saes


class _Model:
    """What get_sparsity_and_variance_metrics asks of a model: run_with_cache -> (_, {hook: activations})."""

    def __init__(self, acts: torch.Tensor) -> None:
        self.acts = acts

    def run_with_cache(self, tokens, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return None, {HOOK: self.acts}


class _Store:
    """What it asks of an activation store: token ids (batch, ctx) (only their shape is read without ignore_tokens)."""

    def get_batch_tokens(self, n: int) -> torch.Tensor:
        return torch.zeros(BATCH, CTX, dtype=torch.long)


def main(out: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(BATCH, CTX, D_IN, generator=torch.Generator().manual_seed(1)) + 0.5  # a nonzero mean
    results: dict[str, object] = {"sae_lens": sae_lens.__version__, "torch": torch.__version__, "x": x.tolist()}
    for name, sae in make_saes().items():
        sae.eval()
        sae.save_model(out / name)
        with torch.no_grad():
            f = sae.encode(x)
            x_hat = sae.decode(f)
            metrics, feature_metrics = get_sparsity_and_variance_metrics(
                sae,
                _Model(x),
                _Store(),
                ActivationScaler(),
                n_batches=1,
                compute_l2_norms=True,
                compute_sparsity_metrics=True,
                compute_variance_metrics=True,
                compute_featurewise_density_statistics=True,
                eval_batch_size_prompts=BATCH,
                model_kwargs={},
            )
        results[name] = {
            "latents": f.tolist(),
            "reconstruction": x_hat.tolist(),
            "metrics": metrics,
            "feature_density": feature_metrics["feature_density"],
        }
    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
