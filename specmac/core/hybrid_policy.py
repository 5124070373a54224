"""The costs a hybrid drafter (``specmac.core.hybrid``) chooses its source by, under any K policy.

``HybridPolicy`` wraps the run's own K policy: the loop asks it for K and tells it every event,
and it hands the drafter the target's step costs per width (the inner AdaptiveK's measured curve
under ``k="auto"``, else the steps' own times), the draft's pass and prefill rate, the tokens the
run has left, and the width the lookup alone would bet (a K policy of its own).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specmac.core.costs import K_MAX
from specmac.core.hybrid import NONE, HybridDrafter
from specmac.core.policy import AdaptiveK


class HybridPolicy:
    """Wraps the run's K policy for a hybrid drafter: the loop asks it for K and tells it each
    event; it hands the drafter the costs (the inner policy's target curve and draft pass where
    it has them, ``k="auto"``; else the steps' own times), the model's prefill rate (measured,
    with a fixed K too) and the tokens the run has left."""

    def __init__(self, inner: Any, drafter: HybridDrafter, horizon: int | None = None,
                 prefill_per_token: float | None = None) -> None:
        self.inner, self.drafter, self.horizon = inner, drafter, horizon
        self.label = getattr(inner, "label", "fixed")
        self.adaptive = isinstance(inner, AdaptiveK)
        self.prefill_per_token = prefill_per_token  # seconds the draft's prefill takes per token
        self.n_out = 0
        self.n_seen = np.zeros(K_MAX + 2)
        self.t_seen = np.zeros(K_MAX + 2)
        self._curve: np.ndarray | None = None
        # under k="auto", the K policy the lookup alone would run under (free drafts, the same curve),
        # fed the lookup's steps and the plain ones: it caps how wide the lookup bets, as it caps the
        # lookup alone. The bets' survival, learnt from every proposal (verified or not) of a copied
        # stretch, reads ~1 at every depth just before the stretch ends; unbounded, one short match
        # then bet 15 wide on the Q4_K_M target (bench/replay_drafters.py: rag 1.01x where the lookup
        # alone made 1.05x)
        self.lookup_policy: AdaptiveK | None = None
        if self.adaptive and inner.prior is not None:
            self.lookup_policy = AdaptiveK(k_max=inner.k_max, horizon=horizon)
            self.lookup_policy.set_costs(list(inner.width_costs()[1:]), 0.0)
        # the lookup proposes its weak matches too where the choice prices them against the model and
        # a plain step (as its own bets do when it runs alone): on a target whose second row is cheap
        # (F16 GGUF on a Xeon with AMX, T(2)/T(1) 1.11) they are most of what the lookup wins, and
        # without them the hybrid ran at 0.87-0.96x the lookup alone in five categories
        # (results/workloads_f16_xeon_amx)
        drafter.lookup.priced = self.lookup_policy is not None
        drafter.cost = self
        if hasattr(inner, "k"):
            self.k = inner.k

    def next_k(self) -> int:
        if self.adaptive:  # the drafter picks the width per source: allow the widest measured
            costs = self.inner.costs
            if costs.t1_doubted and not costs.n_seen[1]:
                return 0  # the inner policy doubts the probe's T(1): one plain step times it again
            return int(self.inner.k_max)
        return self.inner.next_k()

    def update(self, event: Any) -> None:
        self.n_out += len(event.tokens)
        n = event.n_drafted + 1
        if event.n_passes and n < len(self.n_seen):
            self.n_seen[n] += 1
            self.t_seen[n] += event.t_target + event.t_other
        self.inner.update(event)
        if self.lookup_policy is not None and event.source in ("lookup", NONE):
            self.lookup_policy.update(event)
        self._curve = None

    def curve(self) -> np.ndarray:
        """Seconds of a target step per width n: the inner policy's estimate out to its widest
        measured width, or ([K_MAX + 2]) the steps' own mean per width (a width not seen costs what
        the nearest seen narrower one does; before any step every width costs 1, see ``timed``)."""
        if self._curve is None:
            if self.adaptive:
                self._curve = np.asarray(self.inner.width_costs(), float)
            else:
                seen = self.n_seen > 0
                if not seen.any():
                    return np.ones(K_MAX + 2)
                mean = np.where(seen, self.t_seen / np.maximum(self.n_seen, 1), np.nan)
                first = mean[np.flatnonzero(seen)[0]]
                mean[0] = first if np.isnan(mean[1]) else mean[1]
                for i in range(1, len(mean)):
                    if np.isnan(mean[i]):
                        mean[i] = mean[i - 1]
                self._curve = mean
        return self._curve

    def t_draft1(self) -> float:
        return self.inner.costs.prior_draft if self.adaptive else 0.0

    def timed(self) -> bool:
        """Are the target's step costs known in seconds (measured, or a step timed), so the model's
        prefill can be weighed against them? With a fixed K the first step is not yet timed."""
        return self.adaptive or bool(self.n_seen.any()) or not self.prefill_per_token

    def lookup_cap(self) -> int:
        """The widest the lookup may bet now: the K its own policy chooses (no cap without one)."""
        return self.lookup_policy.next_k() if self.lookup_policy is not None else K_MAX

    def tokens_left(self) -> int | None:
        return None if self.horizon is None else max(self.horizon - self.n_out, 1)

    def prefill_s(self, n_tokens: int) -> float:
        """Predicted seconds of the draft's prefill of n_tokens: measured per token where known."""
        return n_tokens * self.prefill_per_token if self.prefill_per_token else 0.0

    def info(self) -> dict:
        base = self.inner.info() if hasattr(self.inner, "info") else {"policy": self.label}
        return base | {"hybrid": self.drafter.info(), "k_choice": self.drafter.k_choice}
