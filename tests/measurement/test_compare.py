"""specmac compare / report: parsing, interleaving, aggregation, and outputs that match the JSON.

Logic runs on the synthetic backend; the issue's small compare (2 pairings x 2 K x 1 repeat) runs
on the embedded pair through the real mlx, gguf and torch backends.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.cli import main
from specmac.compare import measure as cmp
from specmac.compare import report
from specmac.compare.prompts import read_prompts
from specmac.core.sampling import SamplingParams
from specmac.errors import BadOption, VocabMismatch
from tests.support.helpers import skip_unless_installed

SYN = ["--opt", "synthetic:latency_ms=1", "--draft-opt", "synthetic:latency_ms=0.2"]


# --- parsing ------------------------------------------------------------------------------------

def test_parse_pair():
    assert cmp.parse_pair("ngram:synthetic") == cmp.PairSpec("ngram", "synthetic")
    assert cmp.parse_pair("mlx:gguf").id == "mlx:gguf"
    for bad in ("mlx", "mlx:", ":gguf", "nope:gguf", "gguf:nope", "gguf:ngram"):
        with pytest.raises(BadOption):
            cmp.parse_pair(bad)


def test_parse_pairs_dedup_and_all():
    assert cmp.parse_pairs(["synthetic:synthetic", "ngram:synthetic", "synthetic:synthetic"]) == [
        cmp.PairSpec("synthetic", "synthetic"), cmp.PairSpec("ngram", "synthetic")]
    everything = cmp.parse_pairs([])
    targets = {p.target for p in everything}
    assert "synthetic" not in targets and targets
    assert {cmp.PairSpec("ngram", t) for t in targets} <= set(everything)
    assert len(everything) == len(targets) * (len(targets) + 1)


def test_parse_ks():
    assert cmp.parse_ks("4,1,2") == [1, 2, 4]
    assert cmp.parse_ks("1-3, 8,2") == [1, 2, 3, 8]
    assert cmp.parse_ks("auto,2") == [2, "auto"] and cmp.parse_ks("auto") == ["auto"]
    for bad in ("0", "a", "", "1,-2", "3-x"):
        with pytest.raises(BadOption):
            cmp.parse_ks(bad)


def test_default_prompts_are_code_and_prose():
    prompts = read_prompts(None)
    assert len(prompts) == 12
    assert len({p["id"] for p in prompts}) == 12
    kinds = [p["kind"] for p in prompts]
    assert kinds[:2] == ["code", "prose"] and kinds.count("code") == kinds.count("prose")
    assert [p["id"] for p in read_prompts(None, 3)] == [p["id"] for p in prompts[:3]]


def test_read_prompt_files(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("first\nline two\n---\n\n---\nsecond\n")
    assert [p["text"] for p in read_prompts(str(txt))] == ["first\nline two", "second"]
    js = tmp_path / "p.json"
    js.write_text(json.dumps(["a", {"id": "x", "text": "b"}]))
    assert [(p["id"], p["text"]) for p in read_prompts(str(js))] == [("p0", "a"), ("x", "b")]
    for content in ("[]", "{", "[1]"):
        js.write_text(content)
        with pytest.raises(BadOption):
            read_prompts(str(js))
    with pytest.raises(BadOption):
        read_prompts(str(tmp_path / "missing.txt"))
    with pytest.raises(BadOption):
        read_prompts(None, 0)


def test_backend_settings_merge(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[gguf]\ntarget_model = "t.gguf"\noptions = { n_threads = 2 }\n'
                    'draft_options = { n_threads = 1 }\n')
    be = cmp.backend_settings(cmp.read_config(str(toml)), target_model={"gguf": "cli.gguf"},
                              opts=[("mlx", "dtype", "float32")], target_opts=[("gguf", "n_threads", "4")])
    assert cmp.model_and_options(be, "gguf", "target") == ("cli.gguf", {"n_threads": "4"})
    assert cmp.model_and_options(be, "gguf", "draft") == (None, {"n_threads": 1})
    assert cmp.model_and_options(be, "mlx", "draft") == (None, {"dtype": "float32"})
    toml.write_text("[gguf]\nmodel = 'x'\n")
    with pytest.raises(BadOption):
        cmp.backend_settings(cmp.read_config(str(toml)))
    toml.write_text("[gguf\n")
    with pytest.raises(BadOption):
        cmp.read_config(str(toml))


# --- plan, measurement, aggregation -------------------------------------------------------------

def syn_settings(**kw) -> cmp.Settings:
    base = dict(pairs=[cmp.PairSpec("synthetic", "synthetic"), cmp.PairSpec("ngram", "synthetic")],
                ks=[1, 3], prompts=read_prompts(None, 2), params=SamplingParams(0.0), max_tokens=12,
                repeats=2, backends=cmp.backend_settings(opts=[("synthetic", "vocab_size", "20")]))
    return cmp.Settings(**{**base, **kw})


def test_configs_grouped_by_target_with_baseline_first():
    s = syn_settings(pairs=[cmp.PairSpec("a", "t1"), cmp.PairSpec("b", "t2"), cmp.PairSpec("c", "t1")])
    assert [c.id for c in s.configs()] == ["none:t1", "a:t1:k1", "a:t1:k3", "c:t1:k1", "c:t1:k3",
                                           "none:t2", "b:t2:k1", "b:t2:k3"]
    assert s.n_runs() == 8 * (1 + 2 * 2)


def test_measure_interleaves_and_excludes_warmup():
    s = syn_settings()
    loaded = cmp.load_models(s)
    ticks: list[str] = []
    runs, interrupted = cmp.measure(s, loaded, ticks.append)
    ids = [c.id for c in s.configs()]
    assert not interrupted and len(ticks) == s.n_runs()
    assert all(t.startswith("warm-up") for t in ticks[: len(ids)])
    assert len(runs) == len(ids) * len(s.prompts) * s.repeats  # the warm-up is not recorded
    # A B C B C A C A B: each round (prompt, repeat) runs every configuration once, the n-th round
    # starting at the n-th configuration of the plan
    n = len(ids)
    assert [r["config"] for r in runs] == [ids[(j + q) % n] for q in range(len(s.prompts) * s.repeats)
                                           for j in range(n)]
    assert [(r["round"], r["prompt"]) for r in runs[:: len(ids)]] == [
        (r, p["id"]) for r in range(s.repeats) for p in s.prompts]
    # the same prompt gives the same greedy run in every round: nothing is reused from the last
    by = {(r["config"], r["prompt"], r["round"]): r for r in runs}
    for c in ids:
        for p in s.prompts:
            a, b = by[(c, p["id"], 0)], by[(c, p["id"], 1)]
            assert (a["output_sha1"], a["n_target_passes"], a["reached"]) == (
                b["output_sha1"], b["n_target_passes"], b["reached"])
    # nor from the configuration before: every run processes its whole prompt (on the target and on
    # a draft model that shares its backend with another configuration's)
    assert all(r["cached_tokens"] == 0 for r in runs)
    results = cmp.aggregate(runs, greedy=True)
    assert all(r["greedy_match"] == 1.0 for r in results if r["draft"] != cmp.PLAIN)


def test_vocab_mismatch_is_caught_before_measuring():
    s = syn_settings(backends=cmp.backend_settings(draft_opts=[("synthetic", "vocab_size", "20")]))
    with pytest.raises(VocabMismatch):
        cmp.load_models(s)
    s = syn_settings(backends=cmp.backend_settings(opts=[("torch", "device", "cpu")]))
    with pytest.raises(BadOption, match="no pair uses"):
        cmp.load_models(s)


def fake_run(config, draft, k, prompt, rnd, tps, drafted=0, accepted=0, reached=(), acc_at=(), sha="x"):
    seconds = 10 / tps
    return {"config": config, "draft": draft, "target": "t", "k": k, "prompt": prompt, "round": rnd,
            "seed": 0, "n_tokens": 10, "n_target_passes": 10 - accepted, "n_drafted": drafted,
            "n_accepted": accepted, "reached": list(reached), "accepted_at": list(acc_at),
            "t_draft": seconds / 4, "t_verify": seconds / 2, "t_other": seconds / 4, "seconds": seconds,
            "tokens_per_second": tps, "finish_reason": "length", "output_sha1": sha}


def test_aggregate_pairs_each_run_with_its_own_baseline():
    runs = [fake_run("none:t", "none", 0, "p", 0, 10.0), fake_run("d:t:k2", "d", 2, "p", 0, 30.0, 4, 3,
                                                                    (2, 2), (2, 1)),
            fake_run("none:t", "none", 0, "p", 1, 20.0), fake_run("d:t:k2", "d", 2, "p", 1, 20.0, 4, 1,
                                                                    (2, 1), (1, 0), sha="y")]
    base, spec = cmp.aggregate(runs, greedy=True)
    assert base["speedup"]["median"] == 1.0 and base["acceptance_rate"] is None
    assert spec["speedup"]["median"] == pytest.approx((3.0 + 1.0) / 2)  # paired: 30/10 and 20/20
    assert spec["speedup"]["median"] != pytest.approx(25.0 / 15.0)  # not a ratio of medians
    assert spec["tokens_per_second"]["median"] == 25.0
    assert spec["acceptance_rate"] == pytest.approx(4 / 8)
    assert spec["tokens_per_target_pass"] == pytest.approx(20 / (7 + 9))
    assert spec["per_position_acceptance"] == pytest.approx([3 / 4, 1 / 3])
    assert spec["greedy_match"] == 0.5
    assert spec["time_split"] == pytest.approx({"draft": 0.25, "verify": 0.5, "other": 0.25})
    assert cmp.spread([]) is None


# --- outputs: JSON, summary.md and plots agree ----------------------------------------------------

def table_rows(summary: str) -> dict[tuple[str, str], list[str]]:
    """(pairing, K) -> cells of the "Every configuration" tables."""
    part = summary.split("## Every configuration")[1].split("## How this")[0]
    rows = {}
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] != "pairing":
            rows[(cells[0], cells[1])] = cells
    return rows


def num(cell: str) -> float | None:
    return None if cell == "\u2013" else float(cell.rstrip("×%"))


def series(rows: list[dict], legend: str) -> list[dict]:
    """The rows a plotted series labelled "draft → target" stands for, by K."""
    draft, target = legend.split(" \u2192 ")
    return sorted((r for r in rows if (r["draft"], r["target"]) == (draft, target) and r["k"] != "auto"),
                  key=lambda r: r["k"])


def check_outputs(out, n_configs: int) -> dict:
    """results.json is valid and complete; summary.md and every plot show its numbers."""
    record = report.load_record(out)
    assert record["provenance"]["git_sha"] is not None or record["provenance"]["command"]
    assert {"command", "libraries", "machine", "models", "backend_options"} <= set(record["provenance"])
    assert len(record["results"]) == n_configs
    recomputed = cmp.aggregate(record["runs"], SamplingParams(**record["settings"]["sampling"]).greedy)
    for row, again in zip(record["results"], recomputed):
        assert {k: row[k] for k in again} == again  # the aggregates are those of the raw runs

    rows = table_rows((out / "summary.md").read_text())
    assert len(rows) == n_configs
    for r in record["results"]:
        cells = rows[(report.label(r), str(r["k"] or "\u2013"))]
        tps, sp = r["tokens_per_second"], r["speedup"]
        assert num(cells[2]) == pytest.approx(tps["median"], abs=0.051)
        lo, hi = cells[3].split("–")
        assert (num(lo), num(hi)) == pytest.approx((tps["p25"], tps["p75"]), abs=0.051)
        assert num(cells[4]) == pytest.approx(sp["median"], abs=0.0051)
        for cell, value, tol in ((cells[6], r["predicted_speedup"], 0.0051),
                                 (cells[7], r["acceptance_rate"], 5.1e-4),
                                 (cells[8], r["tokens_per_target_pass"], 0.0051)):
            assert (num(cell) is None) == (value is None)
            if value is not None:
                assert num(cell) == pytest.approx(value, abs=tol)

    figs = report.figures(record)
    spec = [r for r in record["results"] if r["draft"] != cmp.PLAIN]
    for ax in figs["speedup_vs_k.png"].axes:
        assert ax.get_xlabel() and ax.get_title()
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.lines)  # the baseline
        for c in ax.containers:
            mine = [r for r in series(spec, c.get_label()) if r["speedup"]]
            assert list(c.lines[0].get_xdata()) == [r["k"] for r in mine]
            y = np.asarray(c.lines[0].get_ydata(), float)
            np.testing.assert_allclose(y, [r["speedup"]["median"] for r in mine])
    assert figs["speedup_vs_k.png"].axes[0].get_ylabel()
    n_series = sum(len(ax.containers) for ax in figs["speedup_vs_k.png"].axes)
    assert n_series == len({(r["draft"], r["target"]) for r in spec})
    for ax in figs["acceptance_vs_k.png"].axes:
        for line in ax.lines:
            mine = [r for r in series(spec, line.get_label()) if r["acceptance_rate"] is not None]
            assert list(line.get_xdata()) == [r["k"] for r in mine]
            y = np.asarray(line.get_ydata(), float)
            np.testing.assert_allclose(y, [r["acceptance_rate"] for r in mine])
    ax = figs["measured_vs_predicted.png"].axes[0]
    points = {tuple(np.round(xy, 9)) for coll in ax.collections for xy in coll.get_offsets()}
    assert points == {(round(r["predicted_speedup"], 9), round(r["speedup"]["median"], 9)) for r in spec
                      if r["predicted_speedup"] is not None}
    assert ax.get_xlabel() and ax.get_ylabel()

    import matplotlib.image

    for name in report.PLOTS:
        img = matplotlib.image.imread(out / name)
        assert img.shape[0] > 200 and img.shape[1] > 300
    return record


def test_compare_cli_synthetic_then_report(tmp_path):
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", "--pair", "synthetic:synthetic", "--pair", "ngram:synthetic",
                                    "--k", "1,3", "--repeats", "2", "--n-prompts", "2", "--max-tokens", "16",
                                    *SYN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "synthetic" in res.stdout
    record = check_outputs(out, n_configs=1 + 2 * 2)
    assert record["interrupted"] is False
    assert set(record["predictions"]) == {"synthetic:synthetic", "ngram:synthetic"}
    assert {"target:synthetic", "draft:synthetic", "draft:ngram"} == set(record["backends"])

    again = tmp_path / "again"
    res = CliRunner().invoke(main, ["report", str(out), "--out", str(again)])
    assert res.exit_code == 0, res.output
    assert (again / "summary.md").read_text() == (out / "summary.md").read_text()
    assert all((again / name).stat().st_size > 0 for name in report.PLOTS)


def test_compare_measures_k_auto_like_any_k(tmp_path):
    """--k 1,auto: K = auto is one more configuration per pairing, measured in the same rounds (each
    run times or reads its pass costs as `specmac run --k auto` does), reported and left off K axes."""
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", "--pair", "synthetic:synthetic", "--k", "1,auto", "--repeats",
                                    "1", "--n-prompts", "2", "--max-tokens", "16", *SYN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    record = check_outputs(out, n_configs=1 + 2)
    auto = next(r for r in record["results"] if r["k"] == "auto")
    assert auto["config"] == "synthetic:synthetic:kauto" and auto["n_tokens"] > 0
    assert auto["greedy_match"] == 1.0 and auto.get("predicted_speedup") is None
    assert "| auto |" in (out / "summary.md").read_text()


def test_compare_json_flag_and_config(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[synthetic]\noptions = { vocab_size = 30 }\ndraft_options = { noise = 0.25 }\n")
    res = CliRunner().invoke(main, ["compare", "--pair", "synthetic:synthetic", "--k", "2", "--repeats",
                                    "1", "--n-prompts", "1", "--max-tokens", "8", "--json", "--config",
                                    str(config), "--target-opt", "synthetic:seed=3", "--draft-opt",
                                    "synthetic:seed=3", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout)
    assert record == json.loads((tmp_path / "results.json").read_text())
    target, draft = (record["backends"][f"{role}:synthetic"]["options"] for role in ("target", "draft"))
    assert (target["vocab_size"], target["noise"], target["seed"]) == (30, 0, 3)
    assert (draft["vocab_size"], draft["noise"], draft["seed"]) == (30, 0.25, 3)


@pytest.mark.parametrize("args, message", [
    (["compare", "--pair", "mlx"], "DRAFT:TARGET"),
    (["compare", "--pair", "synthetic:synthetic", "--k", "0"], "out of range"),
    (["compare", "--pair", "synthetic:synthetic", "--opt", "synthetic=1"], "BACKEND:KEY=VALUE"),
    (["compare", "--pair", "synthetic:synthetic", "--target-model", "gguf"], "BACKEND=PATH"),
    (["compare", "--pair", "synthetic:synthetic", "--opt", "synthetic:bogus=1"], "unknown option"),
    (["compare", "--pair", "synthetic:synthetic", "--repeats", "0"], ">= 1"),
    (["report", "."], "no results.json"),
])
def test_cli_user_errors_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o")] if args[0] == "compare" else args)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) <= 2


def test_report_rejects_other_json(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"format": "something else"}))
    res = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "not a specmac compare record" in res.output


# --- the issue's small compare on the embedded pair -----------------------------------------------

@skip_unless_installed("mlx")
@skip_unless_installed("gguf")
@skip_unless_installed("torch")
def test_compare_embedded_pair(tmp_path):
    """2 pairings x 2 K x 1 repeat on the real backends: valid JSON, summary and PNGs agree."""
    out = tmp_path / "emb"
    res = CliRunner().invoke(main, ["compare", "--pair", "mlx:gguf", "--pair", "torch:gguf", "--k", "1,3",
                                    "--repeats", "1", "--n-prompts", "2", "--max-tokens", "12",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    record = check_outputs(out, n_configs=1 + 2 * 2)
    assert set(record["backends"]) == {"target:gguf", "draft:mlx", "draft:torch"}
    assert all(p.get("sha256") or p.get("files") for p in record["provenance"]["models"])
    assert all("error" not in a for a in record["predictions"].values())
    for r in record["results"]:
        assert r["n_tokens"] > 0 and r["tokens_per_second"]["median"] > 0
        if r["draft"] != cmp.PLAIN:
            assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["tokens_per_target_pass"] <= r["k"] + 1
    assert re.search(r"\*\*(Run|No pairing)", (out / "summary.md").read_text())


def test_results_are_saved_as_the_measurement_goes(tmp_path):
    """After every round the record so far is handed on, marked incomplete; the last is complete."""
    saved = []
    record = cmp.run_compare(syn_settings(), command="test", checkpoint=saved.append)
    assert len(saved) == 2 * 2  # repeats x prompts: one save per round
    assert all(r["complete"] is False for r in saved) and record["complete"] is True
    assert [len(r["runs"]) for r in saved] == sorted(len(r["runs"]) for r in saved)
    assert len(saved[-1]["runs"]) == len(record["runs"])
    assert "Incomplete" in report.summary_markdown(saved[0])


def test_skipped_pairings_are_counted_against_all_that_were_asked_for():
    record = {"settings": {"pairs": ["gguf:gguf", "ngram:gguf"]},
              "skipped_pairs": [{"pair": "mlx:gguf", "reason": "the tokenizers differ"}]}
    assert report.skipped_line(record) == "1 of 3 pairings skipped: mlx:gguf: the tokenizers differ"
    record["skipped_pairs"].append({"pair": "gguf:mlx", "reason": "the tokenizers differ"})
    assert report.skipped_line(record).startswith("2 of 4 pairings skipped: mlx:gguf: ")
    assert report.skipped_line({"settings": {"pairs": ["gguf:gguf"]}, "skipped_pairs": []}) is None
    assert report.skipped_line({"settings": {"pairs": ["gguf:gguf"]}}) is None  # an older record


def test_provenance_names_the_commit_the_run_started_with(monkeypatch):
    """A tree edited (or a commit made) during a long run is not recorded as what was measured."""
    from specmac.compare import results

    monkeypatch.setattr(results, "_AT_START", [])
    shas = iter(["aaa", "bbb+dirty", "bbb+dirty"])
    monkeypatch.setattr(results, "git_sha", lambda cwd=None: next(shas))
    assert results.code_measured() == "aaa"  # as the run starts
    prov = results.provenance("cmd")  # as it writes
    assert prov["git_sha"] == "aaa" and prov["git_sha_at_end"] == "bbb+dirty"
    monkeypatch.setattr(results, "git_sha", lambda cwd=None: "aaa")
    assert "git_sha_at_end" not in results.provenance("cmd")
