"""CPU threads fitted to the load: the count from a sample of runnable tasks, and the backends that
apply it before a run (and leave a count the user set alone)."""

from __future__ import annotations

import itertools

import pytest

from specmac.api import Pair
from specmac.backends import available, load_backend
from specmac.backends import threads as cpu_threads
from specmac.core.drafters import ModelDrafter

STAT = "cpu  1 2 3\nctxt 5\nprocs_running {}\nprocs_blocked 0\n"


def reader(*counts: int):
    it = itertools.cycle(counts)
    return lambda: STAT.format(next(it))


def test_others_running_is_the_least_sample_less_the_sampler():
    assert cpu_threads.others_running(read=reader(1), gap_s=0) == 0  # only the sampling thread
    assert cpu_threads.others_running(read=reader(4, 2, 3), gap_s=0) == 1  # a spinner winding down
    assert cpu_threads.others_running(read=lambda: "cpu 1 2\n", gap_s=0) is None  # no procs_running
    assert cpu_threads.others_running(read=lambda: "procs_running x\n", gap_s=0) is None
    # this process's own runnable threads (its pool spinning down after a pass) are not other work
    assert cpu_threads.others_running(read=reader(5), own=lambda: 3, gap_s=0) == 2


def test_own_running_reads_the_state_after_the_name():
    run = "4242 (py) thr)eads) R 1 2 3"
    sleep = "4243 (R) S 1 2 3"  # a thread named "R", asleep
    assert cpu_threads.own_running([run, run.replace("4242", "4244"), sleep]) == 2
    # this process's own stat texts: the reading thread is running as it reads
    states = [t[t.rindex(")") + 1:].split()[0] for t in cpu_threads.task_stats()]
    assert "R" in states


@pytest.mark.parametrize("default, cpus, others, n", [
    (2, 2, 0, 2), (2, 2, 1, 1), (2, 2, 2, 1), (2, 2, 5, 1), (8, 16, 4, 8), (8, 16, 10, 6), (4, 4, None, 4)])
def test_fit_leaves_other_work_its_cpus(default, cpus, others, n):
    got, why = cpu_threads.fit(default, cpus, others)
    assert got == n
    assert (f"{n} of {default}" in why) == (n != default)


def test_fixed_keeps_the_default(monkeypatch):
    monkeypatch.setattr(cpu_threads, "others_running", lambda: 7)
    monkeypatch.setenv(cpu_threads.ENV, "fixed")
    assert cpu_threads.choose(2) == (2, "2 (SPECMAC_THREADS=fixed)")
    monkeypatch.delenv(cpu_threads.ENV)
    assert cpu_threads.choose(2)[0] == 1


def _busy(monkeypatch, others: int, n_cpus: int = 2) -> None:
    monkeypatch.setattr(cpu_threads, "others_running", lambda: others)
    monkeypatch.setattr(cpu_threads, "cpus", lambda: n_cpus)


@pytest.mark.skipif(not available("gguf"), reason="llama-cpp-python is not installed")
def test_gguf_refits_before_each_run(monkeypatch):
    monkeypatch.setattr("specmac.backends.gguf.default_threads", lambda: 2)
    target = load_backend("gguf", None, {}, role="target")
    draft = load_backend("gguf", None, {"n_threads": 2}, role="draft")  # the user's count: kept
    pair = Pair(target, ModelDrafter(draft))
    _busy(monkeypatch, 1)
    quiet = pair.plain().generate("hello", max_tokens=4, seed=0).token_ids
    pair.generate("hello", max_tokens=4, k=2, seed=0)
    assert target.resolved["n_threads"] == target.resolved["n_threads_batch"] == 1
    assert draft.resolved["n_threads"] == 2
    assert set(pair.threads) == {"target"} and "1 of 2" in pair.threads["target"]
    _busy(monkeypatch, 0)
    pair._fitted_at = -1e9  # the next run refits at once
    again = pair.plain().generate("hello", max_tokens=4, seed=0).token_ids
    assert target.resolved["n_threads"] == 2
    assert again == quiet  # the thread count changes the speed, never the tokens


@pytest.mark.skipif(not available("torch"), reason="torch/transformers are not installed")
def test_torch_refits_its_default_only(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        b = load_backend("torch", None, {"device": "cpu"}, role="target")
        _busy(monkeypatch, 1, n_cpus=max(before, 2))
        why = b.fit_threads()
        assert b.resolved["n_threads"] == torch.get_num_threads() == max(1, min(before, max(before, 2) - 1))
        assert why and str(torch.get_num_threads()) in why
        mine = load_backend("torch", None, {"device": "cpu", "n_threads": 1}, role="target")
        assert mine.fit_threads() is None
    finally:
        torch.set_num_threads(before)


def test_fitter_drops_a_starved_thread_and_takes_free_cpus_back(monkeypatch):
    applied = []
    f = cpu_threads.Fitter(2, applied.append)
    _busy(monkeypatch, 0)
    f.wall, f.cpu = 1.0, 1.9  # quiet: both threads ran all along
    f._look()
    assert f.n == 2 and applied == []
    f.wall, f.cpu = 1.0, 1.1  # short of CPU time, but nothing else runs: serial stretches, kept
    f._look()
    assert f.n == 2 and applied == []
    _busy(monkeypatch, 1)
    f.wall, f.cpu = 1.0, 1.1  # one thread preempted most of the time, its sibling spinning
    f._look()
    assert f.n == 1 and applied == [1] and "55%" in f.why
    f.wall, f.cpu = 1.0, 0.6  # at one thread the share cannot go lower
    f._look()
    assert f.n == 1 and applied == [1]
    _busy(monkeypatch, 0)  # the other work is gone: the CPU is taken back
    f._look()
    assert f.n == 2 and applied == [1, 2] and f.changes == 2


def test_fitter_times_passes_and_looks_every_interval(monkeypatch):
    monkeypatch.setattr(cpu_threads, "INTERVAL_S", 0.0)
    monkeypatch.setattr(cpu_threads, "MIN_PASSES", 2)
    looked = []
    f = cpu_threads.Fitter(2, lambda n: None)
    monkeypatch.setattr(f, "_look", lambda: looked.append(f.wall > 0))
    assert f.timed(lambda: sum(range(10000))) == sum(range(10000))
    assert f.wall == 0 and looked == []  # the window's first pass is not timed
    f.timed(lambda: sum(range(10000)))
    assert looked == []  # one pass timed: too few to judge
    f.timed(lambda: sum(range(10000)))
    assert looked == [True]
    monkeypatch.setenv(cpu_threads.ENV, "fixed")  # fixed: never refitted
    f.timed(lambda: None)
    assert len(looked) == 1


def test_the_loading_thread_gives_its_openmp_pools_up_and_compute_goes_on():
    """``give_up_openmp_pools`` frees the calling thread's pools in the OpenMP runtimes loaded here
    (torch's libgomp; llama.cpp's where it is loaded), so the server's scheduler thread is the one
    process thread with a pool; torch computes the same afterwards, on this thread and on another."""
    import threading
    from pathlib import Path

    torch = pytest.importorskip("torch", reason="torch is not installed (pip install specmac[torch])")
    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc here: the runtimes loaded are not listed")
    x = torch.arange(1 << 17, dtype=torch.float32)
    want = float((x + 1.0).sum())  # a parallel region: this thread's pool exists now
    assert cpu_threads.give_up_openmp_pools() >= 1
    got = []
    t = threading.Thread(target=lambda: got.append(float((x + 1.0).sum())))
    t.start()
    t.join()
    assert got == [want] and float((x + 1.0).sum()) == want
