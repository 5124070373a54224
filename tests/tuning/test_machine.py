"""How busy the machine is: /proc/loadavg and our own threads, parsed from given text; the line
probe-parallelism and advise print, and the load they record, with a faked load."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specmac.cli import main
from specmac.tuning import machine
from specmac.tuning.machine import MachineLoad, machine_load, own_running, parse_loadavg

# /proc/self/task/*/stat: pid (comm) state ...; a command name may hold spaces and parentheses
RUNNING = "4242 (python3) R 1 4242 4242 0 -1 4194304 1000 0 0 0"
SLEEPING = "4243 (gomp worker) S 1 4242 4242 0 -1 4194368 10 0 0 0"
ODD_NAME = "4244 (a) R (b) S 1 4242 4242 0 -1 4194368 10 0 0 0"  # its state is S, after the last ")"


def fake_proc(loadavg: str, stats: list[str]):
    def read(path: str) -> str:
        assert path == "/proc/loadavg"
        return loadavg

    return {"read": read, "task_stats": lambda: stats}


def test_parse_loadavg():
    assert parse_loadavg("3.10 2.05 1.00 5/812 12345\n") == (3.10, 5)


def test_own_running_counts_our_runnable_threads():
    assert own_running([RUNNING, SLEEPING]) == 1
    assert own_running([RUNNING, RUNNING.replace("4242 (", "4245 (")]) == 2
    assert own_running([ODD_NAME]) == 1  # none runnable: still the reading thread itself
    assert own_running([]) == 1


@pytest.mark.parametrize("loadavg, cpus, others, busy", [
    ("0.20 0.10 0.05 1/300 99", 2, 0, False),  # only us
    ("1.90 1.10 0.50 2/300 99", 2, 1, True),  # one other task on 2 CPUs takes a core
    ("3.10 2.00 1.00 3/300 99", 16, 2, False),  # 2 others on 16 CPUs: under a quarter
    ("9.00 8.00 7.00 6/300 99", 16, 5, True),
])
def test_machine_load_from_faked_proc(loadavg, cpus, others, busy):
    m = machine_load(cpus=cpus, samples=3, interval_s=0, **fake_proc(loadavg, [RUNNING, SLEEPING]))
    assert m == MachineLoad(cpus=cpus, load_1m=float(loadavg.split()[0]), others_running=others, busy=busy)


def test_our_own_spinning_threads_are_not_other_tasks():
    m = machine_load(cpus=2, samples=1, **fake_proc("2.00 1.00 0.50 3/300 99", [RUNNING] * 3))
    assert m.others_running == 0 and not m.busy


def test_one_blip_does_not_make_it_busy():
    texts = iter(["0.1 0.1 0.1 1/300 9", "0.1 0.1 0.1 4/300 9", "0.1 0.1 0.1 1/300 9"])
    m = machine_load(cpus=2, samples=3, interval_s=0, read=lambda _p: next(texts),
                     task_stats=lambda: [RUNNING])
    assert m.others_running == 0 and not m.busy


def test_without_proc_the_load_average_counts_us_as_one_task():
    def missing(path: str) -> str:
        raise FileNotFoundError(path)

    quiet = machine_load(cpus=2, read=missing, getloadavg=lambda: (1.2, 1.0, 1.0))
    busy = machine_load(cpus=2, read=missing, getloadavg=lambda: (2.5, 1.0, 1.0))
    assert quiet == MachineLoad(2, 1.2, None, False)
    assert busy.busy and busy.others_running is None
    assert "other task" not in busy.describe() and "load 2.5 on 2 CPUs" in busy.describe()


def test_the_real_machine_gives_a_record():
    m = machine_load(samples=1)
    assert m.cpus >= 1 and m.load_1m >= 0 and isinstance(m.busy, bool)


# --- the commands, with a faked load ------------------------------------------------------

PROBE = ["probe-parallelism", "--backend", "synthetic", "--n-max", "4", "--context", "8", "--repeats", "1"]
ADVISE = ["advise", "--draft", "synthetic", "--target", "synthetic", "--run-tokens", "8", "--context", "8",
          "--repeats", "1"]
BUSY = MachineLoad(cpus=2, load_1m=3.1, others_running=2.0, busy=True)
QUIET = MachineLoad(cpus=2, load_1m=0.3, others_running=0.0, busy=False)


def faked(monkeypatch, *loads: MachineLoad) -> None:
    got = iter(loads)
    monkeypatch.setattr(machine, "machine_load", lambda **_kw: next(got))


@pytest.mark.parametrize("args", [PROBE, ADVISE], ids=["probe-parallelism", "advise"])
def test_busy_machine_is_said_and_recorded(args, monkeypatch):
    faked(monkeypatch, QUIET, BUSY)  # busy by the end of the measurement
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout)
    assert record["machine_load"] == {"before": QUIET.as_dict(), "after": BUSY.as_dict()}
    lines = [line for line in res.stderr.splitlines() if "busy" in line]
    assert lines == ["warning: the machine is busy (2 other tasks running, load 3.1 on 2 CPUs): timings "
                     "are slower and noisier than on a quiet machine; re-run when it is quiet for numbers "
                     "to keep"]


@pytest.mark.parametrize("args", [PROBE, ADVISE], ids=["probe-parallelism", "advise"])
def test_quiet_machine_says_nothing(args, monkeypatch):
    faked(monkeypatch, QUIET, QUIET)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "machine is busy" not in res.stderr and "machine is busy" not in res.stdout
