"""One verification step: which draft tokens the target keeps, and the token that follows.

Rejection rule (Leviathan et al. 2023, Chen et al. 2023), for drafts d_1..d_K drawn from q_1..q_K
and target distributions p_1..p_{K+1}:
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i));
    at the first rejection emit a sample of normalize(max(0, p_i - q_i)) and stop;
    if all K are accepted, emit a bonus sample of p_{K+1}.
Every emitted token is then distributed exactly as the target's own sampling would be.

Coupled sampler: p and q are rows perturbed by the same Gumbel noise (sampling.perturb), each
draft is the draft's perturbed argmax, and verification is the greedy rule on the target's
perturbed rows: every emitted token is the target's perturbed argmax, an exact sample of p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specmac.core.sampling import sample

# (drafts [K], q, p, rng) -> (n_accepted, next_token). q and p are sequences of rows: q[i] is the
# draft's distribution [V] of drafts[i], p[i] the target's at the same position (K + 1 rows; the
# loop warps them lazily, see sampling.WarpedRows), so a rule reads q[i][d] and p[i][d]
AcceptRule = Callable[[Sequence[int], Any, Any, np.random.Generator], tuple[int, int]]

RESIDUAL_EPS = 1e-12


def acceptance_probability(p_d: float, q_d: float) -> float:
    """min(1, p(d)/q(d)), written so that q(d) = 0 never divides."""
    return 1.0 if p_d >= q_d else p_d / q_d


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalize(max(0, p - q)) [V]; falls back to p when the residual mass is ~0 (p == q)."""
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    # with p == q a rejection has probability 0, but round-off can still reach here
    return r / s if s > RESIDUAL_EPS else p


def accept_sampled(drafts, q, p, rng) -> tuple[int, int]:
    """The rejection rule. q: K rows of draft probs, p: K + 1 rows of target probs (both warped)."""
    for i, d in enumerate(drafts):
        p_i, q_i = p[i], q[i]
        if rng.random() >= acceptance_probability(p_i[d], q_i[d]):
            return i, sample(residual(p_i, q_i), rng)
    return len(drafts), sample(p[len(drafts)], rng)


def accept_greedy(drafts, q, p, rng=None) -> tuple[int, int]:
    """Greedy rule (temperature 0): accept while d_i is the target's argmax. p: K + 1 rows of
    target probabilities or logits (warping keeps the argmax, lowest id on ties); q is unused."""
    for i, d in enumerate(drafts):
        t = int(np.argmax(p[i]))
        if d != t:
            return i, t
    return len(drafts), int(np.argmax(p[len(drafts)]))


def coupled_acceptance(p: np.ndarray, q: np.ndarray) -> float:
    """P(argmax(log p + g) == argmax(log q + g)) for one shared Gumbel g [V]: the coupled
    sampler's acceptance at one position, sum_i 1 / sum_j max(p_j / p_i, q_j / q_i) over the
    ids with p_i, q_i > 0 (an exponential race; at least (1 - TV) / (1 + TV))."""
    both = np.flatnonzero((p > 0) & (q > 0))
    ratios = np.maximum(p[None, :] / p[both, None], q[None, :] / q[both, None])  # [n, V]
    return float((1.0 / ratios.sum(axis=1)).sum())
