"""Drafters propose K tokens and the distributions they were drawn from.

``propose(seq, k)`` takes the whole committed sequence, so a drafter keeps its own cache in step:
it rewinds to the longest prefix it has already seen and feeds only what is new (after a fully
accepted step that includes the last draft token, which it proposed but never scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specmac.backends import BaseBackend
from specmac.sampling import SamplingParams, sample, warp
from specmac.vocab import align_logits


class Drafter:
    """No drafts: the speculative loop degenerates to plain target decoding."""

    name = "none"

    def max_k(self, n_seq: int) -> int:
        """The most drafts this drafter can make after a sequence of n_seq tokens."""
        return 0

    def propose(self, seq: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator, n_vocab: int) -> tuple[list[int], Any]:
        """-> drafts [<= k] and q: a row [n_vocab] per draft, the distribution it was drawn from
        (float64, warped like the target), indexable as q[i]; None when ``params.greedy`` (the
        greedy rule reads no q)."""
        return [], np.zeros((0, n_vocab))

    def trim(self, n: int) -> None:
        """Forget everything past the first n tokens of the committed sequence."""

    def info(self) -> dict:
        return {"drafter": self.name}


class ModelDrafter(Drafter):
    """Drafts with any backend, sampling with the same warping as the target."""

    name = "model"

    def __init__(self, backend: BaseBackend) -> None:
        self.backend = backend
        self.seen: list[int] = []  # mirrors the backend's cache

    def max_k(self, n_seq: int) -> int:
        return self.backend.n_ctx - n_seq + 1  # the cache ends holding seq + k - 1 tokens

    def propose(self, seq, k, params, rng, n_vocab):
        m = _common_prefix(self.seen, seq, limit=len(seq) - 1)  # always re-score the last token
        self.trim(m)
        qs, drafts = [], []
        logits = self.backend.prefill(seq[m:])  # [n_logits]
        for i in range(k):
            row = align_logits(logits, n_vocab)
            if params.greedy:  # the greedy rule needs no q: the argmax of the logits is the draft
                d = int(np.argmax(row))
            else:
                qs.append(warp(row, params))
                d = sample(qs[-1], rng)
            drafts.append(d)
            if i < k - 1:
                logits = self.backend.score([d])[0]
        self.seen = list(seq) + drafts[:-1]
        return drafts, (None if params.greedy else qs)

    def trim(self, n: int) -> None:
        n = min(n, len(self.seen), self.backend.n_past)
        self.backend.rewind(n)
        del self.seen[n:]

    def info(self) -> dict:
        return {"drafter": self.name, **self.backend.info()}


class NgramDrafter(Drafter):
    """Prompt lookup: copy what followed the latest earlier match of the last n tokens.

    No model, so q is one-hot on each proposed token (accepted with probability p(d)).
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def max_k(self, n_seq: int) -> int:
        return 1 << 30

    def propose(self, seq, k, params, rng, n_vocab):
        drafts = lookup(seq, k, self.max_ngram, self.min_ngram)
        return drafts, (None if params.greedy else OneHotRows(drafts, n_vocab))

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


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if list(a[:n]) == list(b[:n]):
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))
