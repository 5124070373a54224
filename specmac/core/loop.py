"""The speculative loop: sources propose -> the planner chooses -> one batched target pass -> the
rejection rule -> rewind -> the outcome, reported once to the planner.

A ``Stream`` is one sequence's generation, a step at a time: what its next pass scores
(``ask``, then ``draft``) and what the scored rows make of it (``take``). ``speculative_steps``
drives one stream on its target; ``pass_streams`` drives several through one pass of a target that
holds several sequences (``BaseBackend.lanes``), the server's scheduler calling it between
admissions. One stream alone takes the same steps either way.

Invariant between steps: the target's cache holds seq[:-1]; seq[-1] is the next token it scores.
With no sources this is plain autoregressive decoding, so the baseline and the speculative path
share one sampler, one set of stop rules and one event stream. Greedy or sampled is decided once,
by ``params.greedy``: it picks the default rule, whether the rule reads raw logit rows (the argmax;
warping keeps it) or warped probabilities, and whether a draft model returns q (a free source's q
is one-hot). The coupled sampler (``params.coupled``) is the greedy rule on rows perturbed by the
noise of their output positions (sampling.PerturbedRows); a draft model gets the same noise, so a
stream's text depends on its seed alone, whatever else shares its passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specmac.backends import BaseBackend
from specmac.core.drafters import Drafter, OneHotRows, common_prefix
from specmac.core.planner import K_DEFAULT, Costs, Offer, Planner, Record
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
    n_batch: int = 1  # sequences that shared the step's pass (itself included)
    n_caught_up: int = 0  # tokens the drafting model processed before drafting (text it had not seen)


@dataclass
class Ask:
    """What the planner weighs for one stream's next step (``Planner.plan``): its record, the free
    sources' proposals, each model source's tokens behind, and the most drafts the step may verify."""

    record: Record
    offers: list[Offer] = field(default_factory=list)
    behind: Mapping[int, int] = field(default_factory=dict)
    room: int = 0


FOLD = 64  # prompt tokens at most that a stream's first step reads in its own pass


class _Clock:
    def __init__(self, now: Callable[[], float]) -> None:
        self.now, self.t = now, now()

    def lap(self) -> float:
        dt, self.t = (t := self.now()) - self.t, t
        return dt


class Stream:
    """One sequence's generation on ``target`` (a backend or one of its lanes), planned by
    ``planner`` over ``sources`` (default the planner's; a lane's own, in the planner's order).
    Arguments as ``speculative_steps``. The prompt tokens the target still has to process are
    ``pending`` (the caller prefills them, all at once or in chunks, and says so with
    ``prefilled``); then each step is ``ask`` -> the planner's choice -> ``draft`` -> a pass over
    the tokens it returns -> ``take``. ``close`` leaves the caches holding the text (any exit)."""

    def __init__(self, target: BaseBackend, planner: Planner, prompt: Sequence[int], *,
                 params: SamplingParams, max_tokens: int, rng: np.random.Generator,
                 sources: Sequence[Drafter] | None = None, rule: AcceptRule | None = None,
                 seed: int | None = None, noise: Callable[[int, int], GumbelNoise] | None = None,
                 clock: Callable[[], float] = time.perf_counter, reuse: bool = True) -> None:
        self.target, self.planner, self.params, self.rng = target, planner, params, rng
        self.sources = planner.sources if sources is None else list(sources)
        self.max_tokens, self.now = max_tokens, clock
        self.greedy, self.coupled = params.greedy, params.coupled
        self.rule = rule or (accept_greedy if self.greedy or self.coupled else accept_sampled)
        self.V, self.eos = target.vocab.size, target.vocab.eos_ids
        if self.coupled:
            key = int(rng.integers(2**63)) if seed is None else seed
            self.gumbel = (noise or GumbelNoise)(key, self.V)
        self.seq, self.n_out = list(prompt), 0
        seq = self.seq
        if not seq:
            raise BadTokens("the prompt is empty: give at least one token of text", param="prompt")
        if len(seq) > target.n_ctx:
            raise ContextOverflow(f"the prompt has {len(seq)} tokens but the context window is "
                                  f"{target.n_ctx}: shorten it or raise n_ctx", param="prompt")
        self.free = [i for i, s in enumerate(self.sources) if s.backend is None]
        self.models = [i for i, s in enumerate(self.sources) if s.backend is not None]
        for i in self.models:
            if len(seq) >= self.sources[i].backend.n_ctx:  # it could never draft a token
                raise ContextOverflow(f"the prompt has {len(seq)} tokens but the draft's context window "
                                      f"is {self.sources[i].backend.n_ctx}: shorten it or raise the draft's "
                                      "n_ctx", param="prompt")
        self.record = planner.record(max_tokens)
        held = target.held if reuse else None
        self.n_cached = common_prefix(held, seq, len(seq) - 1) if held is not None else 0
        if held is None:  # not asked to reuse, or the cache was changed outside the contract
            target.reset()
        elif self.n_cached < target.n_past:
            target.rewind(self.n_cached)
        for s in self.sources:
            s.begin(seq if reuse else [])
        self.pending = seq[self.n_cached:-1]  # the prompt's tokens the target has still to process
        self.t_prefill, self._t_ask, self.done = 0.0, 0.0, False
        self._step: tuple = ()
        self._clock: _Clock | None = None

    def prefilled(self, n: int, seconds: float) -> None:
        """The target processed the first n tokens of ``pending`` in ``seconds``."""
        self.pending = self.pending[n:]
        self.t_prefill += seconds

    def ask(self) -> Ask | Event:
        """The next step's ask; an Event (the last) where the context window is full."""
        self._clock = clock = _Clock(self.now)
        seq, sources = self.seq, self.sources
        room = self.target.n_ctx - len(seq)  # a step adds k + 1 rows to len(seq) - 1 cached
        if room < 0:
            self.done = True
            return Event(tokens=[], kinds=[], k=0, n_drafted=0, n_accepted=0, t_draft=0.0,
                         t_target=0.0, t_other=0.0, finish_reason="context", t_prefill=self.t_prefill,
                         n_passes=0, n_cached=self.n_cached)
        kk = max(0, min(self.max_tokens - self.n_out - 1, room,
                        *(sources[i].max_k(len(seq)) for i in self.models)))
        if not kk:
            ask = Ask(self.record)
        else:
            offers = [(i, *sources[i].propose(seq, kk)) for i in self.free]
            behind = {i: sources[i].behind(seq) for i in self.models}
            ask = Ask(self.record, [o for o in offers if o[1]], behind, kk)
        self._t_ask = clock.lap()  # the proposals: part of the step's drafting
        return ask

    def drafting(self, choice: tuple[int | None, int]) -> Generator | None:
        """The chosen model's drafting, its passes left to the caller (``ModelDrafter.drafting``)."""
        src, width = choice
        if src is None or self.sources[src].backend is None:
            return None
        noise = self.gumbel.step(self.n_out) if self.coupled else None
        return self.sources[src].drafting(self.seq, width, self.params, self.rng, self.V, noise=noise)

    def draft(self, ask: Ask, choice: tuple[int | None, int], alone: bool = True,
              drafted: tuple[list[int], Any, float] | None = None) -> list[int]:
        """Draft the chosen source's proposal; -> the tokens the pass scores for this stream
        ([last, *drafts]). ``alone``: the pass is this stream's alone, so a free source's
        continuation of a model's drafts may widen it (``Planner.extend``); else the step's drafting
        time is its own. ``drafted``: the model's drafts, q and seconds, drafted with others'."""
        seq, sources, V = self.seq, self.sources, self.V
        if not alone:
            self._clock = _Clock(self.now)
        src, width = choice
        step = self.gumbel.step(self.n_out) if self.coupled else None  # row i: output position n_out + i
        ext = None
        if src is None:
            drafts, q = [], None
        elif sources[src].backend is None:
            drafts = next(o[1] for o in ask.offers if o[0] == src)[:width]
            q = None if self.greedy or self.coupled else OneHotRows(drafts, V)
        else:
            if drafted is None:
                drafts, q = sources[src].draft(seq, width, self.params, self.rng, V, noise=step)
            else:
                drafts, q, seconds = drafted
                self._t_ask += seconds
            more = [(i, *sources[i].propose(seq + drafts, ask.room - width))
                    for i in self.free if ask.room > width] if alone else []
            # the free sources' continuation of the model's drafts, verified in the same pass if it pays
            ext = self.planner.extend(self.record, [o for o in more if o[1]], choice, ask.behind[src])
            if ext is not None:
                drafts = drafts + ext[1]
                q = None if q is None else [*q, *OneHotRows(ext[1], V)]
        t_draft = self._t_ask + self._clock.lap()
        self._step = (ask, choice, drafts, q, ext, step, t_draft, drafted is not None)
        return [seq[-1], *drafts]

    def take(self, logits: np.ndarray, *, t_pass: float | None = None, n_batch: int = 1) -> Event:
        """The pass's rows for this stream's tokens -> the step's event. ``t_pass``: the seconds of
        a pass shared with other streams (the caller reports its cost, ``Costs.observe``);
        None: the pass was this stream's alone, timed since ``draft`` and reported here."""
        ask, choice, drafts, q, ext, step, t_draft, shared = self._step
        t_target = self._clock.lap() if t_pass is None else t_pass
        if t_pass is not None:
            self._clock = _Clock(self.now)
        seq, sources, src = self.seq, self.sources, choice[0]
        rows = align_logits(logits, self.V)
        if self.greedy:
            view = rows
        else:
            view = PerturbedRows(rows, self.params, step) if self.coupled else WarpedRows(rows, self.params)
        a, nxt = self.rule(drafts, q, view, self.rng)
        new = drafts[:a] + [nxt]
        kinds = ["accepted"] * a + ["corrected" if a < len(drafts) else "bonus" if drafts else "target"]
        stop = next((i for i, t in enumerate(new) if t in self.eos), None)
        if stop is not None:
            new, kinds = new[:stop], kinds[:stop]
        n0 = len(seq)
        seq += new
        self.n_out += len(new)
        self.target.rewind(len(seq) - 1)
        if src is not None and sources[src].backend is not None:
            sources[src].trim(n0 + a)  # the draft's cache: what the target accepted of it
        done = "eos" if stop is not None else "length" if self.n_out >= self.max_tokens else None
        t_rule = self._clock.lap()
        self.planner.observe(self.record, ask.offers, choice, drafts, drafts[:a] + [nxt],
                             ask.behind.get(src, 0), t_draft, t_target + t_rule, ext,
                             timed=t_pass is None, shared=shared, n_batch=n_batch)
        t_other = t_rule + self._clock.lap()  # the rule, the rewinds and the planner's learning
        event = Event(tokens=new, kinds=kinds, k=len(drafts), n_drafted=len(drafts), n_accepted=a,
                      t_draft=t_draft, t_target=t_target, t_other=t_other, finish_reason=done,
                      t_prefill=self.t_prefill, source=sources[src].name if drafts else "none",
                      n_cached=self.n_cached, n_batch=n_batch,
                      n_caught_up=ask.behind.get(src, 0) if drafts else 0)
        self.t_prefill, self.n_cached, self.done = 0.0, 0, done is not None
        return event

    def close(self) -> None:
        """The caches hold seq[:-1] (also after an exception or an early stop); the planner settles it."""
        self.planner.settle(self.record)
        self.target.rewind(min(self.target.n_past, len(self.seq) - 1))
        for s in self.sources:
            s.trim(len(self.seq) - 1)


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
    if not isinstance(planner, Planner):
        planner = Planner(planner, k=K_DEFAULT)
    s = Stream(target, planner, prompt, params=params, max_tokens=max_tokens, rng=rng, rule=rule,
               seed=seed, noise=noise, clock=clock, reuse=reuse)
    try:
        if s.pending:
            c = _Clock(clock)
            target.prefill(s.pending)
            s.prefilled(len(s.pending), c.lap())
        while not s.done:
            ask = s.ask()
            if isinstance(ask, Event):
                yield ask
                return
            choice = planner.choose(ask.record, ask.offers, ask.behind, ask.room) if ask.room else (None, 0)
            tokens = s.draft(ask, choice)
            logits = target.score(tokens)  # [len(tokens), n_logits]
            yield s.take(logits)
    finally:
        s.close()


def pass_streams(target: BaseBackend, streams: Sequence[Stream], planner: Planner,
                 chunks: Mapping[int, int] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> list[Event | Exception | None]:
    """One pass of ``target`` (a lane of the backend the streams run on) for several streams:
    stream i with a prompt still ``pending`` has its next ``chunks[i]`` prompt tokens processed
    (default all); the others take a step, their widths planned together on ``planner``'s costs
    (``Planner.plan``: the pass's cheap width shared between their drafts). -> each stream's event,
    None for a stream that only read its prompt, or the error that ended it (its drafting or its
    rule: the others go on); an error of the pass itself is raised."""
    chunks = chunks or {}
    out: list[Event | Exception | None] = [None] * len(streams)
    stepping, asks = [], []
    # a prompt's last few tokens are read in its first step's pass (as llama.cpp samples a turn's
    # first token from the pass that reads it): one pass less to the first token
    fold = {i for i, s in enumerate(streams)
            if s.pending and len(s.pending) <= FOLD and chunks.get(i, len(s.pending)) >= len(s.pending)}
    for i, s in enumerate(streams):
        if s.done or (s.pending and i not in fold):
            continue
        try:
            ask = s.ask()
        except Exception as e:
            out[i] = e
            continue
        if isinstance(ask, Event):
            out[i] = ask
        else:
            stepping.append(i)
            asks.append(ask)
    if len(asks) > 1:
        choices = planner.plan([(a.record, a.offers, a.behind, a.room) for a in asks], target.forwards)
    else:  # alone: its own planner's choice, as speculative_steps makes it
        choices = [a.record.owner.choose(a.record, a.offers, a.behind, a.room) if a.room
                   else (None, 0) for a in asks]
    items, scored = [], []
    drafted = _draft_together([(i, streams[i], c) for i, c in zip(stepping, choices)], clock, planner.costs)
    for i, a, c in zip(stepping, asks, choices):
        try:
            if isinstance(drafted.get(i), Exception):
                raise drafted[i]
            tokens = streams[i].draft(a, c, alone=len(asks) == 1, drafted=drafted.get(i))
            # the rows of the step's tokens only: a folded prompt's own are never read
            items.append((streams[i].target, list(streams[i].pending) + tokens, len(tokens)))
            scored.append(i)
        except Exception as e:
            out[i] = e
    fills = [(i, n) for i, s in enumerate(streams) if s.pending and not s.done and i not in fold
             and (n := chunks.get(i, len(s.pending))) > 0]
    items += [(streams[i].target, streams[i].pending[:n], False) for i, n in fills]
    if not items:
        return out
    c = _Clock(clock)
    rows = target.score_many(items)
    t = c.lap()
    for (_, _, n), i, r in zip(items, scored, rows):
        try:
            streams[i].prefilled(len(streams[i].pending), 0.0)  # read in the step's pass, timed as it
            out[i] = streams[i].take(r[len(r) - n:], t_pass=t, n_batch=len(scored))
        except Exception as e:
            out[i] = e
    for i, n in fills:
        streams[i].prefilled(n, t)
    if not fills and len(shape := target.forwards([len(x) for _, x, _ in items])) == 1:
        # one forward of steps alone: its cost at its width refines T, the loop's work on its rows
        # included (as a step alone counts it): a wide pass of several streams has many rows to check
        planner.costs.observe(shape[0], t + c.lap())
    return out


def _draft_together(chosen: Sequence[tuple[int, Stream, tuple[int | None, int]]],
                    clock: Callable[[], float], costs: Costs) -> dict[int, tuple | Exception]:
    """Streams whose choice is a model that scores several lanes in one pass (``can_batch``): one
    pass of it per draft position for all, the text each has not seen first, each such pass's
    seconds told to ``costs`` with its number of lanes. -> stream index -> (drafts, q, the shared
    drafting's seconds) or its error; a stream alone on its model: none."""
    groups: dict[str, list] = {}
    for i, s, c in chosen:
        src = c[0]
        if src is not None and s.sources[src].backend is not None and s.sources[src].backend.can_batch:
            groups.setdefault(s.sources[src].name, []).append((i, s, c))
    out: dict[int, tuple | Exception] = {}
    for name, group in ((x, g) for x, g in groups.items() if len(g) > 1):
        lanes = {i: s.sources[c[0]].backend for i, s, c in group}
        lead = lanes[group[0][0]]
        t = _Clock(clock)
        steps, feeds, done = {}, {}, {}
        for i, s, c in group:  # a stream whose drafting fails ends alone
            try:
                feeds[i] = next(steps.setdefault(i, s.drafting(c)))
            except Exception as e:
                out[i] = e
        try:
            text = [(lanes[i], f[:-1], False) for i, f in feeds.items() if len(f) > 1]
            if text:
                lead.score_many(text)
            feeds = {i: f[-1:] for i, f in feeds.items()}
            while feeds:
                keys, t0 = list(feeds), clock()
                rows = lead.score_many([(lanes[i], feeds[i], True) for i in keys])
                costs.observe_draft(name, 1, clock() - t0, lanes=len(keys))
                for i, r in zip(keys, rows):
                    try:
                        feeds[i] = steps[i].send(r[-1])
                    except StopIteration as stop:
                        done[i] = stop.value
                        del feeds[i]
                    except Exception as e:
                        out[i] = e
                        del feeds[i]
        except Exception as e:  # the shared pass failed: each stream still drafting ends with it
            out.update({i: e for i in feeds})
            continue
        seconds = t.lap()
        out.update({i: (*v, seconds) for i, v in done.items()})
    return out
