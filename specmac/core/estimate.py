"""What a step costs, estimated online: measured costs in, a curve of step time per width out.

``CostEstimator`` holds the draft's time per pass and the target's step time over n tokens (the
pass plus the loop's own work on its n rows). Started from measured costs (``set_costs``) the
steps correct them by the loop's overhead (the median of recent steps' residuals, so one stalled
step moves no width) and by their own means; without them it fits a line
T(n) = a + b (n - 1) through the steps seen. A width seen is predicted from its own mean: the
kernels switch with the batch size, so the curve is no line (results/probes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from specmac.core.costs import K_MAX


class CostEstimator:
    """Step costs of one run, in seconds, from measured costs and the loop's events."""

    RESIDUALS = 16

    def __init__(self) -> None:
        self.draft_time = 0.0
        self.draft_tokens = 0  # draft passes timed, the catch-up pass included
        self.sx = self.sy = self.sxx = self.sxy = self.sn = 0.0  # line sums over n - 1
        self.n_seen = np.zeros(K_MAX + 2)  # per width n: steps seen and their summed time
        self.t_seen = np.zeros(K_MAX + 2)
        self.steps = 0
        self._caught_up = False
        self._drafted = False  # did the last step draft? (if not, the next one catches the draft up)
        # measured T_t(n) per width [K_MAX + 2] and T_d(1), and the run's residual against them:
        # the median of the last RESIDUALS steps' (and the probe's own, 0), so one slow step (a page
        # fault, a preemption) does not shift every width; a machine that slows for good moves it
        # within RESIDUALS / 2 steps
        self.prior: np.ndarray | None = None
        self.prior_draft = 0.0
        self.measured = 0  # widths n = 1..measured timed before the run (the chooser goes no wider)
        self.resids: deque[float] = deque(maxlen=self.RESIDUALS)
        self.resid = 0.0
        self.t1_doubted = False  # the run's wider passes beat the probe's T(1) by half

    @property
    def calibrated(self) -> bool:
        return self.prior is not None

    def set_costs(self, t_target: Sequence[float], t_draft1: float) -> None:
        """Known costs: the target's pass T_t(n) for n = 1..len(t_target), the draft's pass. Widths
        past the measured ones hold the widest measured cost, a placeholder: ``measured`` says how far
        the curve is known, and the policies choose no wider."""
        if not 1 <= len(t_target) <= K_MAX + 1:
            raise ValueError(f"t_target has {len(t_target)} widths: give T_t(n) for n = 1..{K_MAX + 1} "
                             "at most")
        self.measured = len(t_target)
        n = np.arange(1, len(t_target) + 1)
        curve = np.interp(np.arange(K_MAX + 2), n, np.asarray(t_target, float))  # n = 0, n > len: ends
        self.prior = np.maximum(curve, 1e-12)
        self.prior_draft = float(t_draft1)

    def t_draft1(self) -> float:
        """Seconds per draft pass: the run's average, where calibrated with the measured pass
        counted as one more (a pass in the loop can cost other than the probe's, and a step's
        draft work beyond its passes is spread over them)."""
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

    def curve(self) -> np.ndarray:
        """[K_MAX + 2] estimated step time per width n (index n)."""
        if self.prior is not None:  # the probe counts as one observation: one slow step cannot
            unseen = self.prior + self.resid  # condemn a width
            return np.maximum((unseen + self.t_seen) / (1 + self.n_seen), 1e-12)
        t1, b = self._line()
        unseen = np.maximum(t1 + b * (np.arange(K_MAX + 2) - 1), 1e-12)
        return np.where(self.n_seen > 0, self.t_seen / np.maximum(self.n_seen, 1), unseen)

    def t_target(self, n: int) -> float:
        """Estimated time of a target step over n tokens, the loop's overhead included."""
        if n < len(self.n_seen):
            return float(self.curve()[n])
        t1, b = self._line()
        return max(t1 + b * (n - 1), 1e-12)

    def observe(self, event: Any) -> None:
        """Fold one step's times in."""
        self.steps += 1
        d = event.n_drafted
        # the first step's draft time includes the prompt's prefill, and a step after steps that
        # drafted nothing the draft's catching up on them: neither is a step's usual cost
        if self.steps > 1 and d > 0 and self._drafted:
            self.draft_time += event.t_draft
            self.draft_tokens += d + self._caught_up
        self._caught_up = 0 < d == event.n_accepted
        self._drafted = d > 0
        if self.steps > 1 and event.t_target > 0:
            # the pass and the loop's work on its n rows both grow with n; plain decoding pays
            # the same for n = 1, so the line is the target's whole cost
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
                    self.prior[1] = y  # the plain step asked for by a doubted T(1) replaces it
                self.resids.append(y - self.prior[d + 1])
                self.resid = float(np.median([0.0, *self.resids]))

    def t1_stalled(self) -> bool:
        """Calibrated and not yet timed by the run, does the probe's T(1) look stalled? T(1) is
        every S(K)'s yardstick and, while the policy drafts, never timed again. A wider pass the
        run timed (twice or more) at under half the probe's T(1) says so: no backend verifies two
        or more tokens in half a one-token pass (results/anatomy_auto)."""
        if self.prior is None or self.t1_doubted or self.n_seen[1]:
            return False
        wide = (np.arange(len(self.n_seen)) >= 2) & (self.n_seen >= 2)
        return bool(wide.any() and (self.t_seen[wide] / self.n_seen[wide]).min() < 0.5 * self.prior[1])
