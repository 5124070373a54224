"""Long waits say what they do, how far they are and how long is left: the reporter's lines off a
terminal (a fake clock), its bar on one, and `run --k auto` with nothing kept."""

from __future__ import annotations

import io
import sys

from click.testing import CliRunner

from specmac.backends import load_backend
from specmac.cli import main, progress
from specmac.cli.progress import Reporter, duration
from specmac.tuning import calibration
from tests.support.helpers import skip_unless_installed

EMBEDDED = ("--draft", "lookup+gguf", "--target", "gguf")  # the embedded pair: 33 widths in a second


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reporter(**kw) -> tuple[Reporter, Clock, io.StringIO]:
    clock, out = Clock(), io.StringIO()
    return Reporter("specmac", out=out, tty=False, clock=clock, thread=False, **kw), clock, out


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_job_is_said_after_quiet_seconds_then_every_few_with_the_time_left():
    r, clock, out = reporter(quiet=1.5, every=5.0)
    r("measuring: pass 0 of 10", 0, 10)
    for t, done in ((1.0, 1), (2.0, 2), (4.0, 4), (6.9, 6.9)):
        clock.now = 100 + t
        r(f"measuring: pass {int(done)} of 10", done, 10)
    # nothing before 1.5 s; at 2 s, 2 of 10 done in 2 s: 8 s left; the next line is due at 7 s
    assert lines(out) == ["specmac: measuring: pass 2 of 10, about 8 s left"]
    clock.now = 107.0
    r.tick()  # between two reports (the thread's tick): the job's last report, timed now
    assert lines(out)[1:] == ["specmac: measuring: pass 6 of 10, about 3 s left"]
    clock.now = 110.0
    r("measuring: pass 10 of 10", 10, 10)  # the end of the job says nothing
    clock.now = 130.0
    r.tick()
    assert len(lines(out)) == 2


def test_the_time_left_follows_the_pace_since_the_first_report_and_counts_down_between_reports():
    """A slow start (the first pass pages the weights in) is not the pace of the rest."""
    r, clock, out = reporter(quiet=4.5, every=5.0)
    r("sweep", 0, 10)
    clock.now += 4.0
    r("sweep", 1, 10)  # 4 s for the first unit
    clock.now += 1.0
    r("sweep", 2, 10)  # then one a second: 8 left, not 2.5 s each
    assert lines(out) == ["specmac: sweep, about 8 s left"]
    clock.now += 5.0  # no report since: the end it foresaw comes nearer
    r.tick()
    assert lines(out)[1:] == ["specmac: sweep, about 3 s left"]


def test_a_short_job_says_nothing_and_a_wait_says_how_long_it_has_taken():
    r, clock, out = reporter(quiet=1.5, every=5.0)
    r("quick", 0, 4)
    clock.now += 1.0
    r("quick", 4, 4)
    assert out.getvalue() == ""
    with r.waiting("loading the models"):
        for _ in range(13):  # 6.5 s of ticks, every half second
            clock.now += 0.5
            r.tick()
    clock.now += 60
    r.tick()  # the wait is over: no line
    assert lines(out) == ["specmac: loading the models (2 s so far)",
                          "specmac: loading the models (6 s so far)"]


def test_a_new_job_has_its_own_clock_and_keeps_the_cadence_of_the_lines_before_it():
    r, clock, out = reporter(quiet=1.5, every=5.0)
    r.say("measuring the target's pass at 33 widths")  # said at once
    r("first", 0, 10)
    clock.now += 1
    r.tick()
    assert lines(out) == ["specmac: measuring the target's pass at 33 widths"]
    clock.now += 3.5
    r("first", 10, 10)  # done in 4.5 s: said nothing of itself
    r("second", 0, 10)  # a new job, 0.5 s old at the next tick, but the last line was 5 s ago
    clock.now += 0.5
    r.tick()
    assert lines(out)[1:] == ["specmac: second (0 s so far)"]
    clock.now += 4.9
    r.tick()
    assert len(lines(out)) == 2
    clock.now += 0.1
    r.tick()
    assert lines(out)[2:] == ["specmac: second (6 s so far)"]  # 5.5 s, said every 5 s
    assert Reporter("", out=io.StringIO(), tty=False).head == ""  # advise's lines have no prefix


def test_on_a_terminal_a_bar_shows_the_job_and_goes_when_it_ends():
    clock, out = Clock(), io.StringIO()
    r = Reporter("specmac", out=out, tty=True, clock=clock, thread=False, quiet=1.5)
    r("measuring: pass 0 of 10", 0, 10)
    clock.now += 1
    r("measuring: pass 1 of 10", 1, 10)
    assert r.bar is None  # younger than quiet: no bar flashes
    clock.now += 1
    r("measuring: pass 2 of 10", 2, 10)
    assert r.bar is not None
    r.bar.refresh()
    assert "measuring: pass 2 of 10" in out.getvalue() and "about 8 s left" in out.getvalue()
    r("measuring: pass 10 of 10", 10, 10)
    assert r.bar is None
    r.close()


def test_durations_read_as_a_person_says_them():
    assert [duration(x) for x in (0.4, 8, 59.6, 60, 125, 3600)] == ["0 s", "8 s", "1 min", "1 min",
                                                                     "2 min 5 s", "60 min"]


def test_the_sweep_reports_every_pass_and_knows_the_total_after_two(monkeypatch):
    """A pass's time in proportion to its width: once the widest and the one-token pass are timed,
    the estimate of the whole sweep is the whole sweep."""
    t = load_backend("synthetic", None, {"latency_ms": 0}, role="target")

    def fake(backend, fn):
        fn()
        return 0.01 * (backend.n_past - 16)  # the width just scored, after the 16-token context

    monkeypatch.setattr(calibration, "timed", fake)
    heard = []
    calibration.sweep_costs(t, [1, 2, 3, 4], repeats=2, progress=lambda *a: heard.append(a))
    order = (4, 1, 1, 2, 3, 4, 1, 2, 3, 4, 1, 1)
    whole = 0.01 * sum(order)
    assert heard[0] == ("timing the target's passes: pass 0 of 12", 0, 1)
    assert [h[0] for h in heard[1:]] == [f"timing the target's passes: pass {i} of 12" for i in range(1, 13)]
    assert all(abs(total - whole) < 1e-9 for _, _, total in heard[2:])
    assert heard[-1][1] == heard[-1][2]  # the last report ends the job


@skip_unless_installed("gguf")
def test_run_auto_with_nothing_kept_says_how_far_the_measurement_is_before_it_ends(monkeypatch, tmp_path):
    """The first line comes before the measurement starts and progress lines while it runs (on
    stderr: with --json the output stays one JSON object)."""
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # every report is due: the test needs no slow model
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    seen = {}
    real = calibration.pass_costs

    def watched(*a, **kw):
        seen["before"] = _stderr()
        out = real(*a, **kw)
        seen["during"] = _stderr()[len(seen["before"]):]
        return out

    monkeypatch.setattr(calibration, "pass_costs", watched)
    r = CliRunner().invoke(main, ["run", *EMBEDDED, "--k", "auto", "--max-tokens", "4", "--json", "hi"])
    assert r.exit_code == 0, r.output
    assert "specmac: measuring the target's pass at 33 widths" in seen["before"]
    assert "specmac: measuring the target's pass costs: pass 1 of " in seen["during"]
    assert ", about " in seen["during"] and " left" in seen["during"]
    assert r.stdout.lstrip().startswith("{")


def _stderr() -> str:
    sys.stderr.flush()
    return sys.stderr.buffer.getvalue().decode()
