"""specmac serve with a planted bug in its speculative step, for the endpoint checks to catch.

``PlantedPair`` is a Pair whose every server stream takes its acceptance rule from ``rule_for``
(the loop's ``rule=`` hook, as tests/lossless plants wrong rules); the real server (worker, app,
uvicorn) runs over it. Two plants: ``skew`` raises the probability of one token (after a step
that drafted, the token the rule emits is that token with probability ``p``), ``one_token``
changes the greedy output at one index (the target's runner-up there instead of its choice).
"""

from __future__ import annotations

import numpy as np

from specmac.api import Pair
from specmac.core.rejection import accept_greedy, accept_sampled


class PlantedPair(Pair):
    def __init__(self, target, sources, rule_for) -> None:
        super().__init__(target, sources)
        self.rule_for = rule_for

    def start(self, *args, **kwargs):
        stream = super().start(*args, **kwargs)
        stream.rule = self.rule_for(stream)
        return stream


def skew(token: int, p: float):
    """Sampled streams: after a step with drafts, the emitted correction or bonus is ``token`` with
    probability ``p``; greedy streams are left alone."""
    def rule_for(stream):
        if stream.greedy:
            return accept_greedy

        def rule(drafts, q, rows, rng):
            a, nxt = accept_sampled(drafts, q, rows, rng)
            return (a, token) if drafts and rng.random() < p else (a, nxt)
        return rule
    return rule_for


def one_token(index: int):
    """Greedy streams: the output token at ``index`` (0-based) is the target's second choice there."""
    def rule_for(stream):
        def rule(drafts, q, rows, rng=None):
            a, nxt = accept_greedy(drafts, q, rows, rng)
            j = index - stream.n_out  # the planted index within this step's tokens (0..a)
            if stream.greedy and 0 <= j <= a:
                return j, int(np.argsort(np.asarray(rows[j]))[-2])
            return a, nxt
        return rule
    return rule_for
