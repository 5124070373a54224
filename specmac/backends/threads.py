"""How many CPUs other work holds right now, and the thread count that leaves them to it.

llama.cpp's and torch's CPU threads spin at their barriers inside a pass: when another busy process
preempts one of them, its siblings spin until it runs again, and a pass takes several times as long.
A thread count no larger than the CPUs that are free avoids that, and costs nothing
on a quiet machine, where it is the default. So a backend whose thread count the user did not set
fits it before each run (``fit``), from a sample of the runnable tasks taken then (``others_running``),
and keeps it fitted during the run (``Fitter``): a pass whose threads got much less CPU time than
they had wall time lost a CPU to other work (one fewer thread), and a run at fewer threads samples
again now and then to take CPUs back when the other work is gone.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from pathlib import Path

INTERVAL_S = 0.5  # a running Fitter looks at its passes this often
MIN_PASSES = 8  # ... once it has timed this many (the first pass after a change is not timed: it is slow)
STARVED = 0.7  # passes whose CPU time was under this share of threads x wall time lost a CPU
ENV = "SPECMAC_THREADS"  # "fixed": keep the default thread count whatever the load (the old behaviour)
STAT = Path("/proc/stat")


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the system says), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _procs_running(read: Callable[[], str]) -> int | None:
    for line in read().splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


def task_stats(read: Callable[[Path], str] = Path.read_text) -> list[str]:
    """The /proc/self/task/*/stat texts of this process's threads (none where there is no /proc)."""
    stats = []
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            stats.append(read(stat))
        except OSError:  # the thread ended meanwhile
            pass
    return stats


def own_running(stats: list[str] | None = None) -> int:
    """This process's runnable threads (state R) from their stat texts, at least one: the thread
    reading them."""
    stats = task_stats() if stats is None else stats
    # the state follows the command name, which is in parentheses and may itself hold spaces
    return max(1, sum(s[s.rindex(")") + 1:].split()[0] == "R" for s in stats if ")" in s))


def others_running(samples: int = 3, gap_s: float = 0.002, read: Callable[[], str] | None = None,
                   own: Callable[[], int] | None = None) -> int | None:
    """Runnable tasks of other processes: /proc/stat's procs_running less this process's own
    runnable threads (its pool threads spin for a while after a pass), the least of a few samples
    (a task between two time slices is not work that stays). None where /proc has no such count."""
    if read is None:
        if not STAT.is_file():
            return None
        read, own = STAT.read_text, own or own_running
    own = own or (lambda: 1)  # an injected reader: only the sampling thread is ours
    seen = []
    for i in range(samples):
        try:
            n = _procs_running(read)
            mine = own()
        except (OSError, ValueError):
            return None
        if n is None:
            return None
        seen.append(n - mine)
        if i + 1 < samples:
            time.sleep(gap_s)
    return max(0, min(seen))


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


class Fitter:
    """A backend's thread count kept fitted to the load: ``start`` before a run, ``timed`` around
    each pass; ``apply(n)`` sets the backend's count. Passes are timed in wall and process CPU time
    (cheap clocks); every INTERVAL_S the fitter drops a thread if the passes were starved, or
    samples the runnable tasks and takes back the CPUs that are free again."""

    def __init__(self, default: int, apply: Callable[[int], None], current: int | None = None) -> None:
        self.default, self.apply = default, apply
        self.n = default if current is None else current
        self.why = f"{self.n} (not fitted yet)"
        self.changes = 0  # refits during runs, for the stats
        self._window()

    def _window(self) -> None:
        self.wall = self.cpu = 0.0
        self.passes = -1  # the first pass of a window is not counted (after a change it sets up threads)
        self.since = time.monotonic()

    def _set(self, n: int, why: str) -> None:
        if n != self.n:
            self.apply(n)
            self.n = n
        self.why = why

    def start(self) -> str:
        """Before a run: the count the load leaves room for now; -> why."""
        self._set(*choose(self.default))
        self._window()
        return self.why

    def timed(self, fn: Callable[[], object]) -> object:
        """Run one pass, timed, and refit if INTERVAL_S has passed since the last look."""
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn()
        finally:
            self.passes += 1
            if self.passes > 0:
                self.wall += time.perf_counter() - w0
                self.cpu += time.process_time() - c0
            if self.passes >= MIN_PASSES and time.monotonic() - self.since >= INTERVAL_S and not fixed():
                self._look()

    def _look(self) -> None:
        share = self.cpu / (self.n * self.wall) if self.wall > 0 else 1.0
        # a pass can also be short of CPU time by itself (serial stretches in a framework's forward):
        # a thread is dropped only where other work is running too
        if self.n > 1 and share < STARVED and fit(self.default, cpus(), others_running())[0] < self.n:
            self.changes += 1
            self._set(self.n - 1, f"{self.n - 1} of {self.default} (its passes had {share:.0%} of "
                                  f"{self.n} threads' CPU time: other work took a CPU)")
        elif self.n < self.default:
            n, why = fit(self.default, cpus(), others_running())
            if n > self.n:
                self.changes += 1
                self._set(n, why)
        self._window()


def give_up_openmp_pools() -> int:
    """Free the calling thread's OpenMP thread pools, in every OpenMP runtime the process loaded
    (torch's own libgomp, llama.cpp's): call it from a thread that is done with compute before
    another thread takes the passes over. libgomp spins its threads at barriers only while the
    process holds no more OpenMP threads than CPUs; a pool kept by the thread that loaded the models
    puts it over, and then every barrier of the thread that runs the passes sleeps and wakes, where
    a pass of a small model has hundreds. -> the pools freed (0 where there is no /proc)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return 0
    names = ("libgomp", "libomp", "libiomp")
    libs = {line.split()[-1] for line in maps.splitlines() if "/" in line}
    freed = 0
    for path in sorted(p for p in libs if any(p.rsplit("/", 1)[-1].startswith(n) for n in names)):
        try:
            lib = ctypes.CDLL(path)
            freed += lib.omp_pause_resource_all(2) == 0  # omp_pause_hard: the pool's threads end
        except (OSError, AttributeError):  # not loadable here, or a runtime without OpenMP 5.0's pause
            continue
    return freed
