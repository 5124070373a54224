"""Draft sources: they propose, and nothing else. The planner (``specmac.core.planner``) chooses.

Two kinds behind one small contract (``Drafter``):
- a *free* source (``backend`` None) proposes without a model pass: every step the loop asks it
  ``propose(seq, k)`` for its drafts and the kind of match they came from (the planner keeps an
  acceptance record per kind); its q is one-hot on each draft. ``NgramDrafter`` here, the lookup
  (``specmac.core.lookup``) and a prediction (``specmac.core.prediction``).
- a *model* source (``ModelDrafter``, any backend) drafts only when the planner chooses it:
  ``draft(seq, k, ...)`` samples K tokens with the target's warping and returns them with q.

A draft name is a list of sources: "none" none, "gguf" one model, "lookup" the lookup,
"lookup+gguf" the lookup and a model (the planner picks per step), "ngram+mlx" the n-gram lookup and
a model (``specmac.core.sources.load_sources``). Under the coupled sampler the loop passes
``noise`` (row i: the Gumbel noise of draft i's output position); a model proposes the argmax of
its perturbed row.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, ClassVar

import numpy as np

from specmac.backends import BaseBackend
from specmac.core.sampling import SamplingParams, StepNoise, perturb, sample, warp
from specmac.vocab import align_logits


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if list(a[:n]) == list(b[:n]):
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))


class Drafter:
    """A draft source. ``backend`` is the draft model's backend, None for a free source.
    ``priors``: per kind of proposal, (the share of drafts assumed accepted before the run shows
    any, its weight in drafts, whether its proposals follow one acceptance rate): the planner's
    prior for this source (``specmac.core.planner.Record.survival``)."""

    name: ClassVar[str] = ""
    backend: BaseBackend | None = None
    priors: ClassVar[dict[str, tuple[float, float, bool]]] = {}
    guesses: ClassVar[tuple[str, ...]] = ()  # kinds that are coincidences: never bet over a paying model

    def propose(self, seq: Sequence[int], k: int) -> tuple[list[int], str]:
        """A free source's drafts (<= k) after ``seq`` and the kind of match they came from."""
        raise NotImplementedError

    def begin(self, seq: Sequence[int]) -> None:
        """A generation starts from ``seq``: keep what this source holds of it (its cache, its
        index), forget the rest."""
        self.trim(0)

    def trim(self, n: int) -> None:
        """The committed sequence now holds only its first n tokens of what this source saw."""

    def fork(self, backend: BaseBackend | None = None) -> Drafter:
        """The same source for another sequence, holding nothing yet (a model's on ``backend``, a
        lane of its model: ``BaseBackend.lanes``)."""
        raise NotImplementedError(f"the {self.name} source cannot draft for several sequences")

    def info(self) -> dict:
        return {"drafter": self.name}


class ModelDrafter(Drafter):
    """Drafts with any backend, sampling with the same warping as the target. Its cache is what
    its backend holds (``BaseBackend.held``): the loop trims it to what the target accepted, so a
    step feeds only what is new, and a new generation keeps what it holds of the prompt."""

    name = "model"
    # a draft of the target's family is right more often than not; four pseudo-drafts, so one unlucky
    # step cannot end a short run and a few bad ones end a wasted one
    priors = {"model": (0.6, 4.0, True)}

    def __init__(self, backend: BaseBackend) -> None:
        self.backend = backend
        self.name = backend.name  # a model source is named by its backend (steps by source say "gguf")

    def fork(self, backend: BaseBackend | None = None) -> ModelDrafter:
        return ModelDrafter(backend or self.backend)

    def max_k(self, n_seq: int) -> int:
        return self.backend.n_ctx - n_seq + 1  # the cache ends holding seq + k - 1 tokens

    def behind(self, seq: Sequence[int]) -> int:
        """Tokens of ``seq`` this draft has not processed (what its next step feeds first)."""
        return len(seq) - self._sync(seq)

    def _sync(self, seq: Sequence[int]) -> int:
        held = self.backend.held or ()
        m = min(len(held), len(seq) - 1)  # always re-score the last token
        if m and held[m - 1] != seq[m - 1]:  # the loop only appends and trims: rarely taken
            m = common_prefix(held, seq, m)
        return m

    def begin(self, seq: Sequence[int]) -> None:
        held = self.backend.held
        self.trim(common_prefix(held, seq, len(seq) - 1) if held is not None and seq else 0)

    def draft(self, seq: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator,
              n_vocab: int, noise: StepNoise | None = None) -> tuple[list[int], Any]:
        """-> k drafts and q: a row [n_vocab] per draft, the distribution it was drawn from (float64,
        warped like the target); None when ``params.greedy`` or ``noise`` is given (the greedy rule
        reads no q)."""
        steps = self.drafting(seq, k, params, rng, n_vocab, noise)
        feed, first = next(steps), True
        try:
            while True:
                logits = self.backend.prefill(feed) if first else self.backend.score(feed)[0]
                feed, first = steps.send(logits), False
        except StopIteration as done:
            return done.value

    def drafting(self, seq: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator,
                 n_vocab: int, noise: StepNoise | None = None) -> Generator[list[int], np.ndarray, tuple]:
        """``draft`` with its backend's passes left to the caller, so several sequences' drafts can
        share them (``specmac.core.loop.pass_streams``): it yields the tokens to append (first the
        text the model has not seen, then one draft at a time), is sent the logits row of the last
        of them, and returns what ``draft`` returns."""
        m = self._sync(seq)
        self.trim(m)
        qs, drafts = [], []
        logits = yield list(seq[m:])  # [n_logits]
        for i in range(k):
            row = align_logits(logits, n_vocab)
            if params.greedy:
                d = int(np.argmax(row))
            elif noise is not None:  # coupled: the target's own choice if q_i were p_i
                d = int(np.argmax(perturb(row, params, noise[i])))
            else:
                qs.append(warp(row, params))
                d = sample(qs[-1], rng)
            drafts.append(d)
            if i < k - 1:
                logits = yield [d]
        return drafts, (None if params.greedy or noise is not None else qs)

    def trim(self, n: int) -> None:
        if self.backend.held is None:  # its cache was changed outside the contract: start over
            self.backend.reset()
        elif n < self.backend.n_past:
            self.backend.rewind(n)

    def info(self) -> dict:
        return {"drafter": self.name, **self.backend.info()}


class NgramDrafter(Drafter):
    """Prompt lookup as llama.cpp and transformers do it: copy what followed the latest earlier
    match of the last n tokens (longest n first)."""

    name = "ngram"
    priors = {"ngram": (0.5, 2.0, False)}
    guesses = ("ngram",)

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, seq, k):
        return lookup(seq, k, self.max_ngram, self.min_ngram), "ngram"

    def begin(self, seq: Sequence[int]) -> None:
        """Nothing held: each proposal searches the text as it is."""

    def fork(self, backend: BaseBackend | None = None) -> NgramDrafter:
        return NgramDrafter(self.max_ngram, self.min_ngram)

    def info(self) -> dict:
        return {"drafter": self.name, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}


class OneHotRows:
    """q for drafts proposed with certainty: row i is the one-hot of drafts[i], built when read."""

    def __init__(self, drafts: Sequence[int], n_vocab: int) -> None:
        self.drafts, self.n_vocab = list(drafts), n_vocab

    def __len__(self) -> int:
        return len(self.drafts)

    def __getitem__(self, i: int) -> np.ndarray:
        row = np.zeros(self.n_vocab)
        row[self.drafts[i]] = 1.0
        return row


def lookup(seq: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The k tokens after the most recent earlier occurrence of seq's last n-gram (longest n first)."""
    s = np.asarray(seq)
    for n in range(min(max_ngram, len(s) - 1), min_ngram - 1, -1):
        tail = s[-n:]
        # windows starting at 0..len-n-1 (the tail itself excluded), latest match first
        win = np.lib.stride_tricks.sliding_window_view(s[:-1], n)
        hits = np.flatnonzero((win == tail).all(axis=1))
        if len(hits):
            start = hits[-1] + n
            return [int(t) for t in s[start : start + k]]
    return []
