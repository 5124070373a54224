"""Drafters propose K tokens and the distributions they were drawn from.

One contract (``Drafter``) and three kinds here: ``PlainDecoding`` (plain target decoding),
``ModelDrafter`` (any backend) and ``NgramDrafter`` (prompt lookup, no model); ``LookupDrafter``
(specmac.core.lookup: a suffix index that bets only on a worthwhile match) and ``HybridDrafter``
(specmac.core.hybrid: lookup or a model, chosen per step) live in their own modules.
``drafter.backend`` is the one way to ask for a drafter's model (None without one);
``drafter.source`` names what made the last proposal; ``load_drafter`` is the one factory.

``propose(seq, k)`` takes the whole committed sequence, so a drafter keeps its own cache in step:
it rewinds to the longest prefix it has already seen and feeds only what is new (after a fully
accepted step that includes the last draft token, which it proposed but never scored).
Under the coupled sampler the loop also passes ``noise`` (row i: the Gumbel noise of draft i's
output position); a model drafter proposes the argmax of its perturbed row, and no q is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from specmac.backends import BaseBackend, backend_class, load_backend
from specmac.core.bets import Bets
from specmac.core.bets import common_prefix as _common_prefix
from specmac.core.sampling import SamplingParams, StepNoise, perturb, sample, warp
from specmac.errors import BadOption
from specmac.vocab import Vocab, align_logits, check_compatible

NO_DRAFT = (None, "none")
MODEL_FREE = ("ngram", "lookup")  # drafters that need no model (besides "none")
HYBRID_LOOKUPS = ("ngram", "lookup")  # "LOOKUP+BACKEND": a hybrid of prompt lookup and a model
# drafters of their own modules register a factory here (specmac.core imports them): a name, or
# HYBRID for LOOKUP+BACKEND (called with the model's drafter and the whole name)
FACTORIES: dict[str, Callable[..., Drafter]] = {}
HYBRID = "+"


def split_hybrid(name: str | None) -> tuple[str, str] | None:
    """"lookup+gguf" -> ("lookup", "gguf"); None for a name that is not a hybrid."""
    if not name or "+" not in name:
        return None
    lookup, _, backend = name.partition("+")
    if lookup not in HYBRID_LOOKUPS or not backend or "+" in backend:
        raise BadOption(f"draft {name!r} is not LOOKUP+BACKEND: write e.g. lookup+gguf or ngram+mlx",
                        param="draft")
    return lookup, backend


class Drafter:
    """The drafter contract. ``drafts`` is False only for PlainDecoding; ``backend`` is the draft model's
    backend, or None for drafters without a model."""

    name: ClassVar[str] = ""
    drafts: ClassVar[bool] = True
    backend: BaseBackend | None = None

    @property
    def source(self) -> str:
        """What made the last proposal (a hybrid names the source it chose; others their name)."""
        return self.name

    def max_k(self, n_seq: int) -> int:
        """The most drafts this drafter can make after a sequence of n_seq tokens."""
        raise NotImplementedError

    def propose(self, seq: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator, n_vocab: int,
                noise: StepNoise | None = None) -> tuple[list[int], Any]:
        """-> drafts [<= k] and q: a row [n_vocab] per draft, the distribution it was drawn from
        (float64, warped like the target), indexable as q[i]; None when ``params.greedy`` or
        ``noise`` is given (the greedy rule reads no q)."""
        raise NotImplementedError

    def trim(self, n: int) -> None:
        """Forget everything past the first n tokens of the committed sequence."""

    def info(self) -> dict:
        return {"drafter": self.name}


class PlainDecoding(Drafter):
    """No drafts: the speculative loop degenerates to plain target decoding."""

    name = "none"
    drafts = False

    def max_k(self, n_seq: int) -> int:
        return 0

    def propose(self, seq, k, params, rng, n_vocab, noise=None):
        return [], None


class ModelDrafter(Drafter):
    """Drafts with any backend, sampling with the same warping as the target."""

    name = "model"

    def __init__(self, backend: BaseBackend) -> None:
        self.backend = backend
        self.seen: list[int] = []  # mirrors the backend's cache

    def max_k(self, n_seq: int) -> int:
        return self.backend.n_ctx - n_seq + 1  # the cache ends holding seq + k - 1 tokens

    def propose(self, seq, k, params, rng, n_vocab, noise=None):
        m = _common_prefix(self.seen, seq, limit=len(seq) - 1)  # always re-score the last token
        self.trim(m)
        qs, drafts = [], []
        logits = self.backend.prefill(seq[m:])  # [n_logits]
        for i in range(k):
            row = align_logits(logits, n_vocab)
            if params.greedy:  # the greedy rule needs no q: the argmax of the logits is the draft
                d = int(np.argmax(row))
            elif noise is not None:  # coupled: the target's own choice if q_i were p_i
                d = int(np.argmax(perturb(row, params, noise[i])))
            else:
                qs.append(warp(row, params))
                d = sample(qs[-1], rng)
            drafts.append(d)
            if i < k - 1:
                logits = self.backend.score([d])[0]
        self.seen = list(seq) + drafts[:-1]
        return drafts, (None if params.greedy or noise is not None else qs)

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
        self.bets = Bets()  # under k="auto" a proposal is cut to the width that pays (specmac.core.bets)

    def max_k(self, n_seq: int) -> int:
        return 1 << 30

    def trim(self, n: int) -> None:
        if n == 0:
            self.bets.reset()

    def propose(self, seq, k, params, rng, n_vocab, noise=None):
        self.bets.learn(seq)
        drafts = self.bets.cut(seq, lookup(seq, k, self.max_ngram, self.min_ngram), "ngram")
        return drafts, (None if params.greedy or noise is not None else OneHotRows(drafts, n_vocab))

    def info(self) -> dict:
        return {"drafter": self.name, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram,
                **self.bets.info()}


def load_drafter(name: str | None, model: str | None = None, options: dict[str, Any] | None = None,
                 *, target_vocab: Vocab) -> Drafter:
    """The drafter called ``name``: "none" (or None), "ngram", "lookup", a backend loaded as the
    draft, or "LOOKUP+BACKEND" (a hybrid of prompt lookup and that backend's model). A backend's
    vocabulary is checked against the target's before its weights load where the backend can
    read a tokenizer alone, and again after."""
    check_draft_args(name, model, options)
    if name in FACTORIES:
        return FACTORIES[name]()
    if name in NO_DRAFT or name in MODEL_FREE:
        return NgramDrafter() if name == "ngram" else PlainDecoding()
    hybrid = split_hybrid(name)
    if hybrid is not None:
        model_drafter = load_drafter(hybrid[1], model, options, target_vocab=target_vocab)
        if not isinstance(model_drafter, ModelDrafter):
            raise BadOption(f"draft {name!r}: after the + comes a model backend, not {hybrid[1]!r}",
                            param="draft")
        return FACTORIES[HYBRID](model_drafter, name)
    cls = backend_class(name)
    peeked = cls.peek_vocab(model, role="draft", **cls.parse_options(options or {}))
    if peeked is not None:
        check_compatible(peeked, target_vocab)
    backend = load_backend(name, model, options, role="draft")
    check_compatible(backend.vocab, target_vocab)
    return ModelDrafter(backend)


def check_draft_args(name: str | None, model: str | None, options: dict[str, Any] | None) -> None:
    """A drafter without a model takes no model and no options."""
    if (name in NO_DRAFT or name in MODEL_FREE) and (model or options):
        raise BadOption(f"draft {name or 'none'!r} takes no draft model or draft options: drop them",
                        param="draft")


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


class ChainedRows:
    """q for one proposal drafted by two sources in turn: the first's rows, then the second's."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self.first)
        return self.first[i] if i < n else self.second[i - n]


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

