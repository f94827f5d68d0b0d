"""Token scores of every generation step of a batch, from hookviz's methods at the token embedding.

A generated continuation is K targets over one sequence: step k's score (`scores.explained_score`) is read at its own
position of the one forward pass over prompt and continuation, so the methods' K-target path gives every step's
attribution from that pass, with the K backward passes over the one graph (`hookviz.targets.batched_grad`). The
targets are a `hookviz.targets.RowTarget`, so methods that expand the batch (Integrated Gradients' path points) score
each row at its own sequence's steps. The steps are taken in chunks whose (n, chunk, T, D) attribution fits
`CHUNK_BYTES`: memory stays bounded at any length, at the cost of one more forward pass per further chunk.

The attribution at the embedding (n, K, T, D) is reduced over D by the method's ``token_reduction``: a sum for
Input x Gradient, Integrated Gradients and the relevance methods (their sum over a token's embedding is the token's
share of the score), the L2 norm for the plain gradient (Saliency: its signed sum is no attribution, e.g. rounding
noise after a LayerNorm, whose gradient sums to zero over the embedding).

The attention rollouts (Abnar & Zuidema, 2020; Chefer et al., 2021) give token scores themselves: step k's row of
the rollout matrix at the position that predicts its token (`RolloutAttribution`'s ``token=`` as an (n, K) tensor).

Occlusion (Zeiler & Fergus, 2014, arXiv:1311.2901) runs forward passes only: each source token in turn replaced by
the baseline token (the continuation teacher-forced), one pass scoring every step at once; the score of (step,
token) is clean score minus occluded score.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from .._device import to_device
from ..methods import LRP, AttentionRollout, GradientRollout, InputXGradient, IntegratedGradients, Saliency
from ..methods.base import Attribution
from ..targets import RowTarget
from .model import LanguageModel, NotLogitsError
from .scores import Steps, explained_score, step_logits, token_score

CHUNK_BYTES = 512 * 2**20  # the attribution at the embedding kept at once, per chunk of steps


@dataclass(frozen=True)
class MethodSpec:
    """How a method name runs at the token embedding: its builder (whose ``token_reduction`` reduces the embedding
    axis) and the options it takes."""

    build: Callable[..., Attribution] | None  # (model, embedding, baseline id, rows, **method_kwargs); None: occlusion
    options: tuple[str, ...]  # method_kwargs it takes
    rollout: bool = False  # gives (n, K, T) token scores itself, reading the row of each step's position (token=)
    relevance: bool = False  # LRP: a contrast is the difference of two relevances, not the relevance of a difference


def _ig(model: Any, emb: Any, baseline: int, rows: int, **kw: Any) -> Attribution:
    # one path point per pass over the batch: a pass is a batch of sequences, as for the other methods
    kw.pop("baseline", None)  # the caller passes the checked baseline token id
    return IntegratedGradients(model, layer=emb, baseline=baseline, batch_size=rows, **kw)


METHODS: dict[str, MethodSpec] = {
    "saliency": MethodSpec(lambda m, e, b, r, **kw: Saliency(m, layer=e, **kw), ("backward",)),
    "input-x-gradient": MethodSpec(lambda m, e, b, r, **kw: InputXGradient(m, layer=e, **kw), ("backward",)),
    "integrated-gradients": MethodSpec(_ig, ("steps", "method", "baseline", "backward")),
    "attn-lrp": MethodSpec(lambda m, e, b, r, **kw: LRP(m, "attn-lrp", layer=e, **kw), ("epsilon",), relevance=True),
    "cp-lrp": MethodSpec(lambda m, e, b, r, **kw: LRP(m, "cp-lrp", layer=e, **kw), ("epsilon",), relevance=True),
    "attention-rollout": MethodSpec(
        lambda m, e, b, r, **kw: AttentionRollout(m, **kw), ("head_fusion", "discard_ratio"), rollout=True
    ),
    "gradient-rollout": MethodSpec(lambda m, e, b, r, **kw: GradientRollout(m, **kw), ("backward",), rollout=True),
    "occlusion": MethodSpec(None, ("baseline", "batch_size")),
}


def check_method(method: object, method_kwargs: dict[str, Any]) -> MethodSpec:
    """The spec of a method name, its options checked; a clear error for a method that cannot run here."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a method name (one of {', '.join(METHODS)}), got {type(method).__name__}")
    spec = METHODS.get(method)
    if spec is None:
        raise ValueError(
            f"method {method!r} cannot explain a generation at the token embedding; choose one of {', '.join(METHODS)}"
        )
    unknown = sorted(set(method_kwargs) - set(spec.options))
    if unknown:
        raise TypeError(
            f"method_kwargs {unknown} are not options of {method!r} here; it takes {', '.join(spec.options) or 'none'}"
        )
    return spec


def chunk_size(n: int, length: int, width: int, itemsize: int, k: int) -> int:
    """Steps per chunk: as many as keep the (n, chunk, length, width) attribution within `CHUNK_BYTES`."""
    per_step = max(1, n * length * width * itemsize)
    return max(1, min(k, CHUNK_BYTES // per_step))


def attribute_steps(
    lm: LanguageModel,
    spec: MethodSpec,
    ids: Tensor,
    mask: Tensor,
    steps: Steps,
    *,
    kind: str,
    baseline: int,
    method_kwargs: dict[str, Any],
) -> tuple[Tensor, Tensor]:
    """(n, K, T) token scores of every step, and the (n, K, V) step logits of the clean forward pass."""
    if spec.relevance and steps.contrast is not None:
        # LRP of a difference of two outputs is the difference of their relevances (LRP-0 through the difference
        # neuron): seeding the difference itself would start relevance +d and -d at the two logits instead
        run = partial(attribute_steps, lm, spec, ids, mask, kind=kind, baseline=baseline, method_kwargs=method_kwargs)
        wanted, logits = run(Steps(steps.pos, steps.token, None, steps.valid))
        against, _ = run(Steps(steps.pos, steps.contrast, None, steps.valid))
        return wanted - against, logits
    if spec.build is None:
        rest = {k: v for k, v in method_kwargs.items() if k != "baseline"}  # `baseline` holds it already
        return occlusion(lm, ids, mask, steps, kind=kind, baseline=baseline, **rest)
    n, length = ids.shape
    k = steps.pos.shape[1]
    weight = getattr(lm.embedding, "weight", None)
    # the rollouts hold a (T, T) matrix per step, the other methods a (T, D) attribution
    width = length if spec.rollout else weight.shape[1] if isinstance(weight, Tensor) else 1
    itemsize = weight.element_size() if isinstance(weight, Tensor) else 4
    size = chunk_size(n, length, width, itemsize, k)
    # the logits needed: from the first step's position (the longest continuation's) to the end
    keep = length - int(steps.pos[steps.valid].min()) if bool(steps.valid.any()) else None
    kwargs = lm.forward_kwargs(mask, keep)
    read = steps.shifted(lm.offset(length, keep))
    parts, logits = [], []
    method = None if spec.rollout else spec.build(lm.module, lm.embedding, baseline, n, **method_kwargs)
    for start in range(0, k, size):
        chunk = steps.columns(start, start + size)
        stash: dict[str, Tensor] = {}
        target = RowTarget(explained_score(read.columns(start, start + size), kind, stash, lm.vocab_size))
        try:
            if method is None:  # a rollout reads each step's row: the position that predicts its token
                rollout = spec.build(lm.module, lm.embedding, baseline, n, token=chunk.pos, **method_kwargs)
                parts.append(rollout.attribute(ids, target=target, forward_kwargs=kwargs).detach())  # (n, chunk, T)
            else:
                a = method.attribute(ids, target=target, forward_kwargs=kwargs).detach()  # (n, chunk, T, D)
                parts.append(a.flatten(3).norm(dim=3) if method.token_reduction == "norm" else a.flatten(3).sum(3))
        except RuntimeError as exc:  # the methods wrap a failing target; a model without logits says so itself
            if isinstance(exc.__cause__, NotLogitsError):
                raise exc.__cause__ from None
            raise
        logits.append(stash["logits"])
    return torch.cat(parts, 1), torch.cat(logits, 1)


def occlusion(
    lm: LanguageModel,
    ids: Tensor,
    mask: Tensor,
    steps: Steps,
    *,
    kind: str,
    baseline: int,
    batch_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Occlusion of one token at a time with the continuation teacher-forced: (n, K, T) clean minus occluded step
    scores (0 for pads), and the clean step logits; forward passes only, ``batch_size`` occluded copies per pass
    (default: as many as the batch has sequences)."""
    n, length = ids.shape
    rows = torch.arange(n)
    keep = length - int(steps.pos[steps.valid].min()) if bool(steps.valid.any()) else None
    steps = steps.shifted(lm.offset(length, keep))
    with torch.no_grad():
        clean_logits = step_logits(lm(ids, mask, keep), steps, rows)
        clean = _score(clean_logits, steps, rows, kind)
        # every real token of every sequence, except the last (it predicts nothing that is explained)
        which = mask.bool().clone()
        which[:, -1] = False
        seq, col = which.nonzero(as_tuple=True)
        out = clean.new_zeros((n, steps.pos.shape[1], length))
        per_pass = batch_size or n
        for start in range(0, seq.shape[0], per_pass):
            s, c = seq[start : start + per_pass], col[start : start + per_pass]
            occluded = ids[s].clone()
            occluded[torch.arange(s.shape[0]), c] = baseline
            logits = step_logits(lm(occluded, mask[s], keep), steps, s.cpu())
            out[s, :, c] = clean[s] - _score(logits, steps, s.cpu(), kind)
    return out * to_device(steps.valid, out.device).unsqueeze(-1), clean_logits


def _score(logits: Tensor, steps: Steps, rows: Tensor, kind: str) -> Tensor:
    score = token_score(logits, to_device(steps.token[rows], logits.device), kind)
    if steps.contrast is not None:
        score = score - token_score(logits, to_device(steps.contrast[rows], logits.device), kind)
    return score
