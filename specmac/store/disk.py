"""The store's disk tier: saved sequences the memory budget evicted, in files of their own.

Entries live under ``directory/<identity>/``, identity a hash of what a cache's content depends
on: every backend's model (its files' size and mtime), options (thread counts aside) and library
version (``BaseBackend.identity``). An entry of another model, option or library version is in
another folder and is never read. An entry is a folder holding one file per role (the backend's
state, written by ``BaseBackend.write_state``: no pickle) and ``entry.json`` (its tokens, its files
and their SHA-256), written last through a temporary name and a rename: a folder without it is a
write that was cut off (a killed server) and is removed at the next start. A file whose SHA-256
does not match is refused with one log line, the entry removed, and the sequence recomputed. The
tier keeps at most ``budget`` bytes, the least recently used going first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from specmac.backends import BaseBackend
from specmac.backends.conversion.cache import sha256_path
from specmac.core.drafters import common_prefix
from specmac.files import write_json
from specmac.store import Entry

log = logging.getLogger("specmac.store")
FORMAT = "specmac.store/1"
VOLATILE = ("n_threads", "n_threads_batch")  # options that change no cache's content
DISK_BUDGET = 16 << 30  # bytes the tier keeps at most


def identity(backends: Mapping[str, BaseBackend]) -> str:
    """The folder name of these backends' entries: a hash of what their caches depend on."""
    ident = {}
    for role, b in sorted(backends.items()):
        info = b.identity()
        info["options"] = {k: v for k, v in (info.get("options") or {}).items() if k not in VOLATILE}
        ident[role] = info
    return hashlib.sha256(json.dumps([FORMAT, ident], sort_keys=True, default=str).encode()).hexdigest()[:24]


class DiskTier:
    """Entries on disk for one set of backends (a pair's target and draft models)."""

    def __init__(self, directory: str | Path, backends: Mapping[str, BaseBackend], budget: int) -> None:
        self.backends, self.budget = dict(backends), int(budget)
        self.root = Path(directory) / identity(self.backends)
        self.root.mkdir(parents=True, exist_ok=True)
        self.index: dict[tuple[int, ...], Path] = {}
        self.refused = 0
        for folder in sorted(self.root.iterdir(), key=lambda p: p.stat().st_mtime):
            meta = self._meta(folder)
            if meta is None:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                self.index[tuple(meta["tokens"])] = folder

    def _meta(self, folder: Path) -> dict | None:
        """An entry's entry.json, or None (with one log line where it exists but cannot be read)."""
        path = folder / "entry.json"
        if not folder.is_dir() or not path.exists():
            return None  # a write cut off before its last step
        try:
            meta = json.loads(path.read_text("utf-8"))
            if meta["format"] != FORMAT or not all(isinstance(t, int) for t in meta["tokens"]):
                raise ValueError("an unknown format")
            return meta
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("store: %s is not a saved sequence (%s): removed", folder, e)
            return None

    def best(self, prompt: Sequence[int]) -> tuple[Entry, int] | None:
        """The entry sharing the longest prefix with ``prompt`` (tokens only: read when taken)."""
        found = max(((t, common_prefix(t, prompt, len(prompt))) for t in self.index), key=lambda x: x[1],
                    default=None)
        return (Entry(found[0], {}), found[1]) if found is not None and found[1] > 0 else None

    def take(self, entry: Entry) -> Entry:
        """The entry read back (and off the disk: the live cache holds it now); where a file is
        corrupt or cut short, one log line and an entry without state (recomputed)."""
        folder = self.index.pop(entry.tokens)
        try:
            meta = self._meta(folder)
            if meta is None:
                raise ValueError("entry.json is missing or unreadable")
            saved = {}
            for role, f in meta["files"].items():
                path = folder / f["name"]
                if role not in self.backends or sha256_path(path) != f["sha256"]:
                    raise ValueError(f"{f['name']} does not match its SHA-256")
                saved[role] = self.backends[role].read_state(path, meta["held"][role])
            return Entry(entry.tokens, saved)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.refused += 1
            log.warning("store: the saved sequence in %s cannot be used (%s): removed, it is recomputed",
                        folder, e)
            return Entry(entry.tokens, {})
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def put(self, entry: Entry) -> None:
        """Write ``entry`` (whole, or not at all), then keep the tier within its budget."""
        if not entry.saved or entry.nbytes > self.budget:
            return
        folder = self.root / f"{time.time_ns():x}-{os.getpid()}"
        folder.mkdir()
        try:
            files = {}
            for role, saved in entry.saved.items():
                path = self.backends[role].write_state(saved, folder / role.replace("/", "_"))
                files[role] = {"name": path.name, "sha256": sha256_path(path)}
            held = {role: list(saved.tokens) for role, saved in entry.saved.items()}
            write_json(folder / "entry.json", {"format": FORMAT, "tokens": list(entry.tokens), "files": files,
                                               "held": held})
        except OSError as e:
            shutil.rmtree(folder, ignore_errors=True)
            log.warning("store: cannot write a saved sequence to %s (%s)", self.root, e)
            return
        for tokens in [t for t in self.index if entry.tokens[:len(t)] == t]:
            shutil.rmtree(self.index.pop(tokens), ignore_errors=True)  # what it grew from
        self.index[entry.tokens] = folder
        self._shrink()

    def _shrink(self) -> None:
        sizes = {t: sum(f.stat().st_size for f in p.iterdir()) for t, p in self.index.items()}
        total = sum(sizes.values())
        for tokens in list(self.index):  # oldest first
            if total <= self.budget:
                break
            shutil.rmtree(self.index.pop(tokens), ignore_errors=True)
            total -= sizes[tokens]

    def info(self) -> dict:
        return {"entries": len(self.index), "refused": self.refused, "budget": self.budget,
                "directory": str(self.root)}
