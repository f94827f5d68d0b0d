"""TCAV's results: one row per (class, concept, layer), as a table for people, a plain dict for code and a figure
(matplotlib, imported only when a figure is drawn)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SCORES", "Score", "ScoreStats", "TCAVResult", "TCAVRow"]

Score: TypeAlias = Literal["sign_count", "magnitude"]
SCORES: tuple[str, ...] = ("sign_count", "magnitude")


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    mean = math.fsum(xs) / len(xs)
    var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return mean, math.sqrt(var)


@dataclass
class ScoreStats:
    """One score kind of one (class, concept, layer): the score of each CAV (one per random set), the null scores
    (random vs random CAVs), their means and sample standard deviations, the t-test and the p-values."""

    scores: list[float]
    null: list[float]
    t: float
    df: float
    p: float
    p_corrected: float = math.nan
    significant: bool = False
    mean: float = field(init=False)
    std: float = field(init=False)
    null_mean: float = field(init=False)
    null_std: float = field(init=False)

    def __post_init__(self) -> None:
        self.mean, self.std = _mean_std(self.scores)
        self.null_mean, self.null_std = _mean_std(self.null)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "std": self.std,
            "scores": list(self.scores),
            "null_mean": self.null_mean,
            "null_std": self.null_std,
            "null": list(self.null),
            "t": self.t,
            "df": self.df,
            "p": self.p,
            "p_corrected": self.p_corrected,
            "significant": self.significant,
        }


@dataclass
class TCAVRow:
    """The TCAV scores of class `cls` for `concept` at `layer`, per score kind (``"sign_count"``, ``"magnitude"``)."""

    cls: int
    class_name: str
    concept: str
    layer: str
    stats: dict[str, ScoreStats]


def _check_score(score: object) -> str:
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(repr(s) for s in SCORES)}, got {score!r}")
    return score  # type: ignore[return-value]


def _p(p: float) -> str:
    if math.isnan(p):
        return "nan"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


class TCAVResult:
    """What `TCAV.interpret` returns: `rows` (one `TCAVRow` per class, concept and layer) and the call's settings.

    ``table()`` for people, ``to_dict()`` for code, ``figure()`` / ``plot()`` for a paper. Scores lie in [0, 1]: 0.5
    is no preference; a significant score above 0.5 says the class's logit rises along the concept at that layer,
    below 0.5 that it falls. "Significant" means: the concept's scores over the random sets differ from the
    random-vs-random null by a two-sided t-test, at `alpha` after the `correction` over all rows.
    """

    def __init__(
        self,
        rows: list[TCAVRow],
        *,
        layers: list[str],
        concepts: list[str],
        classes: list[int],
        n_random: int,
        test: str,
        correction: str,
        alpha: float,
        cav: str,
        pool: str,
    ) -> None:
        self.rows = rows
        self.layers, self.concepts, self.classes = layers, concepts, classes
        self.n_random, self.test, self.correction, self.alpha = n_random, test, correction, alpha
        self.cav, self.pool = cav, pool

    def __repr__(self) -> str:
        return (
            f"TCAVResult({len(self.classes)} classes x {len(self.concepts)} concepts x {len(self.layers)} layers, "
            f"n_random={self.n_random}, {self.test} t-test, {self.correction} correction)"
        )

    def row(self, cls: int, concept: str, layer: str) -> TCAVRow:
        """The row of one class, concept and layer."""
        for r in self.rows:
            if r.cls == cls and r.concept == concept and r.layer == layer:
                return r
        raise KeyError(f"no row for class {cls}, concept {concept!r}, layer {layer!r}")

    def table(self, score: Score = "sign_count", *, markdown: bool = True) -> str:
        """A table, one line per (class, concept, layer): the score's mean +- std over the random sets, the null's
        (random vs random) mean +- std, the p-value, the corrected p-value and whether it is significant. Markdown
        (``markdown=True``) or aligned plain text."""
        _check_score(score)
        head = ["class", "concept", "layer", f"{score} (mean ± std)", "random (mean ± std)", "p", "p corrected", "sig."]
        lines = []
        for r in self.rows:
            s = r.stats[score]
            lines.append(
                [
                    r.class_name,
                    r.concept,
                    r.layer,
                    f"{s.mean:.3f} ± {s.std:.3f}",
                    f"{s.null_mean:.3f} ± {s.null_std:.3f}",
                    _p(s.p),
                    _p(s.p_corrected),
                    "yes" if s.significant else "n.s.",
                ]
            )
        if markdown:
            out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            out += ["| " + " | ".join(line) + " |" for line in lines]
        else:
            widths = [max(len(c) for c in col) for col in zip(head, *lines, strict=True)]
            out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [head, *lines]]
        note = (
            f"{self.n_random} random sets, {self.cav} CAVs, pool={self.pool!r}; two-sided {self.test} t-test against "
            f"random-vs-random CAVs; {self.correction} correction over {len(self.rows)} tests; alpha = {self.alpha}"
        )
        return "\n".join(out) + "\n\n" + note

    def __str__(self) -> str:
        return self.table(markdown=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python data: the settings and ``rows``, each with class, class_name, concept, layer and, per score
        kind, ``{mean, std, scores, null_mean, null_std, null, t, df, p, p_corrected, significant}``."""
        return {
            "method": "TCAV",
            "layers": list(self.layers),
            "concepts": list(self.concepts),
            "classes": list(self.classes),
            "n_random": self.n_random,
            "test": self.test,
            "correction": self.correction,
            "alpha": self.alpha,
            "cav": self.cav,
            "pool": self.pool,
            "rows": [
                {
                    "class": r.cls,
                    "class_name": r.class_name,
                    "concept": r.concept,
                    "layer": r.layer,
                    **{kind: r.stats[kind].to_dict() for kind in SCORES},
                }
                for r in self.rows
            ],
        }

    def figure(self, score: Score = "sign_count") -> Figure:
        """Bars of the mean score per concept (groups) and layer (colours), one panel per class, with the standard
        deviation over the random sets as error bars and the random-vs-random null's mean as a black tick. A
        non-significant bar is pale and hatched and labelled "n.s."; a significant one is labelled by its corrected
        p-value: * below alpha, ** below alpha / 5, *** below alpha / 50 (0.05, 0.01, 0.001 for alpha = 0.05). The
        dashed line is 0.5 (no preference)."""
        _check_score(score)
        from matplotlib.figure import Figure

        n = len(self.classes)
        width = min(16.0, max(4.5, 2.2 + len(self.concepts) * (0.32 * len(self.layers) + 0.35)))
        fig = Figure(figsize=(width, 2.6 * n + 0.4), layout="constrained")
        axes = fig.subplots(n, 1, squeeze=False)[:, 0]
        for ax, k in zip(axes, self.classes, strict=True):
            self._draw(ax, k, score)
        axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, title="layer")
        fig.suptitle(textwrap.fill(self._caption(), width=int(width * 14)), fontsize=8)
        return fig

    def _caption(self) -> str:
        return (
            f"TCAV: bars = concept vs {self.n_random} random sets (mean ± std), black tick = random-vs-random mean; "
            f"{self.correction}-corrected two-sided {self.test} t-test, n.s. = not significant at alpha = {self.alpha}"
        )

    def plot(self, score: Score = "sign_count", *, cls: int | None = None, ax: Axes | None = None) -> Axes:
        """One class's panel of `figure` (the first class unless `cls` is given) drawn into `ax` (a new figure's
        axes if None); returns the axes."""
        _check_score(score)
        k = self.classes[0] if cls is None else cls
        if k not in self.classes:
            raise ValueError(f"cls must be one of the result's classes {self.classes}, got {cls!r}")
        if ax is None:
            from matplotlib.figure import Figure

            ax = Figure(figsize=(6, 3), layout="constrained").add_subplot()
        self._draw(ax, k, score)
        ax.legend(loc="best", fontsize=8, frameon=False, title="layer")
        return ax

    def _draw(self, ax: Axes, k: int, score: str) -> None:
        import matplotlib as mpl

        colours = mpl.colormaps["tab10"]
        nl = len(self.layers)
        bar = 0.8 / nl
        name = str(k)
        for li, layer in enumerate(self.layers):
            for ci, concept in enumerate(self.concepts):
                r = self._find(k, concept, layer)
                name = r.class_name
                s = r.stats[score]
                x = ci + (li - (nl - 1) / 2) * bar
                faint = not s.significant
                ax.bar(
                    x,
                    s.mean,
                    bar * 0.92,
                    yerr=s.std,
                    color=colours(li % 10),
                    alpha=0.35 if faint else 0.95,
                    hatch="///" if faint else None,
                    edgecolor="0.4" if faint else colours(li % 10),
                    linewidth=0.6,
                    capsize=2,
                    error_kw={"elinewidth": 0.8, "ecolor": "0.2"},
                    label=layer if ci == 0 else None,
                )
                ax.plot([x - bar * 0.4, x + bar * 0.4], [s.null_mean] * 2, color="black", linewidth=1.2)
                ax.text(
                    x,
                    min(1.05, s.mean + s.std + 0.02),
                    self._stars(s),
                    ha="center",
                    va="bottom",
                    fontsize=6 if faint else 8,
                    color="0.45" if faint else "black",
                )
        ax.axhline(0.5, color="0.5", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(self.concepts)), self.concepts, fontsize=8)
        ax.set_ylim(0, 1.15)
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_ylabel(f"TCAV {score.replace('_', ' ')}", fontsize=8)
        ax.set_title(f"class {name}", fontsize=9, loc="left")
        ax.tick_params(axis="y", labelsize=7)

    def _stars(self, s: ScoreStats) -> str:
        if not s.significant:
            return "n.s."
        return "***" if s.p_corrected < self.alpha / 50 else "**" if s.p_corrected < self.alpha / 5 else "*"

    def _find(self, k: int, concept: str, layer: str) -> TCAVRow:
        return self.row(k, concept, layer)
