"""Files written whole, and output folders owned by one run at a time. A reader sees the old file or
the whole new one, never a part; a second run pointed at a folder in use is refused with one line
naming the first. Imports the standard library alone (and specmac.errors), so every layer can use
it (result records, the kept pass costs)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specmac.errors import SpecmacError

LOCK_NAME = ".specmac-lock"


class OutputInUse(SpecmacError):
    """Another run holds the output folder (or file) this run was asked to write."""


def umask() -> int:
    """The process's umask (read by setting it and putting it back; the CLI is single-threaded here)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: str | Path, record: Any) -> Path:
    """Write record as JSON atomically: a temporary file in the same folder, then a rename. The file
    gets the mode an ordinary open() would give it (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def place_folder(src: str | Path, dst: str | Path) -> bool:
    """Put a copy of the folder ``src`` at ``dst`` (absent, or an empty folder) whole: hard links
    where the file system allows, else copies, gathered in a hidden sibling then renamed to ``dst``,
    so a failure leaves nothing there. True if every file is a hard link. OSError says what failed."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    linked = True
    try:
        shutil.copymode(src, tmp)  # mkdtemp made it private
        for s in sorted(src.rglob("*")):  # a folder before what it holds
            d = tmp / s.relative_to(src)
            if s.is_dir():
                d.mkdir()
                continue
            try:
                os.link(s, d)
            except OSError:  # another file system, or links not allowed there
                linked = False
                shutil.copy2(s, d)
        os.rename(tmp, dst)  # replaces an empty folder; refused over anything else
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return linked


def cache_home() -> Path:
    """Where specmac keeps what outlives a run (converted models, measured pass costs):
    $SPECMAC_CACHE, else ~/.cache/specmac."""
    return Path(os.environ.get("SPECMAC_CACHE") or Path.home() / ".cache" / "specmac").expanduser()


MODELS_ENV = "SPECMAC_MODELS"


def models_home() -> Path:
    """The folder of the model files a benchmark suite names: $SPECMAC_MODELS, else
    ~/.cache/specmac/models. Not under $SPECMAC_CACHE, which a benchmark may point at a fresh
    folder so that no kept pass cost carries over."""
    return Path(os.environ.get(MODELS_ENV) or Path.home() / ".cache" / "specmac" / "models").expanduser()


def read_capped(path: str | Path, limit: int, what: str, param: str | None = None) -> bytes:
    """The bytes of a file the user named, refused (BadOption) past ``limit`` bytes: a link to
    /dev/zero, or a huge file given by mistake, must not fill the memory. OSError passes through."""
    from specmac.errors import BadOption

    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BadOption(f"{what} {path} is larger than {limit >> 20} MiB, more than such a file ever holds: "
                        "give the right file", param=param)
    return data


def _holder(lock: Path) -> str:
    """Who holds a lock file, as it says: "pid N: command" (or that it does not say)."""
    try:
        info = json.loads(lock.read_text("utf-8"))
        return f"pid {int(info['pid'])}: {info['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that did not say which"


@contextlib.contextmanager
def output_lock(path: str | Path, *, folder: bool, param: str = "out",
                command: str | None = None) -> Iterator[Path]:
    """Hold ``path`` (an output folder, or an output file's place in its folder) for this run:
    an flock on ``DIR/.specmac-lock`` (``.NAME.specmac-lock`` beside a file), taken at once or
    refused with ``OutputInUse`` naming the holder (pid, command). The lock file, and the folder if
    this run created it and left it empty, are removed on the way out. The kernel drops the lock
    when the process dies, so a killed run never holds a folder."""
    path = Path(path)
    where = path if folder else path.parent
    made = not where.exists()
    where.mkdir(parents=True, exist_ok=True)
    lock = where / (LOCK_NAME if folder else f".{path.name}{LOCK_NAME}")
    command = command or shlex.join(["specmac", *sys.argv[1:]])
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputInUse(f"{param} {path} is in use by another specmac run ({_holder(lock)}): wait "
                              f"for it to end, or write elsewhere", param=param) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the holder before us may have removed the file we opened: lock the one in place
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "command": command}).encode())
        yield lock
    finally:
        lock.unlink(missing_ok=True)  # while still held: a waiting run then locks a fresh file
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):
                where.rmdir()  # only if empty: the run wrote nothing


BENCH_LOCK_NAME = "specmac-bench.lock"  # in the temporary folder: one per machine


@contextlib.contextmanager
def machine_lock(waiting: Callable[[str], None] | None = None, path: str | Path | None = None,
                 command: str | None = None) -> Iterator[None]:
    """Hold the machine for this benchmark: two that share the CPUs measure each other. An flock on
    ``path`` (default: BENCH_LOCK_NAME in the temporary folder, the lock every specmac benchmark
    takes), waited for; ``waiting`` is told who holds it, once, if another does. The file is never
    removed, so a run that waits locks the same file as the one it waits for."""
    path = Path(path) if path is not None else Path(tempfile.gettempdir()) / BENCH_LOCK_NAME
    try:
        fd, mine = os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True
    except PermissionError:  # another user's lock file: it can still be locked, not written
        fd, mine = os.open(path, os.O_RDONLY), False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting(_holder(path))
            fcntl.flock(fd, fcntl.LOCK_EX)
        if mine:
            os.ftruncate(fd, 0)
            info = {"pid": os.getpid(), "command": command or shlex.join(["specmac", *sys.argv[1:]])}
            os.write(fd, json.dumps(info).encode())
        yield
    finally:
        os.close(fd)  # closing the last descriptor drops the lock
