"""The cost model of speculative decoding: tokens per target pass, speedup, best K, the beta fit.

One step drafts K tokens (K draft passes of one token) and verifies them in one target pass over
K + 1 tokens, so with acceptance alpha

    E(K) = (1 - alpha^(K+1)) / (1 - alpha)                tokens per target pass
    S(K) = E(K) * T_t(1) / (K * T_d(1) + T_t(K + 1))       speedup over plain decoding

T_t(K + 1) is the *measured* time of a batched pass (probe-parallelism), not T_t(1): on a backend
that verifies serially it grows like (K + 1) * T_t(1) and speculation cannot pay.

Pure numpy: costs in, predictions out. The policies that use these formulas online are in
``specmac.core.policy``; advise measures the costs (``specmac.advise``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

K_MAX = 32  # the widest K the cost model searches: drafts that cost no pass (lookup, n-gram, a prediction)
# The widest K for a model draft. Its step costs K draft passes (c * K of a target pass) on top of
# the batched pass, so S(K) peaks well before a free draft's does; measuring 33 widths at the
# start of every model-draft run would double the probe for widths it would not choose.
K_MODEL = 16
# verdict thresholds on beta, shared with the probe (see specmac.probes.parallelism.verdict)
BETA_PARALLEL, BETA_SERIAL = 0.25, 0.75

Alpha = float | Sequence[float | None]
Curve = Sequence[float] | Callable[[int], float]


def acceptance_profile(alpha: Alpha, k: int) -> np.ndarray:
    """[k] conditional acceptance per draft position; a short profile is extended with its last
    value (positions never reached carry no information of their own)."""
    if np.isscalar(alpha):
        a = float(alpha)  # type: ignore[arg-type]
        _check_alpha(a)
        return np.full(k, a)
    known = [float(a) for a in alpha if a is not None]  # type: ignore[union-attr]
    if not known:
        raise ValueError("the acceptance profile is empty: give at least one measured position")
    prof = [float(a) if a is not None else np.nan for a in alpha][:k]  # type: ignore[union-attr]
    prof = (prof + [known[-1]] * k)[:k]
    out = np.array(prof)
    for i in np.flatnonzero(np.isnan(out)):  # an unreached position inherits the one before
        out[i] = out[i - 1] if i else known[0]
    for a in out:
        _check_alpha(a)
    return out


def _check_alpha(a: float) -> None:
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance {a!r} is out of range: use a probability in [0, 1]")


def expected_tokens(alpha: Alpha, k: int) -> float:
    """E(K): expected tokens emitted per target pass (accepted drafts + the target's own token).

    alpha is a float (i.i.d. acceptance, the closed form) or a per-position profile of
    conditional acceptance rates a_1..a_K: E = 1 + sum_j prod_{i<=j} a_i.
    """
    if k < 0:
        raise ValueError(f"k {k} is out of range: use k >= 0")
    if np.isscalar(alpha):
        a = float(alpha)  # type: ignore[arg-type]
        _check_alpha(a)
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    return float(1.0 + np.cumprod(acceptance_profile(alpha, k)).sum()) if k else 1.0


def curve_fn(t_target: Curve) -> Callable[[int], float]:
    """T_t(n) as a function. A sequence gives T_t(1..len); beyond it the line through the last
    two points is extended (a batched pass grows about linearly in n)."""
    if callable(t_target):
        return t_target
    t = [float(x) for x in t_target]
    if not t:
        raise ValueError("the target's timing curve is empty: give T_t(1) at least")

    def f(n: int) -> float:
        if n <= len(t):
            return t[n - 1]
        slope = max(t[-1] - t[-2], 0.0) if len(t) > 1 else 0.0
        return t[-1] + slope * (n - len(t))

    return f


def draft_passes(alpha: Alpha, k: int, catch_up: bool = False) -> float:
    """Draft passes per step: K, plus (with ``catch_up``) the extra token the draft must consume
    after a step that accepted all K (the last draft and the bonus token arrive together), which
    happens with probability prod a_1..a_K. Counted as a whole pass: on a CPU a 2-token draft pass
    costs about two (see results/probes)."""
    if not catch_up or k == 0:
        return float(k)
    return k + float(np.prod(acceptance_profile(alpha, k)))


def predicted_speedup(k: int, alpha: Alpha, t_draft1: float, t_target: Curve,
                      overhead: float = 0.0, catch_up: bool = False) -> float:
    """S(K) = E(K) * T_t(1) / (K * T_d(1) + T_t(K + 1)); any time unit, used consistently.

    ``overhead`` is a fixed cost per step outside the passes (sampling, the verify rule) that
    plain decoding pays too: S = E (T_t(1) + o) / (K T_d(1) + T_t(K + 1) + o).
    ``catch_up`` adds the draft's catch-up pass after a fully accepted step (``draft_passes``).
    """
    tt = curve_fn(t_target)
    draft = draft_passes(alpha, k, catch_up) * t_draft1
    return expected_tokens(alpha, k) * (tt(1) + overhead) / (draft + tt(k + 1) + overhead)


def speedup_table(alpha: Alpha, t_draft1: float, t_target: Curve, k_max: int = K_MODEL,
                  overhead: float = 0.0, catch_up: bool = False) -> list[dict]:
    """Per K = 1..k_max: k, tokens_per_pass, step_ms (draft + verify + overhead), predicted_speedup."""
    tt = curve_fn(t_target)
    return [{"k": k, "tokens_per_pass": expected_tokens(alpha, k),
             "step_ms": draft_passes(alpha, k, catch_up) * t_draft1 + tt(k + 1) + overhead,
             "predicted_speedup": predicted_speedup(k, alpha, t_draft1, tt, overhead, catch_up)}
            for k in range(1, k_max + 1)]


def best_k(alpha: Alpha, t_draft1: float, t_target: Curve, k_max: int = K_MODEL,
           overhead: float = 0.0, catch_up: bool = False) -> tuple[int, float]:
    """(argmax_K S(K), its S) over K = 1..k_max."""
    table = speedup_table(alpha, t_draft1, t_target, k_max, overhead, catch_up)
    row = max(table, key=lambda r: r["predicted_speedup"])
    return row["k"], row["predicted_speedup"]


def bet_width(alpha: float, m: int, curve: Sequence[float]) -> int:
    """The width w in 0..m (w = 0: no bet, a plain step) with the most expected tokens per second,
    E(w) / T(w + 1), for a free draft of m tokens at acceptance alpha. ``curve[n]`` is the measured
    step time over n tokens; widths beyond it are not considered (never extrapolated). Ties go to
    the narrower width."""
    a = min(max(float(alpha), 0.0), 1.0)
    return best_width(np.cumsum(a ** np.arange(max(int(m), 0) + 1)), curve)  # E(w) = sum_{j<=w} alpha^j


def best_width(expected: Sequence[float], curve: Sequence[float]) -> int:
    """The width w in 0..len(expected) - 1 with the most expected tokens per second,
    expected[w] / T(w + 1), where ``expected[w]`` is the tokens a step over w free drafts is expected
    to commit (expected[0] = 1, a plain step); widths beyond the measured curve are not considered.
    Ties go to the narrower width."""
    t = np.asarray(curve, float)
    e = np.asarray(expected, float)
    ws = np.arange(0, max(0, min(len(e) - 1, len(t) - 2)) + 1)
    return int(ws[int(np.argmax(e[ws] / t[ws + 1]))])


def posterior_moments(accepted: float, rejected: float, k_max: int) -> np.ndarray:
    """[k_max + 1] E[alpha^j] for j = 0..k_max under alpha ~ Beta(accepted, rejected):
    prod_{i<j} (accepted + i) / (accepted + rejected + i). Summed over j = 0..K it is the expected
    tokens per target pass; it tends to the geometric closed form as the counts grow."""
    a, b = max(float(accepted), 1e-9), max(float(rejected), 1e-9)
    i = np.arange(k_max, dtype=float)
    return np.concatenate([[1.0], np.cumprod((a + i) / (a + b + i))])


def model_steps(accepted: float, trials: float, ks: np.ndarray,
                t_draft1: float) -> tuple[np.ndarray, np.ndarray]:
    """(E(K), the draft's seconds) of a model step drafting K, for each K in ``ks`` (ascending):
    E(K) = sum_{j<=K} E[alpha^j] under alpha ~ Beta(accepted, trials - accepted)
    (``posterior_moments``), and K passes of the draft plus, with the chance E[alpha^K] that all K
    are kept, a pass catching it up on its last draft and the target's token. The one prediction
    of a model step: the model draft's K policy (``AdaptiveK``) and a hybrid's model source
    (``HybridDrafter``) weigh the same step alike."""
    return step_of_moments(posterior_moments(accepted, trials - accepted, int(ks[-1])), ks, t_draft1)


def step_of_moments(m: np.ndarray, ks: np.ndarray, t_draft1: float) -> tuple[np.ndarray, np.ndarray]:
    """``model_steps`` from the moments m[j] = E[alpha^j] themselves (any acceptance model)."""
    return np.cumsum(m)[ks], (ks + m[ks]) * t_draft1


def fit_beta(n: Sequence[int], t: Sequence[float]) -> tuple[float, float]:
    """Fit T(n) = T1 * (1 + beta * (n - 1)); returns (T1, beta).

    T1 is the measured one-token time (median of the timings at n = 1) and beta the median over
    n > 1 of each width's own (T(n) / T1 - 1) / (n - 1). Anchoring T1 keeps beta the answer to
    "what does each extra verified token cost, as a fraction of a decode step" even when the
    curve bends (llama.cpp switches matmul kernels with the batch size, so a free intercept
    would call a serial small-n range "partly serial"); the median keeps one preempted timing
    from moving the verdict. Without n = 1, T1 comes from a Theil-Sen line.
    """
    x = np.asarray(n, dtype=float) - 1.0
    y = np.asarray(t, dtype=float)
    if len(x) == 0:
        raise ValueError("fit_beta needs at least one timing")
    if (x == 0).any():
        t1 = float(np.median(y[x == 0]))
    else:
        i, j = np.triu_indices(len(x), k=1)
        keep = x[i] != x[j]
        slope = float(np.median((y[j] - y[i])[keep] / (x[j] - x[i])[keep])) if keep.any() else 0.0
        t1 = float(np.median(y - slope * x))
    wide = x > 0
    if not wide.any() or t1 <= 0:
        return max(t1, 0.0), 0.0
    return t1, float(np.median((y[wide] / t1 - 1.0) / x[wide]))


def why_not(alpha: Alpha, t_draft1: float, t_target: Curve, beta: float, k_max: int = K_MODEL,
            overhead: float = 0.0, catch_up: bool = False) -> list[str]:
    """Reasons speculation does not pay (empty when the best S(K) > 1), most decisive first.

    Each cost is tested alone with the measured acceptance: if even a free draft cannot pay for
    the measured verification, verification is to blame; if even free verification cannot pay
    for the draft, the draft is; if each alone would pay, it is the two together.
    """
    tt = curve_fn(t_target)
    ks = range(1, k_max + 1)
    if best_k(alpha, t_draft1, tt, k_max, overhead, catch_up)[1] > 1.0:
        return []
    c = t_draft1 / tt(1)
    free_draft = max(predicted_speedup(k, alpha, 0.0, tt, overhead) for k in ks)
    free_verify = max(predicted_speedup(k, alpha, t_draft1, lambda n: tt(1), overhead, catch_up)
                      for k in ks)
    blame = []  # (the speedup with the other cost free, reason): the lower, the more decisive
    if beta >= BETA_SERIAL:
        blame.append((min(free_draft, 1.0), f"verification serial: \u03b2 = {beta:.2f}"))
    elif free_draft <= 1.0:
        blame.append((free_draft, f"verification too slow: \u03b2 = {beta:.2f}, T(n) grows too fast "
                                  "for this acceptance"))
    if free_verify <= 1.0:
        blame.append((free_verify, f"draft too slow: c = {c:.2f}"))
    reasons = [r for _, r in sorted(blame, key=lambda b: b[0])]
    if not reasons:
        a = float(np.mean(acceptance_profile(alpha, 1 if np.isscalar(alpha) else max(1, len(alpha)))))
        reasons.append(f"draft and verification costs together: c = {c:.2f}, \u03b2 = {beta:.2f} "
                       f"(either alone would pay at \u03b1 = {a:.2f}: {free_verify:.2f}x with a free "
                       f"batched pass, {free_draft:.2f}x with a free draft)")
    return reasons


def acceptance_from_stats(stats: Any, shrink: float = 4.0) -> tuple[float, list[float]]:
    """(alpha, profile) from RunStats: alpha is the geometric MLE, accepted / (accepted +
    rejections); each position's rate is shrunk toward alpha by ``shrink`` pseudo-trials, so a
    position reached a few times does not swing the prediction."""
    reached, accepted = np.array(stats.reached, float), np.array(stats.accepted_at, float)
    if reached.sum() == 0:
        raise ValueError("the acceptance run drafted nothing: give a longer prompt or max_tokens")
    alpha = float(accepted.sum() / reached.sum())
    profile = (accepted + shrink * alpha) / (reached + shrink)
    return alpha, [float(a) for a in profile]
