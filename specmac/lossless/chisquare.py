"""Chi-square tests and their power, for proving that speculative output is the target's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats

MIN_EXPECTED = 5.0  # the usual validity rule for the chi-square approximation


@dataclass
class ChiSquare:
    chi2: float
    dof: int
    p_value: float
    n_categories: int

    def to_dict(self) -> dict:
        return asdict(self)


def goodness_of_fit(observed: np.ndarray, expected_probs: np.ndarray) -> ChiSquare:
    """Observed counts [C] vs exact probabilities [C]; bins with expected < 5 are pooled."""
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected_probs, dtype=np.float64) * observed.sum()
    if np.any(observed[expected == 0] > 0):  # an impossible outcome happened: certainly not p
        return ChiSquare(float("inf"), 0, 0.0, len(observed))
    small = expected < MIN_EXPECTED
    o = np.append(observed[~small], observed[small].sum())
    e = np.append(expected[~small], expected[small].sum())
    if e[-1] < MIN_EXPECTED:  # the pooled bin itself is too small: fold it into the largest
        o[np.argmax(e[:-1])] += o[-1]
        e[np.argmax(e[:-1])] += e[-1]
        o, e = o[:-1], e[:-1]
    chi2 = float(((o - e) ** 2 / e).sum())
    dof = len(o) - 1
    return ChiSquare(chi2, dof, float(stats.chi2.sf(chi2, dof)) if dof > 0 else 1.0, len(o))


def two_sample(a: Sequence[Hashable], b: Sequence[Hashable]) -> ChiSquare:
    """Are samples a and b from one distribution? Categories whose pooled count is too small
    for the chi-square approximation are merged into one "other" category."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    keys = sorted(set(ca) | set(cb), key=lambda x: -(ca[x] + cb[x]))
    # expected count of a category in the smaller sample must reach MIN_EXPECTED
    frac = min(na, nb) / (na + nb)
    big = [x for x in keys if (ca[x] + cb[x]) * frac >= MIN_EXPECTED]
    rest = [x for x in keys if (ca[x] + cb[x]) * frac < MIN_EXPECTED]
    table = [[ca[x] for x in big], [cb[x] for x in big]]
    other = (sum(ca[x] for x in rest), sum(cb[x] for x in rest))
    if sum(other) * frac >= MIN_EXPECTED:
        table[0].append(other[0])
        table[1].append(other[1])
    elif big and sum(other):  # too few to stand alone: fold into the largest category
        table[0][0] += other[0]
        table[1][0] += other[1]
    t = np.array(table, dtype=np.float64)
    if t.shape[1] < 2:
        return ChiSquare(0.0, 0, 1.0, t.shape[1])
    expected = t.sum(axis=1, keepdims=True) * t.sum(axis=0, keepdims=True) / t.sum()
    chi2 = float(((t - expected) ** 2 / expected).sum())
    dof = t.shape[1] - 1
    return ChiSquare(chi2, dof, float(stats.chi2.sf(chi2, dof)), t.shape[1])


def combine(tests: Sequence[ChiSquare]) -> ChiSquare:
    """Independent chi-square tests (e.g. one per context) as one: chi2 and dof add up."""
    chi2, dof = sum(t.chi2 for t in tests), sum(t.dof for t in tests)
    p = float(stats.chi2.sf(chi2, dof)) if dof > 0 else 1.0
    return ChiSquare(chi2, dof, p, sum(t.n_categories for t in tests))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values [m]: valid whatever the dependence between the tests. The smallest
    adjusted value is the Bonferroni p-value of the whole family, min(1, m * min p)."""
    m = len(p_values)
    order = np.argsort(p_values, kind="stable")
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def noncentrality_for_power(dof: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The noncentrality at which a level-alpha chi-square test with dof rejects with `power`."""
    crit = stats.chi2.isf(alpha, dof)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(crit, dof, lam) - power, 1e-9, 1e6))


def min_detectable_tv(n_a: int, n_b: int, dof: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest total-variation distance (over the test's categories) detected with `power`.

    The two-sample statistic has noncentrality n_a*n_b/(n_a+n_b) * sum((pa-pb)^2 / pbar), and
    by Cauchy-Schwarz sum((pa-pb)^2 / pbar) >= (sum|pa-pb|)^2 = 4 TV^2, so any TV at least this
    large gives at least the stated power.
    """
    if dof < 1 or not n_a or not n_b:
        return 1.0
    lam = noncentrality_for_power(dof, alpha, power)
    return float(min(1.0, np.sqrt(lam / (4 * n_a * n_b / (n_a + n_b)))))
