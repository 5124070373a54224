"""Workload files (JSON Lines in Spec-Bench's shape) and compare's per-category table."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.cli import main
from specmac.compare.categories import ALL, by_category
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.errors import BadOption

SYN = ["--opt", "synthetic:latency_ms=0"]


def write(tmp_path, lines, name="w.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_spec_bench_lines_first_turn_and_all_turns(tmp_path):
    path = write(tmp_path, [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorten it."]},
        "",
        {"question_id": "t2", "category": "chat", "turns": [
            {"role": "system", "content": "Be brief."}, "Hi", {"role": "assistant", "content": "Hello"},
            "What now?"]},
    ])
    first = read_prompts(path)
    assert [(p["id"], p["category"], p["text"]) for p in first] == [
        ("81", "writing", "Write a poem."), ("t2", "chat", "Be brief.\n\nHi")]
    assert [m["role"] for m in first[1]["messages"]] == ["system", "user"]
    both = read_prompts(path, turns="all")
    assert both[0]["messages"] == [{"role": "user", "content": "Write a poem."},
                                   {"role": "user", "content": "Now shorten it."}]
    assert [m["role"] for m in both[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert both[1]["text"] == "Be brief.\n\nHi\n\nHello\n\nWhat now?"


@pytest.mark.parametrize("bad, says", [
    ("{not json", "line 2: is not valid JSON"),
    ("[1, 2]", "line 2: is not a JSON object"),
    ('{"question_id": 2, "category": "x"}', "line 2: has no 'turns'"),
    ('{"question_id": 2, "turns": []}', "line 2: 'turns' is not a non-empty list"),
    ('{"question_id": 2, "turns": [3]}', "line 2: turn 0 is not a string"),
    ('{"question_id": 2, "turns": [{"role": "bot", "content": "x"}]}', "line 2: turn 0"),
    ('{"question_id": 1, "turns": ["again"]}', "question_id '1' is also on line 1"),
    ('{"question_id": 2, "category": 5, "turns": ["x"]}', "line 2: category 5 is not a string"),
    ('{"question_id": 2, "turns": [" "]}', "line 2: no user turn has text"),
])
def test_bad_line_is_one_error_naming_it(tmp_path, bad, says):
    path = write(tmp_path, ['{"question_id": 1, "category": "qa", "turns": ["fine"]}', bad])
    with pytest.raises(BadOption) as e:
        read_prompts(path)
    assert says in str(e.value) and path in str(e.value) and "\n" not in str(e.value)
    assert e.value.param == "prompts_path"


def test_conversation_must_end_with_a_user_turn(tmp_path):
    path = write(tmp_path, [{"question_id": 1, "turns": ["q", {"role": "assistant", "content": "a"}]}])
    assert read_prompts(path)[0]["text"] == "q"  # the first turn is fine
    with pytest.raises(BadOption, match="line 1: the conversation ends with an assistant turn"):
        read_prompts(path, turns="all")


def test_packaged_workload_has_every_category():
    prompts = read_prompts(PACKAGED_WORKLOAD, turns="all")
    cats = {p["category"] for p in prompts}
    assert cats == {"translation", "summarization", "qa", "math_reasoning", "rag", "multi_turn",
                    "code_editing"}
    for cat in cats:
        assert 2 <= sum(p["category"] == cat for p in prompts) <= 3
    assert all(len(p["messages"]) == 3 for p in prompts if p["category"] == "multi_turn")
    edits = [p["text"] for p in prompts if p["category"] == "code_editing"]
    assert all(50 <= e.count("\n") <= 80 for e in edits)
    # the other formats carry a category too: the shipped set's is its kind
    assert {p["category"] for p in read_prompts(None)} == {"code", "prose"}


def _run(draft, prompt, category, n, tps, seconds, drafted=0, accepted=0, passes=None, rnd=0):
    return {"config": f"{draft}:t" if draft == "none" else f"{draft}:t:k2", "draft": draft, "target": "t",
            "k": 0 if draft == "none" else 2, "prompt": prompt, "round": rnd, "category": category,
            "n_tokens": n, "seconds": seconds, "tokens_per_second": tps, "t_prefill": 0.5,
            "n_drafted": drafted, "n_accepted": accepted, "n_target_passes": passes or n}


def test_by_category_pools_and_weights_by_tokens():
    runs = [_run("none", "a", "x", 10, 10.0, 1.0), _run("ngram", "a", "x", 10, 20.0, 0.5, 8, 6, 4),
            _run("none", "b", "y", 30, 10.0, 3.0), _run("ngram", "b", "y", 30, 7.5, 4.0, 10, 1, 29)]
    rows = {(r["config"], r["category"]): r for r in by_category(runs)}
    x, y, a = rows[("ngram:t:k2", "x")], rows[("ngram:t:k2", "y")], rows[("ngram:t:k2", ALL)]
    assert x["speedup"] == pytest.approx(2.0) and y["speedup"] == pytest.approx(0.75)
    assert x["acceptance_rate"] == pytest.approx(0.75) and x["tokens_per_target_pass"] == pytest.approx(2.5)
    # all: 40 tokens in 4.5 s against 40 in 4 s (not the mean of 2.0 and 0.75)
    assert a["tokens_per_second"] == pytest.approx(40 / 4.5) and a["speedup"] == pytest.approx(4.0 / 4.5)
    assert a["end_to_end_speedup"] == pytest.approx(5.0 / 5.5)
    assert a["acceptance_rate"] == pytest.approx(7 / 18)


def test_compare_prints_a_per_category_table(tmp_path):
    path = write(tmp_path, [
        {"question_id": "c1", "category": "copy", "turns": ["abc abc abc abc abc abc abc abc"]},
        {"question_id": "p1", "category": "prose", "turns": ["the quick brown fox"]},
    ])
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", "--pair", "ngram:synthetic", "--pair", "synthetic:synthetic",
                                    "--k", "2", "--repeats", "1", "--max-tokens", "12", "--prompts", path,
                                    *SYN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    record = json.loads((out / "results.json").read_text())
    assert record["settings"]["categories"] == {"c1": "copy", "p1": "prose"}
    assert {r["category"] for r in record["runs"]} == {"copy", "prose"}
    cats = {(r["config"], r["category"]) for r in record["categories"]}
    assert {(c, k) for c in ("none:synthetic", "ngram:synthetic:k2", "synthetic:synthetic:k2")
            for k in ("copy", "prose", ALL)} == cats
    text = (out / "summary.md").read_text()
    assert "## Per category" in text and "| **all** | ngram:synthetic:k2 | 2 |" in text
    plain = [r for r in record["runs"] if r["draft"] == "none"]
    assert all(r["n_plain_steps"] == r["n_target_passes"] and r["plain_step_s"] > 0 for r in plain)
    by = {r["config"]: r for r in record["results"]}
    assert by["none:synthetic"]["speedup_normalised"] is None  # plain's own is 1 by definition
    assert "speedup_normalised" in by["ngram:synthetic:k2"]


def test_compare_chat_without_a_template_is_a_user_error(tmp_path):
    res = CliRunner().invoke(main, ["compare", "--pair", "synthetic:synthetic", "--k", "1", "--repeats", "1",
                                    "--n-prompts", "1", "--max-tokens", "4", "--chat", *SYN,
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "chat template" in res.output and "Traceback" not in res.output


def test_a_run_records_the_steps_that_drafted_nothing():
    """RunStats times every step without drafts (one one-token pass), and only those."""
    from specmac.api import Pair
    from specmac.core.sampling import SamplingParams

    pair = Pair.load("synthetic", "lookup", target_options={"latency_ms": 0.0})
    g = pair.generate("abcdefgh" * 8 + "xyz", params=SamplingParams(0.0), k=4, max_tokens=32)
    s = g.stats
    assert 0 < s.sources.get("none", 0) < s.n_target_passes  # both kinds of step happened
    assert len(s.plain_steps) == s.sources["none"]
    assert s.plain_step_seconds == pytest.approx(float(np.mean(s.plain_steps)))
    d = g.to_dict()
    assert d["n_plain_steps"] == s.sources["none"] and d["plain_step_seconds"] == s.plain_step_seconds


def test_the_normalised_speedup_takes_the_machines_drift_out():
    """A configuration 1.2x plain, run while the machine was 1.5x slower (every step, its plain ones
    too), reads 0.8x paired and 1.2x normalised; too few plain steps: no normalised figure."""
    from specmac.compare.categories import MIN_PLAIN_STEPS, normalised_speedup, plain_step_ratio

    plain = _run("none", "a", "x", 20, 10.0, 2.0) | {"plain_step_s": 0.1, "n_plain_steps": 20}
    # at the machine's usual speed: 10 plain steps of 0.1 s and 4 drafting steps writing 10 tokens in
    # 0.667 s, so 20 tokens in 1.667 s (1.2x plain's 2 s); run 1.5x slower: 2.5 s, plain steps of 0.15 s
    slow = _run("lookup", "a", "x", 20, 20 / 2.5, 2.5, 10, 6, 14) | {"plain_step_s": 0.15,
                                                                    "n_plain_steps": MIN_PLAIN_STEPS + 2}
    assert slow["tokens_per_second"] / plain["tokens_per_second"] == pytest.approx(0.8)
    assert normalised_speedup(slow) == pytest.approx(1.2)
    assert normalised_speedup(plain) == pytest.approx(1.0)
    assert plain_step_ratio(slow, plain) == pytest.approx(1.5)
    assert normalised_speedup(slow | {"n_plain_steps": MIN_PLAIN_STEPS - 1}) is None
    assert normalised_speedup(slow | {"plain_step_s": None}) is None
    # a run whose last pass found EOS: 19 tokens in 20 passes of 0.1 s, plain's own is 1 against itself
    eos = plain | {"n_tokens": 19, "n_target_passes": 20, "tokens_per_second": 9.5}
    assert normalised_speedup(eos) == pytest.approx(0.95)
    assert normalised_speedup(eos, eos) == pytest.approx(1.0)
    rows = {(r["config"], r["category"]): r for r in by_category([plain, slow])}
    row = rows[("lookup:t:k2", "x")]
    assert row["normalised_speedup"] == pytest.approx(1.2) and row["n_normalised"] == 1
    assert row["speedup"] == pytest.approx(0.8)


def test_the_median_run_speedup_is_not_carried_by_one_stalled_run():
    """Three rounds at 2x plain and one stalled at 0.2x: pooled, the stall's long seconds pull the
    category under 1.3x; the median over runs stays at 2x."""
    runs = []
    for rnd, (secs, tps) in enumerate([(0.5, 20.0)] * 3 + [(5.0, 2.0)]):
        runs += [_run("none", "a", "x", 10, 10.0, 1.0, rnd=rnd),
                 _run("ngram", "a", "x", 10, tps, secs, rnd=rnd)]
    row = next(r for r in by_category(runs) if r["config"] == "ngram:t:k2" and r["category"] == "x")
    assert row["speedup"] == pytest.approx(40 / 6.5 / 10)
    assert row["median_speedup"] == pytest.approx(2.0) and row["speedup_range"] == pytest.approx([0.2, 2.0])


def _cat(draft, k, cat, speedup, sources=None):
    """A row of by_category's, as the budget reads it (normalised and end to end from the decoding
    speedup: a run's own plain steps are not the budget's business)."""
    return {"config": f"{draft}:t:k{k}", "draft": draft, "target": "t", "k": k, "category": cat,
            "speedup": speedup, "normalised_speedup": speedup, "end_to_end_speedup": speedup * 0.9,
            "tokens_per_second": 10 * speedup, "end_to_end_tokens_per_second": 9 * speedup,
            "sources": sources}


def test_the_hybrid_is_held_to_the_best_of_plain_its_model_draft_and_its_lookup():
    """edit: the model draft at K auto is the best rival (not its better fixed K, not ngram, which is
    not one of the hybrid's sources); chat: every draft is under plain, so plain (1.0) is the bar."""
    from specmac.compare.categories import budget_markdown, hybrid_checks

    rows = []
    for cat, (gguf, gguf4, lookup, ngram, hybrid) in (
            ("edit", (1.5, 1.8, 1.2, 2.0, 1.65)), ("chat", (0.8, 0.85, 0.9, 0.7, 0.95))):
        rows += [_cat("none", 0, cat, 1.0) | {"config": "none:t"},
                 _cat("gguf", "auto", cat, gguf), _cat("gguf", 4, cat, gguf4),
                 _cat("lookup", "auto", cat, lookup), _cat("ngram", "auto", cat, ngram),
                 _cat("lookup+gguf", "auto", cat, hybrid, {"lookup": 20, "gguf": 3, "none": 7})]
    rows += [_cat("lookup+gguf", "auto", ALL, 9.9)]  # "all" is not a category to check
    checks = {(c["category"], c["measure"]): c for c in hybrid_checks(rows)}
    assert {cat for cat, _ in checks} == {"edit", "chat"}
    edit, chat = checks[("edit", "decoding")], checks[("chat", "decoding")]
    assert edit["best_rival"] == "gguf" and edit["ratio_to_best"] == pytest.approx(1.1)
    assert edit["rivals"] == {"none": 1.0, "gguf": 1.5, "lookup": 1.2}
    assert chat["best_rival"] == "none" and chat["ratio_to_best"] == pytest.approx(0.95)
    assert checks[("edit", "end to end")]["ratio_to_best"] == pytest.approx(1.1)
    text = "\n".join(budget_markdown(rows))
    assert "| edit | 10.0 | 1.50× (15.0) | 1.80× (18.0) K=4 |" in text
    assert "lookup+gguf auto / best of plain, gguf, lookup (auto)" in text
    assert "| chat | 9.0 | " in text.split("end to end")[1]  # plain's end-to-end tokens/s there
    assert "| edit | lookup 20, gguf 3, none 7 |" in text
    # no hybrid, or no categories: no section
    assert budget_markdown([r for r in rows if "+" not in r["draft"]]) == []
    assert budget_markdown([r | {"category": ""} for r in rows if r["category"] != ALL]) == []


def test_compare_with_a_hybrid_writes_its_budget(tmp_path):
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", "--pair", "lookup:synthetic",
                                    "--pair", "lookup+synthetic:synthetic", "--k", "2,auto",
                                    "--repeats", "1", "--max-tokens", "6",
                                    "--prompts", "specmac:workload", "--categories", "code_editing,qa",
                                    "--per-category", "1", *SYN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    record = json.loads((out / "results.json").read_text())
    checks = record["hybrid_checks"]
    assert {(c["category"], c["measure"]) for c in checks} == {
        (cat, m) for cat in ("code_editing", "qa") for m in ("decoding", "normalised", "end to end")}
    assert all(set(c["rivals"]) == {"none", "lookup"} for c in checks)
    text = (out / "summary.md").read_text()
    assert "## Per category: K auto, the best fixed K, the hybrid against its rivals" in text
    assert "lookup+synthetic auto / best of plain, lookup (auto)" in text
