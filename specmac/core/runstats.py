"""Statistics that fall out of the loop's events: acceptance, tokens per pass, time split."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specmac.core.loop import Event


@dataclass
class RunStats:
    """Accumulates events. Per-position acceptance is conditional: of the steps that reached
    draft position i (all earlier drafts accepted), the fraction that accepted it."""

    k: int | str | None = None
    n_tokens: int = 0
    n_target_passes: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    k_steps: list[int] = field(default_factory=list)  # the K each step drafted (K = auto: its choices)
    t_draft: float = 0.0
    t_target: float = 0.0
    t_other: float = 0.0
    t_prefill: float = 0.0  # prompt processing; not part of `seconds` (generation time)
    cached_tokens: int = 0  # tokens of the prompt the target already held (not processed again)
    draft_caught_up: int = 0  # tokens draft models processed to catch up with the text (their prefill)
    finish_reason: str | None = None
    sources: dict[str, int] = field(default_factory=dict)  # steps by what drafted them ("none": no drafts)
    # seconds of each step that drafted nothing (one one-token pass): what plain decoding's step cost
    # while this run ran, so a benchmark can tell the machine's speed from the drafts' (compare)
    plain_steps: list[float] = field(default_factory=list)

    def add(self, e: Event) -> None:
        if e.n_passes:
            self.sources[e.source] = self.sources.get(e.source, 0) + 1
        self.t_prefill += e.t_prefill
        self.cached_tokens += e.n_cached
        self.draft_caught_up += e.n_caught_up
        self.n_tokens += len(e.tokens)
        self.n_target_passes += e.n_passes
        self.n_drafted += e.n_drafted
        self.n_accepted += e.n_accepted
        if e.tokens:
            self.k_steps.append(e.k)
        grow = e.n_drafted - len(self.reached)
        if grow > 0:
            self.reached += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(min(e.n_accepted + 1, e.n_drafted)):
            self.reached[i] += 1
            self.accepted_at[i] += i < e.n_accepted
        self.t_draft += e.t_draft
        self.t_target += e.t_target
        self.t_other += e.t_other
        if e.n_drafted == 0 and e.n_passes == 1:  # the pass that found EOS too (it writes no token)
            self.plain_steps.append(e.t_draft + e.t_target + e.t_other)
        self.finish_reason = e.finish_reason or self.finish_reason

    @property
    def seconds(self) -> float:
        return self.t_draft + self.t_target + self.t_other

    @property
    def acceptance_rate(self) -> float | None:
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def tokens_per_target_pass(self) -> float | None:
        return self.n_tokens / self.n_target_passes if self.n_target_passes else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached)]

    @property
    def tokens_per_second(self) -> float | None:
        return self.n_tokens / self.seconds if self.seconds > 0 else None

    @property
    def plain_step_seconds(self) -> float | None:
        """The mean step that drafted nothing (None: no such step): a stall costs every kind of
        step alike in proportion to its length, so the mean, not the median, is the unit that the
        run's other steps are measured in (``specmac.compare.categories.normalised_speedup``)."""
        return float(np.mean(self.plain_steps)) if self.plain_steps else None

    def to_dict(self, speculative: bool = True) -> dict:
        s = self.seconds
        return {
            "k": self.k,
            "n_tokens": self.n_tokens,
            "n_target_passes": self.n_target_passes,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": self.acceptance_rate if speculative else None,
            "tokens_per_target_pass": self.tokens_per_target_pass if speculative else None,
            "per_position_acceptance": self.per_position_acceptance if speculative else None,
            "tokens_per_second": self.tokens_per_second,
            "seconds": s,
            "prefill_seconds": self.t_prefill,
            "cached_tokens": self.cached_tokens,
            "draft_caught_up_tokens": self.draft_caught_up,
            "time_split": {"draft": self.t_draft, "verify": self.t_target, "other": self.t_other},
            "finish_reason": self.finish_reason,
            "steps_by_source": dict(self.sources),
            "k_steps": list(self.k_steps),
            "plain_step_seconds": self.plain_step_seconds,
            "n_plain_steps": len(self.plain_steps),
        }
