"""One benchmark at a time on a machine: two that share the CPUs measure each other.

Every bench script that times something calls ``take_machine()`` before it loads a model: it waits
for the lock ``specmac compare --exclusive`` takes (specmac.files.machine_lock), says who holds it
while it waits, and holds it until the process exits. Under an outside ``flock`` on the same file
(the command lines older records print) the lock is already this run's, so it does not wait on it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

_held = contextlib.ExitStack()


def take_machine(command: str | None = None) -> None:
    """Wait until no other benchmark holds this machine, then hold it until this process exits."""
    # imported here: bench/ab.py's workers import this module under an older checkout's specmac
    from specmac.files import BENCH_LOCK_NAME, machine_lock

    path = Path(tempfile.gettempdir()) / BENCH_LOCK_NAME
    if _held_by_ancestor(path):
        return
    command = command or shlex.join(["python", *sys.argv])
    _held.enter_context(machine_lock(
        waiting=lambda who: print(f"waiting for the machine: another benchmark holds it ({who})",
                                  file=sys.stderr, flush=True),
        path=path, command=command))
    atexit.register(_held.close)


def _held_by_ancestor(path: Path) -> bool:
    """Whether a process this one descends from holds an flock on ``path`` (Linux: /proc/locks),
    as ``flock LOCK python bench/X.py`` does; elsewhere False, and the run waits as usual."""
    try:
        st, locks = os.stat(path), Path("/proc/locks").read_text()
    except OSError:
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in locks.splitlines():  # "1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF"; "->": a waiter
        f = line.split()
        i = f.index("FLOCK") if "FLOCK" in f and "->" not in f else -1
        if 0 <= i < len(f) - 4 and f[i + 4] == where:
            holders.add(int(f[i + 3]))
    pid = os.getppid()
    while pid > 1:
        if pid in holders:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False
