"""Token vocabularies: bytes per id, special ids, a fingerprint and the draft/target check.

Speculation is lossless only if a draft id means the same bytes to the target, so pairs are
compared by token bytes, not by vocabulary size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from specmac.errors import VocabMismatch


@dataclass(frozen=True, eq=False)
class Vocab:
    """token_bytes[i] is the byte string of id i (b"" for control tokens without text).

    n_logits is the width of the logit rows a backend returns; it may exceed len(token_bytes)
    when the embedding matrix is padded (those columns are masked to -inf).
    """

    token_bytes: Sequence[bytes]
    eos_ids: frozenset[int] = frozenset()
    bos_id: int | None = None
    special_ids: frozenset[int] = frozenset()
    n_logits: int = 0
    unused_ids: frozenset[int] = frozenset()  # padding rows with no text (e.g. "[PAD151665]")

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def fingerprint(self) -> str:
        """sha256 over token bytes and special ids (first 16 hex digits)."""
        h = hashlib.sha256()
        for b in self.token_bytes:
            h.update(len(b).to_bytes(4, "little") + b)
        h.update(repr((sorted(self.eos_ids), self.bos_id, sorted(self.special_ids))).encode())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"size": self.size, "n_logits": self.n_logits or self.size,
                "eos_ids": sorted(self.eos_ids), "bos_id": self.bos_id,
                "fingerprint": self.fingerprint}


def check_compatible(draft: Vocab, target: Vocab, max_listed: int = 5) -> None:
    """Raise VocabMismatch unless every id both vocabularies have maps to the same bytes."""
    if draft.fingerprint == target.fingerprint:
        return
    n = min(draft.size, target.size)
    unused = draft.unused_ids | target.unused_ids  # padding: never real text on either side
    bad = [i for i in range(n) if draft.token_bytes[i] != target.token_bytes[i] and i not in unused]
    if bad:
        shown = ", ".join(f"{i} ({draft.token_bytes[i]!r} vs {target.token_bytes[i]!r})"
                          for i in bad[:max_listed])
        raise VocabMismatch(
            f"draft and target tokenizers differ on {len(bad)} of {n} shared ids, e.g. {shown}: "
            "pick a draft model from the target's family (same tokenizer)")
    if not (target.eos_ids & draft.eos_ids) and draft.eos_ids and target.eos_ids:
        raise VocabMismatch(f"draft EOS ids {sorted(draft.eos_ids)} and target EOS ids "
                            f"{sorted(target.eos_ids)} differ: use models with the same tokenizer")


def align_logits(logits: np.ndarray, n_vocab: int) -> np.ndarray:
    """Logit rows [n, W] -> [n, n_vocab]: drop padded columns, or pad missing ids with -inf."""
    w = logits.shape[-1]
    if w == n_vocab:
        return logits
    if w > n_vocab:
        return logits[..., :n_vocab]
    pad = np.full(logits.shape[:-1] + (n_vocab - w,), -np.inf, dtype=logits.dtype)
    return np.concatenate([logits, pad], axis=-1)
