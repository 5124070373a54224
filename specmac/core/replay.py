"""Replaying a K policy on a recorded greedy acceptance string: every policy decodes the same text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specmac.core.loop import Event


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
        t_pass = t_target[k]
        new = min(a + 1, n_tokens - out)
        if not isinstance(policy, int):
            policy.update(Event(tokens=[0] * new, kinds=["accepted"] * new, k=k, n_drafted=k, n_accepted=a,
                                t_draft=t_draft, t_target=t_pass, t_other=t_other))
        seconds += t_draft + t_pass + t_other
        pos, out, caught_up = pos + new, out + new, 0 < k == a
    return n_tokens / seconds
