"""A methods x metrics table over a data set with masks (`hookviz.zoo`'s shapes): the whole evaluation in one call."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .._checks import int_at_least, number_at_least
from .._modes import eval_mode
from .._progress import progress_bar
from ..inputs import model_device
from ..methods.base import Attribution, get_method
from ._checks import check_images, check_masks, check_model, class_scores
from .faithfulness import Baseline, deletion, insertion
from .localisation import energy_in_mask, pointing_game
from .sanity import sanity_check

#: metric name -> whether higher is better
METRICS: dict[str, bool] = {
    "pointing game": True,
    "energy in mask": True,
    "deletion AUC": False,
    "insertion AUC": True,
    "sanity ρ": False,
}


@dataclass
class Evaluation:
    """Result of `evaluate`: ``table`` (M, K) holds the mean of each metric (NaN ignored) for each method;
    ``scores[method][metric]`` the per-sample values ((N,), or (sanity_n,) for the sanity check); ``maps[method]``
    the attributions that were scored, (N, ...) on the CPU, when `evaluate` was asked to keep them (else None)."""

    methods: list[str]
    metrics: list[str]
    table: Tensor
    scores: dict[str, dict[str, Tensor]] = field(repr=False)
    n: int = 0
    steps: int = 0
    maps: dict[str, Tensor] | None = field(default=None, repr=False)

    def value(self, method: str, metric: str) -> float:
        """The table entry for one method and metric."""
        return float(self.table[self.methods.index(method), self.metrics.index(metric)])

    def _header(self) -> list[str]:
        return [f"{m} {'↑' if METRICS.get(m, True) else '↓'}" for m in self.metrics]

    def to_markdown(self, digits: int = 3) -> str:
        """A GitHub markdown table (arrows: higher or lower is better)."""
        lines = [
            "| method | " + " | ".join(self._header()) + " |",
            "|---|" + "---:|" * len(self.metrics),
        ]
        for i, name in enumerate(self.methods):
            cells = " | ".join(f"{v:.{digits}f}" for v in self.table[i].tolist())
            lines.append(f"| {name} | {cells} |")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in ["method", *self._header()])
        best = {}
        for j, m in enumerate(self.metrics):
            col = self.table[:, j]
            if (~col.isnan()).any():
                v = col.nan_to_num(nan=-math.inf if METRICS.get(m, True) else math.inf)
                best[j] = int(v.argmax() if METRICS.get(m, True) else v.argmin())
        rows = []
        for i, name in enumerate(self.methods):
            cells = "".join(
                f"<td>{'<b>' if best.get(j) == i else ''}{v:.3f}{'</b>' if best.get(j) == i else ''}</td>"
                for j, v in enumerate(self.table[i].tolist())
            )
            rows.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
        caption = f"{len(self.methods)} methods on {self.n} images (deletion / insertion with {self.steps} steps)"
        return (
            f'<table class="hookviz-evaluation"><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr>'
            f"</thead><tbody>{''.join(rows)}</tbody></table>"
        )

    def __str__(self) -> str:
        return self.to_markdown()


def _methods(methods: object, model: nn.Module) -> list[tuple[str, Attribution]]:
    items = [methods] if isinstance(methods, str | Attribution) else methods
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise TypeError(f"methods must be a method name, an Attribution or a non-empty list of them, got {methods!r}")
    out: list[tuple[str, Attribution]] = []
    for m in items:
        if isinstance(m, str):
            out.append((m, get_method(m)(model)))
        elif isinstance(m, Attribution):
            if m.model is not model:
                raise ValueError(
                    f"method {m!r} explains another model than the one evaluated; build it on the same `model`"
                )
            out.append((getattr(m, "key", "") or type(m).__name__, m))
        else:
            raise TypeError(f"methods must hold names (hookviz.METHODS) or Attribution instances, got {m!r}")
    names = [n for n, _ in out]
    return [(f"{n} ({names[:i].count(n) + 1})" if names.count(n) > 1 else n, m) for i, (n, m) in enumerate(out)]


def evaluate(
    methods: str | Attribution | Sequence[str | Attribution],
    model: nn.Module,
    data: Any,
    *,
    target: Literal["label", "predicted"] = "label",
    steps: int = 50,
    tolerance: float = 0,
    deletion_baseline: Baseline = "zeros",
    insertion_baseline: Baseline = "blur",
    sanity_n: int = 8,
    seed: int = 42,
    batch_size: int = 64,
    progress: bool = True,
    keep_maps: bool = False,
) -> Evaluation:
    """Evaluate attribution methods on a data set with object masks: a methods x metrics table.

    Metrics (see each function for its paper and conventions): `pointing_game` (with `tolerance`),
    `energy_in_mask`, `deletion` AUC (`deletion_baseline`), `insertion` AUC (`insertion_baseline`), both with
    `steps` steps, and the `sanity_check` correlation after full (cascading) randomisation, the mean over the first
    `sanity_n` images (0 leaves it out; it costs one explanation per resettable module).

    Args:
        methods: names from the registry (`hookviz.METHODS`, built on `model` with default options) or `Attribution`
            instances built on `model`.
        model: a classifier returning (N, classes) logits.
        data: a `hookviz.zoo.Shapes` set or anything with ``images`` (N, C, H, W) float, ``labels`` (N,) int and
            ``masks`` (N, H, W) bool.
        target: ``"label"`` (the data's labels) or ``"predicted"`` (the model's top class).
        batch_size: images per explanation / forward pass.
        progress: a tqdm bar.
        keep_maps: keep the attributions that were scored in ``result.maps`` (on the CPU), e.g. for a report of the
            same maps (`hookviz.report`) without computing them again.

    Returns:
        An `Evaluation` (renders as a table in notebooks; ``.to_markdown()``).
    """
    check_model(model)
    pairs = _methods(methods, model)
    x, labels, masks = _check_data(data)
    if target not in ("label", "predicted"):
        raise ValueError(f"target must be 'label' or 'predicted', got {target!r}")
    steps = int_at_least("steps", steps, 1, "perturbation steps")
    number_at_least("tolerance", tolerance, 0, "a distance in pixels")
    sanity_n = int_at_least("sanity_n", sanity_n, 0, "images for the sanity check")
    batch_size = int_at_least("batch_size", batch_size, 1, "images per forward pass")
    if not isinstance(keep_maps, bool):
        raise TypeError(f"keep_maps must be True or False, got {keep_maps!r}")
    device = model_device(model)
    x, masks = x.to(device), masks.to(device)
    t = _targets(model, x, labels, target, batch_size)
    metrics = [m for m in METRICS if m != "sanity ρ" or sanity_n > 0]
    bar = progress_bar(total=len(pairs) * 4, enabled=progress, desc="evaluate", unit="step")
    scores: dict[str, dict[str, Tensor]] = {}
    maps: dict[str, Tensor] = {}
    try:
        for name, method in pairs:
            bar.set_description(f"{name}: explain")
            chunks = zip(x.split(batch_size), t.split(batch_size), strict=True)
            attr = torch.cat([method.attribute(xc, tc).detach() for xc, tc in chunks])
            if keep_maps:
                maps[name] = attr.cpu()
            s = {"pointing game": pointing_game(attr, masks, tolerance), "energy in mask": energy_in_mask(attr, masks)}
            _tick(bar, f"{name}: deletion")
            s["deletion AUC"] = deletion(
                model, x, attr, t, steps=steps, baseline=deletion_baseline, batch_size=batch_size
            )
            _tick(bar, f"{name}: insertion")
            s["insertion AUC"] = insertion(
                model, x, attr, t, steps=steps, baseline=insertion_baseline, batch_size=batch_size
            )
            _tick(bar, f"{name}: sanity check")
            if sanity_n > 0:
                s["sanity ρ"] = sanity_check(method, x[:sanity_n], t[:sanity_n], seed=seed).final
            _tick(bar, None)
            scores[name] = {k: v.detach().cpu() for k, v in s.items()}
    finally:
        bar.close()
    table = torch.tensor([[scores[name][m].nanmean().item() for m in metrics] for name, _ in pairs])
    return Evaluation(
        [name for name, _ in pairs], metrics, table, scores, n=x.shape[0], steps=steps, maps=maps if keep_maps else None
    )


def _check_data(data: Any) -> tuple[Tensor, Tensor, Tensor]:
    """(images, labels, masks) of a data set with object masks, checked against each other."""
    for attr in ("images", "labels", "masks"):
        if not hasattr(data, attr):
            raise TypeError(f"data must have images, labels and masks (a hookviz.zoo.Shapes set), it lacks {attr!r}")
    x = check_images(data.images, "data.images")
    n = x.shape[0]
    labels = data.labels
    if not isinstance(labels, Tensor) or labels.shape != (n,) or labels.is_floating_point():
        got = f"shape {tuple(labels.shape)}, {labels.dtype}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"data.labels must be an (N,) = ({n},) integer tensor, got {got}")
    return x, labels, check_masks(data.masks, n, "data.masks")


def _targets(model: nn.Module, x: Tensor, labels: Tensor, target: str, batch_size: int) -> Tensor:
    """The (N,) classes explained: the labels, or the model's top classes (in eval mode, without a graph)."""
    with eval_mode(model), torch.no_grad():
        logits = torch.cat([class_scores(model(c), c.shape[0]) for c in x.split(batch_size)])
    classes = logits.shape[1]
    t = logits.argmax(dim=1) if target == "predicted" else labels.to(x.device).long()
    if ((t < 0) | (t >= classes)).any():
        raise ValueError(f"data.labels must be classes of the model, 0..{classes - 1}; got {t.min()}..{t.max()}")
    return t


def _tick(bar: Any, desc: str | None) -> None:
    bar.update(1)
    if desc is not None:
        bar.set_description(desc)
