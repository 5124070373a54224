"""advise ends with its first choice as `specmac run` and `specmac serve` command lines that load
what it ranked first (and `serve --profile FILE` after --save), in the ranking and one pairing."""

from __future__ import annotations

import json
import shlex

from click.testing import CliRunner

from specmac.cli import main

FAST = ("--target-opt", "latency_ms=2", "--draft-opt", "latency_ms=0.1", "--draft-opt", "noise=0.1",
        "--run-tokens", "16")


def invoke(*args: str):
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res


def run_command(line: str) -> dict:
    """Run advise's `specmac run ... 'YOUR PROMPT'` line, a few tokens, as JSON."""
    argv = shlex.split(line)
    assert argv[:2] == ["specmac", "run"] and argv[-1] == "YOUR PROMPT"
    return json.loads(invoke(*argv[1:-1], "-n", "8", "--json", "def f(").stdout)


def test_the_rankings_first_choice_runs_as_printed(tmp_path):
    save = tmp_path / "profile.json"
    r = json.loads(invoke("advise", "--target", "synthetic", *FAST, "--k-max", "4", "-c", "512",
                          "--temperature", "0.5", "--save", str(save), "--json").stdout)
    top, first = r["ranking"][0], r["first_choice"]
    assert first["group"] == top["group"]
    assert "n_ctx" not in first["run"] and " -c 512 " in first["run"]
    assert "--temperature 0.5" in first["run"] and "--temperature" not in first["serve"]
    assert first["serve"] == first["run"].split(" --temperature")[0].replace("specmac run", "specmac serve")
    assert first["profile"] == f"specmac serve --profile {shlex.quote(str(save))}"
    ran = run_command(first["run"])
    assert ran["k"] == top["k"] and ran["target"]["n_ctx"] == 512
    assert (ran["draft"].get("drafter") or ran["draft"]["backend"]) == top["draft"]


def test_the_ranking_prints_its_first_choice_last():
    res = invoke("advise", "--target", "synthetic", *FAST, "--k-max", "2")
    lines = res.stdout.strip().splitlines()
    assert lines[-3].startswith("first choice (")
    assert lines[-2].startswith("  specmac run --target synthetic")
    assert lines[-1].startswith("  specmac serve --target synthetic")


def test_one_pairing_that_pays_runs_at_its_best_k():
    r = json.loads(invoke("advise", "--draft", "synthetic", "--target", "synthetic", *FAST, "--repeats", "1",
                          "--context", "16", "--json").stdout)
    assert not r["reasons"]
    run = r["first_choice"]["run"]
    assert "--draft synthetic" in run and f"--k {r['best_k']} " in run
    ran = run_command(run)
    assert ran["k"] == r["best_k"] and ran["draft"]["backend"] == "synthetic"
    text = invoke("advise", "--draft", "synthetic", "--target", "synthetic", *FAST, "--repeats", "1",
                  "--context", "16").stdout.strip().splitlines()
    assert text[-3] == "first choice, to copy:" and text[-1].startswith("  specmac serve --target synthetic")


def test_one_pairing_that_does_not_pay_advises_plain_decoding():
    """A serial target and a slow draft: speculation loses, and the first choice drafts nothing."""
    r = json.loads(invoke("advise", "--draft", "synthetic", "--target", "synthetic", "--target-opt",
                          "latency_ms=2", "--target-opt", "beta=1.0", "--draft-opt", "latency_ms=2",
                          "--run-tokens", "16", "--repeats", "1", "--context", "16", "--json").stdout)
    assert r["reasons"]
    flags = "--target synthetic --target-opt latency_ms=2 --target-opt beta=1.0"  # no draft, no --k
    assert r["first_choice"]["run"] == f"specmac run {flags} 'YOUR PROMPT'"
    assert r["first_choice"]["serve"] == f"specmac serve {flags}"
