"""Ground truth for the shipped SAE (issue 37, part 8): which latents of `hookviz.zoo.sae.retrieval_sae` (the
retrieval LM's residual stream after ``blocks.0``) track keys, values and the query, and whether attribution to
latents finds the answering value's feature.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/sae_retrieval_study.py [--n 2000] [--seed 3] [--out PATH.md]

The prompts are ``<bos> k v ... k v ? k`` (`hookviz.zoo.retrieval`); the zoo knows which list position holds the
answer (the value after the asked key's occurrence in the list).

1. **Roles.** Each token of the prompt has a role: ``bos``, ``key`` (a listed key), ``value`` (a listed value),
   ``?`` and ``query`` (the asked key after ``?``, the last position, where the answer is predicted). For each latent,
   its mean activation at each role; its role is the one with the largest mean, and its selectivity that mean over the
   sum of the five (1: it fires for that role only; 0.2: alike for all). For the value latents, also which value
   token they fire for (mean activation per value id at value positions; token selectivity likewise over the 16
   values) and which *preceding key* (mean per key id of the token before, at value positions: a value's residual
   must know its key for the induction head of block 1 to find it).
2. **Attribution.** Metric m = logit(answer) - logit(alt) at the last position, alt a value not in the list; the
   corrupted prompt has the answer's value replaced by alt in the list (the model then answers alt). Effects per
   (position, latent) by `hv.latent_attribution`: ``"gradient"`` (gradient x activation on the clean prompt) and
   ``"patching"`` (attribution patching, the estimated drop of m when a latent takes its corrupted value; its
   importance is -effect). Reported per prompt: whether the top (position, latent) node is at the answer's value
   position (chance: the share of active nodes that stand there), whether the top latent (effects summed over the
   positions) is active at that position (chance: the share of the prompt's active latents that are), and whether
   it is the latent whose preferred value token (part 1) is the answer.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

import hookviz as hv
from hookviz.features import SAE
from hookviz.zoo import retrieval, retrieval_lm
from hookviz.zoo.retrieval import N_VALUES, QUERY_ID, VALUE_BASE, Retrieval
from hookviz.zoo.sae import SAE_LAYER, retrieval_sae

ROLES = ("bos", "key", "value", "?", "query")


@dataclass
class Study:
    """The study's numbers (module docstring). Per latent (d_sae,): `role_means` (5, d_sae), `role`, `selectivity`;
    `value_means` / `prev_key_means` (16, d_sae): mean activation at value positions per value id / per preceding
    key id; `answer_means` (16, d_sae): mean activation at the query position per answer id. ``attribution[method]``
    holds per prompt (N,): ``node_at_value``, ``node_at_query`` (the top node's position), ``node_is_answer`` /
    ``node_is_alt`` (the top node's latent prefers the answer / alt at the query position), ``latent_at_value`` (the
    top latent, effects summed over positions, is active at the answer's value), ``share_value``, ``share_query``
    (the importance there over the total), and the chance levels ``chance_node``, ``chance_latent``."""

    role_means: Tensor
    role: Tensor
    selectivity: Tensor
    value_means: Tensor
    prev_key_means: Tensor
    answer_means: Tensor
    attribution: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    def value_feature(self) -> Tensor:
        """(16,) for each value id, the latent most raised at that value's positions over its mean at all values."""
        return _contrast(self.value_means).argmax(1)

    def preferred_answer(self) -> Tensor:
        """(d_sae,) for each latent, the answer id it is most raised for at the query position."""
        return _contrast(self.answer_means).argmax(0)


def _contrast(means: Tensor) -> Tensor:
    """(16, d) mean per token id minus the mean over the 16 ids: how much a latent is raised for one id."""
    return means - means.mean(0, keepdim=True)


def prompt_ids(data: Retrieval) -> Tensor:
    """The prompts (``<bos>`` ... ``? k``) of items that all have the same number of pairs: (N, 2K + 3)."""
    (k,) = set(data.pairs.tolist())
    return data.ids[:, : 2 * k + 3]


def roles_of(ids: Tensor) -> Tensor:
    """(N, T) int: the role index (into `ROLES`) of each token of prompts without padding."""
    t = torch.arange(ids.shape[1]).expand_as(ids)
    role = torch.where(t % 2 == 1, 1, 2)  # listed keys at odd, values at even positions
    role = torch.where(t == 0, 0, role)
    role = torch.where(ids == QUERY_ID, 3, role)
    return torch.where(t == ids.shape[1] - 1, 4, role)


def groups(data: Retrieval) -> list[Retrieval]:
    """`data` split by the number of pairs, so that each group's prompts have one length (no padding)."""
    return [data[torch.nonzero(data.pairs == k).flatten()] for k in data.pairs.unique().tolist()]


@torch.no_grad()
def latents_of(model: nn.Module, sae: SAE, ids: Tensor, layer: str = SAE_LAYER) -> Tensor:
    """(N, T, d_sae) the SAE's latents of `layer`'s output on the prompts `ids`."""
    with hv.splice(model, {layer: sae}) as spliced:
        model(ids)
    return spliced.latents[layer]


def corrupt(data: Retrieval) -> tuple[Tensor, Tensor, Tensor]:
    """(clean prompts, corrupted prompts, alt ids): alt is the first value id not in the item's list, written in
    place of the answer at its list position."""
    ids = prompt_ids(data)
    listed = torch.zeros(len(data), N_VALUES, dtype=torch.bool)
    values = ids[:, 2:-2:2] - VALUE_BASE
    listed.scatter_(1, values, True)
    alt = (~listed).float().argmax(1) + VALUE_BASE
    bad = ids.clone()
    bad[torch.arange(len(data)), data.value_positions + 1] = alt  # +1: <bos>
    return ids, bad, alt


def study(
    model: nn.Module,
    sae: SAE,
    data: Retrieval,
    *,
    layer: str = SAE_LAYER,
    methods: tuple[str, ...] = ("gradient", "patching"),
    batch: int = 250,
) -> Study:
    """The study on `data` (module docstring): roles of the latents, then attribution per prompt."""
    d = sae.d_sae
    role_sum = torch.zeros(len(ROLES), d, dtype=torch.float64)
    role_n = torch.zeros(len(ROLES), 1, dtype=torch.float64)
    value_sum = torch.zeros(N_VALUES, d, dtype=torch.float64)
    prev_sum = torch.zeros(N_VALUES, d, dtype=torch.float64)
    value_n = torch.zeros(N_VALUES, 1, dtype=torch.float64)
    prev_n = torch.zeros(N_VALUES, 1, dtype=torch.float64)
    answer_sum = torch.zeros(N_VALUES, d, dtype=torch.float64)
    answer_n = torch.zeros(N_VALUES, 1, dtype=torch.float64)
    kept: list[tuple[Retrieval, Tensor]] = []
    for part in groups(data):
        ids = prompt_ids(part)
        for i in range(0, len(part), batch):
            f = latents_of(model, sae, ids[i : i + batch], layer).double()
            sub = ids[i : i + batch]
            role = roles_of(sub)
            for r in range(len(ROLES)):
                at = role == r
                role_sum[r] += f[at].sum(0)
                role_n[r] += at.sum()
            at = role == 2
            vid = sub[at] - VALUE_BASE
            prev = sub[:, :-1][at[:, 1:]] - 4  # the key before each value (KEY_BASE = 4)
            value_sum.index_add_(0, vid, f[at])
            value_n.index_add_(0, vid, torch.ones(len(vid), 1, dtype=torch.float64))
            prev_sum.index_add_(0, prev, f[at])
            prev_n.index_add_(0, prev, torch.ones(len(prev), 1, dtype=torch.float64))
            answer = part.answers[i : i + batch] - VALUE_BASE
            answer_sum.index_add_(0, answer, f[:, -1])
            answer_n.index_add_(0, answer, torch.ones(len(answer), 1, dtype=torch.float64))
            kept.append((part[i : i + batch], f.float()))
    role_means = (role_sum / role_n.clamp(min=1)).float()
    total = role_means.sum(0)
    result = Study(
        role_means=role_means,
        role=role_means.argmax(0),
        selectivity=torch.where(total > 0, role_means.max(0).values / total.clamp(min=1e-30), 0.0),
        value_means=(value_sum / value_n.clamp(min=1)).float(),
        prev_key_means=(prev_sum / prev_n.clamp(min=1)).float(),
        answer_means=(answer_sum / answer_n.clamp(min=1)).float(),
    )
    prefers = result.preferred_answer()
    for method in methods:
        keys = (
            "node_at_value",
            "node_at_query",
            "node_is_answer",
            "node_is_alt",
            "latent_at_value",
            "share_value",
            "share_query",
        )
        rows: dict[str, list[Tensor]] = {k: [] for k in (*keys, "chance_node", "chance_latent")}
        for part, f in kept:
            clean, bad, alt = corrupt(part)
            good = part.answers
            metric = logit_difference(good, alt)
            got = hv.latent_attribution(
                model, clean, {layer: sae}, metric, method=method, corrupted=bad if method == "patching" else None
            )
            effect = got.latents[layer]  # (n, T, d_sae)
            importance = -effect if method == "patching" else effect
            n, t, _ = importance.shape
            at = part.value_positions + 1  # token index of the answer's value (<bos> first)
            rows_ = torch.arange(n)
            top_node = importance.reshape(n, -1).argmax(1)
            rows["node_at_value"].append(top_node // d == at)
            rows["node_at_query"].append(top_node // d == t - 1)
            rows["node_is_answer"].append(prefers[top_node % d] == good - VALUE_BASE)
            rows["node_is_alt"].append(prefers[top_node % d] == alt - VALUE_BASE)
            per_position = importance.sum(2)
            whole = per_position.sum(1)
            rows["share_value"].append(per_position[rows_, at] / whole)
            rows["share_query"].append(per_position[:, -1] / whole)
            active = f > 0
            rows["chance_node"].append(active[rows_, at].sum(1) / active.reshape(n, -1).sum(1).clamp(min=1))
            top_latent = importance.sum(1).argmax(1)
            rows["latent_at_value"].append(active[rows_, at, top_latent])
            anywhere = active.any(1)
            rows["chance_latent"].append(
                (active[rows_, at] & anywhere).sum(1) / anywhere.sum(1).clamp(min=1)
            )  # fmt: skip
        result.attribution[method] = {k: torch.cat(v) for k, v in rows.items()}
    return result


def logit_difference(good: Tensor, bad: Tensor) -> Callable[[Tensor], Tensor]:
    """logits (N, T, V) -> (N,): logit(good) - logit(bad) at the last position."""

    def metric(out: Tensor) -> Tensor:
        last = out[:, -1]
        rows = torch.arange(last.shape[0], device=last.device)
        return last[rows, good] - last[rows, bad]

    return metric


def report(s: Study, n: int, seconds: float) -> str:
    """The study as Markdown."""
    lines = [f"# Ground truth: the shipped SAE of the retrieval LM ({n} prompts, {seconds:.0f} s)", ""]
    alive = s.role_means.sum(0) > 0
    lines += ["## Roles", "", "| role | latents (largest mean there) | of which selectivity > 0.8 | mean activation |"]
    lines += ["|---|---|---|---|"]
    for r, name in enumerate(ROLES):
        mine = alive & (s.role == r)
        sharp = mine & (s.selectivity > 0.8)
        lines.append(f"| {name} | {int(mine.sum())} | {int(sharp.sum())} | {s.role_means[r].sum():.3g} |")
    lines.append(f"| never active | {int((~alive).sum())} | | |")
    value_latents = alive & (s.role == 2)
    vm = s.value_means[:, value_latents]
    tok_sel = vm.max(0).values / vm.sum(0).clamp(min=1e-30)
    pm = s.prev_key_means[:, value_latents]
    key_sel = pm.max(0).values / pm.sum(0).clamp(min=1e-30)
    feature = s.value_feature()
    own = s.value_means[torch.arange(N_VALUES), feature] / s.value_means[:, feature].sum(0).clamp(min=1e-30)
    query = alive & (s.role == 4)
    am = s.answer_means[:, query]
    ans_sel = am.max(0).values / am.sum(0).clamp(min=1e-30)
    lines += [
        "",
        f"Value latents ({int(value_latents.sum())}): token selectivity over the 16 values (max mean / sum; 1/16 = "
        f"{1 / 16:.3f} uniform) median {tok_sel.median():.3f}, > 0.5 for {int((tok_sel > 0.5).sum())}; selectivity "
        f"for the preceding key median {key_sel.median():.3f}, > 0.5 for {int((key_sel > 0.5).sum())}.",
        f"Each value's own latent (the most raised at that value over the mean at all values): "
        f"{len(set(feature.tolist()))} distinct latents for the 16 values, token selectivity median {own.median():.3f} "
        f"(min {own.min():.3f}).",
        f"Query latents ({int(query.sum())}): selectivity for the answer (max mean over the 16 answer ids / sum) "
        f"median {ans_sel.median():.3f}, > 0.5 for {int((ans_sel > 0.5).sum())}; distinct preferred answers among "
        f"those: {len(set(s.preferred_answer()[query][ans_sel > 0.5].tolist()))} of 16.",
        "",
        "## Attribution of logit(answer) - logit(alt) at the last position to latents",
        "",
        "Per prompt, the top node (position, latent) by importance (gradient x activation; minus the attribution "
        "patching estimate: the drop of the metric), and the top latent (importance summed over the positions). "
        "Means over prompts:",
        "",
        "| method | top node at the query | top node at the answer's value (chance) | top node's latent prefers the "
        "answer (chance 1/16) | ... prefers alt (1/16) | top latent active at the answer's value (chance) | "
        "importance share at the query | "
        "at the answer's value |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, a in s.attribution.items():
        lines.append(
            f"| {method} | {a['node_at_query'].float().mean():.3f} | {a['node_at_value'].float().mean():.3f} "
            f"({a['chance_node'].mean():.3f}) | {a['node_is_answer'].float().mean():.3f} | "
            f"{a['node_is_alt'].float().mean():.3f} | "
            f"{a['latent_at_value'].float().mean():.3f} ({a['chance_latent'].mean():.3f}) | "
            f"{a['share_query'].mean():.3f} | {a['share_value'].mean():.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = retrieval_lm()
    sae = retrieval_sae()
    start = time.perf_counter()
    s = study(model, sae, retrieval(a.n, seed=a.seed))
    text = report(s, a.n, time.perf_counter() - start)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
