"""Draft sources on the command line: a free source and a model together, under run and compare."""

from __future__ import annotations

import json
from collections import Counter

from click.testing import CliRunner

from specmac.cli import main
from specmac.cli.render import stats_block


def test_run_and_compare_take_a_lookup_and_a_model(tmp_path):
    res = CliRunner().invoke(main, ["run", "--draft", "lookup+synthetic", "--target", "synthetic", "--k", "3",
                                    "--max-tokens", "12", "--json", "abcabcabcabc"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["draft"]["drafter"] == "lookup+synthetic"
    assert set(r["steps_by_source"]) <= {"lookup", "synthetic", "none"}
    assert r["k_policy"]["policy"] == "fixed" and r["k_policy"]["k"] == 3
    res = CliRunner().invoke(main, ["run", "--draft", "foo+synthetic", "--target", "synthetic", "x"])
    assert res.exit_code == 2 and "FREE+BACKEND" in res.output
    out = tmp_path / "cmp"
    pairs = ["--pair", "lookup+synthetic:synthetic", "--pair", "lookup:synthetic"]
    res = CliRunner().invoke(main, ["compare", *pairs, "--k", "3", "--repeats", "1", "--n-prompts", "2",
                                    "--max-tokens", "12", "--draft-opt", "synthetic:noise=0.2",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "steps by source" in (out / "summary.md").read_text()


def test_the_stats_say_the_k_of_each_step_and_the_sources(tmp_path, monkeypatch):
    """K per step counts the drafts each step verified (0: a plain step), not a K asked for and never
    drafted; a pair of sources says how many steps each drafted."""
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    run = ["run", "--draft", "lookup+synthetic", "--target", "synthetic", "--k", "auto", "--max-tokens", "24"]
    res = CliRunner().invoke(main, [*run, "abcdefgh" * 6])
    assert res.exit_code == 0, res.output
    assert "K per step:" in res.output and "steps by source:" in res.output
    assert "pass costs: target:" in res.output
    # K auto plans from timings, so a second run may choose other K: the line is checked against the
    # numbers of the run it is printed from.
    res = CliRunner().invoke(main, [*run, "--json", "abcdefgh" * 6])
    r = json.loads(res.stdout)
    steps = r["k_steps"]
    assert len(steps) == r["n_target_passes"] and sum(steps) == r["n_drafted"]
    k_line = next(line for line in stats_block(r, speculative=True) if line.startswith("K per step:"))
    assert all(f"{n} step{'' if n == 1 else 's'} at {k}" in k_line for k, n in Counter(steps).items())
