"""The cost model of speculative decoding: tokens per target pass, speedup, best K, adaptive K.

One step drafts K tokens (K draft passes of one token) and verifies them in one target pass over
K + 1 tokens, so with acceptance alpha

    E(K) = (1 - alpha^(K+1)) / (1 - alpha)                tokens per target pass
    S(K) = E(K) * T_t(1) / (K * T_d(1) + T_t(K + 1))       speedup over target-only decoding

T_t(K + 1) is the *measured* time of a batched pass (probe-parallelism), not T_t(1): on a backend
that verifies serially it grows like (K + 1) * T_t(1) and speculation cannot pay. Pure numpy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specmac.errors import SpecmacError

K_MAX = 16
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
    target-only decoding pays too: S = E (T_t(1) + o) / (K T_d(1) + T_t(K + 1) + o).
    ``catch_up`` adds the draft's catch-up pass after a fully accepted step (``draft_passes``).
    """
    tt = curve_fn(t_target)
    draft = draft_passes(alpha, k, catch_up) * t_draft1
    return expected_tokens(alpha, k) * (tt(1) + overhead) / (draft + tt(k + 1) + overhead)


def speedup_table(alpha: Alpha, t_draft1: float, t_target: Curve, k_max: int = K_MAX,
                  overhead: float = 0.0, catch_up: bool = False) -> list[dict]:
    """Per K = 1..k_max: k, tokens_per_pass, step_ms (draft + verify + overhead), predicted_speedup."""
    tt = curve_fn(t_target)
    return [{"k": k, "tokens_per_pass": expected_tokens(alpha, k),
             "step_ms": draft_passes(alpha, k, catch_up) * t_draft1 + tt(k + 1) + overhead,
             "predicted_speedup": predicted_speedup(k, alpha, t_draft1, tt, overhead, catch_up)}
            for k in range(1, k_max + 1)]


def best_k(alpha: Alpha, t_draft1: float, t_target: Curve, k_max: int = K_MAX,
           overhead: float = 0.0, catch_up: bool = False) -> tuple[int, float]:
    """(argmax_K S(K), its S) over K = 1..k_max."""
    table = speedup_table(alpha, t_draft1, t_target, k_max, overhead, catch_up)
    row = max(table, key=lambda r: r["predicted_speedup"])
    return row["k"], row["predicted_speedup"]


def posterior_moments(accepted: float, rejected: float, k_max: int) -> np.ndarray:
    """[k_max + 1] E[alpha^j] for j = 0..k_max under alpha ~ Beta(accepted, rejected):
    prod_{i<j} (accepted + i) / (accepted + rejected + i). Summed over j = 0..K it is the expected
    tokens per target pass; it tends to the geometric closed form as the counts grow."""
    a, b = max(float(accepted), 1e-9), max(float(rejected), 1e-9)
    i = np.arange(k_max, dtype=float)
    return np.concatenate([[1.0], np.cumprod((a + i) / (a + b + i))])


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


def why_not(alpha: Alpha, t_draft1: float, t_target: Curve, beta: float, k_max: int = K_MAX,
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


class AdaptiveK:
    """Chooses K every step as argmax S(K) from costs and acceptance estimated online.

    From each event: the draft's time per pass (T_d(1); a step makes K passes, one more after a
    fully accepted step), the time of a target step over n_drafted + 1 tokens, pass plus the
    loop's overhead (a least-squares line T_t(n) = a + b (n - 1) through every step seen), and
    acceptance as a Beta(accepted, rejections) posterior over the geometric acceptance rate
    (Jeffreys prior Beta(1/2, 1/2); counts exponentially forgotten so a change of text is
    followed). E(K) is the posterior expectation sum_j E[alpha^j] (``posterior_moments``), not
    E(K) at the point estimate: the run length it predicts has the heavier tail of a
    beta-geometric, so after a long run of acceptances one rejection does not pull a wide K down
    to a narrow one (on Qwen 0.5B -> 1.5B, where only K = 15 nears break-even, the point estimate
    flipped between K = 2 and 15; see results/advise).
    The curve is a line only where no step of that width was seen: a width seen is predicted from
    its own mean (llama.cpp switches kernels with the batch size, so T(17) can be below T(9)).
    Built by ``for_pair`` (what ``--k auto`` uses) it starts calibrated: a short probe times the
    target's pass at the widths K can take and the draft's pass, so no step is spent exploring
    (the steps then add the loop's own overhead to that curve). Uncalibrated, a short warm-up
    visits K = 2, 6 and 16 so the line has a slope and the widest pass is known, and every
    ``explore_every`` steps a neighbour of the current best is tried.
    When no K is predicted to beat target-only decoding, even at an optimistic acceptance, it
    drafts nothing (K = 0, plain decoding) until the fading counts make drafting worth a try
    again; ``k_min=1`` always drafts.
    """

    label = "auto"

    def __init__(self, k_max: int = K_MAX, k_init: int = 4, warmup: Sequence[int] = (2, 6, K_MAX),
                 decay: float = 0.97, prior_alpha: float = 0.5, prior_weight: float = 1.0,
                 explore_every: int = 16, k_min: int = 0, off_z: float = 1.64) -> None:
        self.k_max = int(min(max(k_max, 1), K_MAX))
        if k_min not in (0, 1):
            raise ValueError(f"k_min {k_min!r} is out of range: use 0 (may stop drafting) or 1")
        self.k_min, self.off_z = int(k_min), off_z
        self.k_init = self._clamp(k_init)
        self.schedule = [self._clamp(k) for k in warmup]
        self.decay, self.explore_every = decay, explore_every
        self.acc = prior_alpha * prior_weight  # decayed accepted drafts
        self.trials = prior_weight  # decayed accepted + rejected drafts
        self.draft_time = 0.0
        self.draft_tokens = 0
        self.sx = self.sy = self.sxx = self.sxy = self.sn = 0.0  # verify-line sums over n - 1
        # per width: steps seen and their summed time; the curve is not a line (kernels switch
        # with the batch size), so a width seen is predicted from its own mean
        self.n_seen = np.zeros(K_MAX + 2)
        self.t_seen = np.zeros(K_MAX + 2)
        self.steps = 0
        self._caught_up = False
        self._drafted = False  # did the last step draft? (if not, the next one catches the draft up)
        self.history: list[int] = []
        self._k = self.k_init
        # calibration (for_pair): measured T_t(n) per width [K_MAX + 2] and T_d(1), seconds;
        # steps then correct the prior by the loop's overhead (mean residual) and by their own means
        self.prior: np.ndarray | None = None
        self.prior_draft = 0.0
        self.resid_sum = self.resid_n = 0.0
        self.draft_fixed_sum = self.draft_fixed_n = 0.0  # a step's draft time beyond its passes
        self.calibration_s = 0.0

    @classmethod
    def for_pair(cls, pair: Any, *, calibrate: bool = True, **kw) -> AdaptiveK:
        """A policy for this pair. With ``calibrate``, a short probe first times the target's pass
        at the widths K can take and the draft's one-token pass (seconds on a 1.5B model, before
        the first token), so no step is spent exploring costs; acceptance is learnt online."""
        policy = cls(**kw)
        if calibrate:
            policy.calibrate(pair)
        return policy

    def calibrate(self, pair: Any, context: int = 16) -> None:
        """Measure T_t(n) for n = 1..k_max + 1 and T_d(1); see for_pair."""
        from specmac.probes.latency import probe_tokens, time_single, timed

        t0, target = time.perf_counter(), pair.target
        # every width: llama.cpp switches kernels with the batch size, so T(n) has dips
        # (T(16) < T(13) on a 1.5B Q4_K_M here) that interpolation would miss
        widths = list(range(1, self.k_max + 2))
        try:
            ids = probe_tokens(target, context + widths[-1])
            target.reset()
            target.prefill(ids[:context])
            times: dict[int, list[float]] = {}
            # the first two warm buffers and kernels up; T(1), every S(K)'s yardstick, gets 3 timings
            for n in (widths[-1], 1, *widths, 1, 1):
                target.rewind(context)
                t = timed(target, lambda n=n: target.score(ids[context:context + n]))
                times.setdefault(n, []).append(t)
            backend = getattr(pair.drafter, "backend", None)
            t_draft = time_single(backend, context=context, repeats=3, warmup=1)["median_ms"] / 1e3 \
                if backend is not None else 0.0
        except (ValueError, SpecmacError):  # e.g. a context window too small to probe
            return
        finally:
            target.reset()
            pair.drafter.trim(0)
        self.set_costs([float(np.median(times[1][-3:]))] + [times[w][-1] for w in widths[1:]], t_draft)
        self.calibration_s = time.perf_counter() - t0

    def set_costs(self, t_target: Sequence[float], t_draft1: float) -> None:
        """Start from known costs (seconds): the target's pass T_t(n) for n = 1..len(t_target) and
        the draft's one-token pass. No exploring steps follow; the run's steps refine them."""
        n = np.arange(1, len(t_target) + 1)
        curve = np.interp(np.arange(K_MAX + 2), n, np.asarray(t_target, float))  # n = 0, n > len: ends
        self.prior = np.maximum(curve, 1e-12)
        self.prior_draft = float(t_draft1)
        self.schedule, self.explore_every = [], 0
        self._k = self._best()

    def _clamp(self, k: int) -> int:
        return int(min(max(k, 1), self.k_max))

    # --- estimates ----------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        return self.acc / self.trials

    def t_draft1(self) -> float:
        """Seconds per draft pass: the calibrated pass, else the run's average per pass."""
        if self.prior is not None:
            return self.prior_draft
        return self.draft_time / self.draft_tokens if self.draft_tokens else 0.0

    def t_draft_fixed(self) -> float:
        """Calibrated only: the draft's cost per step beyond its passes (catching up on the
        accepted tokens, sampling); paid once per step whatever K, so it favours larger K."""
        return self.draft_fixed_sum / self.draft_fixed_n if self.draft_fixed_n else 0.0

    def _line(self) -> tuple[float, float]:
        """(T1, slope) of the least-squares line through the steps seen (seconds)."""
        if self.sn == 0:
            return 1.0, 0.0
        mx, my = self.sx / self.sn, self.sy / self.sn
        var = self.sxx / self.sn - mx * mx
        b = (self.sxy / self.sn - mx * my) / var if var > 1e-12 else 0.0
        a = my - b * mx
        t1 = a if a > 0 else my / (1 + mx) if my > 0 else 1e-9
        return t1, max(b, 0.0)

    def _curve(self) -> np.ndarray:
        """[K_MAX + 2] estimated step time per width n (index n): its own mean where seen, else
        the line."""
        if self.prior is not None:
            unseen = self.prior + (self.resid_sum / self.resid_n if self.resid_n else 0.0)
        else:
            t1, b = self._line()
            unseen = np.maximum(t1 + b * (np.arange(K_MAX + 2) - 1), 1e-12)
        seen = self.n_seen > 0
        if self.prior is not None:  # the probe counts as one observation: one slow step cannot
            return np.maximum((unseen + self.t_seen) / (1 + self.n_seen), 1e-12)  # condemn a width
        return np.where(seen, self.t_seen / np.maximum(self.n_seen, 1), np.maximum(unseen, 1e-12))

    def t_target(self, n: int) -> float:
        """Estimated time of a target step over n tokens, the loop's overhead included (seconds)."""
        if n < len(self.n_seen):
            return float(self._curve()[n])
        t1, b = self._line()
        return max(t1 + b * (n - 1), 1e-12)

    def alpha_high(self) -> float:
        """An optimistic acceptance: the posterior mean plus off_z standard deviations (capped at 1).
        It widens while the policy drafts nothing, since the counts are forgotten and none added."""
        a, b = self.acc, max(self.trials - self.acc, 0.0)
        n = a + b
        return min(a / n + self.off_z * np.sqrt(a * b / (n * n * (n + 1.0))), 1.0)

    def _speedups(self, optimistic: bool = False, curve: np.ndarray | None = None) -> np.ndarray:
        """[k_max] predicted S(K) for K = 1..k_max, vectorised: the policy runs every step, so it
        must cost microseconds. E(K) and the chance of a catch-up pass, E[alpha^K], are posterior
        expectations (``optimistic``: powers of ``alpha_high``). ``curve``: ``_curve()``, if the
        caller has it already."""
        curve = self._curve() if curve is None else curve
        ks = np.arange(1, self.k_max + 1)
        if optimistic:
            m = self.alpha_high() ** np.arange(self.k_max + 1.0)
        else:
            m = posterior_moments(self.acc, self.trials - self.acc, self.k_max)
        e = np.cumsum(m)[ks]
        return e * curve[1] / ((ks + m[ks]) * self.t_draft1() + self.t_draft_fixed() + curve[ks + 1])

    def predicted(self, k: int) -> float:
        """Predicted S(K); K = 0 (no drafting) is target-only decoding, 1 by definition."""
        return float(self._speedups()[k - 1]) if k else 1.0

    def _best(self) -> int:
        """argmax S(K), or 0 (draft nothing) when no K pays even at the optimistic acceptance
        (``k_min`` 0). While at 0 the counts fade, alpha_high rises and a K >= 1 is tried again,
        so a pessimistic start is not final; a draft that cannot pay even when always accepted
        (c too high for the target's curve) is never tried."""
        curve = self._curve()
        s = self._speedups(curve=curve)
        k = int(np.argmax(s)) + 1
        if self.k_min == 0 and s[k - 1] < 1.0 and self._speedups(True, curve).max() < 1.0:
            return 0
        return k

    # --- the policy ---------------------------------------------------------------------
    def next_k(self) -> int:
        return self._k

    def update(self, event: Any) -> None:
        """Fold one step's event into the estimates and choose the next K."""
        self.steps += 1
        self.history.append(event.k)
        d, a = event.n_drafted, event.n_accepted
        self.acc = self.decay * self.acc + a
        self.trials = self.decay * self.trials + a + (1 if a < d else 0)
        # the first step's draft time includes the prompt's prefill, and a step after steps that
        # drafted nothing the draft's catching up on them: neither is a step's usual cost
        if self.steps > 1 and d > 0 and self._drafted:
            self.draft_time += event.t_draft
            self.draft_tokens += d + self._caught_up  # passes, the catch-up pass included
            if self.prior is not None:
                self.draft_fixed_sum += max(event.t_draft - d * self.prior_draft, 0.0)
                self.draft_fixed_n += 1
        self._caught_up = 0 < d == a
        self._drafted = d > 0
        if self.steps > 1 and event.t_verify > 0:
            # the pass and the loop's work on its n rows (warp, verify, rewind) both grow with n;
            # target-only decoding pays the same for n = 1, so the line is the target's whole cost
            x, y = float(d), float(event.t_verify + event.t_other)  # x = n - 1 for d + 1 tokens
            self.sn += 1
            self.sx += x
            self.sy += y
            self.sxx += x * x
            self.sxy += x * y
            self.n_seen[d + 1] += 1
            self.t_seen[d + 1] += y
            if self.prior is not None:
                self.resid_sum += y - self.prior[d + 1]
                self.resid_n += 1
        self._k = self._choose()

    def _choose(self) -> int:
        if self.steps <= len(self.schedule):
            return self.schedule[self.steps - 1]
        best = self._best()
        if self.explore_every and self.steps % self.explore_every == 0:
            return self._clamp(best + (1 if (self.steps // self.explore_every) % 2 else -1))
        return best

    def info(self) -> dict:
        return {"policy": self.label, "alpha": self.alpha, "alpha_high": self.alpha_high(),
                "k_min": self.k_min, "t_draft1_ms": self.t_draft1() * 1e3,
                "t_target1_ms": self.t_target(1) * 1e3, "calibrated": self.prior is not None,
                "calibration_s": self.calibration_s, "k_history": list(self.history)}


def replay_greedy(match: str, policy: Any, n_tokens: int, t_target: Sequence[float], t_draft1: float,
                  t_draft2: float, t_other: float = 0.0) -> float:
    """tokens/s of greedy speculative decoding of n_tokens, replayed on a recorded acceptance string.

    match[i] is "1" where the draft's greedy guess equals the target's token i of the target's
    own greedy text (bench/acceptance_trace.py records it). Under greedy decoding that decides
    every step: a step at position i drafting K keeps the run of 1s from i (at most K) plus one
    token. Costs, seconds: the target's pass over n tokens t_target[n - 1], the draft's one-token
    pass and its two-token pass (the first pass after a fully accepted step, the catch-up), and a
    fixed t_other a step. ``policy`` is an int (fixed K) or has next_k() and update(event), like
    AdaptiveK, which then learns from the replayed events. Every policy sees the same text, which a
    real low-precision run does not guarantee (batched passes can flip a near-tied argmax).
    """
    from specmac.speculative import Event

    if n_tokens > len(match):
        raise ValueError(f"the trace has {len(match)} tokens: replay at most that many")
    pos = out = 0
    seconds, caught_up = 0.0, False
    while out < n_tokens:
        k = max(0, min(policy if isinstance(policy, int) else policy.next_k(), n_tokens - out - 1,
                       len(t_target) - 1))
        a = 0
        while a < k and match[pos + a] == "1":
            a += 1
        t_draft = k and (t_draft2 if caught_up else t_draft1) + (k - 1) * t_draft1
        t_verify = t_target[k]
        new = min(a + 1, n_tokens - out)
        if not isinstance(policy, int):
            policy.update(Event([0] * new, ["accepted"] * new, k, k, a, t_draft, t_verify, t_other))
        seconds += t_draft + t_verify + t_other
        pos, out, caught_up = pos + new, out + new, 0 < k == a
    return n_tokens / seconds


# --- advise: measure, then predict --------------------------------------------------------

def advise_prompts() -> list[str]:
    """The prompts advise measures acceptance on by default: the first four of the packaged set
    compare uses (code and prose alternating), so one easy text does not set alpha."""
    from specmac.compare import default_prompts

    return [p["text"] for p in default_prompts()[:4]]


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


def warp_cost_ms(n_logits: int, n_vocab: int, params: Any, n: int, repeats: int = 15) -> float:
    """Median ms the loop spends on n logit rows before the rule reads them: aligning them, then
    the argmax (greedy) or warping them into probabilities. For sampling an upper bound: the loop
    warps rows lazily, and rows past the first rejection are never warped."""
    from specmac.sampling import warp
    from specmac.vocab import align_logits

    x = np.random.default_rng(0).standard_normal((n, n_logits)).astype(np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = align_logits(x, n_vocab)
        np.argmax(rows, axis=-1) if params.greedy else warp(rows, params)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def _loop_costs(pair: Any, prompts: Sequence[Any], params: Any, run_tokens: int, k: int, seed: int):
    """Short runs of ``run_tokens`` per prompt at K = k (k = 0: target only). -> RunStats over all
    of them and the loop's own costs in ms: per draft pass (a step makes n_drafted passes, one more
    after a fully accepted step: the catch-up), per step outside the passes, and per emitted token
    overall (each run's first step is left out: its draft time includes the prompt's prefill)."""
    from specmac.api import Pair
    from specmac.drafters import Drafter
    from specmac.metrics import RunStats

    runner = pair if k else Pair(pair.target, Drafter())
    stats = RunStats(k=k)
    draft_s = other_s = total_s = 0.0
    drafted = steps = tokens = 0
    for prompt in prompts:
        caught_up = False  # did the previous step accept all its drafts?
        for i, event in enumerate(runner.stream(prompt, params=params, max_tokens=run_tokens,
                                                k=max(k, 1), seed=seed)):
            stats.add(event)
            if i and event.tokens:
                draft_s, drafted = draft_s + event.t_draft, drafted + event.n_drafted + caught_up
                other_s, steps = other_s + event.t_other, steps + 1
                total_s += event.t_draft + event.t_verify + event.t_other
                tokens += len(event.tokens)
            caught_up = 0 < event.n_drafted == event.n_accepted
    loop = {"draft_ms_per_pass": 1e3 * draft_s / drafted if drafted else None,
            "other_ms_per_step": 1e3 * other_s / steps if steps else None,
            "ms_per_token": 1e3 * total_s / tokens if tokens else None}
    return stats, loop


def advise(pair: Any, *, params: Any, prompts: str | Sequence[str | Sequence[int]] | None = None,
           run_tokens: int = 48, run_k: int = 8, k_max: int = K_MAX, context: int = 128,
           repeats: int = 3, seed: int = 0) -> dict:
    """Measure T_draft(1), the target's T(n) curve and acceptance (short speculative runs of
    ``run_tokens`` per prompt at K = ``run_k``), then predict S(K) for K = 1..k_max.

    ``prompts`` is one prompt (text or token ids) or several; None gives ``advise_prompts()``.
    Acceptance differs a lot between texts (code that repeats its prompt vs free prose), so it is
    pooled over several.

    Costs are what the loop pays: the draft's cost per pass (its pass plus sampling, as measured in
    the run; at least the bare pass T_draft(1)), K passes a step plus a catch-up pass after a fully
    accepted step (``draft_passes``); per speculative step over n tokens
    the measured T_t(n) plus the loop's overhead o(n) (turning n rows into probabilities, timed
    on the spot, plus the fixed rest measured in the run); and per token of target-only decoding
    what a short target-only run of the loop measures (T_t(1) and its lighter overhead), which is
    the curve's n = 1 entry, the numerator of S(K).

    Returns best_k, predicted_speedup, alpha, alpha_profile, c, beta, verdict, t_draft_ms,
    t_target_ms, table (per K: k, tokens_per_pass, step_ms, predicted_speedup), reasons (why
    speculation will not pay; empty when it will) and the probe record.
    """
    from specmac.drafters import ModelDrafter
    from specmac.errors import BadOption
    from specmac.probes import probe_parallelism, time_single

    if not pair.speculative:
        raise BadOption("advise needs a draft: add --draft BACKEND (or --draft ngram)")
    if prompts is None:
        prompts = advise_prompts()
    elif isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], (int, np.integer))):
        prompts = [prompts]  # one prompt: text or token ids
    if not prompts:
        raise BadOption("advise needs at least one prompt to measure acceptance on")
    stats, loop = _loop_costs(pair, prompts, params, run_tokens, run_k, seed)
    alpha, profile = acceptance_from_stats(stats)
    _, base = _loop_costs(pair, prompts, params, run_tokens, 0, seed)
    target = pair.target
    n_max = k_max + 1
    probe = probe_parallelism(target, n_max=n_max, context=min(context, target.n_ctx - n_max),
                              repeats=repeats)
    t_pass = None
    if isinstance(pair.drafter, ModelDrafter):
        d = pair.drafter.backend
        t_pass = time_single(d, context=min(context, d.n_ctx - 1), repeats=10)["median_ms"]
    t_draft = max(x for x in (loop["draft_ms_per_pass"], t_pass, 0.0) if x is not None)
    V, W = target.vocab.size, target.vocab.n_logits or target.vocab.size
    w1, wn = warp_cost_ms(W, V, params, 1), warp_cost_ms(W, V, params, n_max)
    w_row = max(wn - w1, 0.0) / (n_max - 1)
    fixed = max((loop["other_ms_per_step"] or 0.0) - (w1 + w_row * run_k), 0.0)
    t_curve = probe["batched_ms"]
    step = [t + fixed + w1 + w_row * (n - 1) for n, t in enumerate(t_curve, start=1)]  # T_t(n) + o(n)
    step[0] = base["ms_per_token"] or step[0]  # what target-only decoding pays per token
    table = speedup_table(profile, t_draft, step, k_max, catch_up=True)
    best = max(table, key=lambda r: r["predicted_speedup"])
    return {
        "best_k": best["k"], "predicted_speedup": best["predicted_speedup"],
        "alpha": alpha, "alpha_profile": profile, "c": t_draft / step[0],
        "beta": probe["beta"], "verdict": probe["verdict"],
        "t_draft_ms": t_draft, "t_draft_pass_ms": t_pass, "t_target_ms": t_curve[0],
        "target_only_ms_per_token": step[0],
        "target_curve_ms": t_curve, "loop_overhead_ms": [s - t for s, t in zip(step, t_curve)],
        "table": table,
        "reasons": why_not(profile, t_draft, step, probe["beta"], k_max, catch_up=True),
        "acceptance_run": {"k": run_k, "prompts": len(prompts), "n_tokens": stats.n_tokens,
                           "n_drafted": stats.n_drafted, "n_accepted": stats.n_accepted,
                           "per_position_acceptance": stats.per_position_acceptance, **loop},
        "target_only_run": base,
        "probe": probe,
        **pair.info(),
    }
