"""The speculative loop: drafter -> one batched target pass -> the rejection rule -> rewind.

Invariant between steps: the target's cache holds seq[:-1]; seq[-1] is the next token it scores.
With the drafter that drafts nothing (``PlainDecoding``) this is plain autoregressive decoding, so the
baseline and the speculative path share one sampler, one set of stop rules and one event stream.
Greedy or sampled is decided once, by ``params.greedy``: it picks the default rule, whether the
rule reads raw logit rows (the argmax; warping keeps it) or warped probabilities, and whether the
drafter returns q. The coupled sampler (``params.coupled``) is the greedy rule on rows perturbed by
the noise of their output positions (sampling.PerturbedRows); the drafter gets the same noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specmac.backends import BaseBackend
from specmac.core.drafters import Drafter
from specmac.core.policy import K_DEFAULT, FixedK, KPolicy
from specmac.core.rejection import AcceptRule, accept_greedy, accept_sampled
from specmac.core.sampling import GumbelNoise, PerturbedRows, SamplingParams, WarpedRows
from specmac.errors import BadTokens, ContextOverflow
from specmac.vocab import align_logits


@dataclass
class Event:
    """One step. kinds[i] of tokens[i]: accepted (draft kept), corrected (target's resample at
    the first rejection), bonus (after all drafts were kept) or target (no drafts this step).
    A step that stops at the context window before any pass has n_passes 0 and no tokens."""

    tokens: list[int]
    kinds: list[str]
    k: int  # drafts asked for
    n_drafted: int
    n_accepted: int
    t_draft: float
    t_target: float
    t_other: float
    finish_reason: str | None = None  # eos | length | context, on the last event
    t_prefill: float = 0.0  # prompt processing, on the first event
    n_passes: int = 1  # target passes this step made
    source: str = "none"  # what drafted this step (drafter.source), "none" for a step without drafts


@dataclass
class _Clock:
    t: float = field(default_factory=time.perf_counter)

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt


def speculative_steps(target: BaseBackend, drafter: Drafter, prompt: Sequence[int], *,
                      params: SamplingParams, max_tokens: int, rng: np.random.Generator,
                      k: int | KPolicy = K_DEFAULT, rule: AcceptRule | None = None, seed: int | None = None,
                      noise: Callable[[int, int], GumbelNoise] | None = None) -> Iterator[Event]:
    """Generate up to max_tokens tokens after ``prompt`` (EOS is not emitted). ``rule`` replaces
    the rejection rule (tests plant wrong rules here); it reads rows as ``params`` decides.
    The coupled sampler keys its noise by ``seed`` (drawn from ``rng`` when None); ``noise``,
    (seed, n_vocab) -> GumbelNoise, replaces its noise (tests plant wrong noise here)."""
    policy = FixedK(k) if isinstance(k, int) else k
    greedy, coupled = params.greedy, params.coupled
    rule = rule or (accept_greedy if greedy or coupled else accept_sampled)
    V, eos = target.vocab.size, target.vocab.eos_ids
    if coupled:
        key = int(rng.integers(2**63)) if seed is None else seed
        gumbel = (noise or GumbelNoise)(key, V)
    seq, n_out = list(prompt), 0
    if not seq:
        raise BadTokens("the prompt is empty: give at least one token of text", param="prompt")
    if len(seq) > target.n_ctx:
        raise ContextOverflow(f"the prompt has {len(seq)} tokens but the context window is "
                              f"{target.n_ctx}: shorten it or raise n_ctx", param="prompt")
    d = drafter.backend
    if drafter.drafts and d is not None and len(seq) >= d.n_ctx:  # it could never draft a token
        raise ContextOverflow(f"the prompt has {len(seq)} tokens but the draft's context window is "
                              f"{d.n_ctx}: shorten it or raise the draft's n_ctx", param="prompt")
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
                yield Event(tokens=[], kinds=[], k=0, n_drafted=0, n_accepted=0, t_draft=0.0,
                            t_target=0.0, t_other=0.0, finish_reason="context", t_prefill=t_prefill,
                            n_passes=0)
                return
            kk = max(0, min(policy.next_k(), max_tokens - n_out - 1, room, drafter.max_k(len(seq))))
            clock = _Clock()
            step = gumbel.step(n_out) if coupled else None  # row i: output position n_out + i
            extra = {"noise": step} if coupled else {}  # the rejection rule's drafters need no noise
            drafts, q = drafter.propose(seq, kk, params, rng, V, **extra) if kk else ([], None)
            t_draft = clock.lap()
            logits = target.score([seq[-1], *drafts])  # [len(drafts) + 1, n_logits]
            t_target = clock.lap()
            rows = align_logits(logits, V)
            if greedy:
                view = rows
            else:
                view = PerturbedRows(rows, params, step) if coupled else WarpedRows(rows, params)
            a, nxt = rule(drafts, q, view, rng)
            new = drafts[:a] + [nxt]
            kinds = ["accepted"] * a + ["corrected" if a < len(drafts) else "bonus" if drafts else "target"]
            stop = next((i for i, t in enumerate(new) if t in eos), None)
            if stop is not None:
                new, kinds = new[:stop], kinds[:stop]
            seq += new
            n_out += len(new)
            target.rewind(len(seq) - 1)
            done = "eos" if stop is not None else "length" if n_out >= max_tokens else None
            event = Event(tokens=new, kinds=kinds, k=kk, n_drafted=len(drafts), n_accepted=a,
                          t_draft=t_draft, t_target=t_target, t_other=clock.lap(), finish_reason=done,
                          t_prefill=t_prefill, source=drafter.source if drafts else "none")
            t_prefill = 0.0
            policy.update(event)
            yield event
            if done:
                return
    finally:  # also on an exception, or a consumer that stops early: caches hold seq[:-1]
        target.rewind(min(target.n_past, len(seq) - 1))
        drafter.trim(len(seq) - 1)
