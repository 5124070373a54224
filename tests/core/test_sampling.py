"""Sampling parameters and warping against slow, obvious float64 references."""

import numpy as np
import pytest

from specmac.core.sampling import SamplingParams, WarpedRows, sample, warp
from specmac.errors import BadOption


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_warp(logits, t, top_k=0, top_p=1.0, min_p=0.0):
    """One row, written the slow way: sort, walk, cut."""
    p = softmax(np.asarray(logits, dtype=np.float64) / t)
    order = sorted(range(len(p)), key=lambda i: -p[i])
    keep = set(order)
    if top_k:
        kth = p[order[top_k - 1]]
        keep = {i for i in keep if p[i] >= kth}
    if top_p < 1:
        q = np.array([p[i] if i in keep else 0.0 for i in range(len(p))])
        q /= q.sum()
        mass, kept = 0.0, set()
        for i in sorted(keep, key=lambda i: -q[i]):
            kept.add(i)
            mass += q[i]
            if mass >= top_p:
                break
        cutoff = min(q[i] for i in kept)
        keep = {i for i in keep if q[i] >= cutoff}
    if min_p:
        top = max(p[i] for i in keep)
        keep = {i for i in keep if p[i] >= min_p * top}
    out = np.array([p[i] if i in keep else 0.0 for i in range(len(p))])
    return out / out.sum()


@pytest.mark.parametrize("t,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.3, 5, 1.0, 0.0), (1.0, 0, 0.8, 0.0),
    (1.0, 0, 1.0, 0.1), (0.8, 10, 0.9, 0.05), (1.0, 1, 1.0, 0.0), (2.0, 0, 0.3, 0.0),
])
def test_warp_matches_reference(t, top_k, top_p, min_p):
    rng = np.random.default_rng(0)
    params = SamplingParams(t, top_k, top_p, min_p)
    for _ in range(20):
        logits = rng.standard_normal(32) * 3
        np.testing.assert_allclose(warp(logits[None], params)[0],
                                   reference_warp(logits, t, top_k, top_p, min_p), atol=1e-12, rtol=0)


def test_warp_by_hand():
    # logits log(1), log(2), log(3), log(4): probs 0.1, 0.2, 0.3, 0.4
    logits = np.log([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(warp(logits, SamplingParams(1.0)), [0.1, 0.2, 0.3, 0.4], atol=1e-15)
    np.testing.assert_allclose(warp(logits, SamplingParams(1.0, top_k=2)), [0, 0, 3 / 7, 4 / 7], atol=1e-15)
    np.testing.assert_allclose(warp(logits, SamplingParams(1.0, top_p=0.65)), [0, 0, 3 / 7, 4 / 7],
                               atol=1e-15)
    np.testing.assert_allclose(warp(logits, SamplingParams(1.0, top_p=0.75)), [0, 2 / 9, 3 / 9, 4 / 9],
                               atol=1e-15)
    np.testing.assert_allclose(warp(logits, SamplingParams(1.0, min_p=0.6)), [0, 0, 3 / 7, 4 / 7],
                               atol=1e-15)


def test_greedy_is_one_hot_of_argmax_lowest_on_ties():
    out = warp(np.array([[1.0, 3.0, 3.0, 0.0], [-np.inf, 0.0, -1.0, 5.0]]), SamplingParams(0.0))
    np.testing.assert_array_equal(out, [[0, 1, 0, 0], [0, 0, 0, 1]])


def test_neg_inf_columns_get_zero():
    p = warp(np.array([0.0, -np.inf, 1.0]), SamplingParams(0.9, top_p=0.99))
    assert p[1] == 0 and abs(p.sum() - 1) < 1e-15


def test_ties_at_top_k_boundary_are_kept():
    p = warp(np.array([2.0, 1.0, 1.0, 0.0]), SamplingParams(1.0, top_k=2))
    assert p[1] == p[2] > 0 and p[3] == 0


@pytest.mark.parametrize("kw,match", [
    ({"temperature": -1}, "temperature -1"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -3}, "top_k -3"), ({"top_k": 1.5}, "top_k"), ({"top_p": 0}, "top_p 0"),
    ({"top_p": 1.5}, "top_p 1.5"), ({"min_p": 1.0}, "min_p 1.0"), ({"min_p": -0.1}, "min_p"),
])
def test_bad_values_name_value_and_range(kw, match):
    with pytest.raises(BadOption, match=match) as e:
        SamplingParams(**kw)
    assert "range" in str(e.value) or "use" in str(e.value)


def test_sample_frequencies_and_zeros():
    rng = np.random.default_rng(1)
    p = np.array([0.0, 0.5, 0.0, 0.25, 0.25, 0.0])
    draws = np.bincount([sample(p, rng) for _ in range(20000)], minlength=6)
    assert draws[[0, 2, 5]].sum() == 0
    np.testing.assert_allclose(draws / draws.sum(), p, atol=0.015)


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(0.7, top_k=5),
                                    SamplingParams(1.3, top_p=0.8, min_p=0.05)])
def test_warped_rows_equal_warp_and_warp_only_rows_read(params):
    logits = np.random.default_rng(4).standard_normal((6, 50)).astype(np.float32)
    logits[2, 7] = -np.inf
    rows, full = WarpedRows(logits, params), warp(logits, params)
    assert len(rows) == 6
    assert np.array_equal(rows[3], full[3]) and np.array_equal(rows[-1], full[5])
    assert sorted(rows._rows) == [3, 5]  # rows never read were never warped
    assert all(np.array_equal(rows[i], full[i]) for i in range(6))
    with pytest.raises(IndexError):
        rows[6]
