"""Ground truth for an SAE of the shapes ViT (issue 37, part 8): does a TopK SAE trained on the patch tokens of
`hookviz.zoo.shapes_vit` find latents that fire on the object (its mask) rather than the background, per class, and
does attribution to latents put its mass on the object's patches?

Usage::

    OMP_NUM_THREADS=2 python benchmarks/sae_vit_study.py [--layer blocks.2] [--d-sae 256] [--k 8] [--steps 5000]
        [--n-train 4000] [--n 1000] [--seed 7] [--out PATH.md]

1. **Training.** A TopK SAE (`train_sae`) on the residual stream at `--layer`'s output, patch tokens only (the class
   token dropped: ``select=lambda a: a[:, 1:]``), on `--n-train` images of ``shapes(seed=0)``, `--steps` Adam steps
   of 1,024 patch tokens (5,000: 35 s of two idle CPU cores; the wall time is reported).
2. **Evaluation** on `--n` held-out images (``shapes(seed=--seed)``): `evaluate_sae` (variance explained, L0, MSE,
   dead / dense latents), then the classifier's cross-entropy and accuracy on the labels with the patch tokens
   replaced by the SAE's reconstruction (`hv.splice` with the error term zeroed at the patch tokens: the class token
   keeps its own value, the SAE was not trained on it), original, patch tokens zero-ablated and mean-ablated (the
   mean patch token of the evaluation set); loss recovered = (CE_ablated - CE_SAE) / (CE_ablated - CE_original).
3. **Masks.** A patch (8x8 pixels, the ViT's 8x8 grid in row-major order) is an object patch when the object's mask
   covers more than half of its pixels (`patch_object`). Per latent, the fraction of its activation mass (summed over
   the evaluation images' patches) on object patches; chance is the fraction of object patches overall. Object-
   selective: > 0.9; background-selective: < 0.1. Per class, the latents whose activation mass on object patches is
   most concentrated on that class's images (share of the latent's object-patch mass on the class; chance ~1/8).
4. **Attribution.** gradient x activation of the labelled class's logit to every (patch, latent) of the spliced SAE
   (`hv.latent_attribution`); per image, the fraction of the attribution mass (|effect| and the positive part,
   summed over latents) on object patches against the image's fraction of object patches, and the same for the top
   latent (effects summed over the patches).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hookviz as hv
from hookviz.features import SAE, SAEEvaluation, evaluate_sae, train_sae
from hookviz.zoo import shapes, shapes_vit
from hookviz.zoo.data import CLASSES, Shapes

PATCH = 8


def patch_tokens(a: Tensor) -> Tensor:
    """The rows of the patch tokens of a ViT activation (N, 1 + P, D) -> (N * P, D), the class token dropped."""
    return a[:, 1:].reshape(-1, a.shape[-1])


def patch_object(masks: Tensor, patch: int = PATCH, threshold: float = 0.5) -> Tensor:
    """(N, H, W) bool masks -> (N, (H / patch) * (W / patch)) bool, row-major like the ViT's tokens: True where the
    mask covers more than `threshold` of the patch's pixels (0: any pixel, a patch the object touches)."""
    cover = F.avg_pool2d(masks[:, None].float(), patch)  # (N, 1, H / patch, W / patch), the covered fraction
    return (cover > threshold).flatten(1)


def train(
    model: nn.Module, layer: str, images: Tensor, *, d_sae: int, k: int, steps: int, batch_size: int = 1024
) -> SAE:
    """A TopK SAE of `layer`'s patch tokens on `images`."""
    got = train_sae(
        model,
        layer,
        images,
        d_sae=d_sae,
        act="topk",
        k=k,
        steps=steps,
        batch_size=batch_size,
        select=patch_tokens,
        progress=False,
    )
    return got.sae


def evaluate(model: nn.Module, layer: str, sae: SAE, images: Tensor) -> SAEEvaluation:
    return evaluate_sae(model, layer, sae, images, select=patch_tokens)


@torch.no_grad()
def classifier_metrics(model: nn.Module, layer: str, sae: SAE, data: Shapes, batch: int = 250) -> dict[str, dict]:
    """Cross-entropy on the labels and accuracy: original, SAE spliced at the patch tokens, patch tokens zero- and
    mean-ablated; plus the loss recovered against each ablation."""
    model.eval()
    mean = torch.zeros(sae.d_in, dtype=torch.float64)
    for i in range(0, len(data), batch):
        a = hv.cache(model, data.images[i : i + batch], layer)[layer]
        mean += patch_tokens(a).double().sum(0)
    mean = (mean / (len(data) * (data.images.shape[-1] // PATCH) ** 2)).float()

    def zero_patches(a: Tensor) -> Tensor:
        out = a.clone()
        out[:, 1:] = 0
        return out

    def mean_patches(a: Tensor) -> Tensor:
        out = a.clone()
        out[:, 1:] = mean
        return out

    def run(kind: str, images: Tensor) -> Tensor:
        if kind == "original":
            return model(images)
        if kind == "sae":
            with (
                hv.splice(model, {layer: sae}) as spliced,
                hv.intervene(model, {spliced.error_sites[layer]: zero_patches}),
            ):
                return model(images)
        edit = zero_patches if kind == "zero" else mean_patches
        with hv.intervene(model, {layer: edit}):
            return model(images)

    out: dict[str, dict] = {}
    for kind in ("original", "sae", "zero", "mean"):
        ce, right = 0.0, 0
        for i in range(0, len(data), batch):
            logits = run(kind, data.images[i : i + batch])
            labels = data.labels[i : i + batch]
            ce += float(F.cross_entropy(logits.double(), labels, reduction="sum"))
            right += int((logits.argmax(1) == labels).sum())
        out[kind] = {"ce": ce / len(data), "accuracy": right / len(data)}
    for ablation in ("zero", "mean"):
        gap = out[ablation]["ce"] - out["original"]["ce"]
        out[ablation]["recovered"] = (out[ablation]["ce"] - out["sae"]["ce"]) / gap if gap else float("nan")
    return out


@torch.no_grad()
def patch_latents(model: nn.Module, layer: str, sae: SAE, images: Tensor, batch: int = 250) -> Tensor:
    """(N, P, d_sae) the SAE's latents at the patch tokens."""
    parts = []
    for i in range(0, len(images), batch):
        with hv.splice(model, {layer: sae}) as spliced:
            model(images[i : i + batch])
        parts.append(spliced.latents[layer][:, 1:])
    return torch.cat(parts)


@dataclass
class MaskStats:
    """Per latent (d_sae,): `mass` (total activation over the patches), `object_fraction` (its share on object
    patches; nan for a latent that never fired), `class_share` (n_classes, d_sae): the share of its object-patch mass
    on each class's images; `chance` the fraction of object patches overall."""

    mass: Tensor
    object_fraction: Tensor
    class_share: Tensor
    chance: float


def mask_stats(latents: Tensor, objects: Tensor, labels: Tensor, n_classes: int = len(CLASSES)) -> MaskStats:
    """`latents` (N, P, d_sae), `objects` (N, P) bool, `labels` (N,) -> `MaskStats`."""
    f = latents.double()
    mass = f.sum((0, 1))
    on_object = (f * objects[..., None]).sum(1)  # (N, d_sae)
    obj = on_object.sum(0)
    per_class = torch.zeros(n_classes, f.shape[-1], dtype=torch.float64).index_add_(0, labels, on_object)
    return MaskStats(
        mass=mass.float(),
        object_fraction=torch.where(mass > 0, obj / mass.clamp(min=1e-30), torch.nan).float(),
        class_share=(per_class / obj.clamp(min=1e-30)).float(),
        chance=float(objects.float().mean()),
    )


def class_logit(labels: Tensor):
    return lambda out: out[torch.arange(out.shape[0]), labels]


def attribution_on_objects(
    model: nn.Module,
    layer: str,
    sae: SAE,
    data: Shapes,
    objects: Tensor,
    batch: int = 100,
    touched: Tensor | None = None,
) -> dict[str, Tensor]:
    """Per image (N,): ``abs`` / ``pos`` the fraction of the |effect| / positive effect mass (gradient x activation
    of the labelled class's logit, summed over latents) on object patches; ``top_abs`` the same for the top latent
    (effects summed over the patches) alone; ``chance`` the image's fraction of object patches; ``error_share`` the
    error nodes' share of the layer's total effect |sum| at the patch tokens; ``top`` the top latent. With `touched`
    (another object definition, e.g. the patches the object touches) also ``abs_touched`` and ``chance_touched``."""
    keys = ("abs", "pos", "top_abs", "chance", "error_share", "top", "abs_touched", "chance_touched")
    rows: dict[str, list[Tensor]] = {k: [] for k in keys}
    for i in range(0, len(data), batch):
        part = data[i : i + batch]
        obj = objects[i : i + batch].float()
        got = hv.latent_attribution(model, part.images, {layer: sae}, class_logit(part.labels))
        eff = got.latents[layer][:, 1:].double()  # (n, P, d_sae)
        err = got.errors[layer][:, 1:].double()  # (n, P)
        a = eff.abs().sum(-1)
        p = eff.clamp(min=0).sum(-1)
        rows["abs"].append((a * obj).sum(1) / a.sum(1).clamp(min=1e-30))
        rows["pos"].append((p * obj).sum(1) / p.sum(1).clamp(min=1e-30))
        top = eff.sum(1).argmax(1)
        t = eff[torch.arange(len(part)), :, top].abs()  # (n, P)
        rows["top_abs"].append((t * obj).sum(1) / t.sum(1).clamp(min=1e-30))
        rows["top"].append(top)
        rows["chance"].append(obj.double().mean(1))
        if touched is not None:
            near = touched[i : i + batch].double()
            rows["abs_touched"].append((a * near).sum(1) / a.sum(1).clamp(min=1e-30))
            rows["chance_touched"].append(near.mean(1))
        lat_total, err_total = eff.sum((1, 2)), err.sum(1)
        rows["error_share"].append(err_total.abs() / (lat_total.abs() + err_total.abs()).clamp(min=1e-30))
    return {k: torch.cat(v) for k, v in rows.items() if v}


def report(
    cfg: dict,
    ev: SAEEvaluation,
    cls: dict[str, dict],
    ms: MaskStats,
    att: dict[str, Tensor],
    data: Shapes,
    touched: MaskStats | None = None,
) -> str:
    lines = [f"# Ground truth: an SAE of the shapes ViT's patch tokens ({cfg['layer']})", ""]
    lines += ["Command:", "", "```", cfg["command"], "```", ""]
    lines += [
        f"TopK SAE, d_sae {cfg['d_sae']}, k {cfg['k']}, {cfg['steps']} steps of 1024 patch tokens "
        f"({cfg['train_seconds']:.0f} s on {cfg['threads']} CPU threads) on {cfg['n_train']} images of "
        f"shapes(seed=0); evaluated on {cfg['n']} images of shapes(seed={cfg['seed']}).",
        "",
        "## Reconstruction (evaluate_sae, patch tokens)",
        "",
        ev.table(),
        "",
        "## The classifier with the SAE spliced at the patch tokens",
        "",
        "| run | cross-entropy | accuracy | loss recovered vs this ablation |",
        "|---|---|---|---|",
    ]
    names = {"original": "original", "sae": "SAE (class token kept)", "zero": "patches zero-ablated"}
    names["mean"] = "patches mean-ablated"
    for kind in ("original", "sae", "zero", "mean"):
        r = cls[kind]
        rec = f"{r['recovered']:.3f}" if "recovered" in r else ""
        lines.append(f"| {names[kind]} | {r['ce']:.4f} | {r['accuracy']:.3f} | {rec} |")
    alive = ms.mass > 0
    of = ms.object_fraction[alive]
    lines += [
        "",
        "## Latents against the object masks",
        "",
        f"Object patches (mask covers > 50 % of the 8x8 patch): {ms.chance:.3f} of all patches (chance for a "
        f"latent's object fraction). Latents that fired: {int(alive.sum())} of {len(ms.mass)}.",
        "",
        "| object fraction of activation mass | latents | their share of all activation mass |",
        "|---|---|---|",
    ]
    total = float(ms.mass.sum())
    of_all = ms.object_fraction
    bins = (
        ("> 0.9 (object-selective)", of_all > 0.9),
        ("0.5 - 0.9", (of_all > 0.5) & (of_all <= 0.9)),
        ("0.1 - 0.5", (of_all >= 0.1) & (of_all <= 0.5)),
        ("< 0.1 (background-selective)", of_all < 0.1),
        ("of which < 0.01", of_all < 0.01),
    )
    for name, sel in bins:
        sel = alive & sel
        lines.append(f"| {name} | {int(sel.sum())} | {float(ms.mass[sel].sum()) / total:.3f} |")
    lines += [
        "",
        f"Median object fraction {of.median():.3f}; weighted by mass "
        f"{float((ms.object_fraction[alive] * ms.mass[alive]).sum()) / total:.3f}; latents above 2x chance "
        f"({2 * ms.chance:.2f}): {int((of > 2 * ms.chance).sum())}.",
        "",
    ]
    if touched is not None:
        tf = touched.object_fraction[alive]
        lines += [
            f"With object = a patch the object touches (any mask pixel; {touched.chance:.3f} of all patches): "
            f"latents with object fraction > 0.9: {int((tf > 0.9).sum())}, > 0.5: {int((tf > 0.5).sum())}, "
            f"< 0.1: {int((tf < 0.1).sum())}; median {tf.median():.3f}.",
        ]
    lines += [
        "",
        "### Per class: the latents whose object-patch mass is most concentrated on that class (chance 1/8 = 0.125)",
        "",
        f"Among latents with object fraction > 4x chance ({4 * ms.chance:.2f}) and at least 0.1 % of the activation "
        "mass; the class's object patches are its share of patches in its images.",
        "",
        "| class | object patches (share) | top latents: class share / object fraction |",
        "|---|---|---|",
    ]
    objects = patch_object(data.masks)
    eligible = alive & (ms.object_fraction > 4 * ms.chance) & (ms.mass > 1e-3 * total)
    for c, name in enumerate(CLASSES):
        share = torch.where(eligible, ms.class_share[c], -1.0)
        top = share.argsort(descending=True)[:3]
        cells = ", ".join(
            f"{int(j)}: {ms.class_share[c, j]:.2f} / {ms.object_fraction[j]:.2f}" for j in top if share[j] >= 0
        )
        frac = float(objects[data.labels == c].float().mean())
        lines.append(f"| {name} | {frac:.3f} | {cells} |")
    ratio = att["abs"] / att["chance"]
    lines += [
        "",
        "## Attribution of the labelled class's logit to latents (gradient x activation), per image",
        "",
        "| quantity | mean over images | median | images above chance |",
        "|---|---|---|---|",
        f"| fraction of object patches (chance) | {att['chance'].mean():.3f} | {att['chance'].median():.3f} | |",
    ]
    for key, name in (("abs", "abs. effect mass on object patches"), ("pos", "positive effect mass on object patches")):
        above = float((att[key] > att["chance"]).float().mean())
        lines.append(f"| {name} | {att[key].mean():.3f} | {att[key].median():.3f} | {above:.3f} |")
    above = float((att["top_abs"] > att["chance"]).float().mean())
    lines.append(
        f"| top latent's abs. effect on object patches | {att['top_abs'].mean():.3f} | {att['top_abs'].median():.3f} | "
        f"{above:.3f} |"
    )
    if "abs_touched" in att:
        above = float((att["abs_touched"] > att["chance_touched"]).float().mean())
        lines.append(
            f"| abs. effect mass on touched patches (chance {att['chance_touched'].mean():.3f}) | "
            f"{att['abs_touched'].mean():.3f} | {att['abs_touched'].median():.3f} | {above:.3f} |"
        )
    top_of = ms.object_fraction[att["top"]]
    lines += [
        "",
        f"Abs. effect mass on objects over chance: median ratio {ratio.median():.2f}. The top latent's object fraction "
        f"(over the evaluation set) median {top_of.nanmedian():.3f}; {len(set(att['top'].tolist()))} distinct top "
        f"latents. Error node's share of the abs. total effect at the patch tokens: mean "
        f"{att['error_share'].mean():.3f}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer", default="blocks.2")
    p.add_argument("--d-sae", type=int, default=256)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--n-train", type=int, default=4000)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = shapes_vit().eval()
    train_images = shapes(a.n_train, seed=0).images
    data = shapes(a.n, seed=a.seed)
    steps = a.steps
    start = time.perf_counter()
    sae = train(model, a.layer, train_images, d_sae=a.d_sae, k=a.k, steps=steps)
    train_seconds = time.perf_counter() - start
    ev = evaluate(model, a.layer, sae, data.images)
    cls = classifier_metrics(model, a.layer, sae, data)
    objects = patch_object(data.masks)
    touched = patch_object(data.masks, threshold=0.0)
    f = patch_latents(model, a.layer, sae, data.images)
    ms, ms_touched = mask_stats(f, objects, data.labels), mask_stats(f, touched, data.labels)
    att = attribution_on_objects(model, a.layer, sae, data, objects, touched=touched)
    command = (
        f"OMP_NUM_THREADS={a.threads} python benchmarks/sae_vit_study.py --layer {a.layer} --d-sae {a.d_sae} "
        f"--k {a.k} --steps {a.steps} --n-train {a.n_train} --n {a.n} --seed {a.seed} --threads {a.threads}"
    )
    cfg = dict(vars(a), command=command, steps=steps, train_seconds=train_seconds)
    text = report(cfg, ev, cls, ms, att, data, ms_touched)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
