"""Suites: a compare --config with a [compare] table of flags, models under $SPECMAC_MODELS, records
under a folder named by the machine, and --exclusive's machine-wide lock. On the synthetic backend."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac.cli import main
from specmac.compare import measure as cmp
from specmac.compare import suite
from specmac.compare.results import machine_label
from specmac.errors import BadOption
from specmac.files import machine_lock
from tests.support.helpers import REPO

SUITE = """
[compare]
pairs = ["synthetic:synthetic", "lookup:synthetic"]
k = [1, 2]
prompts = "specmac:workload"
categories = ["code_editing", "qa"]
per_category = 1
max_tokens = 6
max_tokens_for = { code_editing = 10 }
repeats = 1
warmup_tokens = 2
out = "runs/{machine}"

[synthetic]
options = { latency_ms = 0.2 }
"""


def test_suite_file_runs_into_the_machines_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECMAC_MACHINE", "Test Box")
    (tmp_path / "s.toml").write_text(SUITE)
    res = CliRunner().invoke(main, ["compare", "--config", "s.toml", "--k", "1"])  # the flag wins
    assert res.exit_code == 0, res.output
    record = json.loads((tmp_path / "runs" / "test-box" / "results.json").read_text())
    st = record["settings"]
    assert st["k"] == [1] and st["repeats"] == 1 and st["max_tokens_for"] == {"code_editing": 10}
    assert sorted(st["categories"].values()) == ["code_editing", "qa"]  # one prompt of each
    assert {r["config"] for r in record["results"]} == {"none:synthetic", "synthetic:synthetic:k1",
                                                          "lookup:synthetic:k1"}
    assert all(r["n_tokens"] == 6 + 10 for r in record["results"])  # per prompt, its own max_tokens
    assert "(code_editing: 10)" in (tmp_path / "runs" / "test-box" / "summary.md").read_text()


@pytest.mark.parametrize("table, needle", [
    ("bogus = 1", "unknown key 'bogus'"),
    ("k = true", "not a K list"),
    ('pairs = "synthetic:synthetic"', "not a list of names"),
    ('max_tokens = "8"', "is not an integer"),
    ("max_tokens = 0", "must be integers >= 1"),
    ("max_tokens_for = { nothing = 8 }", "no prompt has the category 'nothing'"),
    ('out = "o/{host}"', "may name only {machine}"),
])
def test_bad_compare_table_is_one_line(table, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    key = table.split()[0]
    rest = {"pairs": 'pairs = ["synthetic:synthetic"]', "out": 'out = "o"'}
    lines = [table, 'prompts = "specmac:workload"', *(v for k, v in rest.items() if k != key)]
    (tmp_path / "s.toml").write_text("[compare]\n" + "\n".join(lines) + "\n")
    res = CliRunner().invoke(main, ["compare", "--config", "s.toml"])
    assert res.exit_code == 2, res.output
    assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "o" / "results.json").exists()


def test_model_paths_name_the_models_folder(monkeypatch, tmp_path):
    tables = {"gguf": {"target_model": "$SPECMAC_MODELS/t.gguf", "draft_model": "${HOME}/d.gguf",
                       "options": {"n_threads": 2}}}
    monkeypatch.setenv("SPECMAC_MODELS", str(tmp_path))
    monkeypatch.setenv("HOME", "/h")
    out = suite.expand_models(tables)["gguf"]
    assert out == {"target_model": f"{tmp_path}/t.gguf", "draft_model": "/h/d.gguf",
                   "options": {"n_threads": 2}}
    monkeypatch.delenv("SPECMAC_MODELS")  # unset: the default folder, not an error
    assert suite.expand_models(tables)["gguf"]["target_model"] == "/h/.cache/specmac/models/t.gguf"
    with pytest.raises(BadOption, match=r"names \$NOPE_NOT_SET, which is not set"):
        suite.expand_models({"gguf": {"target_model": "$NOPE_NOT_SET/t.gguf"}})
    # a table that is not one is left for check_table to name
    with pytest.raises(BadOption, match=r"\[gguf\] is not a table"):
        cmp.backend_settings(suite.expand_models({"gguf": 3}))


@pytest.mark.parametrize("model, features, label", [
    ("Intel(R) Xeon(R) Platinum 8480+", ["avx2", "avx512f", "amx_bf16"], "xeon-amx"),
    ("AMD EPYC 7763 64-Core Processor", ["avx2", "avx512f"], "epyc-avx512"),
    ("13th Gen Intel(R) Core(TM) i7-13700K", ["avx2"], "core-avx2"),
    ("Apple M2 Pro", None, "apple-m2"),
    ("", None, "aarch64"),
])
def test_machine_label(model, features, label, monkeypatch):
    monkeypatch.delenv("SPECMAC_MACHINE", raising=False)
    assert machine_label({"cpu_model": model, "cpu_features": features, "machine": "aarch64"}) == label
    monkeypatch.setenv("SPECMAC_MACHINE", "../My Mac")  # a name, never a path
    assert machine_label() == "my-mac"


def test_every_bench_suite_parses():
    files = sorted((REPO / "bench" / "suites").glob("*.toml"))
    assert files
    for path in files:
        table, backends = suite.split(cmp.read_config(str(path)))
        values = suite.flag_values(table)
        cmp.parse_pairs(list(values["pairs"]))
        cmp.parse_ks(values["k"])
        cmp.backend_settings(suite.expand_models(backends))
        assert "{machine}" in values["out"], f"{path.name}: each machine's record in its own folder"


def test_machine_lock_waits_for_the_holder(tmp_path):
    lock = tmp_path / "bench.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    lock.write_text(json.dumps({"pid": 1, "command": "specmac compare --out a"}))
    told, entered = [], threading.Event()

    def second():
        with machine_lock(told.append, path=lock, command="specmac compare --out b"):
            entered.set()

    t = threading.Thread(target=second)
    t.start()
    assert not entered.wait(0.3)  # still held by the first
    os.close(fd)
    t.join(10)
    assert entered.is_set() and told == ["pid 1: specmac compare --out a"]
    assert json.loads(lock.read_text())["command"] == "specmac compare --out b"


def test_exclusive_takes_the_machine_lock(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # not the real machine's lock
    res = CliRunner().invoke(main, ["compare", "--pair", "synthetic:synthetic", "--k", "1", "--repeats", "1",
                                    "--n-prompts", "1", "--max-tokens", "4", "--exclusive",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert json.loads(Path(tmp_path / "specmac-bench.lock").read_text())["pid"] == os.getpid()
