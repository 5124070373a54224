"""Long waits on stderr: what is being done, how far it is, about how long is left.

One ``Reporter`` per command. Its ``say`` is a ``notify`` (a line now); the reporter itself is a
``specmac.tuning.timing.Progress`` callback, handed down to the layers that measure (they never
import click or rich); ``waiting(what)`` covers a wait that reports nothing (a model loading). On a
terminal a rich bar shows the job, its share done and the time left; elsewhere (a log, a pipe) a
line is written when a job has run ``quiet`` seconds, then every ``every`` seconds while it runs,
also between two of its reports (a thread keeps time); a job that follows another is said
``every`` seconds after the last line at the latest, so a wait made of several jobs is never silent
for long.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

import click

EVERY_S = 5.0  # off a terminal: a line this often while a job runs
QUIET_S = 1.5  # a job shorter than this says nothing


def duration(seconds: float) -> str:
    """'8 s', '2 min 5 s': a time left or gone, as a person reads it."""
    s = max(0, round(seconds))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"


class Reporter:
    """Says what a long wait is doing on ``out`` (stderr); ``prefix`` names the command ("": none)."""

    def __init__(self, prefix: str = "specmac", *, out: IO[str] | None = None, tty: bool | None = None,
                 every: float | None = None, quiet: float | None = None,
                 clock: Callable[[], float] = time.monotonic, thread: bool = True) -> None:
        self.head = f"{prefix}: " if prefix else ""
        self.every = EVERY_S if every is None else every
        self.quiet = QUIET_S if quiet is None else quiet
        self.out, self.clock = out, clock
        self.tty = (out or sys.stderr).isatty() if tty is None else tty
        self.lock = threading.RLock()
        self.job: dict | None = None  # what, done, total, started, said (when its last line was written)
        self.last: float | None = None  # when the last line was written
        self.bar = self.task = None
        self._thread = thread
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- what the layers below call ------------------------------------------------------------
    def say(self, message: str) -> None:
        """A line now (above the bar on a terminal)."""
        with self.lock:
            if self.bar is not None:
                self.bar.console.print(f"{self.head}{message}", highlight=False, markup=False)
            else:
                click.echo(f"{self.head}{message}", err=self.out is None, file=self.out)
            self.last = self.clock()

    def __call__(self, what: str, done: float, total: float) -> None:
        """``done`` of ``total`` (work of like cost; 0 where how far is unknown) of the job ``what``.
        ``done`` 0 starts a job; ``done`` >= ``total`` > 0 ends it."""
        with self.lock:
            now = self.clock()
            if self.job is None or done <= 0 or done < self.job["done"]:
                self.job = {"started": now, "said": None}
                self._start_ticker()
            job = self.job
            job.update(what=what, done=done, total=total)
            if total > 0 and done >= total:
                self._end()
                return
            if total > 0 and done > 0:
                # the pace since the first report (the time before it, a warm-up or a load, is not
                # the pace of the rest), or since the start where there is one report
                t0, d0 = job.setdefault("first", (now, done))
                pace = (now - t0) / (done - d0) if done > d0 and now > t0 else (now - job["started"]) / done
                job["end"] = now + pace * (total - done)
            self.tick(now)

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """A wait that reports nothing while it lasts: said (with the time gone) if it lasts."""
        self(what, 0, 0)
        try:
            yield
        finally:
            with self.lock:
                self._end()

    def close(self) -> None:
        with self.lock:
            self._end()
        self._stop.set()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def tick(self, now: float | None = None) -> None:
        """Show the job if it is due: ``quiet`` s after it started; then on a terminal the bar at
        every tick, elsewhere a line every ``every`` s."""
        with self.lock:
            job = self.job
            if job is None:
                return
            now = self.clock() if now is None else now
            if self.tty:
                if self.bar is not None or now >= job["started"] + self.quiet:
                    self._draw(now)
                return
            due = job["started"] + self.quiet if job["said"] is None else job["said"] + self.every
            if self.last is not None:
                due = min(due, self.last + self.every)
            if now >= due:
                job["said"] = self.last = now
                click.echo(f"{self.head}{self.line(now)}", err=self.out is None, file=self.out)

    def line(self, now: float) -> str:
        """The job, and how long is left (from its share done so far) or how long it has taken."""
        return f"{self.job['what']}{self._left(now)}"

    def _left(self, now: float) -> str:
        job = self.job
        if "end" in job:
            return f", about {duration(max(1.0, job['end'] - now))} left"
        return f" ({duration(now - job['started'])} so far)"

    def _start_ticker(self) -> None:
        if self._thread and self._ticker is None:
            self._ticker = threading.Thread(target=self._run_ticker, name="specmac-progress", daemon=True)
            self._ticker.start()

    def _run_ticker(self) -> None:
        while not self._stop.wait(0.25):
            self.tick()

    # --- on a terminal: a rich bar -------------------------------------------------------------
    def _draw(self, now: float) -> None:
        job = self.job
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.fields[left]}"), transient=True,
                                console=Console(file=self.out or sys.stderr, force_terminal=True))
            self.bar.start()
            self.task = self.bar.add_task("", total=None, left="")
        self.bar.update(self.task, description=f"{self.head}{job['what']}", left=self._left(now).lstrip(", "),
                        total=job["total"] if job["total"] > 0 else None, completed=job["done"])

    def _end(self) -> None:
        self.job = None
        if self.bar is not None:
            self.bar.stop()
            self.bar = self.task = None
