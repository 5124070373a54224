"""The speculative loop: sources propose -> the planner chooses -> one batched target pass -> the
rejection rule -> rewind -> the outcome, reported once to the planner.

Invariant between steps: the target's cache holds seq[:-1]; seq[-1] is the next token it scores.
With no sources this is plain autoregressive decoding, so the baseline and the speculative path
share one sampler, one set of stop rules and one event stream. Greedy or sampled is decided once,
by ``params.greedy``: it picks the default rule, whether the rule reads raw logit rows (the argmax;
warping keeps it) or warped probabilities, and whether a draft model returns q (a free source's q
is one-hot). The coupled sampler (``params.coupled``) is the greedy rule on rows perturbed by the
noise of their output positions (sampling.PerturbedRows); a draft model gets the same noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from specmac.backends import BaseBackend
from specmac.core.drafters import Drafter, OneHotRows, common_prefix
from specmac.core.planner import K_DEFAULT, Planner
from specmac.core.rejection import AcceptRule, accept_greedy, accept_sampled
from specmac.core.sampling import GumbelNoise, PerturbedRows, SamplingParams, WarpedRows
from specmac.errors import BadTokens, ContextOverflow
from specmac.vocab import align_logits


@dataclass
class Event:
    """One step. kinds[i] of tokens[i]: accepted (a draft), corrected (target's resample at the
    first rejection), bonus (after all drafts were accepted) or target (no drafts this step).
    A step that stops at the context window before any pass has n_passes 0 and no tokens."""

    tokens: list[int]
    kinds: list[str]
    k: int  # drafts verified (the width the planner chose)
    n_drafted: int
    n_accepted: int
    t_draft: float
    t_target: float
    t_other: float
    finish_reason: str | None = None  # eos | length | context, on the last event
    t_prefill: float = 0.0  # prompt processing, on the first event
    n_passes: int = 1  # target passes this step made
    n_cached: int = 0  # tokens of the prompt the target already held (on the first event)
    source: str = "none"  # the source that drafted this step (its name), "none" for a step without drafts


class _Clock:
    def __init__(self, now: Callable[[], float]) -> None:
        self.now, self.t = now, now()

    def lap(self) -> float:
        t = self.now()
        dt, self.t = t - self.t, t
        return dt


def speculative_steps(target: BaseBackend, planner: Planner | Sequence[Drafter], prompt: Sequence[int], *,
                      params: SamplingParams, max_tokens: int, rng: np.random.Generator,
                      rule: AcceptRule | None = None, seed: int | None = None,
                      noise: Callable[[int, int], GumbelNoise] | None = None,
                      clock: Callable[[], float] = time.perf_counter, reuse: bool = True) -> Iterator[Event]:
    """Generate up to max_tokens tokens after ``prompt`` (EOS is not emitted). ``planner`` chooses
    each step's source (of its ``sources``) and width; a list of sources is planned with
    ``K_DEFAULT`` drafts a step (none: plain decoding). ``rule`` replaces
    the rejection rule (tests plant wrong rules here); it reads rows as ``params`` decides.
    The coupled sampler keys its noise by ``seed`` (drawn from ``rng`` when None); ``noise``,
    (seed, n_vocab) -> GumbelNoise, replaces its noise (tests plant wrong noise here). ``clock``
    times the steps (a replay on recorded costs gives a simulated one). With ``reuse`` the target and
    the sources keep what they hold of the prompt (a conversation's earlier turns: the target
    processes only the rest); without it every cache starts empty."""
    clock_fn = clock
    if not isinstance(planner, Planner):
        planner = Planner(planner, k=K_DEFAULT)
    sources = planner.sources
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
    free = [i for i, s in enumerate(sources) if s.backend is None]
    models = [i for i, s in enumerate(sources) if s.backend is not None]
    for i in models:
        if len(seq) >= sources[i].backend.n_ctx:  # it could never draft a token
            raise ContextOverflow(f"the prompt has {len(seq)} tokens but the draft's context window is "
                                  f"{sources[i].backend.n_ctx}: shorten it or raise the draft's n_ctx",
                                  param="prompt")
    record = planner.record(max_tokens)
    held = target.held if reuse else None
    n_cached = common_prefix(held, seq, len(seq) - 1) if held is not None else 0
    if held is None:  # not asked to reuse, or the cache was changed outside the contract
        target.reset()
    elif n_cached < target.n_past:
        target.rewind(n_cached)
    for s in sources:
        s.begin(seq if reuse else [])
    try:
        clock = _Clock(clock_fn)
        if len(seq) - 1 > n_cached:
            target.prefill(seq[n_cached:-1])
        t_prefill = clock.lap()
        while n_out < max_tokens:
            room = target.n_ctx - len(seq)  # a step adds k + 1 rows to len(seq) - 1 cached
            if room < 0:
                yield Event(tokens=[], kinds=[], k=0, n_drafted=0, n_accepted=0, t_draft=0.0,
                            t_target=0.0, t_other=0.0, finish_reason="context", t_prefill=t_prefill,
                            n_passes=0, n_cached=n_cached)
                return
            kk = max(0, min(max_tokens - n_out - 1, room, *(sources[i].max_k(len(seq)) for i in models)))
            clock = _Clock(clock_fn)
            offers = [(i, *sources[i].propose(seq, kk)) for i in free] if kk else []
            offers = [o for o in offers if o[1]]
            behind = {i: sources[i].behind(seq) for i in models} if kk else {}
            choice = planner.choose(record, offers, behind, kk) if kk else (None, 0)
            src, width = choice
            step = gumbel.step(n_out) if coupled else None  # row i: output position n_out + i
            ext = None
            if src is None:
                drafts, q = [], None
            elif sources[src].backend is None:
                drafts = next(o[1] for o in offers if o[0] == src)[:width]
                q = None if greedy or coupled else OneHotRows(drafts, V)
            else:
                drafts, q = sources[src].draft(seq, width, params, rng, V, noise=step)
                # the free sources' continuation of the model's drafts, verified in the same pass if it pays
                more = [(i, *sources[i].propose(seq + drafts, kk - width)) for i in free if kk > width]
                ext = planner.extend(record, [o for o in more if o[1]], choice, behind[src])
                if ext is not None:
                    drafts = drafts + ext[1]
                    q = None if q is None else [*q, *OneHotRows(ext[1], V)]
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
            n0 = len(seq)
            seq += new
            n_out += len(new)
            target.rewind(len(seq) - 1)
            if src is not None and sources[src].backend is not None:
                sources[src].trim(n0 + a)  # the draft's cache: what the target accepted of it
            done = "eos" if stop is not None else "length" if n_out >= max_tokens else None
            t_rule = clock.lap()
            planner.observe(record, offers, choice, drafts, drafts[:a] + [nxt], behind.get(src, 0),
                            t_draft, t_target + t_rule, ext)
            t_other = t_rule + clock.lap()  # the rule, the rewinds and the planner's learning
            yield Event(tokens=new, kinds=kinds, k=len(drafts), n_drafted=len(drafts), n_accepted=a,
                        t_draft=t_draft, t_target=t_target, t_other=t_other, finish_reason=done,
                        t_prefill=t_prefill, source=sources[src].name if drafts else "none",
                        n_cached=n_cached)
            t_prefill, n_cached = 0.0, 0
            if done:
                return
    finally:  # also on an exception, or a consumer that stops early: caches hold seq[:-1]
        target.rewind(min(target.n_past, len(seq) - 1))
        for s in sources:
            s.trim(len(seq) - 1)
