"""A numpy language model with an exactly known distribution: tests, demos and probe controls.

Logits depend on the last two tokens through seeded random tables, so the distribution of any
continuation is computable exactly (``next_logits``). The draft of the pair is the target plus
``noise`` times an independent table: noise 0 agrees perfectly, larger noise agrees less.
``latency_ms`` and ``beta`` simulate the cost of a pass over n tokens, T1 * (1 + beta * (n - 1)),
so the probes and the cost model can be exercised with numpy alone.
"""

from __future__ import annotations

import copy
import string
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specmac.backends import MAX_CTX, BaseBackend, Option, Saved, tail_rows
from specmac.errors import BadOption
from specmac.vocab import Vocab

ALPHABET = string.ascii_lowercase + " " + string.digits + string.ascii_uppercase + ".,:;()=+-*/_'\"\n#[]"


class SyntheticBackend(BaseBackend):
    name = "synthetic"
    library = "numpy"

    @classmethod
    def variants(cls, model: str | None, role: str = "target") -> list[tuple[dict, str]]:
        return [({}, "float32")]

    @classmethod
    def source_name(cls, model: str | None, role: str = "target") -> str:
        return "synthetic pair"
    options = {
        "vocab_size": Option(int, 48, "number of ids including EOS, 3..%d" % (len(ALPHABET) + 1),
                             lo=3, hi=len(ALPHABET) + 1),
        "seed": Option(int, 0, "seed of the target's tables (shared by the draft)", lo=0, hi=2**63 - 1),
        "noise": Option(float, None, "draft perturbation; default 0 for a target, 0.5 for a draft",
                        lo=0, hi=100),
        "sharpness": Option(float, 2.0, "scale of the logits; larger is more peaked", lo=0, hi=100),
        "eos_bias": Option(float, -3.0, "added to the EOS logit", lo=-100, hi=100),
        "n_ctx": Option(int, 4096, "context window in tokens", lo=2, hi=MAX_CTX),
        "latency_ms": Option(float, 0.0, "simulated time of a one-token pass", lo=0, hi=60_000),
        "beta": Option(float, 0.0, "simulated serial fraction of a batched pass (0 parallel, 1 serial)",
                       lo=0, hi=16),
    }

    def __init__(self, model: str | None = None, *, role: str = "target", **opts) -> None:
        if model is not None:  # its model is its options: a path here would be silently ignored
            raise BadOption(f"{role}_model {model!r}: the synthetic backend loads no model files; set "
                            "its model with options (seed, noise, vocab_size, ...)", param=f"{role}_model")
        o = {k: v.default for k, v in self.options.items()} | opts
        if o["noise"] is None:
            o["noise"] = 0.5 if role == "draft" else 0.0
        V = o["vocab_size"]
        if not 3 <= V <= len(ALPHABET) + 1:
            raise BadOption(f"option vocab_size={V} is out of range: use 3..{len(ALPHABET) + 1}")
        if o["n_ctx"] < 2:
            raise BadOption(f"option n_ctx={o['n_ctx']} is out of range: use >= 2")
        self.resolved = o
        self.model_id = f"synthetic(seed={o['seed']}, noise={o['noise']})"
        self.chars = ALPHABET[: V - 1]
        self.eos_id = V - 1
        self.vocab = Vocab([c.encode() for c in self.chars] + [b""], eos_ids=frozenset({V - 1}),
                           special_ids=frozenset({V - 1}), n_logits=V)
        self.n_ctx = o["n_ctx"]
        rng = np.random.default_rng(o["seed"])
        # row V stands for "no token" before the start of the sequence
        self.last_table = rng.standard_normal((V + 1, V)) * o["sharpness"]
        self.prev_table = rng.standard_normal((V + 1, V)) * o["sharpness"] * 0.5
        self.last_table[:, V - 1] += o["eos_bias"]
        if o["noise"]:
            noise = np.random.default_rng([o["seed"], 1]).standard_normal((V + 1, V))
            self.last_table = self.last_table + o["noise"] * o["sharpness"] * noise
        self.tokens: list[int] = []

    # --- exact distribution -------------------------------------------------------------
    def next_logits(self, context: Sequence[int]) -> np.ndarray:
        """[V] logits of the token that follows ``context``: exactly what ``score`` returns."""
        V = self.vocab.size
        last = context[-1] if len(context) >= 1 else V
        prev = context[-2] if len(context) >= 2 else V
        return (self.last_table[last] + self.prev_table[prev]).astype(np.float32)

    # --- the contract ---------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        tokens = self.check_tokens(tokens)
        self._simulate_cost(len(tokens))
        return self._append(tokens)

    def _append(self, tokens: list[int]) -> np.ndarray:
        V = self.vocab.size
        full = [V, V] + self.tokens + tokens
        last = np.array(full[-len(tokens):])
        prev = np.array(full[-len(tokens) - 1 : -1])
        self.tokens.extend(tokens)
        return (self.last_table[last] + self.prev_table[prev]).astype(np.float32)

    can_batch = True  # its lanes' tokens cost one simulated pass over all of them

    def lanes(self, n: int) -> list[BaseBackend]:
        out: list[BaseBackend] = [self]
        for _ in range(1, n):
            lane = copy.copy(self)  # the same tables, its own tokens
            lane.tokens, lane._held = [], []
            out.append(lane)
        return out

    def score_many(self, asks):
        checked = [(lane, lane.check_tokens(tokens), rows) for lane, tokens, rows in asks]
        self._simulate_cost(sum(len(t) for _, t, _ in checked))
        out = []
        for lane, tokens, rows in checked:
            logits, n = lane._append(tokens), tail_rows(rows, len(tokens))
            out.append(logits[len(tokens) - n:] if n else None)
        return out

    def _simulate_cost(self, n: int) -> None:
        if self.resolved["latency_ms"] > 0:
            time.sleep(self.resolved["latency_ms"] * (1 + self.resolved["beta"] * (n - 1)) / 1e3)

    def rewind(self, n_past: int) -> None:
        self.check_rewind(n_past)
        del self.tokens[n_past:]

    can_save = True

    def save(self) -> Saved:
        return Saved(tuple(self.tokens), None, 8 * len(self.tokens))  # its state is its tokens

    def restore(self, saved: Saved) -> None:
        self.tokens = list(saved.tokens)

    def write_state(self, saved: Saved, stem: Path) -> Path:
        path = stem.with_suffix(".none")
        path.write_bytes(b"")  # nothing beyond the tokens, which the store keeps itself
        return path

    def read_state(self, path: Path, tokens: Sequence[int]) -> Saved:
        return Saved(tuple(tokens), None, 8 * len(tokens))

    def encode(self, text: str) -> list[int]:
        # characters outside the alphabet fold onto it, so any prompt is accepted
        n = len(self.chars)
        return [self.chars.find(c) if c in self.chars else ord(c) % n for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids if i != self.eos_id)
