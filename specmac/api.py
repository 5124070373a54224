"""The Python API: load a draft/target pair once, then generate or stream from it.

    >>> import specmac
    >>> out = specmac.generate("hello", target="synthetic", draft="synthetic", k=4, seed=0)
    >>> out.text, out.stats.acceptance_rate
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specmac.backends import BaseBackend, load_backend
from specmac.core.costs import K_MAX, K_MODEL
from specmac.core.drafters import Drafter, PlainDecoding, check_draft_args, load_drafter
from specmac.core.hybrid import HybridDrafter
from specmac.core.hybrid_policy import HybridPolicy
from specmac.core.loop import Event, speculative_steps
from specmac.core.policy import K_DEFAULT, K_LIMIT, AdaptiveK, FixedK, KPolicy
from specmac.core.prediction import PredictionDrafter
from specmac.core.rejection import AcceptRule
from specmac.core.runstats import RunStats
from specmac.core.sampling import SamplingParams
from specmac.errors import BadOption

MAX_TOKENS = 128  # tokens a run writes unless told otherwise
FIT_EVERY_S = 1.0  # a run refits the backends' CPU threads to the load unless the last fit is this recent


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


class Pair:
    """A target backend and a drafter (a model on any backend, n-gram lookup, or none)."""

    def __init__(self, target: BaseBackend, drafter: Drafter) -> None:
        self.target, self.drafter = target, drafter
        self.threads: dict[str, str] = {}  # role -> the CPU threads the last fit chose, and why
        self._fitted_at = -FIT_EVERY_S

    def fit_threads(self) -> dict[str, str]:
        """Fit each backend's CPU threads to how busy the machine is now (before every run, at most
        once a FIT_EVERY_S): -> {role: threads and why} for the backends that have a count to fit."""
        now = time.monotonic()
        if now - self._fitted_at >= FIT_EVERY_S:
            self._fitted_at = now
            draft = self.drafter.backend
            notes = {"target": self.target.fit_threads(),
                     "draft": draft.fit_threads() if draft is not None and draft is not self.target else None}
            self.threads = {role: why for role, why in notes.items() if why}
        return self.threads

    def threads_now(self) -> dict[str, str]:
        """{role: the thread count now and why}, a refit during the last run included."""
        draft = self.drafter.backend
        notes = {"target": self.target.threads_note,
                 "draft": draft.threads_note if draft is not None and draft is not self.target else None}
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
        return cls(tb, load_drafter(draft, draft_model, draft_options, target_vocab=tb.vocab))

    def plain(self) -> Pair:
        """The same target with no drafter: plain decoding."""
        return Pair(self.target, PlainDecoding())

    @property
    def speculative(self) -> bool:
        return self.drafter.drafts

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        return self.target.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def policy(self, k: int | str | KPolicy = K_DEFAULT, max_tokens: int | None = None) -> KPolicy:
        """The K policy that ``k`` names, at no cost: an integer >= 1 (FixedK) or a policy object,
        returned as is. "auto" needs the pair's pass costs: it is ``timed_auto_policy``. A hybrid
        drafter's policy is wrapped in a HybridPolicy, which hands the drafter the costs it
        chooses its source by (``max_tokens``: the tokens the run can write; with a fixed K the
        model's prefill rate is measured once and kept, see ``cached_prefill_per_token``)."""
        if isinstance(k, KPolicy):
            self._bet_on(k)
            return k
        if check_k(k) == "auto":
            raise BadOption("k 'auto' is timed from the pair's passes: call timed_auto_policy(max_tokens) "
                            "(or pass k='auto' to generate or stream)", param="k")
        return self._wrap(FixedK(int(k)), max_tokens)

    def _wrap(self, policy: KPolicy, max_tokens: int | None) -> KPolicy:
        """The policy as this drafter needs it: a hybrid's wrapped with the costs it chooses by
        (the model's prefill rate included, whatever K); a free drafter's bets (lookup, n-gram) cut
        by the policy's measured step costs under "auto", uncut under a fixed K."""
        if isinstance(self.drafter, HybridDrafter):
            rate = getattr(policy, "prefill_per_token", None)
            if not rate:
                from specmac.core.calibration import cached_prefill_per_token

                rate = cached_prefill_per_token(self.drafter.backend)
            return HybridPolicy(policy, self.drafter, horizon=max_tokens, prefill_per_token=rate)
        self._bet_on(policy)
        return policy

    def _bet_on(self, policy: KPolicy) -> None:
        """A free drafter's bets (lookup, n-gram) weigh each proposal against this run's policy's
        measured step costs when it is a calibrated AdaptiveK, and cut nothing otherwise."""
        bets = getattr(self.drafter, "bets", None)
        if bets is not None:
            bets.cost = policy if isinstance(policy, AdaptiveK) and policy.prior is not None else None

    def timed_auto_policy(self, max_tokens: int | None = None, n_prompt: int | None = None) -> KPolicy:
        """K = auto: an AdaptiveK started from this pair's pass costs, timed now (seconds on a large
        model) or kept from an earlier run (see specmac.core.calibration). ``max_tokens``, the
        run's length, sizes its exploration budget; with ``n_prompt``, the prompt's tokens, it
        weighs the draft's prefill of the prompt against what drafting can win in the run. K goes
        to ``K_MAX`` where drafts cost no pass (lookup, n-gram, a prediction; the hybrid's lookup
        half), to ``K_MODEL`` for a model draft: the widths measured before the run."""
        from specmac.core.calibration import adaptive_policy

        self.fit_threads()  # the pass costs are timed (and kept) at the thread count the run will use
        free = self.drafter.backend is None or isinstance(self.drafter, HybridDrafter)
        return self._wrap(adaptive_policy(self.target, self.drafter.backend, horizon=max_tokens,
                                          n_prompt=n_prompt, k_max=K_MAX if free else K_MODEL), max_tokens)

    def _resolve(self, k: int | str | KPolicy, max_tokens: int | None,
                 n_prompt: int | None = None) -> KPolicy:
        if isinstance(k, str) and k == "auto":
            return self.timed_auto_policy(max_tokens, n_prompt)
        return self.policy(k, max_tokens)

    def prediction_drafter(self, prediction: str | Sequence[int]) -> PredictionDrafter:
        """A drafter for one generation that proposes ``prediction`` (the text expected back: OpenAI's
        Predicted Outputs) where the output has reached it, and this pair's drafter elsewhere."""
        if isinstance(prediction, str):
            ids = self.target.encode(prediction)
            if ids and ids[0] == self.target.vocab.bos_id:  # an output never starts with BOS
                ids = ids[1:]
        else:
            ids = [int(t) for t in prediction]
            if ids and not 0 <= min(ids) <= max(ids) < self.target.vocab.size:
                raise BadOption(f"prediction: token ids must be in [0, {self.target.vocab.size})",
                                param="prediction")
        return PredictionDrafter(ids, fallback=self.drafter)

    def stream(self, prompt: str | Sequence[int], *, params: SamplingParams | None = None,
               max_tokens: int = MAX_TOKENS, k: int | str | KPolicy = K_DEFAULT, seed: int = 0,
               rule: AcceptRule | None = None, noise: Callable | None = None,
               prediction: str | Sequence[int] | PredictionDrafter | None = None) -> Iterator[Event]:
        """k: drafts per step, "auto" (adaptive, from the cost model), or a policy object. Under
        ``params.sampler == "coupled"`` the text depends on ``seed`` alone, whatever the drafter
        and K. prediction: text (or ids) expected back, drafted from where the output reaches it;
        pass a ``prediction_drafter`` to read its accepted/rejected counts afterwards. ``rule`` and
        ``noise`` plant wrong variants (tests)."""
        check_max_tokens(max_tokens)
        check_seed(seed)
        self.fit_threads()
        drafter = self.drafter
        if prediction is not None:
            drafter = prediction if isinstance(prediction, PredictionDrafter) else \
                self.prediction_drafter(prediction)
        ids = self.encode(prompt)
        policy = self._resolve(k, max_tokens, len(ids))
        steps = speculative_steps(self.target, drafter, ids,
                                  params=params or SamplingParams(), max_tokens=max_tokens,
                                  rng=np.random.default_rng(seed), k=policy, rule=rule, seed=seed,
                                  noise=noise)
        return _settled(steps, drafter) if isinstance(drafter, PredictionDrafter) else steps

    def generate(self, prompt: str | Sequence[int], **kw) -> Generation:
        prompt = self.encode(prompt)
        policy = self._resolve(kw.pop("k", K_DEFAULT), kw.get("max_tokens", MAX_TOKENS), len(prompt))
        inner = getattr(policy, "inner", policy)  # a hybrid's policy wraps the run's own
        stats = RunStats(k=inner.k if isinstance(inner, FixedK) else getattr(policy, "label", "auto"))
        prediction = kw.pop("prediction", None)
        if prediction is not None and not isinstance(prediction, PredictionDrafter):
            prediction = self.prediction_drafter(prediction)
        ids: list[int] = []
        for event in self.stream(prompt, k=policy, prediction=prediction, **kw):
            stats.add(event)
            ids += event.tokens
        return Generation(self.target.decode(ids), ids, stats, self.speculative or prediction is not None,
                          prediction.usage() if prediction is not None else None)

    def info(self) -> dict:
        return {"target": self.target.info(), "draft": self.drafter.info(), "threads": self.threads_now()}


def _settled(steps: Iterator[Event], drafter: PredictionDrafter) -> Iterator[Event]:
    """The events, each first told to the prediction drafter (its accepted/rejected counts)."""
    try:
        for event in steps:
            drafter.settle(event.n_drafted, event.n_accepted)
            yield event
    finally:  # a consumer that stops early closes this generator: close the loop's too (its finally)
        steps.close()


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
