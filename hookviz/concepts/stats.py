"""The statistics of TCAV's significance test, in plain Python (no scipy at run time).

Kim et al. (2018), "Interpretability Beyond Feature Attribution: Quantitative Testing with Concept Activation Vectors
(TCAV)", ICML, section 3.2: a concept's TCAV scores over many random counter-example sets are compared with the
scores of CAVs trained between two random sets (the null), by a two-sided t-test; the paper's code
(tensorflow/tcav, ``stats.ttest_ind``) and captum's tutorial use Student's test with pooled variance, which is the
default here; Welch's test (unequal variances) is the option. p-values over several hypotheses are corrected for
multiple testing (Bonferroni by default, Holm, Benjamini-Hochberg).

The t distribution's CDF goes through the regularized incomplete beta function, evaluated by its continued fraction
(modified Lentz's method, as in Numerical Recipes, section 6.4): for t with nu degrees of freedom,
``P(|T| >= |t|) = I_{nu / (nu + t^2)}(nu / 2, 1 / 2)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ["CORRECTIONS", "TESTS", "TTest", "betainc", "correct", "t_sf_two_sided", "ttest_ind"]

Correction: TypeAlias = Literal["bonferroni", "holm", "bh", "none"]
TestKind: TypeAlias = Literal["student", "welch"]
CORRECTIONS: tuple[str, ...] = ("bonferroni", "holm", "bh", "none")
TESTS: tuple[str, ...] = ("student", "welch")

_TINY = 1e-300  # keeps Lentz's denominators away from zero
_EPS = 3e-16  # a continued-fraction step that changes the value by less than this (relative) ends it
_MAX_TERMS = 10_000


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes' betacf), by the modified Lentz method."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"the incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), a, b > 0, 0 <= x <= 1 (scipy.special.betainc)."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    # the fraction converges fast for x < (a + 1) / (a + b + 2); above, use the symmetry I_x(a, b) = 1 - I_1-x(b, a)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` > 0 degrees of freedom (df need not be an integer: Welch)."""
    if math.isnan(t) or math.isnan(df):
        return math.nan
    if math.isinf(t):
        return 0.0
    return min(1.0, betainc(df / 2.0, 0.5, df / (df + t * t)))


@dataclass(frozen=True)
class TTest:
    """A two-sample t-test's statistic, degrees of freedom and two-sided p-value."""

    t: float
    df: float
    p: float


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mean = math.fsum(xs) / n
    return mean, math.fsum((x - mean) ** 2 for x in xs) / (n - 1)


def ttest_ind(a: Sequence[float], b: Sequence[float], test: TestKind = "student") -> TTest:
    """Two-sided two-sample t-test of mean(a) = mean(b) (scipy.stats.ttest_ind, ``equal_var=test == "student"``).

    ``"student"``: pooled variance, df = n_a + n_b - 2 (the TCAV paper's code). ``"welch"``: unequal variances,
    Welch-Satterthwaite df. Both samples need >= 2 values. Where both samples are constant (zero variance, common
    for sign counts of 0 or 1) scipy gives NaN; here p = 1 when the means are equal and p = 0 when they differ
    (t = +-inf), so that a constant score of 1.0 against a constant null of 0.5 counts as significant.
    """
    if test not in TESTS:
        raise ValueError(f"test must be one of {', '.join(repr(t) for t in TESTS)}, got {test!r}")
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError(f"ttest_ind needs >= 2 values per sample, got {na} and {nb}")
    ma, va = _mean_var(a)
    mb, vb = _mean_var(b)
    if test == "student":
        df = float(na + nb - 2)
        se2 = ((na - 1) * va + (nb - 1) * vb) / df * (1.0 / na + 1.0 / nb)
    else:
        qa, qb = va / na, vb / nb
        se2 = qa + qb
        df = se2 * se2 / (qa * qa / (na - 1) + qb * qb / (nb - 1)) if se2 > 0 else float(na + nb - 2)
    diff = ma - mb
    if se2 <= 0.0:
        if diff == 0.0:
            return TTest(0.0, df, 1.0)
        return TTest(math.copysign(math.inf, diff), df, 0.0)
    t = diff / math.sqrt(se2)
    return TTest(t, df, t_sf_two_sided(t, df))


def correct(pvalues: Sequence[float], method: Correction = "bonferroni") -> list[float]:
    """p-values adjusted for testing them together, in the order given (statsmodels' ``multipletests``).

    ``"bonferroni"``: min(1, m p). ``"holm"``: Holm's step-down, p_(i) (m - i + 1) made monotone (controls the
    family-wise error as Bonferroni does, with more power). ``"bh"``: Benjamini-Hochberg, p_(i) m / i made monotone
    from the top (controls the false discovery rate). ``"none"``: as given. NaN p-values stay NaN and do not count.
    """
    if method not in CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(repr(c) for c in CORRECTIONS)}, got {method!r}")
    ps = [float(p) for p in pvalues]
    valid = [i for i, p in enumerate(ps) if not math.isnan(p)]
    m = len(valid)
    out = list(ps)
    if method == "none" or m == 0:
        return out
    if method == "bonferroni":
        for i in valid:
            out[i] = min(1.0, ps[i] * m)
        return out
    order = sorted(valid, key=lambda i: ps[i])
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * ps[i]))
            out[i] = running
        return out
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, ps[i] * m / (rank + 1))
        out[i] = min(1.0, running)
    return out
