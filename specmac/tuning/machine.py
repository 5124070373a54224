"""How busy the machine is now: tasks other than ours waiting for or running on its CPUs.

Timings taken beside other work are slower and noisier, so the commands that measure record the
load before and after and say so when the machine is busy. On Linux the count is instantaneous:
the runnable tasks of /proc/loadavg (field 4, ``running/total``) less this process's runnable
threads (state R in /proc/self/task/*/stat), the median of a few samples; the 1-minute load
average is recorded beside it but not used, since it still holds this process's own work.
Elsewhere only ``os.getloadavg()`` is known: this process counts as one runnable task there. In
a container /proc/loadavg may count the host's tasks, so "busy" can mean a busy host.
Standard library only; the readers are parameters so the parsing is tested on given text.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from specmac.backends.threads import cpus as usable_cpus
from specmac.backends.threads import own_running  # noqa: F401  (part of this module's face)
from specmac.backends.threads import task_stats as read_task_stats

SAMPLES = 5  # instantaneous counts, median of: one blip (a cron job's fork) does not make it busy
INTERVAL_S = 0.02
_GETLOADAVG = getattr(os, "getloadavg", None)  # not on Windows


@dataclass(frozen=True)
class MachineLoad:
    """cpus: usable CPUs; load_1m: the 1-minute load average; others_running: runnable tasks that
    are not this process's (None where the system does not count them); busy: whether those take
    a share of the CPUs large enough to slow and scatter timings."""

    cpus: int
    load_1m: float
    others_running: float | None
    busy: bool

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line for a busy machine (what it does to the numbers, what to do)."""
        others = (f"{self.others_running:g} other task{'s' if self.others_running != 1 else ''} "
                  "running, " if self.others_running is not None else "")
        return (f"the machine is busy ({others}load {self.load_1m:.1f} on {self.cpus} CPU"
                f"{'s' if self.cpus != 1 else ''}): timings are slower and noisier than on a quiet "
                "machine; re-run when it is quiet for numbers to keep")


def busy_threshold(cpus: int) -> float:
    """Other runnable tasks from which the machine counts as busy: one on a small machine (it
    takes a core the measurement would use), a quarter of the CPUs on a large one."""
    return max(1.0, cpus / 4)


def parse_loadavg(text: str) -> tuple[float, int]:
    """/proc/loadavg's text -> (1-minute load, runnable tasks), e.g. "0.52 0.58 0.59 3/812 1234"."""
    fields = text.split()
    return float(fields[0]), int(fields[3].split("/")[0])


def _read(path: str) -> str:
    return Path(path).read_text()


def machine_load(*, cpus: int | None = None, read: Callable[[str], str] = _read,
                 task_stats: Callable[[], list[str]] | None = None,
                 getloadavg: Callable[[], tuple[float, float, float]] | None = _GETLOADAVG,
                 samples: int = SAMPLES, interval_s: float = INTERVAL_S) -> MachineLoad:
    """The machine's load now (``samples`` counts ``interval_s`` apart, about 0.1 s by default)."""
    cpus = cpus or usable_cpus()
    stats = task_stats or (lambda: read_task_stats(lambda p: read(str(p))))
    try:
        counts = []
        for i in range(samples):
            if i:
                time.sleep(interval_s)
            load_1m, running = parse_loadavg(read("/proc/loadavg"))
            counts.append(max(0, running - own_running(stats())))
        others = float(statistics.median(counts))
        return MachineLoad(cpus, load_1m, others, others >= busy_threshold(cpus))
    except (OSError, ValueError, IndexError):  # no /proc (macOS, Windows), or a text not understood
        load_1m = getloadavg()[0] if getloadavg is not None else 0.0
        return MachineLoad(cpus, load_1m, None, load_1m - 1 >= busy_threshold(cpus))
