"""Hostile input, part two (issue 24): outputs shared by two runs, kept pass costs that lie, signals
during C calls, flags outside their mode, a broken model cache, a plugin with another vocabulary.
As in test_hostile.py, a refusal is one line on stderr, exit 2, no traceback, nothing left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac.cli import main
from tests.support.helpers import error_lines

REPO = Path(__file__).resolve().parents[2]
PAIR = ("--draft", "synthetic", "--target", "synthetic")
QUICK_COMPARE = ("compare", "--pair", "synthetic:synthetic", "--k", "1,2", "--n-prompts", "2",
                 "--max-tokens", "8")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SPECMAC_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env | extra


def _spawn(args, cwd, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specmac", *args], cwd=cwd, env=kw.pop("env", _env()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _one_line(code: int, err: str, needle: str, status: int = 2) -> None:
    lines = error_lines(err)
    assert code == status, f"exit {code}: {err}"
    assert "Traceback" not in err
    assert len(lines) == 1, f"expected one line, got {err!r}"
    assert needle.lower() in lines[0].lower(), lines[0]


def invoke(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


# --- 1. outputs are owned ---------------------------------------------------------------------

def test_two_compares_into_one_folder_one_runs(tmp_path):
    """Started together: one measures, the other exits 2 naming it (or, if the first was already
    done, its complete record); the folder holds one complete record."""
    args = [*QUICK_COMPARE, "--repeats", "6", "--out", "D"]
    first = _spawn(args, tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "D" / ".specmac-lock").exists() and first.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    second = _spawn(args, tmp_path)
    (_, err1), (_, err2) = first.communicate(timeout=120), second.communicate(timeout=120)
    assert first.returncode == 0, err1.decode()
    assert second.returncode == 2
    line = err2.decode().strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert ("in use by another specmac run (pid " in line and "compare --pair" in line) or \
        "already holds the complete record" in line, line
    record = json.loads((tmp_path / "D" / "results.json").read_text())
    assert record["complete"] is True and len(record["runs"]) == 3 * 2 * 6
    assert not (tmp_path / "D" / ".specmac-lock").exists()


def test_a_folder_held_by_another_run_is_refused_naming_it(tmp_path):
    from specmac.files import output_lock

    with output_lock(tmp_path / "D", folder=True, command="specmac compare --out D (the first)"):
        r = invoke([*QUICK_COMPARE, "--out", tmp_path / "D"])
    _one_line(r.exit_code, r.stderr, f"in use by another specmac run (pid {os.getpid()}: specmac compare "
              "--out D (the first))")
    assert not (tmp_path / "D").exists()  # made for the lock, removed with it


@pytest.mark.parametrize("command", [["probe-parallelism", "--backend", "synthetic", "--out", "{f}"],
                                     ["advise", *PAIR, "--out", "{f}"],
                                     ["report", "{d}", "--out", "{d}"]])
def test_file_outputs_are_held_too(tmp_path, command):
    from specmac.files import output_lock

    d = tmp_path / "rec"
    d.mkdir()
    (d / "results.json").write_text("{}")
    f = tmp_path / "out.json"
    folder = command[0] == "report"
    with output_lock(d if folder else f, folder=folder, command="specmac first"):
        r = invoke([a.format(f=f, d=d) for a in command])
    _one_line(r.exit_code, r.stderr, "in use by another specmac run")
    assert not f.exists()


def test_a_complete_record_is_not_overwritten(tmp_path):
    assert invoke([*QUICK_COMPARE, "--repeats", "1", "--out", tmp_path / "D"]).exit_code == 0
    before = (tmp_path / "D" / "results.json").read_bytes()
    r = invoke([*QUICK_COMPARE, "--repeats", "1", "--out", tmp_path / "D"])
    _one_line(r.exit_code, r.stderr, "already holds the complete record of another run")
    assert (tmp_path / "D" / "results.json").read_bytes() == before


def test_an_incomplete_record_is_measured_again(tmp_path):
    (tmp_path / "D").mkdir()
    (tmp_path / "D" / "results.json").write_text(json.dumps({"complete": False}))
    assert invoke([*QUICK_COMPARE, "--repeats", "1", "--out", tmp_path / "D"]).exit_code == 0
    assert json.loads((tmp_path / "D" / "results.json").read_text())["complete"] is True


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_json_outputs_follow_the_umask(tmp_path, mask, mode):
    from specmac.files import write_json

    old = os.umask(mask)
    try:
        write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# --- 2. kept pass costs are evidence ----------------------------------------------------------

# a target pass long beside a busy machine's scheduling delays, so a fresh T(1) agrees with the kept one
AUTO = ["run", *PAIR, "--target-opt", "latency_ms=5", "--k", "auto", "--max-tokens", "40", "hello"]


def _costs_line(r) -> str:
    assert r.exit_code == 0, r.stderr
    return next(line for line in r.stderr.splitlines() if line.startswith("pass costs: "))


def _used(line: str) -> bool:
    """Did the run take its costs from the kept entries (the target's curve as kept, or derived from it
    where the fresh T(1) says the load moved; the draft's prefill as kept)?"""
    target, draft = line.removeprefix("pass costs: ").split("; synthetic draft: ")
    return target.startswith(("target: kept (T(1)", "target: derived from the kept curve")) \
        and draft.endswith("now, prefill kept")


def _after_line(r) -> str:
    """What became of the kept costs after the run ("" where nothing was done)."""
    return next((line for line in r.stderr.splitlines() if line.startswith("after the run: ")), "")


@pytest.fixture()
def kept(tmp_path, monkeypatch):
    """The kept entries for AUTO's pair, made by a first run and taken by a second: {"curve": the
    target's curve's path, "draft": the draft model's path}."""
    from specmac.tuning import calibration

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    line = _costs_line(invoke(AUTO))
    assert "target: measured in" in line and "(none was kept)" in line, line
    assert "synthetic draft: pass" in line and "prefill measured now (none was kept)" in line, line
    line = _costs_line(invoke(AUTO))
    assert _used(line), line
    entries = {kind: list(calibration.costs_dir().glob(f"{kind}-*.json")) for kind in ("curve", "draft")}
    assert [len(e) for e in entries.values()] == [1, 1], entries
    return {kind: e[0] for kind, e in entries.items()}


def _damage(entry: dict, field: str, how: str) -> dict:
    t = entry[field]
    return entry | {field: {"nan": [float("nan")] + t[1:], "inf": t[:-1] + [float("inf")],
                            "x1000": [x * 1000 for x in t], "x0.001": [x / 1000 for x in t],
                            "negative": [-x for x in t], "short": t[:3],
                            "strings": ["fast"] * len(t)}[how] if isinstance(t, list) else
                    {"nan": float("nan"), "x1000": t * 1000, "x0.001": t / 1000, "negative": -t,
                     "strings": "fast"}[how]}


@pytest.mark.parametrize("kind, field, how, why", [
    ("curve", "t_target", "nan", "measured in"), ("curve", "t_target", "inf", "measured in"),
    ("curve", "t_target", "negative", "measured in"), ("curve", "t_target", "short", "measured in"),
    ("curve", "t_target", "strings", "measured in"),
    ("curve", "t_target", "x1000", "derived from the kept curve"),
    ("curve", "t_target", "x0.001", "derived from the kept curve"),
    ("draft", "t_draft", "nan", "measured now"), ("draft", "t_draft", "strings", "measured now"),
    # (a thousandth of the synthetic draft's pass is not told from it: both are under the timer's floor)
    ("draft", "t_draft", "x1000", "measured now"),
    ("draft", "prefill", "negative", "measured now"), ("draft", "prefill", "strings", "measured now"),
])
def test_a_kept_entry_that_lies_is_measured_again_or_derived(kept, kind, field, how, why):
    """A kept entry that holds no finite positive times, too few widths, or a pass that a fresh one
    contradicts is not used as it is: the curve is measured again (or, where only its scale is
    wrong, derived from it and a few widths timed now), the draft's pass and prefill are measured
    again; the line says why, the entry is rewritten with sound times and the next run keeps it."""
    path = kept[kind]
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(_damage(entry, field, how)))
    line = _costs_line(invoke(AUTO))
    reason = {"nan": "holds nan s", "inf": "holds inf s", "negative": "not a finite positive time",
              "short": "the kept one was narrower", "strings": "the kept entry is malformed",
              "x1000": "kept in its place" if kind == "curve" else "is not now's",
              "x0.001": "kept in its place"}[how]
    target, draft = line.split("; synthetic draft: ")
    part = target if kind == "curve" else draft
    assert why in part and reason in part, line
    again = json.loads(path.read_text())
    if kind == "curve":
        assert all(0 < x < 1 for x in again["t_target"]) and len(again["t_target"]) == len(entry["t_target"])
    else:
        assert all(0 < again[f] < 1 for f in ("t_draft", "prefill"))
    assert _used(_costs_line(invoke(AUTO)))


def test_a_kept_curve_the_run_contradicts_is_dropped(kept):
    """T(1) right (it passes the fresh check), the wider passes 10x too cheap: the run drafts wide,
    its own passes disagree, and the entry goes; the next run measures again."""
    path = kept["curve"]
    entry = json.loads(path.read_text())
    t = entry["t_target"]
    path.write_text(json.dumps(entry | {"t_target": t[:1] + [x / 10 for x in t[1:]]}))
    r = invoke(AUTO)
    assert "target: kept (T(1)" in _costs_line(r)
    after = _after_line(r)
    assert "this run's target passes took" in after and "the kept entry is dropped" in after, r.stderr
    assert not path.exists()
    assert "target: measured in" in _costs_line(invoke(AUTO))


def test_remeasure_flag(kept):
    before = {kind: path.stat().st_mtime_ns for kind, path in kept.items()}
    line = _costs_line(invoke([*AUTO, "--remeasure"]))
    assert "target: measured in" in line and "(as asked)" in line, line
    assert "prefill measured now (as asked)" in line, line
    assert all(path.stat().st_mtime_ns > before[kind] for kind, path in kept.items())


@pytest.mark.parametrize("where", ["cache_is_a_file", "home_under_a_file", "read_only"])
def test_costs_that_cannot_be_kept_say_so(tmp_path, monkeypatch, where):
    (tmp_path / "file").write_text("")
    if where == "cache_is_a_file":
        monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "file"))
    elif where == "home_under_a_file":
        monkeypatch.delenv("SPECMAC_CACHE", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "file" / "home"))
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder: no permission to be refused")
        (tmp_path / "ro").mkdir(mode=0o555)
        monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "ro"))
    for _ in range(2):  # nothing was kept: the second run measures again, and says so again
        line = _costs_line(invoke(AUTO))
        assert "target: measured in" in line and "(none was kept)" in line, line
        assert ("could not keep it: Not a directory" in line
                or "could not keep it: Permission denied" in line), line


@pytest.mark.parametrize("args, needle", [
    (["--k", "auto", "--target", "synthetic"], "--k auto chooses how many drafts"),
    (["--remeasure", *PAIR], "--remeasure re-measures the pass costs that --k auto uses"),
])
def test_run_flags_that_would_do_nothing_are_refused(args, needle):
    r = invoke(["run", *args, "hello"])
    _one_line(r.exit_code, r.stderr, needle)
    assert r.stdout == ""


# --- 3. signals during C calls ------------------------------------------------------------------

SIGNAL_IN_PROGRESS_CALLBACK = """
import signal, sys, time
import llama_cpp
real = llama_cpp.llama_progress_callback
calls = []
def wrapped(fn):  # the signal arrives while llama.cpp loads: inside its first progress callback
    def cb(progress, user_data):
        if not calls:
            signal.raise_signal(getattr(signal, sys.argv[1]))
        calls.append(progress)
        return fn(progress, user_data)
    return real(cb)
llama_cpp.llama_progress_callback = wrapped
from specmac.cli import main
t0 = time.monotonic()
try:
    main(sys.argv[2:])
finally:
    print(f"calls={len(calls)} seconds={time.monotonic() - t0:.2f}", file=sys.stderr)
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_a_gguf_load_stops_it(tmp_path, sig):
    """Before: the KeyboardInterrupt was raised inside llama.cpp's log callback, printed as "Exception
    ignored on calling ctypes callback function", and the load went on to exit 0."""
    pytest.importorskip("llama_cpp")
    r = subprocess.run([sys.executable, "-c", SIGNAL_IN_PROGRESS_CALLBACK, sig, "run", "--target", "gguf",
                        "--max-tokens", "4", "hello"], capture_output=True, env=_env(), cwd=tmp_path,
                       timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 130, err
    assert "Traceback" not in err and "Exception ignored" not in err and r.stdout == b""
    assert err.strip().splitlines()[0] == "interrupted"
    calls = int(err.split("calls=")[1].split()[0])
    assert calls == 1, err  # the load stopped at the callback that saw the signal


SLOW_QUANTIZE = """
import subprocess, sys, threading, os, signal
from specmac.backends import gguf_quantize
real = subprocess.Popen
def slow(args, **kw):  # a child that takes as long as a 1.5B model's requantisation
    child = real([sys.executable, "-c", "import time; time.sleep(60)"], **kw)
    threading.Timer(0.5, os.kill, (os.getpid(), getattr(signal, sys.argv[1]))).start()
    return child
gguf_quantize.subprocess.Popen = slow
from specmac.cli import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_a_requantisation_stops_it_and_leaves_no_entry(tmp_path, sig):
    pytest.importorskip("llama_cpp")
    from specmac import assets

    cache = tmp_path / "cache"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", SLOW_QUANTIZE, sig, "run", "--target", "gguf", "--target-model",
                        str(assets.gguf_file("target", "f16")), "--target-opt", "quant=q8_0", "hello"],
                       capture_output=True, env=_env(SPECMAC_CACHE=str(cache)), cwd=tmp_path, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 130, err
    assert time.monotonic() - t0 < 30  # the 60 s child was killed, not waited for
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted"
    assert list((cache / "converted").iterdir()) == []  # no entry, no half-written temporary folder


def test_a_signal_during_a_framework_import_waits_for_it(tmp_path):
    """Ctrl-C during `import torch` once aborted the process ("terminate called after throwing an
    instance of 'pybind11::error_already_set'", exit -6): it is held until the import is done."""
    pytest.importorskip("torch")
    script = ("import os, signal, sys, threading\n"
              "from specmac.backends.interrupt import import_held\n"
              "threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
              "try:\n    import_held('torch')\nexcept KeyboardInterrupt:\n"
              "    print('torch' in sys.modules and hasattr(sys.modules['torch'], 'tensor'))\n"
              "    sys.exit(130)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, env=_env(), timeout=300)
    assert r.returncode == 130, r.stderr.decode()
    assert r.stdout.decode().strip() == "True"  # the import finished before the interrupt was raised


# --- 4. every flag does what it says or is refused -----------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["advise", "--target", "synthetic", "--backends", ","], "--backends ',' has an empty name"),
    (["advise", "--backends", "gguf,,torch"], "has an empty name"),
    (["advise", "--target", "synthetic", "--plot", "p.png"], "--plot applies only to one pairing"),
    (["advise", "--target", "synthetic", "--context", "64"], "--context applies only to one pairing"),
    (["advise", "--target", "synthetic", "--repeats", "2"], "--repeats applies only to one pairing"),
    (["advise", *PAIR, "--k-max", "4"], "--k-max applies only to the ranking"),
    (["advise", "--target-model", "a.gguf", "--target-model", "a.gguf"], "--target-model a.gguf is given"),
    (["advise", "--draft-model", "d.gguf", "--draft-model", "d.gguf"], "--draft-model d.gguf is given"),
    (["verify", *PAIR, "--tokens", "9223372036854775807"], "use at most 10000000 per method"),
    (["verify", *PAIR, "--length", "5000", "--tokens", "99999999"], "use at most 10000000 per method"),
    (["verify", *PAIR, "--length", "100000", "--tokens", "999999"], "does not fit the target's context"),
    (["verify", *PAIR, "--target-opt", "latency_ms=20", "--tokens", "9999999"], "at most 24 h): use"),
])
def test_flags_outside_their_mode_or_bounds_are_refused(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    r = invoke(args)
    _one_line(r.exit_code, r.stderr, needle)
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def good_record(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("rec") / "D"
    assert invoke([*QUICK_COMPARE, "--repeats", "1", "--out", d]).exit_code == 0
    return json.loads((d / "results.json").read_text())


@pytest.mark.parametrize("damage, needle", [
    (lambda r: r["results"][1].update(draft=None), "results[1].draft is None, not a name"),
    (lambda r: r["results"][1]["speedup"].update(median=float("nan")), "results[1].speedup holds"),
    (lambda r: r["results"][0]["tokens_per_second"].update(p25=float("inf")), "not finite numbers"),
    (lambda r: r["results"][1].update(speedup=float("nan")), "results[1].speedup holds nan"),
    (lambda r: r["results"].__setitem__(0, 3), "results[0] is not an object"),
])
def test_report_refuses_a_record_it_would_render_wrong(tmp_path, good_record, damage, needle):
    rec = json.loads(json.dumps(good_record))
    damage(rec)
    (tmp_path / "results.json").write_text(json.dumps(rec))
    r = invoke(["report", tmp_path])
    _one_line(r.exit_code, r.stderr, needle)
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    '{"a": ' * 100_000 + "0" + "}" * 100_000,
], ids=["lists", "objects"])
def test_report_refuses_a_record_nested_too_deeply(tmp_path, text):
    """JSON nested past Python's recursion limit is a malformed record like any other."""
    (tmp_path / "results.json").write_text(text)
    r = invoke(["report", tmp_path])
    _one_line(r.exit_code, r.stderr, "nested too deeply")
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_compare_into_a_folder_with_a_deeply_nested_record_measures(tmp_path, monkeypatch):
    """compare reads an old results.json in --out only to refuse overwriting a complete one: one
    nested too deeply for the parser is not a complete record, and the run goes ahead."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    r = invoke([*QUICK_COMPARE, "--repeats", "1", "--out", "o"])
    assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "o" / "results.json").read_text())["complete"] is True


@pytest.mark.parametrize("what", ["config", "record"])
def test_dev_zero_is_refused_by_size(tmp_path, what):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    if what == "config":
        (tmp_path / "c.toml").symlink_to("/dev/zero")
        r = invoke([*QUICK_COMPARE, "--config", tmp_path / "c.toml", "--out", tmp_path / "o"])
        needle = "--config"
    else:
        (tmp_path / "results.json").symlink_to("/dev/zero")
        r = invoke(["report", tmp_path])
        needle = "results.json is larger than 64 MiB"
    _one_line(r.exit_code, r.stderr, needle)
    assert "larger than" in r.stderr and not (tmp_path / "o").exists()


def _proc(args, cwd, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "specmac", *args], cwd=cwd, env=env or _env(),
                          capture_output=True, timeout=120, **kw)


def test_a_full_disk_on_stdout_is_one_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "specmac", "run", *PAIR, "--max-tokens", "20", "hello"],
                           stdout=full, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path, timeout=120)
    _one_line(r.returncode, r.stderr.decode(), "no space left on the device")


def test_a_closed_stdout_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specmac", "run", *PAIR, "--max-tokens", "5", "hello"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path,
                       timeout=120, preexec_fn=lambda: os.close(1))
    _one_line(r.returncode, r.stderr.decode(), "standard output is closed")


def test_compare_in_a_deleted_working_folder_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = ("import os, sys, time\nos.rmdir(os.getcwd())\nfrom specmac.cli import main\n"
              "main(['compare', '--pair', 'synthetic:synthetic', '--k', '1', '--n-prompts', '1'])\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=gone, env=_env(), capture_output=True, timeout=120)
    _one_line(r.returncode, r.stderr.decode(), "the working folder no longer exists")


def test_utf8_arguments_under_the_c_locale(tmp_path):
    env = _env(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    r = _proc(["run", "--target", "synthetic", "--max-tokens", "3", "--json", "héllo wörld"], tmp_path, env)
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["n_prompt_tokens"] > 0
    bad = _proc(["run", "--target", "synthetic", b"ab\xffcd"], tmp_path, env)
    _one_line(bad.returncode, bad.stderr.decode(), "PROMPT is not UTF-8 text (byte 2)")


# --- 5. the cache commands survive a broken cache -------------------------------------------------

@pytest.fixture()
def broken_cache(tmp_path, monkeypatch) -> Path:
    """A cache with one good entry and every kind of rubbish beside it."""
    from specmac.backends.conversion import cache

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "m.bin"
    src.write_bytes(b"m" * 100)
    cache.converted(src, "gguf-f16", lambda s, o: (o / "model.gguf").write_bytes(b"x" * 10), what="a test")
    root = cache.cache_root()
    for name, text in (("bad_json", "{x"), ("a_list", "[1]"), ("odd_fields", '{"source": 5, "what": null}')):
        (root / name).mkdir()
        (root / name / cache.SIDECAR).write_text(text)
    (root / "no_sidecar").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("not the cache's")
    (root / "link").symlink_to(tmp_path / "elsewhere")
    (root / "stray").write_text("x")
    (root / ".tmp-half.1").mkdir()
    return root


def test_models_lists_a_broken_cache_and_names_what_it_cannot_read(broken_cache):
    r = invoke(["models"])
    assert r.exit_code == 0, r.output
    for name, why in (("bad_json", "is not valid JSON"), ("a_list", "is not a JSON object"),
                      ("no_sidecar", "has no specmac_source.json"), ("link", "a link to"),
                      ("stray", "a file, not an entry")):
        assert f"{name}: " in r.stderr and why in r.stderr, r.stderr
    assert "unfinished conversion" in r.stdout and "8 entries" in r.stdout
    listed = json.loads(invoke(["models", "--json"]).stdout)["entries"]
    assert len(listed) == 8 and sum(e["problem"] is None for e in listed) == 3  # good, odd_fields, .tmp


def test_models_clear_all_removes_links_as_links_and_says_what(broken_cache, tmp_path):
    r = invoke(["models", "clear", "--all", "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["removed"]) == 8 and json.loads(r.stdout)["not_removed"] == {}
    assert list(broken_cache.iterdir()) == []
    assert (tmp_path / "elsewhere" / "keep.txt").read_text() == "not the cache's"  # the link went, not this


def test_models_clear_names_what_it_could_not_remove(broken_cache, monkeypatch):
    from specmac.backends.conversion import cache

    real = cache.remove

    def stubborn(entry):
        if entry.name == "stray":
            raise PermissionError(13, "Permission denied", str(entry))
        real(entry)

    monkeypatch.setattr(cache, "remove", stubborn)  # as a root-owned file would (the tests may run as root)
    r = invoke(["models", "clear", "--all"])
    assert "removed 7 entries" in r.stdout and "stray" not in r.stdout.split(":", 1)[1]
    _one_line(r.exit_code, r.stderr, "could not remove 1 of 8: stray: Permission denied")
    assert [p.name for p in broken_cache.iterdir()] == ["stray"]


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_cache_in_an_impossible_place_is_one_line(tmp_path, monkeypatch, where):
    pytest.importorskip("llama_cpp")
    from specmac import assets

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "file" / ("" if where == "a_file" else "sub")))
    assert "no converted models" in invoke(["models"]).stdout
    assert "removed 0 entries" in invoke(["models", "clear", "--all"]).stdout
    r = invoke(["run", "--target", "gguf", "--target-model", assets.gguf_file("target", "f16"),
                "--target-opt", "quant=q8_0", "hello"])
    _one_line(r.exit_code, r.stderr, "cannot write the model cache")
    assert "point SPECMAC_CACHE at a writable folder" in r.stderr


@pytest.mark.parametrize("kind, needle", [("junk", "is not a readable gguf file"),
                                          ("truncated", "is not a readable gguf file")])
def test_quant_on_a_junk_gguf_is_one_line(tmp_path, monkeypatch, kind, needle):
    pytest.importorskip("llama_cpp")
    from specmac import assets

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    data = assets.gguf_file("target", "f16").read_bytes()
    f.write_bytes(b"GGUF" + b"\x07" * 60 if kind == "junk" else data[: len(data) // 3])
    r = invoke(["run", "--target", "gguf", "--target-model", f, "--target-opt", "quant=q8_0", "hello"])
    _one_line(r.exit_code, r.stderr, needle)
    assert not (tmp_path / "cache" / "converted").exists() or \
        list((tmp_path / "cache" / "converted").iterdir()) == []


# --- 6. a plugin with another vocabulary ------------------------------------------------------------

OTHER_VOCAB_PLUGIN = '''
from specmac.backends.synthetic import SyntheticBackend
from specmac.vocab import Vocab


class Backend(SyntheticBackend):
    """The synthetic backend under another name, whose tokens are other bytes."""

    name = "othervocab"

    def __init__(self, model=None, **opts):
        super().__init__(model, **opts)
        v = self.vocab
        self.vocab = Vocab([b"#" + t for t in v.token_bytes[:-1]] + [b""], eos_ids=v.eos_ids)
'''


@pytest.fixture()
def other_vocab_plugin(tmp_path, monkeypatch):
    from specmac.compare import settings

    info = tmp_path / "specmac_othervocab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specmac-othervocab\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specmac.backends]\nothervocab = othervocab_mod:Backend\n")
    (tmp_path / "othervocab_mod.py").write_text(OTHER_VOCAB_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = settings.available
    # the default pairs are every installed model backend: here the embedded GGUF pair and the plugin
    monkeypatch.setattr(settings, "available", lambda n: n == "othervocab" or (n == "gguf" and real(n)))


def test_default_compare_pairs_only_what_can_pair(tmp_path, other_vocab_plugin):
    pytest.importorskip("llama_cpp")
    r = invoke(["compare", "--k", "1", "--n-prompts", "1", "--repeats", "1", "--max-tokens", "4",
                "--warmup-tokens", "2", "--out", tmp_path / "D"])
    assert r.exit_code == 0, r.output
    for pair in ("othervocab:gguf", "gguf:othervocab"):
        assert f"skipped {pair}: " in r.stderr, r.stderr
    record = json.loads((tmp_path / "D" / "results.json").read_text())
    assert sorted(s["pair"] for s in record["skipped_pairs"]) == ["gguf:othervocab", "othervocab:gguf"]
    measured = {(row["draft"], row["target"]) for row in record["results"]}
    assert measured == {("none", "gguf"), ("gguf", "gguf"), ("ngram", "gguf"), ("none", "othervocab"),
                        ("othervocab", "othervocab"), ("ngram", "othervocab")}
    summary = (tmp_path / "D" / "summary.md").read_text()
    assert "Not measured: othervocab:gguf" in summary
    # the header said 6 pairings x 1 K: that 2 of them were not measured is said, with why
    assert r.stderr.startswith("6 pairings x 1 K"), r.stderr
    counted = [line for line in r.stderr.splitlines() if line.startswith("2 of 6 pairings skipped: ")]
    assert len(counted) == 1 and "othervocab:gguf: " in counted[0] and "gguf:othervocab: " in counted[0]
    assert f"> {counted[0]}" in summary.split("## Best K per pairing")[0]  # the summary's header
    again = invoke(["report", str(tmp_path / "D"), "--out", str(tmp_path / "E")])
    assert again.exit_code == 0 and counted[0] in again.stderr, again.output


def test_a_named_pair_that_cannot_pair_is_still_refused(tmp_path, other_vocab_plugin):
    pytest.importorskip("llama_cpp")
    r = invoke(["compare", "--pair", "othervocab:gguf", "--k", "1", "--out", tmp_path / "D"])
    _one_line(r.exit_code, r.stderr.splitlines()[-1], "tokenizers differ", 2)
