"""Runs what `run` and `verify` asked for and shows it as it goes: streamed coloured text, Ctrl-C
that leaves the caches consistent, the stats block; verify's progress, table and verdict."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import click

from specmac.api import Pair
from specmac.cli.render import (
    EXIT_INTERRUPTED,
    STYLE,
    legend,
    show_verdict,
    stats_block,
    tenths,
    verdict,
    verify_table,
)
from specmac.core.loop import Event
from specmac.core.planner import Planner
from specmac.core.runstats import RunStats
from specmac.core.sampling import SamplingParams


class TextStream:
    """Writes the text of a growing id list as it becomes printable, coloured by token kind.

    Decodes only a short window (ids[prefix:]) per token, so the cost stays linear: text is held
    back while it ends in an incomplete UTF-8 sequence, and the window's first token gives the
    tokenizer the context it needs to decode leading spaces correctly.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], color: bool, out=None) -> None:
        self.decode, self.color = decode, color
        self.out = out
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] is the context already printed

    def push(self, ids: Sequence[int], kinds: Sequence[str]) -> None:
        for t, kind in zip(ids, kinds):
            self.ids.append(t)
            before = self.decode(self.ids[self.prefix : self.read])
            text = self.decode(self.ids[self.prefix :])
            if len(text) > len(before) and not text.endswith("\ufffd"):
                self._write(text[len(before) :], kind)
                self.prefix, self.read = self.read, len(self.ids)
        self._flush()

    def finish(self, all_ids: Sequence[int]) -> None:
        """Print whatever ``all_ids`` holds beyond what was shown (ids pushed or still held back)."""
        missing = list(all_ids[len(self.ids) :])
        self.ids.extend(missing)
        before = self.decode(self.ids[self.prefix : self.read])
        text = self.decode(self.ids[self.prefix :])
        if len(text) > len(before):
            self._write(text[len(before) :], "target")
        self._flush()

    def _write(self, text: str, kind: str) -> None:
        style = STYLE[kind] if self.color else None
        click.echo(click.style(text, fg=style) if style else text, nl=False, file=self.out,
                   color=self.color or None)

    def _flush(self) -> None:
        (self.out or sys.stdout).flush()


# --- signals ---------------------------------------------------------------------------------

@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while the final output is written, so that it is never cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# --- run -------------------------------------------------------------------------------------

def generate_events(pair: Pair, ids: list[int], on_event: Callable[[Event], None] | None = None,
                    **kw) -> tuple[list[Event], bool]:
    """Run the loop, collecting events; -> (events, interrupted). Ctrl-C stops it cleanly
    (the loop's ``finally`` leaves both caches consistent)."""
    events: list[Event] = []
    try:
        for event in pair.stream(ids, **kw):
            events.append(event)  # one step, so what was printed and what is counted agree
            if on_event is not None:
                on_event(event)
    except KeyboardInterrupt:
        return events, True
    return events, False


def summarize(events: list[Event], k: Planner | None, speculative: bool,
              interrupted: bool) -> tuple[RunStats, dict]:
    fixed = k.k if k is not None else None
    stats = RunStats(k=fixed if fixed is not None or k is None else "auto")
    for e in events:
        stats.add(e)
    if interrupted:
        stats.finish_reason = "interrupted"
    d = stats.to_dict(speculative)
    if not speculative:
        d["k"] = None  # no drafts were asked for
    elif fixed is not None:  # one number per draft position, even if never reached
        d["per_position_acceptance"] = (d["per_position_acceptance"] + [None] * fixed)[:fixed]
    return stats, d


def run(pair: Pair, prompt: str, *, params: SamplingParams, k: Planner, max_tokens: int, seed: int,
        baseline: bool, as_json: bool, color: bool, meta: dict, prediction: str | None = None) -> int:
    """Stream one generation (and optionally the baseline); return the exit status."""
    ids = pair.encode(prompt)
    out = TextStream(pair.target.decode, color)
    predicted = pair.prediction_drafter(prediction) if prediction is not None else None
    speculative = pair.speculative or predicted is not None
    need_legend = [color and speculative]

    def show(event: Event) -> None:
        if need_legend[0]:  # on the first event: the loop's own checks (prompt length) have passed
            click.echo(legend(), err=True)
            need_legend[0] = False
        out.push(event.tokens, event.kinds)

    threads = pair.thread_counts()  # as fitted for this run (a refit during it shows at its end)
    t0 = time.perf_counter()
    events, interrupted = generate_events(pair, ids, None if as_json else show, params=params,
                                          max_tokens=max_tokens, k=k, seed=seed, prediction=predicted)
    wall = time.perf_counter() - t0
    token_ids = [t for e in events for t in e.tokens]
    stats, sd = summarize(events, k, speculative, interrupted)
    result = {"prompt": prompt, "n_prompt_tokens": len(ids), "text": pair.target.decode(token_ids),
              "token_ids": token_ids, **sd, "wall_seconds": wall, "sampling": params.to_dict(),
              "seed": seed, **pair.info(), **meta}
    if predicted is not None:
        result["prediction"] = {**predicted.usage(), "prediction_tokens": len(predicted.pred)}
    if k.k is None or len(k.sources) > 1:  # what the planner learned and why it chose as it did
        result["k_policy"] = k.info()
    if baseline and not interrupted:
        # measured like the run: warm, right after it, at the CPU threads the run ended on
        ended = pair.thread_counts()
        plain = pair.plain(same_threads=True)
        base_events, interrupted = generate_events(plain, ids, params=params,
                                                   max_tokens=max_tokens, seed=seed)
        _, bd = summarize(base_events, None, False, interrupted)
        bd["thread_counts"] = {"run": {"start": threads, "end": ended},
                               "baseline": plain.thread_counts()}
        result["baseline"] = bd
        b, s = bd["tokens_per_second"], stats.tokens_per_second
        result["speedup"] = s / b if (b and s and not interrupted) else None
    with sigint_deferred():
        if as_json:
            click.echo(json.dumps(result, indent=2, default=str))
        else:
            out.finish(token_ids)
            click.echo("")
            for line in stats_block(result, speculative):
                click.echo(line, err=True)
    return EXIT_INTERRUPTED if interrupted else 0


def verify(pair: Pair, *, params: SamplingParams, k: int, tokens: int, length: int, seed: int,
           as_json: bool, progress_lines: bool = False) -> None:
    """``progress_lines``: off a terminal, a line at every tenth of the tokens (a long run)."""
    from specmac.lossless.harness import two_sample_check

    kw = dict(params=params, n_tokens=tokens, k=k, length=length, seed=seed)
    if as_json or not sys.stderr.isatty():
        res = two_sample_check(pair, **kw, progress=tenths(2 * tokens, "tokens") if progress_lines else None)
    else:
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("sampling speculative and plain", total=2 * tokens)
            res = two_sample_check(pair, **kw, progress=lambda n: bar.advance(task, n))
    res.update(pair.info())
    res["verdict"] = verdict(res)
    show_verdict(res, [] if as_json else verify_table(res), as_json)
