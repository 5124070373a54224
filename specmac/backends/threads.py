"""How many CPUs other work holds right now, and the thread count that leaves them to it.

llama.cpp's and torch's CPU threads spin at their barriers inside a pass: when another busy process
preempts one of them, its siblings spin until it runs again, and a pass takes several times as long
(results/busy). A thread count no larger than the CPUs that are free avoids that, and costs nothing
on a quiet machine, where it is the default. So a backend whose thread count the user did not set
fits it before each run (``fit``), from a sample of the runnable tasks taken then (``others_running``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

ENV = "SPECMAC_THREADS"  # "fixed": keep the default thread count whatever the load (the old behaviour)
STAT = Path("/proc/stat")


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _procs_running(read: Callable[[], str]) -> int | None:
    for line in read().splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


def others_running(samples: int = 3, gap_s: float = 0.002,
                   read: Callable[[], str] | None = None) -> int | None:
    """Runnable tasks besides the sampling thread: the least of a few samples of /proc/stat's
    procs_running (Linux; None where there is none). The least, because this process's own threads
    spinning down after a pass, and a task between two time slices, are not work that stays."""
    if read is None:
        if not STAT.is_file():
            return None
        read = STAT.read_text
    seen = []
    for i in range(samples):
        try:
            n = _procs_running(read)
        except (OSError, ValueError):
            return None
        if n is None:
            return None
        seen.append(n)
        if i + 1 < samples:
            time.sleep(gap_s)
    return max(0, min(seen) - 1)


def fit(default: int, n_cpus: int, others: int | None) -> tuple[int, str]:
    """-> (threads, why): the default, or fewer where other work holds CPUs the default would use."""
    if others is None:
        return default, f"{default} (the default; this system does not say how busy it is)"
    n = max(1, min(default, n_cpus - others))
    busy = f"{others} other runnable task{'s' * (others != 1)} on {n_cpus} CPU{'s' * (n_cpus != 1)}"
    if n == default:
        return n, f"{n} ({busy})"
    return n, f"{n} of {default} ({busy}: more threads would wait for preempted siblings)"


def fixed() -> bool:
    """SPECMAC_THREADS=fixed: the user asked for the default thread count whatever the load."""
    return os.environ.get(ENV, "").strip().lower() == "fixed"


def choose(default: int) -> tuple[int, str]:
    """-> (threads, why) for a backend whose default count is ``default``, sampled now."""
    if fixed():
        return default, f"{default} ({ENV}=fixed)"
    return fit(default, cpus(), others_running())
