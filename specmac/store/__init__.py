"""The store: conversations' caches kept while others are served, so each pays only for its new tokens.

A pair's backends hold one sequence at a time (the live cache, reused by the next generation as far
as its prompt agrees: ``specmac.core.loop``). When a generation's prompt agrees further with a
saved sequence than with the live one (two chat windows, an agent beside an editor), the pair saves
the live sequence here and restores the saved one (``specmac.api.Pair``): target and draft models
together, as mlx_lm.server's prompt cache keeps the draft's beside the target's. The store holds
sequences least recently used first out, within a memory budget; a sequence that grew replaces
the one it grew from. ``disk.DiskTier`` keeps what the budget evicts, where one is given.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from specmac.backends import Saved
from specmac.core.drafters import common_prefix

DEFAULT_MAX = 8 << 30  # bytes: the most the default budget takes, as llama-server's --cache-ram


def default_budget() -> int:
    """A quarter of the memory available now (of all of it where the system does not say what is
    available), at most ``DEFAULT_MAX``."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError):
        free = os.sysconf("SC_PHYS_PAGES") * page
    return int(min(free // 4, DEFAULT_MAX))


@dataclass
class Entry:
    """One saved sequence: per role ("target", or a draft model source's name) its backend's state."""

    tokens: tuple[int, ...]
    saved: dict[str, Saved]
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(s.nbytes for s in self.saved.values())


class SequenceStore:
    """Saved sequences, least recently used first out within ``budget`` bytes (0: none kept), and
    what became of them: hits (a prompt found its sequence here), evictions."""

    def __init__(self, budget: int, disk=None) -> None:
        self.budget, self.disk = int(budget), disk
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.nbytes = self.hits = self.evictions = 0

    def best(self, prompt: Sequence[int]) -> tuple[Entry, int] | None:
        """The saved sequence sharing the longest prefix with ``prompt`` (at least one token), and
        that prefix's length; the disk tier's too, where one is kept."""
        found = max(((e, common_prefix(e.tokens, prompt, len(prompt))) for e in self.entries.values()),
                    key=lambda x: x[1], default=None)
        if self.disk is not None:
            on_disk = self.disk.best(prompt)
            if on_disk is not None and (found is None or on_disk[1] > found[1]):
                found = on_disk
        return found if found is not None and found[1] > 0 else None

    def take(self, entry: Entry) -> Entry:
        """Out of the store to be restored (the live cache holds it from now on; a hit)."""
        if self.entries.pop(entry.tokens, None) is not None:
            self.nbytes -= entry.nbytes
        elif self.disk is not None:
            entry = self.disk.take(entry)
        self.hits += 1
        return entry

    def put(self, entry: Entry) -> None:
        """Keep ``entry`` (most recently used): it replaces the sequences it grew from; the least
        recently used go (to the disk tier, where kept) until the store is within its budget."""
        for tokens in [t for t in self.entries if len(t) <= len(entry.tokens) and entry.tokens[:len(t)] == t]:
            self.nbytes -= self.entries.pop(tokens).nbytes
        if entry.nbytes > self.budget:
            self._evict(entry)
            return
        self.entries[entry.tokens] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes
            self._evict(old)

    def _evict(self, entry: Entry) -> None:
        self.evictions += 1
        if self.disk is not None:
            self.disk.put(entry)

    def info(self) -> dict:
        out = {"entries": len(self.entries), "bytes": self.nbytes, "budget": self.budget, "hits": self.hits,
               "evictions": self.evictions}
        return out | ({"disk": self.disk.info()} if self.disk is not None else {})
