"""The folder of converted models: one entry per (source file, format, precision), made once.

Each entry is a folder under ``cache_root()`` (``$SPECMAC_CACHE/converted``, default
``~/.cache/specmac/converted``) holding the converted model and ``specmac_source.json``: where it
came from, the source's SHA-256 and how it was made. An entry is built in a hidden temporary folder
and renamed into place, so a failed or interrupted conversion leaves nothing that looks complete.
Imports the standard library alone, with specmac.errors and specmac.files (the converters import
their frameworks themselves).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from specmac.errors import SpecmacError
from specmac.files import cache_home, umask

SIDECAR = "specmac_source.json"


class CacheUnwritable(SpecmacError):
    """The converted-model cache folder cannot be made or written."""

TMP_PREFIX = ".tmp-"


def cache_root() -> Path:
    """Where converted models live: $SPECMAC_CACHE/converted, else ~/.cache/specmac/converted."""
    return cache_home() / "converted"


def sha256_path(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file; of a folder, the SHA-256 of its sorted "name sha256" lines (files only)."""
    if path.is_dir():
        lines = [f"{f.name} {sha256_path(f)}\n" for f in sorted(path.iterdir()) if f.is_file()
                 and f.name != SIDECAR]
        return hashlib.sha256("".join(lines).encode()).hexdigest()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def signature(path: Path) -> dict:
    """Cheap identity of a source (path, size, mtime) so a cache hit needs no re-hash."""
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
    return {"path": str(path.resolve()), "bytes": sum(f.stat().st_size for f in files),
            "mtime_ns": max(f.stat().st_mtime_ns for f in files)}


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text).strip("._")[:80] or "model"


def read_sidecar(entry: Path) -> dict | None:
    meta = sidecar_problem(entry)
    return meta if isinstance(meta, dict) else None


def sidecar_problem(entry: Path) -> dict | str:
    """The entry's sidecar, or why it cannot be read (one phrase)."""
    try:
        meta = json.loads((entry / SIDECAR).read_text("utf-8"))
    except FileNotFoundError:
        return f"has no {SIDECAR}"
    except OSError as e:
        return f"{SIDECAR} cannot be read ({e.strerror})"
    except ValueError:
        return f"{SIDECAR} is not valid JSON"
    return meta if isinstance(meta, dict) else f"{SIDECAR} is not a JSON object"


def derived_from(path: Path) -> str | None:
    """The resolved source a cached file was made from (its entry's sidecar), if it is one."""
    meta = read_sidecar(path.parent) if path.is_file() else None
    try:
        return str(Path(meta["source"]).resolve()) if meta else None
    except (KeyError, TypeError, OSError):
        return None


def entries() -> Iterator[tuple[Path, dict]]:
    """Every complete entry with its sidecar, sorted by name (temporary folders, links, broken
    entries excluded: ``scan`` lists those)."""
    for entry, meta in scan():
        if isinstance(meta, dict) and meta is not LEFTOVER:
            yield entry, meta


LEFTOVER: dict = {"kind": "unfinished conversion"}


def scan() -> Iterator[tuple[Path, dict | str]]:
    """Everything in the cache folder, sorted by name: (path, its sidecar) for a complete entry,
    (path, LEFTOVER) for an unfinished conversion's folder, else (path, what is wrong with it: a
    link, a stray file, a broken sidecar). An unreadable cache folder is an OSError."""
    root = cache_root()
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if entry.is_symlink():
            yield entry, f"a link to {os.readlink(entry)}, not an entry"
        elif entry.name.startswith(TMP_PREFIX) and entry.is_dir():
            yield entry, LEFTOVER
        elif not entry.is_dir():
            yield entry, "a file, not an entry"
        else:
            yield entry, sidecar_problem(entry)


def entry_bytes(entry: Path) -> int | None:
    """Bytes under an entry (a link counts as itself, not what it points to); None if unreadable."""
    try:
        if entry.is_symlink() or entry.is_file():
            return entry.lstat().st_size
        return sum(f.lstat().st_size for f in entry.rglob("*") if not f.is_dir() or f.is_symlink())
    except OSError:
        return None


def lookup(source: Path, variant: str) -> tuple[Path, dict] | None:
    """The entry made from this source (same path, size and mtime) as ``variant``, if any."""
    sig = signature(source)
    for entry, meta in entries():
        if meta.get("variant") == variant and meta.get("source_signature") == sig:
            return entry, meta
    return None


def converted(source: str | Path, variant: str, build: Callable[[Path, Path], None], *,
              what: str, details: dict | None = None) -> tuple[Path, dict]:
    """The cache entry for ``source`` as ``variant``: found, or made once by ``build(source, folder)``.

    ``build`` writes into an empty temporary folder; on success the folder gets the sidecar and is
    renamed to ``<name>-<sha12>-<variant>``; on any failure it is removed. Returns (entry, sidecar).
    """
    source = Path(source).expanduser()
    hit = lookup(source, variant)
    if hit:
        return hit
    sha = sha256_path(source)
    root = cache_root()
    final = root / f"{_slug(source.stem if source.is_file() else source.name)}-{sha[:12]}-{variant}"
    meta = read_sidecar(final)
    if meta is not None:  # same content under another path or mtime: reuse it
        return final, meta
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}.", dir=root))
    except OSError as e:
        raise CacheUnwritable(f"cannot write the model cache {root} ({e.strerror}): point SPECMAC_CACHE at "
                              "a writable folder") from None
    tmp.chmod(0o777 & ~umask())  # mkdtemp makes it private; an entry is an ordinary folder
    status(f"specmac: converting {source} to {what} (once; cached in {final})")
    try:
        build(source, tmp)
        _ordinary_modes(tmp)
        meta = {"source": str(source.resolve()), "source_sha256": sha, "variant": variant,
                "source_signature": signature(source), "what": what, **(details or {}),
                "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        (tmp / SIDECAR).write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():  # made meanwhile by another process: keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, meta


def _ordinary_modes(folder: Path) -> None:
    """What a converter wrote gets the modes of new files and folders (0666, 0777 less the umask):
    safetensors writes through a private temporary file (0600), which keeps other users out of a
    shared cache and out of an --out folder of links to it."""
    mask = umask()
    for p in folder.rglob("*"):
        if not p.is_symlink():
            p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def remove(entry: Path) -> None:
    """Delete one entry (or a leftover temporary folder, a link as the link, a stray file) of the
    cache; an OSError names the first thing that could not be removed."""
    entry = Path(entry)
    if entry.parent.resolve() != cache_root().resolve():
        raise ValueError(f"{entry} is not an entry of {cache_root()}")
    if entry.is_symlink() or not entry.is_dir():
        entry.unlink()
        return
    failed: list[OSError] = []
    shutil.rmtree(entry, onerror=lambda _fn, _path, exc: failed.append(exc[1]))
    if failed:
        raise failed[0]


def status(line: str) -> None:
    """A one-time conversion is slow: say so on stderr (one line)."""
    print(line, file=sys.stderr, flush=True)


def progress_bars() -> bool:
    """Show the converters' progress bars only on a terminal."""
    return sys.stderr.isatty()
