"""The Python API: load a draft/target pair once, then generate or stream from it.

    >>> import specmac
    >>> out = specmac.generate("hello", target="synthetic", draft="synthetic", k=4, seed=0)
    >>> out.text, out.stats.acceptance_rate
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from specmac.backends import BaseBackend, load_backend
from specmac.core.costs import K_LIMIT, K_MAX, K_MODEL
from specmac.core.drafters import Drafter, common_prefix
from specmac.core.loop import Event, Stream, speculative_steps
from specmac.core.planner import K_DEFAULT, Planner
from specmac.core.prediction import PredictionDrafter
from specmac.core.rejection import AcceptRule
from specmac.core.runstats import RunStats
from specmac.core.sampling import SamplingParams
from specmac.core.sources import check_draft_args, load_sources
from specmac.errors import BadOption
from specmac.store import Entry, SequenceStore

if TYPE_CHECKING:
    from specmac.tuning.timing import Progress

MAX_TOKENS = 128  # tokens a run writes unless told otherwise
FIT_EVERY_S = 1.0  # a run refits the backends' CPU threads to the load unless the last fit is this recent
REUSE_COSTS_S = 60.0  # k="auto" reuses the pair's costs (refined by its runs) if measured this recently
# tokens a prompt must cut of the live sequence for it to be saved in the store (fewer: a chat
# template's end of turn, cheaper to recompute than to copy the cache)
SAVE_FROM = 8


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    stats: RunStats
    speculative: bool
    prediction: dict | None = None  # accepted/rejected prediction tokens, with a prediction

    def to_dict(self) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids,
               **self.stats.to_dict(speculative=self.speculative)}
        if self.prediction is not None:
            out["prediction"] = self.prediction
        return out


@dataclass
class Lane:
    """One sequence a pair holds among several (``Pair.lanes``): a lane of the target and the
    pair's sources for it (each draft model on a lane of its own)."""

    target: BaseBackend
    sources: list[Drafter]
    used: float = 0.0  # when a generation last started on it (time.monotonic)

    def backends(self) -> dict[str, BaseBackend]:
        """The backends whose caches make up the sequence: "target", then each draft model's name."""
        return {"target": self.target, **{s.name: s.backend for s in self.sources
                                          if s.backend is not None and s.backend is not self.target}}


class Pair:
    """A target backend and its draft sources (none, a model on any backend, prompt lookup, or both).
    Consecutive generations reuse what the caches hold of the next prompt; with a ``store``
    (``specmac.store.SequenceStore``) several conversations do, each its own."""

    def __init__(self, target: BaseBackend, sources: Drafter | Sequence[Drafter] = (),
                 store: SequenceStore | None = None) -> None:
        self.target, self.store = target, store
        self.sources = [sources] if isinstance(sources, Drafter) else list(sources)
        self.threads: dict[str, str] = {}  # role -> the CPU threads the last fit chose, and why
        self._fitted_at = -FIT_EVERY_S
        # k="auto": (width, drafts, threads) -> (when measured, its costs, where they are kept)
        self._auto: dict[tuple, tuple[float, Any, Any]] = {}
        self._lanes: list[Lane] = []
        self._asked = 0  # the lanes asked for when they were made (fewer were made: all it can hold)

    @property
    def drafts(self) -> dict[str, BaseBackend]:
        """The draft models, by source name (free sources have none)."""
        return {s.name: s.backend for s in self.sources if s.backend is not None}

    def _backends(self) -> dict[str, BaseBackend]:
        out = {"target": self.target}
        for name, b in self.drafts.items():
            if b is not self.target:
                out["draft" if len(self.drafts) == 1 else f"draft {name}"] = b
        return out

    def fit_threads(self) -> dict[str, str]:
        """Fit each backend's CPU threads to how busy the machine is now (before every run, at most
        once a FIT_EVERY_S): -> {role: threads and why} for the backends that have a count to fit."""
        now = time.monotonic()
        if now - self._fitted_at >= FIT_EVERY_S:  # never where held (``plain(same_threads=True)``)
            self._fitted_at = now
            notes = {role: b.fit_threads() for role, b in self._backends().items()}
            self.threads = {role: why for role, why in notes.items() if why}
        return self.threads

    def threads_now(self) -> dict[str, str]:
        """{role: the thread count now and why}, a refit during the last run included."""
        notes = {role: b.threads_note for role, b in self._backends().items()}
        return {role: why for role, why in notes.items() if why and role in self.threads}

    @classmethod
    def load(cls, target: str = "synthetic", draft: str | None = None, *,
             target_model: str | None = None, draft_model: str | None = None,
             target_options: dict[str, Any] | None = None,
             draft_options: dict[str, Any] | None = None) -> Pair:
        """Load the target, check the draft's vocabulary (before its weights where the backend
        can read a tokenizer alone), then load the draft."""
        check_draft_args(draft, draft_model, draft_options)  # before any weights load
        tb = load_backend(target, target_model, target_options, role="target")
        return cls(tb, load_sources(draft, draft_model, draft_options, target_vocab=tb.vocab))

    def plain(self, same_threads: bool = False) -> Pair:
        """The same target with no sources: plain decoding. ``same_threads``: its runs keep the CPU
        threads the target runs on now instead of fitting them to the load again (a baseline
        measured like the run before it)."""
        out = Pair(self.target, store=self.store)
        if same_threads:
            out.threads, out._fitted_at = dict(self.threads), math.inf
        return out

    def thread_counts(self) -> dict[str, int]:
        """{role: the CPU threads its passes run on now}, for the backends whose count is fitted."""
        return {role: n for role, b in self._backends().items() if (n := b.thread_count) is not None}

    def lanes(self, n: int) -> list[Lane]:
        """Up to n sequences held at once, each a lane of the target with the pair's sources forked
        for it (the first is the pair's own): as many as the target can score in one pass
        (``BaseBackend.can_batch``; one where it cannot) and every draft model can hold. Made
        anew (a backend may make its cache anew) where more are asked for than were made before,
        which ends those; else the same lanes again."""
        if len(self._lanes) < n and (not self._lanes or len(self._lanes) == self._asked):
            targets = self.target.lanes(n) if self.target.can_batch and n > 1 else [self.target]
            drafts = {name: b.lanes(len(targets)) if len(targets) > 1 else [b]
                      for name, b in self.drafts.items()}
            m = min([len(targets), *(len(d) for d in drafts.values())])
            self._lanes = [Lane(targets[i], [s if i == 0 else s.fork(drafts[s.name][i] if s.backend else None)
                                             for s in self.sources]) for i in range(m)]
            self._asked = n
        return self._lanes[:n]

    def _switch(self, ids: Sequence[int], lane: Lane | None = None) -> None:
        """Before a generation on ``ids`` (on ``lane``, default the pair's own sequence): the
        sequence it holds (target and draft models) is saved in the store where the prompt would
        cut ``SAVE_FROM`` tokens or more of it (another conversation), and a sequence of the store
        that shares more of ``ids`` is restored in its place."""
        lane = lane or Lane(self.target, self.sources)
        backends = lane.backends()
        if self.store is None or not all(b.can_save for b in backends.values()):
            return
        target = lane.target
        held = target.held
        live = common_prefix(held, ids, len(ids) - 1) if held is not None else 0
        found = self.store.best(ids)
        better = found is not None and min(found[1], len(ids) - 1) > live
        if held and (better or len(held) - live >= SAVE_FROM):
            saved = {r: b.save() for r, b in backends.items() if b.held is not None}
            self.store.put(Entry(tuple(held), saved))
        if not better:
            return
        entry = self.store.take(found[0])
        for role, b in backends.items():
            if role in entry.saved:
                b.restore(entry.saved[role])
            else:
                b.reset()

    @property
    def speculative(self) -> bool:
        return bool(self.sources)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        return self.target.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def planner(self, k: int | str = K_DEFAULT, sources: Sequence[Drafter] | None = None, *,
                remeasure: bool = False, notify: Callable[[str], None] | None = None,
                progress: Progress | None = None) -> Planner:
        """The planner ``k`` asks for, over ``sources`` (default: the pair's). An integer fixes the
        width; where there are several sources to weigh (a lookup and a model) the draft models'
        passes are timed first (a few passes; the prefill rate is kept). "auto" chooses widths from
        the target's pass at every width it may choose, measured once per machine and model and
        kept (``specmac.tuning.calibration``; ``remeasure`` measures again; ``notify`` hears of a
        long measurement before it starts, ``progress`` how far it is), out to ``K_MAX`` drafts
        where a free source may bet that wide, ``K_MODEL`` for a model alone."""
        sources = self.sources if sources is None else list(sources)
        k = check_k(k)
        drafts = {s.name: s.backend for s in sources if s.backend is not None}
        if k != "auto" and (len(sources) < 2 or not drafts):
            return Planner(sources, k=int(k))
        from specmac.tuning.calibration import measure_costs

        self.fit_threads()  # costs are timed at the thread count the run will use
        # a model drafts at most K_MODEL; a free source (or a request's prediction, later) bets wider
        width = K_MODEL if sources and all(s.backend is not None for s in sources) else K_MAX
        key = (width if k == "auto" else None, tuple(sorted(drafts)), tuple(sorted(self.threads.items())))
        when, costs, kept = self._auto.get(key, (-REUSE_COSTS_S, None, None))
        if remeasure or time.monotonic() - when >= REUSE_COSTS_S:  # else this pair's, refined by its runs
            costs, kept = measure_costs(self.target if k == "auto" else None, drafts, width,
                                        remeasure=remeasure, notify=notify, progress=progress)
            self._auto[key] = (time.monotonic(), costs, kept)
        planner = Planner(sources, costs, k=None if k == "auto" else int(k))
        planner.kept = kept
        return planner

    def _planner_for(self, k: int | str | Planner, prediction: PredictionDrafter | None) -> Planner:
        if isinstance(k, Planner):
            if prediction is None or prediction in k.sources:
                return k
            # the prediction is one more source, weighed on the same costs
            planner = Planner([prediction, *k.sources], k.costs, k.k, k.length, k.decay)
            planner.kept, planner.done, planner.ledger = k.kept, k.done, k.ledger  # shared with it
            return planner
        return self.planner(k, [prediction, *self.sources] if prediction is not None else None)

    def prediction_drafter(self, prediction: str | Sequence[int]) -> PredictionDrafter:
        """A source for one generation that proposes ``prediction`` (the text expected back: OpenAI's
        Predicted Outputs) where the output has reached it; the pair's sources stay beside it."""
        if isinstance(prediction, str):
            ids = self.target.encode(prediction)
            if ids and ids[0] == self.target.vocab.bos_id:  # an output never starts with BOS
                ids = ids[1:]
        else:
            ids = [int(t) for t in prediction]
            if ids and not 0 <= min(ids) <= max(ids) < self.target.vocab.size:
                raise BadOption(f"prediction: token ids must be in [0, {self.target.vocab.size})",
                                param="prediction")
        return PredictionDrafter(ids)

    def start(self, lane: Lane, ids: Sequence[int], *, params: SamplingParams, max_tokens: int,
              k: int | str | Planner, seed: int, prediction: PredictionDrafter | None = None) -> Stream:
        """A generation on ``lane`` (``lanes``) that the caller steps, with others sharing its passes
        (``specmac.core.loop.pass_streams``): as ``stream``, its prompt's held prefix reused. The
        caller settles a prediction's counts and the planner's kept costs as ``stream`` does."""
        check_max_tokens(max_tokens)
        check_seed(seed)
        self.fit_threads()
        planner = self._planner_for(k, prediction)
        self._switch(ids, lane)
        lane.used = time.monotonic()
        by_name = {s.name: s for s in lane.sources}
        sources = [by_name.get(s.name, s) for s in planner.sources]  # the lane's own, in the planner's order
        return Stream(lane.target, planner, ids, sources=sources, params=params, max_tokens=max_tokens,
                      rng=np.random.default_rng(seed), seed=seed)

    def stream(self, prompt: str | Sequence[int], *, params: SamplingParams | None = None,
               max_tokens: int = MAX_TOKENS, k: int | str | Planner = K_DEFAULT, seed: int = 0,
               rule: AcceptRule | None = None, noise: Callable | None = None,
               prediction: str | Sequence[int] | PredictionDrafter | None = None,
               reuse: bool = True) -> Iterator[Event]:
        """k: drafts per step, "auto" (chosen every step by the planner), or a ``Planner``. Under
        ``params.sampler == "coupled"`` the text depends on ``seed`` alone, whatever the sources
        and K. prediction: text (or ids) expected back, drafted from where the output reaches it;
        pass a ``prediction_drafter`` to read its accepted/rejected counts afterwards. ``reuse``
        (default): the target and the draft keep what they already hold of the prompt, so a
        conversation's next turn processes only its new tokens (``RunStats.cached_tokens``); False
        starts every cache empty. ``rule`` and ``noise`` plant wrong variants (tests)."""
        check_max_tokens(max_tokens)
        check_seed(seed)
        self.fit_threads()
        if prediction is not None and not isinstance(prediction, PredictionDrafter):
            prediction = self.prediction_drafter(prediction)
        planner = self._planner_for(k, prediction)
        ids = self.encode(prompt)
        if reuse:
            self._switch(ids)
        steps = speculative_steps(self.target, planner, ids,
                                  params=params or SamplingParams(), max_tokens=max_tokens,
                                  rng=np.random.default_rng(seed), rule=rule, seed=seed, noise=noise,
                                  reuse=reuse)
        return _settled(steps, planner, prediction)

    def generate(self, prompt: str | Sequence[int], **kw) -> Generation:
        prediction = kw.get("prediction")
        if prediction is not None and not isinstance(prediction, PredictionDrafter):
            kw["prediction"] = prediction = self.prediction_drafter(prediction)
        k = kw.get("k", K_DEFAULT)
        stats = RunStats(k=("auto" if k.k is None else k.k) if isinstance(k, Planner) else k)
        ids: list[int] = []
        for event in self.stream(prompt, **kw):
            stats.add(event)
            ids += event.tokens
        return Generation(self.target.decode(ids), ids, stats, self.speculative or prediction is not None,
                          prediction.usage() if prediction is not None else None)

    def info(self) -> dict:
        draft = [s.info() for s in self.sources]
        return {"target": self.target.info(), "draft": draft[0] if len(draft) == 1 else
                {"drafter": "+".join(s.name for s in self.sources), "sources": draft} if draft else
                {"drafter": "none"}, "threads": self.threads_now()}


def _settled(steps: Iterator[Event], planner: Planner,
             prediction: PredictionDrafter | None) -> Iterator[Event]:
    """The events, each first told to the prediction (its accepted/rejected counts); after the run,
    the kept costs are set against the run's own passes (``specmac.tuning.calibration.settle``)."""
    try:
        for event in steps:
            if prediction is not None:
                prediction.settle(event.source, event.n_drafted, event.n_accepted)
            yield event
    finally:  # a consumer that stops early closes this generator: close the loop's too (its finally)
        steps.close()
        if planner.kept is not None:
            from specmac.tuning.calibration import settle

            planner.settled = settle(planner.costs, planner.kept)


def check_k(k: Any) -> int | str:
    """An integer 1..K_LIMIT (not a bool, not a float) or "auto"; anything else is a BadOption."""
    if isinstance(k, str) and k == "auto":
        return k
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= K_LIMIT:
        raise BadOption(f"k {k!r} is out of range: use an integer 1..{K_LIMIT} (or 'auto')", param="k")
    return int(k)


def check_max_tokens(max_tokens: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
        raise BadOption(f"max_tokens {max_tokens!r} is out of range: use an integer >= 1", param="max_tokens")


def check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise BadOption(f"seed {seed!r} is out of range: use an integer in [0, 2**63)", param="seed")


def generate(prompt: str | Sequence[int], *, target: str = "synthetic", draft: str | None = None,
             target_model: str | None = None, draft_model: str | None = None,
             target_options: dict | None = None, draft_options: dict | None = None,
             k: int | str = K_DEFAULT, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             min_p: float = 0.0, max_tokens: int = MAX_TOKENS, seed: int = 0,
             sampler: str = "rejection") -> Generation:
    """Load a pair and generate once. For many calls, load a ``Pair`` once and reuse it.
    sampler="coupled": the same seed gives the same text with or without a draft, at any k."""
    params = SamplingParams(temperature, top_k, top_p, min_p, sampler)
    pair = Pair.load(target, draft, target_model=target_model, draft_model=draft_model,
                     target_options=target_options, draft_options=draft_options)
    return pair.generate(prompt, params=params, max_tokens=max_tokens, k=k, seed=seed)


def stream(prompt: str | Sequence[int], *, target: str = "synthetic", draft: str | None = None,
           k: int | str = K_DEFAULT, params: SamplingParams | None = None, max_tokens: int = MAX_TOKENS,
           seed: int = 0, **load_kw) -> Iterator[Event]:
    """Load a pair and stream its events (tokens with their kind, per step)."""
    pair = Pair.load(target, draft, **load_kw)
    yield from pair.stream(prompt, params=params, max_tokens=max_tokens, k=k, seed=seed)
