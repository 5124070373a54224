"""`specmac advise --save FILE` then `specmac serve --profile FILE` (and `run --profile`): the profile
holds advise's ranking per precision group, complete enough to load; serve loads the first choice of
the group asked for and a live server answers the openai client with that configuration; every bad
profile or conflicting flag is one line and exit status 2.

The models are copies of the embedded GGUF pair in a folder of their own, named by relative paths,
so the profile must hold absolute ones (and a deleted copy is a model that is gone).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from specmac import assets
from specmac.advise.profile import SCHEMA, VERSION, build_profile, choose, read_profile
from specmac.cli import main
from specmac.errors import BadOption
from tests.support.helpers import skip_unless_installed

pytestmark = skip_unless_installed("gguf")
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """advise on the copied pair (gguf only, tiny runs): the profile's path, the ranking and the folder."""
    where = tmp_path_factory.mktemp("profile")
    for role, quant, name in (("target", "f16", "t-f16.gguf"), ("target", "q8_0", "t-q8.gguf"),
                              ("draft", "q8_0", "d-q8.gguf")):
        shutil.copy(assets.gguf_file(role, quant), where / name)
    here = os.getcwd()
    os.chdir(where)  # the models are named relative to it
    try:
        res = CliRunner().invoke(main, ["advise", "--backends", "gguf", "--target-model", "t-f16.gguf",
                                        "--target-model", "t-q8.gguf", "--draft-model", "d-q8.gguf",
                                        "--run-tokens", "4", "--k-max", "2", "--prompt", PROMPT,
                                        "--save", "p.json", "--json"])
    finally:
        os.chdir(here)
    assert res.exit_code == 0, res.output
    return where / "p.json", json.loads(res.stdout), where


def test_the_profile_holds_the_ranking_per_group_ready_to_load(saved):
    path, record, where = saved
    prof = read_profile(path)
    assert (prof["schema"], prof["version"]) == (SCHEMA, VERSION)
    assert prof["provenance"]["git_sha"] and prof["sampling"] == record["sampling"]
    flat = [c for g in prof["groups"] for c in g["configurations"]]
    assert [c["rank"] for c in flat] == [e["rank"] for e in record["ranking"]]
    assert [c["rank"] for c in flat] == list(range(1, len(flat) + 1))
    assert [g["group"] for g in prof["groups"]] == list(dict.fromkeys(e["group"] for e in record["ranking"]))
    assert {g["precision"] for g in prof["groups"]} == {"F16", "Q8_0"}
    assert all(g["as_given"] for g in prof["groups"])  # llama.cpp runs a .gguf as it is
    for c, e in zip(flat, record["ranking"]):
        assert c["k"] == e["k"] and c["predicted_tokens_per_second"] == e["predicted_tokens_per_second"]
        assert c["predicted_speedup"] == e["predicted_speedup"] and c["sampler"] == "rejection"
        assert c["target"]["model"] == str((where / e["target_model"]).resolve())
        assert Path(c["target"]["model"]).is_absolute()
        assert c["draft"]["kind"] == {"none": "none", "ngram": "lookup", "lookup": "lookup"}.get(
            e["draft"], "hybrid" if "+" in e["draft"] else "model")
        if c["draft"]["kind"] == "model":
            assert c["draft"]["model"] == str((where / "d-q8.gguf").resolve())
            assert c["draft"]["backend"] == "gguf"
    kinds = {c["draft"]["kind"] for c in flat}
    assert kinds == {"none", "lookup", "model", "hybrid"}  # plain, lookups, the draft model, the hybrid


def test_build_profile_refuses_a_row_it_cannot_load(saved):
    _, record, _ = saved
    broken = copy.deepcopy(record)
    broken["drafts"] = [d for d in broken["drafts"] if d["backend"] != "gguf"]  # the model draft's options
    with pytest.raises(ValueError, match="did not probe"):
        build_profile(broken)


def test_choose_by_precision_target_file_or_first(saved):
    path, _, where = saved
    prof = read_profile(path)
    first = prof["groups"][0]
    assert choose(prof, path)[:2] == (first, first["configurations"][0])
    f16 = next(g for g in prof["groups"] if g["precision"] == "F16")
    assert choose(prof, path, precision="f16")[0] is f16  # the precision alone, any case
    assert choose(prof, path, precision=f16["group"].upper())[0] is f16  # the full name
    assert choose(prof, path, target_model=str(where / "t-f16.gguf"))[0] is f16
    with pytest.raises(BadOption, match="no group"):
        choose(prof, path, precision="Q8_0", target_model=str(where / "t-f16.gguf"))
    converted = copy.deepcopy(f16)  # the same file run by a backend that converts it, ranked first
    converted.update(group="t-f16.gguf bfloat16", precision="bfloat16", as_given=False)
    both = {**prof, "groups": [converted, *prof["groups"]]}
    assert choose(both, path, target_model=str(where / "t-f16.gguf"))[0]["group"] == f16["group"]
    assert choose(both, path)[0] is converted
    twin = copy.deepcopy(prof)
    twin["groups"].append({**copy.deepcopy(f16), "group": "other.gguf F16"})
    with pytest.raises(BadOption, match="matches several groups"):
        choose(twin, path, precision="F16")


def test_run_profile_takes_the_group_of_the_target_file(saved, monkeypatch):
    path, _, where = saved
    monkeypatch.chdir(where)
    res = CliRunner().invoke(main, ["run", "--profile", str(path), "--target-model", "t-f16.gguf",
                                    "--max-tokens", "4", "--json", PROMPT])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    group = next(g for g in read_profile(path)["groups"] if g["precision"] == "F16")
    assert r["profile"]["group"] == group["group"] and "--target-model t-f16.gguf" in r["profile"]["line"]
    assert r["target"]["model"] == str((where / "t-f16.gguf").resolve()) and r["n_tokens"] == 4


# --- a live server ----------------------------------------------------------------------------

def _serve(args: list[str]):
    """Start `specmac serve ... --port 0`; -> (process, base URL, the stderr lines from the URL's on).
    Before the URL it may say what it waits for: loading, measuring the pass costs k="auto" weighs
    (once per machine and model) and how far that is."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "specmac", "serve", "--port", "0", *args],
                            stderr=subprocess.PIPE, text=True, env=env)
    said, line = [], proc.stderr.readline()
    while line and "http://127.0.0.1:" not in line:
        said.append(line)
        line = proc.stderr.readline()
    waits = ("specmac serve: measuring the target's pass", "specmac serve: loading the models")
    assert all(x.startswith(waits) for x in said), said
    lines = [line] + [proc.stderr.readline() for _ in range(2)]
    assert "http://127.0.0.1:" in lines[0], said + lines
    base = lines[0].split("http://")[1].split()[0]
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://{base.removesuffix('/v1')}/health")
            return proc, f"http://{base}", lines
        except httpx.ConnectError:
            assert time.monotonic() < deadline and proc.poll() is None, lines
            time.sleep(0.2)


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _check_served(url: str, config: dict, k: int) -> dict:
    """/v1/models says the profile's configuration is served, and the openai client gets text."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    [model] = client.models.list().data
    served = model.model_dump()["specmac"]
    assert served["target"]["backend"] == config["target"]["backend"]
    assert served["target"]["model"] == config["target"]["model"]
    draft = config["draft"]
    if draft["kind"] == "model":
        assert (served["draft"]["backend"], served["draft"]["model"]) == (draft["backend"], draft["model"])
    else:
        assert served["draft"]["drafter"] == ("none" if draft["kind"] == "none" else draft["backend"])
    assert served["k"] == k
    out = client.completions.create(model=model.id, prompt=PROMPT, max_tokens=6, temperature=0)
    assert out.choices[0].text and out.usage.completion_tokens == 6
    return out.usage.model_dump()


def test_serve_profile_serves_the_groups_first_choice(saved):
    path, _, _ = saved
    prof = read_profile(path)
    group = next(g for g in prof["groups"] if g["precision"] == "Q8_0")
    config = group["configurations"][0]
    proc, url, lines = _serve(["--profile", str(path), "--precision", "Q8_0"])
    try:
        assert f"first choice of group {group['group']} in {path} (--precision Q8_0)" in lines[2], lines
        _check_served(url, config, config["k"] or "auto")
    finally:
        _stop(proc)


def _first(path: Path, where: Path, which, k: int | None = None) -> tuple[Path, dict]:
    """The saved profile with its first group's configuration ``which(config)`` picks put first
    (at K ``k`` where given), written to ``where``: -> (its path, that configuration)."""
    prof = json.loads(path.read_text())
    group = prof["groups"][0]
    config = next(c for c in group["configurations"] if which(c))
    if k is not None:
        config["k"] = k
    group["configurations"].remove(config)
    group["configurations"].insert(0, config)
    edited = where / "edited.json"
    edited.write_text(json.dumps(prof))
    return edited, config


def test_serve_profile_loads_a_model_draft_at_its_k(saved, tmp_path):
    """The same with the draft model's configuration first (a profile edited by hand): it is what
    is served, at the profile's K, and it drafts."""
    edited, config = _first(saved[0], tmp_path, lambda c: c["draft"]["kind"] == "model", k=2)
    proc, url, lines = _serve(["--profile", str(edited)])
    try:
        assert "(the profile's first choice): gguf Q8_0 draft \u2192 gguf" in lines[2] and "K 2" in lines[2]
        usage = _check_served(url, config, 2)
        assert usage["speculative"]["drafted"] > 0
    finally:
        _stop(proc)


# --- bad profiles and flags: one line, exit 2 -----------------------------------------------------

def _variants(path: Path, tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (serve's arguments, a piece of the one line it must print)."""
    prof = json.loads(path.read_text())

    def write(name: str, data) -> str:
        p = tmp / name
        p.write_text(data if isinstance(data, str) else json.dumps(data))
        return str(p)

    gone = copy.deepcopy(prof)
    lost = tmp / "lost.gguf"
    shutil.copy(gone["groups"][0]["configurations"][0]["target"]["model"], lost)
    for c in gone["groups"][0]["configurations"]:
        c["target"]["model"] = str(lost)
    lost_path = write("gone.json", gone)
    lost.unlink()
    no_k = copy.deepcopy(prof)
    del no_k["groups"][0]["configurations"][0]["k"]
    alien = copy.deepcopy(prof)
    alien["groups"][0]["configurations"][0]["target"]["backend"] = "nosuch"
    ok = str(path)
    return {
        "missing": (["--profile", str(tmp / "none.json")], "does not exist"),
        "folder": (["--profile", str(tmp)], "is a folder"),
        "not json": (["--profile", write("bad.json", "{not json")], "is not JSON"),
        "not a profile": (["--profile", write("other.json", {"ranking": []})], "is not a specmac profile"),
        "wrong version": (["--profile", write("v9.json", {**prof, "version": 9})], "has version 9"),
        "no groups": (["--profile", write("empty.json", {**prof, "groups": []})], "holds no precision group"),
        "no k": (["--profile", write("nok.json", no_k)], "is malformed"),
        "group absent": (["--profile", ok, "--precision", "Q2_K"], "is no group"),
        "model gone": (["--profile", lost_path], "names a target model that is gone"),
        "backend absent": (["--profile", write("alien.json", alien)], "backend 'nosuch' is not installed"),
        "target not in it": (["--profile", ok, "--target-model", str(tmp / "none.gguf")], "is in no group"),
        "conflicting draft": (["--profile", ok, "--draft", "gguf"], "--draft conflicts with --profile"),
        "conflicting option": (["--profile", ok, "--target-opt", "n_ctx=64"], "--target-opt conflicts"),
        "precision alone": (["--precision", "F16"], "add --profile FILE"),
    }


CASES = ["missing", "folder", "not json", "not a profile", "wrong version", "no groups", "no k",
         "group absent", "model gone", "backend absent", "target not in it", "conflicting draft",
         "conflicting option", "precision alone"]


@pytest.mark.parametrize("case", CASES)
def test_bad_profile_is_one_line_and_exit_2(saved, tmp_path, monkeypatch, case):
    pytest.importorskip("uvicorn")
    from specmac.serve import server

    monkeypatch.setattr(server, "serve", lambda *a, **kw: 0)  # a profile let through: exit 0, not a hang
    args, says = _variants(saved[0], tmp_path)[case]
    res = CliRunner().invoke(main, ["serve", "--port", "0", *args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], res.output
    if "--profile" in args and case not in ("target not in it", "precision alone"):
        assert args[args.index("--profile") + 1] in lines[0]  # names the file


@pytest.mark.parametrize("extra, says", [
    (["--draft", "gguf"], "--save applies only to the ranking"),
    (["--out", "same.json"], "--save and --out are the same file"),
])
def test_advise_save_refusals(tmp_path, monkeypatch, extra, says):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["advise", "--save", "same.json", *extra])
    assert res.exit_code == 2 and says in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "same.json").exists()


def test_run_profile_with_a_plain_first_choice(saved, tmp_path):
    """A plain configuration (K 0) runs at run's default K (no draft), not refused as --k auto would be."""
    edited, plain = _first(saved[0], tmp_path, lambda c: c["draft"]["kind"] == "none")
    res = CliRunner().invoke(main, ["run", "--profile", str(edited), "--max-tokens", "3", "--json", PROMPT])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["draft"]["drafter"] == "none" and r["target"]["model"] == plain["target"]["model"]


def test_serve_default_k_auto_is_served(monkeypatch):
    """`specmac serve` with its default --k auto times the pair's passes instead of refusing."""
    pytest.importorskip("uvicorn")
    from specmac.serve import server

    got = {}
    monkeypatch.setattr(server, "serve", lambda pair, sock, **kw: got.update(kw) or 0)
    res = CliRunner().invoke(main, ["serve", "--target", "gguf", "--draft", "gguf", "--port", "0"])
    assert res.exit_code == 0, res.output
    assert got["k"] == "auto" and got["config"]["k"] == "auto"


@pytest.mark.parametrize("drafter", ["lookup", "lookup+gguf"])
def test_a_lookup_or_hybrid_first_choice_loads_in_run_and_serve(saved, tmp_path, drafter):
    """advise ranks a lookup or a hybrid first often (a lookup needs no backend of its own, a
    hybrid's model does): run --profile and serve --profile load it at its K instead of calling
    its backend 'lookup' not installed."""
    edited, config = _first(saved[0], tmp_path, lambda c: c["draft"]["backend"] == drafter, k=2)
    res = CliRunner().invoke(main, ["run", "--profile", str(edited), "--max-tokens", "4", "--json", PROMPT])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["draft"]["drafter"] == config["draft"]["backend"] and r["k"] == 2
    proc, url, lines = _serve(["--profile", str(edited)])
    try:
        assert "K 2" in lines[2], lines
        _check_served(url, config, 2)
    finally:
        _stop(proc)
