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

from specmac.core.costs import K_MAX, K_MODEL, model_steps, step_of_moments
from specmac.core.estimate import CostEstimator

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
    """Chooses K every step as argmax S(K) from costs (``CostEstimator``) and acceptance estimated
    online.

    Acceptance is a Beta(accepted, rejections) posterior over the geometric acceptance rate, prior
    Beta(2, 2) (four pseudo-drafts at 1/2, so one unlucky first step cannot switch drafting off for
    a short run), counts exponentially forgotten so a change of text is followed. E(K) is the
    posterior expectation sum_j E[alpha^j] (``posterior_moments``), not E(K) at the point
    estimate: its heavier tail keeps one rejection after a long run of acceptances from pulling a
    wide K down to a narrow one (results/advise).

    Started from measured costs (``set_costs``; ``specmac.core.calibration`` times them for
    ``k="auto"``) no step is spent exploring, and K is never wider than the widest width measured
    (a width never timed is never chosen). ``k_max`` is ``K_MODEL`` for a model draft, up to
    ``K_MAX`` for drafts that cost no pass. Uncalibrated, a short warm-up visits K = 2, 6 and
    ``k_max`` and every ``explore_every`` steps a neighbour of the current best is tried. A probe's T(1)
    that the run's wider passes show stalled is timed again by one plain step. When no K is
    predicted to beat plain decoding it drafts nothing (K = 0) and tries again only within an
    exploration budget (``_best``); ``k_min=1`` always drafts.
    """

    label = "auto"

    def __init__(self, k_max: int = K_MODEL, k_init: int = 4, warmup: Sequence[int] | None = None,
                 decay: float = 0.97, prior_alpha: float = 0.5, prior_weight: float = 4.0,
                 explore_every: int = 16, k_min: int = 0, off_z: float = 1.64,
                 budget: float = 0.03, horizon: int | None = None) -> None:
        self.k_max = int(min(max(k_max, 1), K_MAX))
        if k_min not in (0, 1):
            raise ValueError(f"k_min {k_min!r} is out of range: use 0 (may stop drafting) or 1")
        self.k_min, self.off_z = int(k_min), off_z
        self.schedule = [self._clamp(k) for k in (warmup if warmup is not None else (2, 6, self.k_max))]
        self.decay, self.explore_every = decay, explore_every
        self.acc = prior_alpha * prior_weight  # decayed accepted drafts
        self.trials = prior_weight  # decayed accepted + rejected drafts
        self.costs = CostEstimator()
        self.history: list[int] = []
        self._k = self._clamp(k_init)
        self.calibration_s = 0.0  # what measuring the costs took (set by whoever measured them)
        self.calibration_cached = False  # were they measured by an earlier run (kept on disk)?
        # exploration budget: seconds decoded, and seconds drafting lost against plain decoding
        self.budget, self.elapsed, self.lost = float(budget), 0.0, 0.0
        self.horizon = horizon  # tokens the run will write at most (max_tokens), if known
        # the draft's prefill (set_prefill): seconds per token of catching the draft up, and the
        # tokens it has not seen (the prompt, then what steps without drafts added)
        self.prefill_per_token, self.n_behind, self.n_out = 0.0, 0, 0
        self.k_choice = ""  # why the first choice drafts nothing, where its costs say so (the run's stats)

    def set_prefill(self, per_token: float, n_prompt: int) -> None:
        """The draft's prefill costs ``per_token`` seconds a token, and it has not seen the prompt's
        ``n_prompt`` tokens: the first drafting step pays for them. Every S(K) then spreads that
        over the tokens the run has left (``horizon``) and an exploring step counts it whole, so a
        long prompt with a short answer is decoded plainly where the prefill cannot pay."""
        self.prefill_per_token, self.n_behind = float(per_token), int(n_prompt)
        if self.prior is not None:
            self._k = self._best()
            self.k_choice = self._first_choice()

    def prefill_s(self) -> float:
        """Seconds the draft's catching up on what it has not seen will cost the next drafting step."""
        return self.prefill_per_token * self.n_behind

    @property
    def prior(self) -> np.ndarray | None:
        """The measured step costs per width the policy started from (None: uncalibrated)."""
        return self.costs.prior

    def set_costs(self, t_target: Sequence[float], t_draft1: float) -> None:
        """Start from known costs (seconds): the target's pass T_t(n) for n = 1..len(t_target) and
        the draft's one-token pass. No exploring steps follow; the run's steps refine them."""
        if len(t_target) < 2:
            raise ValueError(f"t_target has {len(t_target)} width: give T_t(1) and T_t(2) at least")
        self.costs.set_costs(t_target, t_draft1)
        self.k_max = min(self.k_max, len(t_target) - 1)  # no wider than measured
        self.schedule, self.explore_every = [], 0
        self._k = self._best()

    def _clamp(self, k: int) -> int:
        return int(min(max(k, 1), self.k_max))

    # --- acceptance ---------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        return self.acc / self.trials

    def alpha_high(self) -> float:
        """An optimistic acceptance: the posterior mean plus off_z standard deviations (capped at 1).
        It widens while the policy drafts nothing, since the counts are forgotten and none added."""
        a, b = self.acc, max(self.trials - self.acc, 0.0)
        n = a + b
        return min(a / n + self.off_z * np.sqrt(a * b / (n * n * (n + 1.0))), 1.0)

    def t_draft1(self) -> float:
        return self.costs.t_draft1()

    def t_target(self, n: int) -> float:
        return self.costs.t_target(n)

    def width_costs(self) -> np.ndarray:
        """[k_max + 2] estimated step time per width n (index n) out to the widest K this policy may
        choose: what a drafter that costs no pass weighs each bet against (``specmac.core.bets``)."""
        return self.costs.curve()[: self.k_max + 2]

    # --- choosing -----------------------------------------------------------------------
    def _speedups(self, optimistic: bool = False, curve: np.ndarray | None = None) -> np.ndarray:
        """[k_max] predicted S(K) for K = 1..k_max, vectorised (the policy runs every step, so it
        must cost microseconds). E(K) and the chance of a catch-up pass, E[alpha^K], are posterior
        expectations (``optimistic``: powers of ``alpha_high``)."""
        curve = self.costs.curve() if curve is None else curve
        ks = np.arange(1, self.k_max + 1)
        if optimistic:
            e, draft = step_of_moments(self.alpha_high() ** np.arange(self.k_max + 1.0), ks, self.t_draft1())
        else:
            e, draft = model_steps(self.acc, self.trials, ks, self.t_draft1())
        # the draft's prefill, spread over the tokens left (a step writes e of them)
        left = max(self.horizon - self.n_out, 1) if self.horizon else 0
        share = self.prefill_s() / left if left else 0.0
        return e * curve[1] / (draft + curve[ks + 1] + e * share)

    def _best(self) -> int:
        """argmax S(K) where the posterior expects that K to pay (or always, with ``k_min`` 1).

        Where no K is expected to pay, drafting is a bet on a higher acceptance than the
        posterior's: it is tried (at the K that pays best at the optimistic acceptance) only when
        that K pays there and the step's worst case (every draft rejected) fits the exploration
        budget: ``budget`` of the time decoded so far (or, if more, of plain decoding's time for
        the ``horizon`` tokens of the run), less what drafting has lost against plain decoding so
        far (gains count back). So trying never costs more than ``budget`` of the run's planned
        time, even where only a wide K could pay. Otherwise 0, plain decoding; as the counts fade
        and time accrues a try comes again, and a draft that cannot pay even when always accepted
        is never tried."""
        curve = self.costs.curve()
        s = self._speedups(curve=curve)
        k = int(np.argmax(s)) + 1
        if self.k_min or s[k - 1] >= 1.0:
            return k
        hope = self._speedups(True, curve)
        ks = np.arange(1, self.k_max + 1)
        worst = ks * self.t_draft1() + curve[ks + 1] - curve[1] + self.prefill_s()  # 1 token kept
        room = self.budget * max(self.elapsed, (self.horizon or 0) * curve[1]) - self.lost
        ok = (hope >= 1.0) & (worst <= room)
        return int(ks[ok][np.argmax(hope[ok])]) if ok.any() else 0

    def _first_choice(self) -> str:
        """Why the first step drafts nothing when the draft's prefill is what stops it: the prefill
        against the best saving drafting could make over the tokens left (at the optimistic
        acceptance), both in seconds. Empty where it drafts, or where it would not even unpaid."""
        if self._k or not self.n_behind or not self.prefill_per_token or not self.horizon:
            return ""
        rate, prefill = self.prefill_per_token, self.prefill_s()
        self.prefill_per_token = 0.0
        try:  # the same choice with the prefill free
            hope, free = float(np.max(self._speedups(True))), self._best()
        finally:
            self.prefill_per_token = rate
        if not free or hope <= 1.0:
            return ""
        left = max(self.horizon - self.n_out, 1)
        saving = left * float(self.costs.curve()[1]) * (1.0 - 1.0 / hope)
        return (f"model draft not explored: its prefill of {self.n_behind} tokens \u2248 {prefill:.2g} s "
                f"exceeds the best saving over {left} tokens \u2248 {saving:.2g} s")

    def _t1_stalled(self) -> bool:
        return self.costs.t1_stalled()

    # --- the policy ---------------------------------------------------------------------
    def next_k(self) -> int:
        return self._k

    def update(self, event: Any) -> None:
        """Fold one step's event into the estimates and choose the next K."""
        self.history.append(event.k)
        d, a = event.n_drafted, event.n_accepted
        self.n_out += len(event.tokens)  # the draft has now seen all but the tokens it did not score
        self.n_behind = len(event.tokens) - a + (0 < d == a) if d else self.n_behind + len(event.tokens)
        step = event.t_draft + event.t_target + event.t_other
        self.elapsed += step
        if d > 0:  # what plain decoding would have paid for these tokens, as the curve says now
            self.lost += step - len(event.tokens) * float(self.costs.curve()[1])
        self.acc = self.decay * self.acc + a
        self.trials = self.decay * self.trials + a + (1 if a < d else 0)
        self.costs.observe(event)
        self._k = self._choose()

    def _choose(self) -> int:
        steps = self.costs.steps
        if steps <= len(self.schedule):
            return self.schedule[steps - 1]
        if self._t1_stalled():
            self.costs.t1_doubted = True
            return 0  # one plain step: the estimator puts the run's own T(1) in the probe's place
        best = self._best()
        if self.explore_every and steps % self.explore_every == 0:
            return self._clamp(best + (1 if (steps // self.explore_every) % 2 else -1))
        return best

    def info(self) -> dict:
        return {"policy": self.label, "alpha": self.alpha, "alpha_high": self.alpha_high(),
                "k_min": self.k_min, "t_draft1_ms": self.t_draft1() * 1e3,
                "t_target1_ms": self.t_target(1) * 1e3, "calibrated": self.prior is not None,
                "calibration_s": self.calibration_s, "calibration_cached": self.calibration_cached,
                "exploration_lost_s": self.lost, "k_max": self.k_max, "k_choice": self.k_choice,
                "draft_prefill_per_token_ms": self.prefill_per_token * 1e3,
                "k_history": list(self.history)}
