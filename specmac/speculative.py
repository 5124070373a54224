"""The speculative loop: drafter -> one batched target pass -> verify -> rewind. Yields events.

Invariant between steps: the target's cache holds seq[:-1]; seq[-1] is the next token it scores.
With the ``Drafter`` that drafts nothing this is plain autoregressive decoding, so the baseline
and the speculative path share one sampler, one set of stop rules and one event stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specmac.backends import BaseBackend
from specmac.drafters import Drafter
from specmac.errors import ContextOverflow
from specmac.sampling import SamplingParams, WarpedRows
from specmac.verify import VerifyRule, verify_greedy, verify_sampled
from specmac.vocab import align_logits


@dataclass
class Event:
    """One step. kinds[i] of tokens[i]: accepted (draft kept), corrected (target's resample at
    the first rejection), bonus (after all drafts were kept) or target (no drafts this step)."""

    tokens: list[int]
    kinds: list[str]
    k: int  # drafts asked for
    n_drafted: int
    n_accepted: int
    t_draft: float
    t_verify: float
    t_other: float
    finish_reason: str | None = None  # eos | length | context, on the last event
    t_prefill: float = 0.0  # prompt processing, on the first event


class FixedK:
    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    def update(self, event: Event) -> None:
        pass


@dataclass
class _Clock:
    t: float = field(default_factory=time.perf_counter)

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt


def speculative_steps(target: BaseBackend, drafter: Drafter, prompt: Sequence[int], *,
                      params: SamplingParams, max_tokens: int, rng: np.random.Generator,
                      k: int | FixedK = 4, rule: VerifyRule | None = None) -> Iterator[Event]:
    """Generate up to max_tokens tokens after ``prompt`` (EOS is not emitted)."""
    policy = FixedK(k) if isinstance(k, int) else k
    rule = rule or (verify_greedy if params.greedy else verify_sampled)
    V, eos = target.vocab.size, target.vocab.eos_ids
    seq, n_out = list(prompt), 0
    if not seq:
        raise ContextOverflow("the prompt is empty: give at least one token of text")
    if len(seq) > target.n_ctx:
        raise ContextOverflow(f"the prompt has {len(seq)} tokens but the context window is "
                              f"{target.n_ctx}: shorten it or raise n_ctx")
    target.reset()
    drafter.trim(0)
    try:
        clock = _Clock()
        if len(seq) > 1:
            target.prefill(seq[:-1])
        t_prefill = clock.lap()
        while n_out < max_tokens:
            room = target.n_ctx - len(seq)  # a step adds k + 1 rows to len(seq) - 1 cached
            if room < 0:
                yield Event([], [], 0, 0, 0, 0.0, 0.0, 0.0, "context", t_prefill)
                return
            kk = max(0, min(policy.next_k(), max_tokens - n_out - 1, room, drafter.max_k(len(seq))))
            clock = _Clock()
            drafts, q = drafter.propose(seq, kk, params, rng, V) if kk else ([], None)
            t_draft = clock.lap()
            logits = target.score([seq[-1], *drafts])  # [len(drafts) + 1, n_logits]
            t_verify = clock.lap()
            rows = align_logits(logits, V)
            # the greedy rule reads only the argmax, which warping keeps: no probabilities needed
            a, nxt = rule(drafts, q, rows if rule is verify_greedy else WarpedRows(rows, params), rng)
            new = drafts[:a] + [nxt]
            kinds = ["accepted"] * a + ["corrected" if a < len(drafts) else "bonus" if drafts else "target"]
            stop = next((i for i, t in enumerate(new) if t in eos), None)
            if stop is not None:
                new, kinds = new[:stop], kinds[:stop]
            seq += new
            n_out += len(new)
            target.rewind(len(seq) - 1)
            done = "eos" if stop is not None else "length" if n_out >= max_tokens else None
            event = Event(new, kinds, kk, len(drafts), a, t_draft, t_verify, clock.lap(), done, t_prefill)
            t_prefill = 0.0
            policy.update(event)
            yield event
            if done:
                return
    finally:  # also on an exception, or a consumer that stops early: caches hold seq[:-1]
        target.rewind(min(target.n_past, len(seq) - 1))
        drafter.trim(len(seq) - 1)
