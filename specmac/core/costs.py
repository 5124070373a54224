"""The cost model of speculative decoding: tokens per target pass, speedup, best K, the beta fit.

One step drafts K tokens (K draft passes of one token) and verifies them in one target pass over
K + 1 tokens, so with acceptance alpha

    E(K) = (1 - alpha^(K+1)) / (1 - alpha)                tokens per target pass
    S(K) = E(K) * T_t(1) / (K * T_d(1) + T_t(K + 1))       speedup over plain decoding

T_t(K + 1) is the *measured* time of a batched pass (probe-parallelism), not T_t(1): on a backend
that verifies serially it grows like (K + 1) * T_t(1) and speculation cannot pay.

``Costs`` is the one cost model the planner (``specmac.core.planner``) weighs every step by: the
target's step over n tokens, each draft model's pass and its prefill per token, measured before a
run where they can be (``specmac.tuning``) and refined by the run's own steps. Pure numpy: costs in,
predictions out; advise measures the costs it predicts from (``specmac.advise``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

K_MAX = 32  # the widest K the cost model searches: drafts that cost no pass (lookup, n-gram, a prediction)
# The widest K for a model draft. Its step costs K draft passes (c * K of a target pass) on top of
# the batched pass, so S(K) peaks well before a free draft's does; measuring 33 widths at the
# start of every model-draft run would double the probe for widths it would not choose.
K_MODEL = 16
K_LIMIT = 256  # the most drafts per step a caller may ask for (the planner searches 1..K_MAX)
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
    costs about two."""
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


def capped_by_wider(c: np.ndarray, n_seen: np.ndarray) -> np.ndarray:
    """The curve ``c`` with each width at most the estimate of any wider width the run timed twice
    or more: a pass over fewer tokens does no more work than one over more, so a width read dearer
    is a timing the machine disturbed (a stall during the probe's sweeps), and one the planner
    avoids, so it would never be timed and never learnt better. On the run's evidence only: a probe
    can read a narrower width dearer for good reason (torch's one-token pass can cost more than its
    two-token one), and what the run keeps timing settles it; a wider width's estimate, not its
    bare mean, so two lucky passes there do not make every narrower width look cheap."""
    twice = np.where(n_seen[: len(c)] >= 2, c, np.inf)
    wider = np.append(np.minimum.accumulate(twice[::-1])[::-1][1:], np.inf)  # least over widths > n
    return np.minimum(c, wider)


class Costs:
    """Seconds of a step as the planner weighs it: T(n), the target's pass over n tokens with the
    loop's work on its rows; each draft model's one-token pass; its prefill per token of text it
    has not seen.

    Measured before the run (``t_target``: T(n) for n = 1..len, the widest the planner may choose)
    or not (a fixed K: the run's own steps). A measured width counts as one observation beside the
    run's, so one slow step cannot condemn it, and the median of the recent residuals moves every
    width when the machine slows down for good. No pass over more tokens costs less than one over
    fewer: a width read dearer than a wider width the run timed (twice) is capped at that width's
    estimate (``capped_by_wider``; T(1) too, a stalled probe of a plain step). Unmeasured, a width
    costs its own mean where the run saw it, else the nearest narrower width's, and before any step
    every width costs one unit (``timed`` is False: seconds of a draft cannot be weighed yet).
    """

    RESIDUALS = 16

    def __init__(self, t_target: Sequence[float] | None = None, t_draft: Mapping[str, float] | None = None,
                 prefill: Mapping[str, float] | None = None, note: str = "") -> None:
        self.measured = 0 if t_target is None else len(t_target)
        if t_target is not None and not 2 <= self.measured <= K_LIMIT + 1:
            raise ValueError(f"t_target has {self.measured} widths: give T(1) and T(2) at least, "
                             f"{K_LIMIT + 1} at most")
        size = max(self.measured, K_LIMIT + 1) + 1  # index n: a step over n tokens
        self.n_seen, self.t_seen = np.zeros(size), np.zeros(size)
        self.prior: np.ndarray | None = None
        if t_target is not None:
            prior = np.asarray([t_target[0], *t_target], float)
            self.prior = np.maximum(prior, 1e-12)
        self.resids: deque[float] = deque(maxlen=self.RESIDUALS)
        self.resid = 0.0
        self.draft_prior = {k: float(v) for k, v in (t_draft or {}).items()}
        self.prefill_rate = {k: float(v) for k, v in (prefill or {}).items()}
        self.draft_seen: dict[str, list[float]] = {}  # name -> [passes, seconds] timed by the run
        # name -> lanes -> [passes, seconds]: passes drafting for several sequences at once
        self.draft_wide: dict[str, dict[int, list[float]]] = {}
        self.note = note  # how the measured costs were come by (the run's stats)
        self._curve: np.ndarray | None = None

    @property
    def timed(self) -> bool:
        """Are steps known in seconds (measured, or one timed), so a draft's seconds can be weighed?"""
        return self.prior is not None or bool(self.n_seen.any())

    def widest(self, limit: int) -> int:
        """The widest step (tokens) the planner may ask for: the widest measured, else ``limit``."""
        return min(self.measured, limit) if self.measured else limit

    def curve(self) -> np.ndarray:
        """[n] estimated seconds of a step over n tokens (index 0 repeats n = 1)."""
        if self._curve is None:
            self._curve = self._estimate()
        return self._curve

    def _estimate(self) -> np.ndarray:
        seen = self.n_seen > 0
        if self.prior is not None:
            m = len(self.prior)
            c = (self.prior + self.resid + self.t_seen[:m]) / (1 + self.n_seen[:m])
            c = capped_by_wider(c, self.n_seen)
            c[0] = c[1]
            return np.maximum(c, 1e-12)
        if not seen.any():
            return np.ones(len(self.n_seen))
        mean = np.where(seen, self.t_seen / np.maximum(self.n_seen, 1), np.nan)
        first = np.flatnonzero(seen)[0]
        mean[: first + 1] = mean[first]
        idx = np.where(np.isnan(mean), 0, np.arange(len(mean)))
        return mean[np.maximum.accumulate(idx)]  # each unseen width: the nearest narrower seen one

    def draft(self, name: str, lanes: int = 1) -> float:
        """Seconds of one pass of the draft model ``name`` (0 where neither measured nor timed).
        ``lanes`` > 1: of one pass drafting for that many sequences at once (``pass_streams``),
        read off the passes the run timed at each number of lanes, one sequence's included, by
        straight lines between them, and beyond the most lanes timed along the last of them (no
        cheaper per lane). Before any such pass is timed, a lane costs what one sequence's pass
        does: what sharing a pass saves is a property of the backend and the machine (a quantized
        model on a CPU saves little), learnt from the passes that share, never assumed."""
        n, t = self.draft_seen.get(name, (0.0, 0.0))
        prior = self.draft_prior.get(name)
        one = (prior + t) / (1 + n) if prior is not None else t / n if n else 0.0
        wide = self.draft_wide.get(name)
        if lanes <= 1:
            return one
        if not wide:
            return lanes * one
        xs = [1, *sorted(wide)]
        ys = [one, *(wide[m][1] / wide[m][0] for m in xs[1:])]
        if lanes <= xs[-1]:
            return float(np.interp(lanes, xs, ys))
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return ys[-1] + slope * (lanes - xs[-1])

    def lanes(self, name: str, lanes: int) -> float:
        """What a pass of ``name`` drafting for ``lanes`` sequences costs against one sequence's
        (1 where one sequence's pass is not known)."""
        one = self.draft(name)
        return self.draft(name, lanes) / one if lanes > 1 and one > 0 else 1.0

    def knows(self, name: str) -> bool:
        """Can a step of the draft model ``name`` be weighed in seconds yet?"""
        return self.timed and (name in self.draft_prior or name in self.draft_seen)

    def prefill(self, name: str) -> float:
        """Seconds per token of the draft model's catching up on text it has not seen (0: unknown)."""
        return self.prefill_rate.get(name, 0.0)

    def observe(self, n: int, seconds: float) -> None:
        """A step over n tokens took ``seconds`` (the target's pass and the loop's work on it)."""
        if not 0 < n < len(self.n_seen) or seconds <= 0:
            return
        self.n_seen[n] += 1
        self.t_seen[n] += seconds
        if self.prior is not None and n < len(self.prior):
            self.resids.append(seconds - float(self.prior[n]))
            self.resid = float(np.median([0.0, *self.resids]))
        self._curve = None

    def observe_draft(self, name: str, passes: int, seconds: float, lanes: int = 1) -> None:
        """``passes`` one-token passes of the draft model ``name`` took ``seconds``, each drafting
        for ``lanes`` sequences at once."""
        if passes > 0 and seconds > 0:
            seen = (self.draft_seen.setdefault(name, [0.0, 0.0]) if lanes <= 1
                    else self.draft_wide.setdefault(name, {}).setdefault(lanes, [0.0, 0.0]))
            seen[0] += passes
            seen[1] += seconds

    def info(self) -> dict:
        c = self.curve()
        top = self.measured or (int(np.flatnonzero(self.n_seen)[-1]) if self.n_seen.any() else 1)
        return {"measured_widths": self.measured, "note": self.note,
                "t_target_ms": [float(x) * 1e3 for x in c[1:top + 1]] if self.timed else [],
                "t_draft_ms": {k: self.draft(k) * 1e3 for k in sorted({*self.draft_prior, *self.draft_seen})},
                "prefill_ms_per_token": {k: v * 1e3 for k, v in sorted(self.prefill_rate.items())},
                **({"t_draft_lanes_ms": {k: {m: t / n * 1e3 for m, (n, t) in sorted(v.items())}
                                         for k, v in sorted(self.draft_wide.items())}}
                   if self.draft_wide else {})}
