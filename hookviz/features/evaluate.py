"""`evaluate_sae`: an SAE's metrics on a layer of a model, as the field defines them (SAELens's evaluation, Gao et
al. 2024 §4, Bricken et al. 2023).

Over the activation rows x (M, d_in) of the evaluation data (tokens, or a CNN layer's pixels) and their
reconstructions x̂:

- ``l0``: mean number of latents firing (f != 0) per row.
- ``fve``: fraction of variance explained, 1 - sum_d Var(x_d - x̂_d) / sum_d Var(x_d), variances over the rows.
- ``mse``: mean over all elements of (x - x̂)^2.
- ``dead``: latents that never fire over the data; ``dense``: latents firing on more than `dense_threshold` (10 %)
  of the rows; ``frequency``: each latent's firing rate.

For a language model (integer token ids (N, T) in, logits (N, T, V) out), with the SAE's reconstruction spliced in
without the error term (`splice`, ``error_term=False``) and with the layer zero-ablated:

- ``ce_orig``, ``ce_sae``, ``ce_zero``: next-token cross-entropy (logits at t score token t + 1), over the positions
  whose token and next token are real (attention mask);
- ``loss_recovered``: (ce_zero - ce_sae) / (ce_zero - ce_orig), 1 for a perfect reconstruction, 0 for one no better
  than zeros;
- ``kl``: mean over real positions of KL(p_orig || p_sae) of the next-token distributions (nats).

`scored` narrows both to chosen positions (the answer of a task whose other tokens are random).

The statistics are accumulated in float64 batch by batch (the data set is never held whole).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import positive_int
from ..interventions._common import parse_key, prepared
from ..interventions.intervene import intervene
from ._acts import Select, batches, model_device, model_inputs, rows_of
from .sae import SAE
from .splice import splice

__all__ = ["SAEEvaluation", "evaluate_sae"]


@dataclass
class SAEEvaluation:
    """An SAE's metrics on a layer (module docstring); the language-model ones are None for other models."""

    layer: str
    d_sae: int
    rows: int
    l0: float
    fve: float
    mse: float
    dead: int
    dense: int
    dense_threshold: float
    frequency: Tensor = field(repr=False)
    ce_orig: float | None = None
    ce_sae: float | None = None
    ce_zero: float | None = None
    loss_recovered: float | None = None
    kl: float | None = None

    def as_dict(self) -> dict[str, Any]:
        keys = ("layer", "d_sae", "rows", "l0", "fve", "mse", "dead", "dense", "ce_orig", "ce_sae", "ce_zero")
        return {k: getattr(self, k) for k in (*keys, "loss_recovered", "kl")}

    def table(self) -> str:
        """A Markdown table of the metrics."""

        def fmt(v: Any) -> str:
            if v is None:
                return "—"
            if isinstance(v, float):
                return f"{v:.4g}"
            return str(v)

        rows = [
            ("layer", self.layer),
            ("latents (d_sae)", self.d_sae),
            ("rows evaluated", self.rows),
            ("L0 (mean latents firing)", self.l0),
            ("variance explained", self.fve),
            ("MSE", self.mse),
            ("CE original", self.ce_orig),
            ("CE with SAE", self.ce_sae),
            ("CE zero-ablated", self.ce_zero),
            ("CE loss recovered", self.loss_recovered),
            ("KL(orig ‖ SAE), nats", self.kl),
            ("dead latents", f"{self.dead} ({self.dead / self.d_sae:.1%})"),
            (f"dense latents (> {self.dense_threshold:.0%} of rows)", self.dense),
        ]
        return "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {fmt(v)} |" for k, v in rows)

    def __str__(self) -> str:
        return self.table()


def _logits(output: Any) -> Tensor | None:
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def _token_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    ids = args[0] if args else kwargs.get("input_ids")
    if isinstance(ids, Tensor) and ids.dim() == 2 and not ids.is_floating_point() and not ids.is_complex():
        return ids
    return None


@torch.no_grad()
def evaluate_sae(
    model: nn.Module,
    layer: str,
    sae: SAE,
    data: Any,
    *,
    data_batch_size: int = 32,
    select: Select | None = None,
    dense_threshold: float = 0.1,
    language_model: bool | None = None,
    scored: Callable[[Tensor], Tensor] | None = None,
) -> SAEEvaluation:
    """The metrics of `sae` on `layer`'s outputs over `data` (module docstring for the definitions).

    Args:
        model: any module (eval mode for the evaluation, restored after).
        layer: the module whose output the SAE reads.
        sae: the SAE.
        data: a tensor (N, ...) of inputs split into batches of `data_batch_size`, or an iterable of batches (as
            `train_sae` takes them; a dict batch's ``attention_mask`` keeps padding out).
        select: the output -> rows rule, when the default is not wanted (see `train_sae`).
        dense_threshold: a latent firing on more than this fraction of rows is dense.
        language_model: compute the cross-entropy and KL metrics (None: when the inputs are token ids (N, T) and the
            output logits (N, T, V)).
        scored: token ids (N, T) -> bool (N, T), the positions whose next-token prediction the cross-entropy and
            the KL count (None: every real position; e.g. only the answer of a task whose other tokens are random).
    """
    name, _ = parse_key(model, layer, "layer")
    positive_int("data_batch_size", data_batch_size, "inputs per forward")
    if not isinstance(sae, SAE):
        raise TypeError(f"sae must be a hookviz.features.SAE, got {type(sae).__name__}")
    device = model_device(model)
    d = sae.d_in
    n_rows = 0
    sums = {k: torch.zeros(d, dtype=torch.float64, device=device) for k in ("x", "x2", "r", "r2")}
    l0_sum = torch.zeros((), dtype=torch.float64, device=device)
    fired = torch.zeros(sae.d_sae, dtype=torch.float64, device=device)
    ce = {k: torch.zeros((), dtype=torch.float64, device=device) for k in ("orig", "sae", "zero")}
    kl_sum = torch.zeros((), dtype=torch.float64, device=device)
    ce_count = kl_count = 0
    lm_seen = False
    with prepared(model, True):
        for batch in batches(data, data_batch_size):
            args, kwargs = model_inputs(batch, device)
            mask = kwargs.get("attention_mask")
            with splice(model, {name: sae}, error_term=False, name_sites=False) as spliced:
                out_sae = model(*args, **kwargs)
            if name not in spliced.inputs:
                raise ValueError(f"layer {name!r} did not run in the model's forward")
            x = rows_of(spliced.inputs[name], select, mask, name).double()
            x_hat = rows_of(spliced.reconstructions[name], select, mask, name).double()
            f = rows_of(spliced.latents[name], select, mask, name)
            r = x - x_hat
            n_rows += x.shape[0]
            sums["x"] += x.sum(0)
            sums["x2"] += x.square().sum(0)
            sums["r"] += r.sum(0)
            sums["r2"] += r.square().sum(0)
            active = f != 0
            l0_sum += active.sum(-1).double().sum()
            fired += active.double().sum(0)

            ids = _token_ids(args, kwargs)
            logits_sae = _logits(out_sae)
            is_lm = language_model
            if is_lm is None:
                is_lm = ids is not None and logits_sae is not None and logits_sae.dim() == 3
            if not is_lm:
                continue
            if ids is None or logits_sae is None or logits_sae.shape[:2] != ids.shape:
                raise ValueError("language_model=True needs token ids (N, T) in and logits (N, T, V) out")
            lm_seen = True
            logits_orig = _logits(model(*args, **kwargs))
            with intervene(model, {name: torch.zeros_like}):
                logits_zero = _logits(model(*args, **kwargs))
            real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
            pairs = real[:, :-1] & real[:, 1:]
            if scored is not None:
                chosen = scored(ids).to(real.device).bool()
                if chosen.shape != ids.shape:
                    raise ValueError(f"scored must return a bool mask {tuple(ids.shape)}, got {tuple(chosen.shape)}")
                real = real & chosen
                pairs = pairs & chosen[:, :-1]
            target = ids[:, 1:]
            for key, logits in (("orig", logits_orig), ("sae", logits_sae), ("zero", logits_zero)):
                loss = F.cross_entropy(logits[:, :-1].double().transpose(1, 2), target, reduction="none")
                ce[key] += loss[pairs].sum()
            ce_count += int(pairs.sum())
            lp_orig = F.log_softmax(logits_orig.double(), -1)
            lp_sae = F.log_softmax(logits_sae.double(), -1)
            kl = (lp_orig.exp() * (lp_orig - lp_sae)).sum(-1)
            kl_sum += kl[real].sum()
            kl_count += int(real.sum())
    if n_rows == 0:
        raise ValueError("data gave no activation rows to evaluate on")
    var_x = (sums["x2"] / n_rows - (sums["x"] / n_rows).square()).sum()
    var_r = (sums["r2"] / n_rows - (sums["r"] / n_rows).square()).sum()
    frequency = (fired / n_rows).float().cpu()
    result = SAEEvaluation(
        layer=name,
        d_sae=sae.d_sae,
        rows=n_rows,
        l0=float(l0_sum / n_rows),
        fve=float(1 - var_r / var_x) if float(var_x) > 0 else math.nan,
        mse=float(sums["r2"].sum() / (n_rows * d)),
        dead=int((frequency == 0).sum()),
        dense=int((frequency > dense_threshold).sum()),
        dense_threshold=dense_threshold,
        frequency=frequency,
    )
    if lm_seen and ce_count:
        result.ce_orig, result.ce_sae, result.ce_zero = (float(ce[k] / ce_count) for k in ("orig", "sae", "zero"))
        gap = result.ce_zero - result.ce_orig
        result.loss_recovered = (result.ce_zero - result.ce_sae) / gap if gap != 0 else math.nan
        result.kl = float(kl_sum / max(kl_count, 1))
    return result
