"""The Python API: load a draft/target pair once, then generate or stream from it.

    >>> import specmac
    >>> out = specmac.generate("hello", target="synthetic", draft="synthetic", k=4, seed=0)
    >>> out.text, out.stats.acceptance_rate
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specmac.backends import BaseBackend, backend_class, load_backend
from specmac.drafters import Drafter, ModelDrafter, NgramDrafter
from specmac.errors import BadOption
from specmac.metrics import RunStats
from specmac.sampling import SamplingParams
from specmac.speculative import Event, FixedK, speculative_steps
from specmac.verify import VerifyRule
from specmac.vocab import check_compatible

NO_DRAFT = (None, "none")
MODEL_FREE_DRAFTERS = ("ngram",)


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    stats: RunStats
    speculative: bool

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids,
                **self.stats.to_dict(speculative=self.speculative)}


class Pair:
    """A target backend and a drafter (a model on any backend, n-gram lookup, or none)."""

    def __init__(self, target: BaseBackend, drafter: Drafter) -> None:
        self.target, self.drafter = target, drafter

    @classmethod
    def load(cls, target: str = "synthetic", draft: str | None = None, *,
             target_model: str | None = None, draft_model: str | None = None,
             target_options: dict[str, Any] | None = None,
             draft_options: dict[str, Any] | None = None) -> Pair:
        """Load the target, check the draft's vocabulary (before its weights where the backend
        can read a tokenizer alone), then load the draft."""
        if draft in NO_DRAFT or draft in MODEL_FREE_DRAFTERS:
            if draft_model or draft_options:
                raise BadOption(f"--draft {draft or 'none'} takes no draft model or draft options")
        tb = load_backend(target, target_model, target_options, role="target")
        if draft in NO_DRAFT:
            return cls(tb, Drafter())
        if draft == "ngram":
            return cls(tb, NgramDrafter())
        dcls = backend_class(draft)
        peek = getattr(dcls, "peek_vocab", None)
        if peek is not None:
            check_compatible(peek(draft_model, role="draft", **dcls.parse_options(draft_options or {})),
                             tb.vocab)
        db = load_backend(draft, draft_model, draft_options, role="draft")
        check_compatible(db.vocab, tb.vocab)
        return cls(tb, ModelDrafter(db))

    @property
    def speculative(self) -> bool:
        return type(self.drafter) is not Drafter

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        return self.target.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def stream(self, prompt: str | Sequence[int], *, params: SamplingParams | None = None,
               max_tokens: int = 128, k: int | str | FixedK = 4, seed: int = 0,
               rule: VerifyRule | None = None) -> Iterator[Event]:
        """k: drafts per step, "auto" (adaptive, from the cost model), or a policy object."""
        check_run_args(max_tokens, k)
        if k == "auto":
            from specmac.costmodel import AdaptiveK

            k = AdaptiveK.for_pair(self)
        return speculative_steps(self.target, self.drafter, self.encode(prompt),
                                 params=params or SamplingParams(), max_tokens=max_tokens,
                                 rng=np.random.default_rng(seed), k=k, rule=rule)

    def generate(self, prompt: str | Sequence[int], **kw) -> Generation:
        k = kw.get("k", 4)
        stats = RunStats(k=k if isinstance(k, int) else getattr(k, "label", "auto"))
        ids: list[int] = []
        for event in self.stream(prompt, **kw):
            stats.add(event)
            ids += event.tokens
        return Generation(self.target.decode(ids), ids, stats, self.speculative)

    def info(self) -> dict:
        return {"target": self.target.info(), "draft": self.drafter.info()}


def check_run_args(max_tokens: int, k: int | FixedK) -> None:
    if not (isinstance(max_tokens, int) and max_tokens >= 1):
        raise BadOption(f"max_tokens {max_tokens!r} is out of range: use an integer >= 1")
    if isinstance(k, str) and k != "auto" or isinstance(k, int) and not k >= 1:
        raise BadOption(f"k {k!r} is out of range: use an integer >= 1 (or 'auto')")


def generate(prompt: str | Sequence[int], *, target: str = "synthetic", draft: str | None = None,
             target_model: str | None = None, draft_model: str | None = None,
             target_options: dict | None = None, draft_options: dict | None = None,
             k: int | str = 4, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             min_p: float = 0.0, max_tokens: int = 128, seed: int = 0) -> Generation:
    """Load a pair and generate once. For many calls, load a ``Pair`` once and reuse it."""
    params = SamplingParams(temperature, top_k, top_p, min_p)
    pair = Pair.load(target, draft, target_model=target_model, draft_model=draft_model,
                     target_options=target_options, draft_options=draft_options)
    return pair.generate(prompt, params=params, max_tokens=max_tokens, k=k, seed=seed)


def stream(prompt: str | Sequence[int], *, target: str = "synthetic", draft: str | None = None,
           k: int | str = 4, params: SamplingParams | None = None, max_tokens: int = 128, seed: int = 0,
           **load_kw) -> Iterator[Event]:
    """Load a pair and stream its events (tokens with their kind, per step)."""
    pair = Pair.load(target, draft, **load_kw)
    yield from pair.stream(prompt, params=params, max_tokens=max_tokens, k=k, seed=seed)
