"""The chi-square machinery and the power claim behind min_detectable_tv."""

import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sstats

from specmac.lossless.chisquare import goodness_of_fit, min_detectable_tv, two_sample


def test_two_sample_matches_scipy_contingency():
    rng = np.random.default_rng(0)
    a = list(rng.choice(6, 3000, p=[0.3, 0.2, 0.2, 0.1, 0.1, 0.1]))
    b = list(rng.choice(6, 2500, p=[0.3, 0.2, 0.2, 0.1, 0.1, 0.1]))
    res = two_sample(a, b)
    table = np.array([np.bincount(a, minlength=6), np.bincount(b, minlength=6)])
    ref = sstats.chi2_contingency(table, correction=False)
    assert res.dof == 5 and abs(res.chi2 - ref.statistic) < 1e-9 and abs(res.p_value - ref.pvalue) < 1e-12


def test_rare_categories_are_pooled():
    a = ["x"] * 500 + ["y"] * 500 + [f"rare{i}" for i in range(30)]
    b = ["x"] * 500 + ["y"] * 500 + [f"rare{i + 100}" for i in range(30)]
    res = two_sample(a, b)
    assert res.n_categories == 3 and res.p_value > 0.5


def test_goodness_of_fit_detects_impossible_outcomes():
    assert goodness_of_fit(np.array([10, 5, 1]), np.array([0.6, 0.4, 0.0])).p_value == 0.0


def test_min_detectable_tv_has_the_power_it_claims():
    """Shift a distribution by exactly that TV: the test rejects at least ~80% of the time."""
    rng = np.random.default_rng(1)
    n, dof = 2000, 3
    tv = min_detectable_tv(n, n, dof)
    p = np.array([0.25, 0.25, 0.25, 0.25])
    q = p + np.array([tv, -tv, 0, 0])  # TV(p, q) = tv
    rejected = sum(two_sample(list(rng.choice(4, n, p=p)), list(rng.choice(4, n, p=q))).p_value < 0.05
                   for _ in range(200))
    assert rejected >= 0.75 * 200
    assert min_detectable_tv(4 * n, 4 * n, dof) < tv / 1.9  # quadrupling n halves it


def test_import_specmac_imports_no_ml_framework():
    code = ("import specmac, specmac.cli.app, sys; "
            "print(sorted(m for m in ('torch','mlx','llama_cpp','transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_holm_matches_its_definition():
    from specmac.lossless.chisquare import holm

    p = [0.01, 0.04, 0.03, 0.5]
    # sorted 0.01, 0.03, 0.04, 0.5 -> 4*0.01, max(., 3*0.03), max(., 2*0.04), max(., 0.5)
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert min(holm([1e-3] + [0.9] * 19)) == pytest.approx(0.02)  # Bonferroni for the family
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1


def test_combine_adds_independent_tests():
    from specmac.lossless.chisquare import ChiSquare, combine

    c = combine([ChiSquare(3.0, 2, 0.2, 3), ChiSquare(5.0, 4, 0.3, 5)])
    assert (c.chi2, c.dof, c.n_categories) == (8.0, 6, 8)
    assert c.p_value == pytest.approx(sstats.chi2.sf(8.0, 6))


def test_min_detectable_tv_per_group_has_its_power_at_a_family_level():
    """verify's claim: a TV shift in one of 6 groups (the others equal), tested as the sum over
    groups at level 0.05 / 20, is caught at least ~80% of the time."""
    from specmac.lossless.chisquare import combine

    rng = np.random.default_rng(3)
    n, groups, level = 1500, 6, 0.05 / 20
    p = np.full(4, 0.25)
    tests = [two_sample(list(rng.choice(4, n, p=p)), list(rng.choice(4, n, p=p))) for _ in range(groups)]
    tv = min_detectable_tv(n, n, combine(tests).dof, alpha=level)
    q = p + np.array([tv, -tv, 0, 0])
    hits = 0
    for _ in range(100):
        ts = [two_sample(list(rng.choice(4, n, p=p)), list(rng.choice(4, n, p=q if g == 0 else p)))
              for g in range(groups)]
        hits += combine(ts).p_value < level
    assert hits >= 72
