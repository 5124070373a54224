"""K policies: how many drafts the next step asks for. Costs and events in, K out.

``FixedK`` always asks for the same K; ``AdaptiveK`` chooses argmax S(K) every step from the cost
model (``specmac.core.costs``) with costs measured before the run (``set_costs``: what
``specmac.core.calibration`` times for ``k="auto"``) and refined, with acceptance, from the loop's events.
Pure numpy: a policy never touches a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from specmac.core.costs import K_MAX, posterior_moments

K_DEFAULT = 4  # drafts per step unless told otherwise
K_LIMIT = 256  # the most drafts per step a caller may ask for (the cost model searches 1..K_MAX)


@runtime_checkable
class KPolicy(Protocol):
    """What the loop asks of a policy: the next K, and each step's event afterwards."""

    def next_k(self) -> int: ...
    def update(self, event: Any) -> None: ...


class FixedK:
    label = "fixed"

    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    def update(self, event: Any) -> None:
        pass


class AdaptiveK:
    """Chooses K every step as argmax S(K) from costs and acceptance estimated online.

    From each event: the draft's time per pass (T_d(1); a step makes K passes, one more after a
    fully accepted step), the time of a target step over n_drafted + 1 tokens, pass plus the
    loop's overhead (a least-squares line T_t(n) = a + b (n - 1) through every step seen), and
    acceptance as a Beta(accepted, rejections) posterior over the geometric acceptance rate
    (prior Beta(2, 2): four pseudo-drafts at 1/2, so that one unlucky first step cannot switch
    drafting off for a whole short run, as the Jeffreys prior Beta(1/2, 1/2) did on prose with a
    torch draft in results/anatomy; counts exponentially forgotten so a change of text is
    followed). E(K) is the posterior expectation sum_j E[alpha^j] (``posterior_moments``), not
    E(K) at the point estimate: the run length it predicts has the heavier tail of a
    beta-geometric, so after a long run of acceptances one rejection does not pull a wide K down
    to a narrow one (on Qwen 0.5B -> 1.5B, where only K = 15 nears break-even, the point estimate
    flipped between K = 2 and 15; see results/advise).
    The curve is a line only where no step of that width was seen: a width seen is predicted from
    its own mean (llama.cpp switches kernels with the batch size, so T(17) can be below T(9)).
    Given measured costs (``set_costs``; ``specmac.core.calibration`` times them for ``k="auto"``) it
    starts calibrated: no step is spent exploring (the steps then add the loop's own overhead
    to that curve). Uncalibrated, a short warm-up visits K = 2, 6 and 16 so the line has a slope
    and the widest pass is known, and every ``explore_every`` steps a neighbour of the current
    best is tried.
    A probe's T(1) that the run's wider passes show stalled is timed again by one plain step
    (``_t1_stalled``). When no K is predicted to beat plain decoding it drafts nothing (K = 0, plain
    decoding), and tries drafting again only within an exploration budget (``budget``, a share
    of the time decoded, or, where the run's length is known (``horizon``, tokens), of what plain
    decoding of the whole run takes, so that a short run can try from its first step; see
    ``_best``); ``k_min=1`` always drafts.
    """

    label = "auto"

    def __init__(self, k_max: int = K_MAX, k_init: int = 4, warmup: Sequence[int] = (2, 6, K_MAX),
                 decay: float = 0.97, prior_alpha: float = 0.5, prior_weight: float = 4.0,
                 explore_every: int = 16, k_min: int = 0, off_z: float = 1.64,
                 budget: float = 0.03, horizon: int | None = None) -> None:
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
        # calibration (set_costs): measured T_t(n) per width [K_MAX + 2] and T_d(1), seconds;
        # steps then correct the prior by the loop's overhead (mean residual) and by their own means
        self.prior: np.ndarray | None = None
        self.prior_draft = 0.0
        self.resid_sum = self.resid_n = 0.0
        self.t1_doubted = False  # the run's wider passes beat the probe's T(1) by half: a stalled probe
        self.calibration_s = 0.0  # what measuring the costs took (set by whoever measured them)
        self.calibration_cached = False  # were they measured by an earlier run (kept on disk)?
        # exploration budget: seconds decoded, and seconds drafting lost against plain decoding
        self.budget, self.elapsed, self.lost = float(budget), 0.0, 0.0
        self.horizon = horizon  # tokens the run will write at most (max_tokens), if known

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
        """Seconds per draft pass: the run's average per pass, where calibrated with the measured
        pass counted as one more. A pass in the loop can cost other than the probe's: in front of
        a torch target the Q4_K_M draft's pass timed 24 ms in calibration, right after the
        target's sweep, and 16-19 ms per pass in the run (results/anatomy_auto); kept at the
        probe's value it held auto at a narrower K than paid. A step's draft cost beyond its
        passes (sampling, bookkeeping) is spread over them: the passes include the catch-up
        pass after a fully accepted step, which ``_speedups`` counts as one more pass."""
        if self.prior is not None:
            return (self.prior_draft + self.draft_time) / (1 + self.draft_tokens)
        return self.draft_time / self.draft_tokens if self.draft_tokens else 0.0

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
        return e * curve[1] / ((ks + m[ks]) * self.t_draft1() + curve[ks + 1])

    def _best(self) -> int:
        """argmax S(K) where the posterior expects that K to pay (or always, with ``k_min`` 1).

        Where no K is expected to pay, drafting is a bet on a higher acceptance than the
        posterior's: it is tried (at the K that pays best at the optimistic acceptance) only when
        that K pays there and the step's worst case (every draft rejected) fits the exploration
        budget: ``budget`` of the time decoded so far (or, if more, of plain decoding's time for
        the ``horizon`` tokens of the run), less what drafting has lost against plain decoding so
        far (gains count back). So trying never costs more than ``budget`` overall (of the
        run's planned time: a run that an EOS ends early can have spent more of its own),
        even where only a wide K could pay (on Qwen Q4_K_M, trying K = 15 on optimism ran at 0.65x
        of plain). Otherwise 0, plain decoding; as the counts fade and time accrues, a try
        comes again, and a draft that cannot pay even when always accepted is never tried."""
        curve = self._curve()
        s = self._speedups(curve=curve)
        k = int(np.argmax(s)) + 1
        if self.k_min or s[k - 1] >= 1.0:
            return k
        hope = self._speedups(True, curve)
        ks = np.arange(1, self.k_max + 1)
        worst = ks * self.t_draft1() + curve[ks + 1] - curve[1]  # 1 token kept
        room = self.budget * max(self.elapsed, (self.horizon or 0) * curve[1]) - self.lost
        ok = (hope >= 1.0) & (worst <= room)
        return int(ks[ok][np.argmax(hope[ok])]) if ok.any() else 0

    # --- the policy ---------------------------------------------------------------------
    def next_k(self) -> int:
        return self._k

    def update(self, event: Any) -> None:
        """Fold one step's event into the estimates and choose the next K."""
        self.steps += 1
        self.history.append(event.k)
        d, a = event.n_drafted, event.n_accepted
        step = event.t_draft + event.t_target + event.t_other
        self.elapsed += step
        if d > 0:  # what plain decoding would have paid for these tokens, as the curve says now
            self.lost += step - len(event.tokens) * float(self._curve()[1])
        self.acc = self.decay * self.acc + a
        self.trials = self.decay * self.trials + a + (1 if a < d else 0)
        # the first step's draft time includes the prompt's prefill, and a step after steps that
        # drafted nothing the draft's catching up on them: neither is a step's usual cost
        if self.steps > 1 and d > 0 and self._drafted:
            self.draft_time += event.t_draft
            self.draft_tokens += d + self._caught_up  # passes, the catch-up pass included
        self._caught_up = 0 < d == a
        self._drafted = d > 0
        if self.steps > 1 and event.t_target > 0:
            # the pass and the loop's work on its n rows (warp, verify, rewind) both grow with n;
            # plain decoding pays the same for n = 1, so the line is the target's whole cost
            x, y = float(d), float(event.t_target + event.t_other)  # x = n - 1 for d + 1 tokens
            self.sn += 1
            self.sx += x
            self.sy += y
            self.sxx += x * x
            self.sxy += x * y
            self.n_seen[d + 1] += 1
            self.t_seen[d + 1] += y
            if self.prior is not None:
                if d == 0 and self.t1_doubted and self.n_seen[1] == 1:
                    self.prior[1] = y  # the plain step that _choose asked for: the run's T(1) is the probe's
                self.resid_sum += y - self.prior[d + 1]
                self.resid_n += 1
        self._k = self._choose()

    def _t1_stalled(self) -> bool:
        """Calibrated and not yet timed by the run, does the probe's T(1) look stalled? T(1) is
        every S(K)'s yardstick and, while the policy drafts, never timed again: a probe stalled by
        a busy machine would keep it drafting where plain decoding is faster. A wider pass the run
        timed (twice or more) at under half the probe's T(1) says so: no backend here verifies two
        or more tokens in half a one-token pass (torch bf16's T(2..5) are its cheapest, at 0.8)."""
        if self.prior is None or self.t1_doubted or self.n_seen[1]:
            return False
        wide = (np.arange(len(self.n_seen)) >= 2) & (self.n_seen >= 2)
        return bool(wide.any() and (self.t_seen[wide] / self.n_seen[wide]).min() < 0.5 * self.prior[1])

    def _choose(self) -> int:
        if self.steps <= len(self.schedule):
            return self.schedule[self.steps - 1]
        if self._t1_stalled():
            self.t1_doubted = True
            return 0  # one plain step: update() puts the run's own T(1) in the probe's place
        best = self._best()
        if self.explore_every and self.steps % self.explore_every == 0:
            return self._clamp(best + (1 if (self.steps // self.explore_every) % 2 else -1))
        return best

    def info(self) -> dict:
        return {"policy": self.label, "alpha": self.alpha, "alpha_high": self.alpha_high(),
                "k_min": self.k_min, "t_draft1_ms": self.t_draft1() * 1e3,
                "t_target1_ms": self.t_target(1) * 1e3, "calibrated": self.prior is not None,
                "calibration_s": self.calibration_s, "calibration_cached": self.calibration_cached,
                "exploration_lost_s": self.lost,
                "k_history": list(self.history)}
