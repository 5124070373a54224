"""advise on a workload: --prompts FILE, --turns, --chat, the packaged workload as the default, the
prediction per category, and lookup and the hybrid lookup+BACKEND ranked as configurations."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.advise.measure import Probe
from specmac.advise.predict import Chains, chances, model_steps
from specmac.advise.variants import Variant
from specmac.cli import main
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.core.sampling import SamplingParams
from tests.support.helpers import skip_unless_installed

FAST = ["--k-max", "4", "--run-tokens", "16"]
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
PROSE = "The river ran past the old mill, and the miller's daughter watched it from the bridge."


def workload(tmp_path, lines=None):
    lines = lines or [{"question_id": "c1", "category": "code", "turns": [CODE]},
                      {"question_id": "c2", "category": "code", "turns": [CODE.replace("add", "plus")]},
                      {"question_id": "p1", "category": "prose", "turns": [PROSE]}]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def advise(*args: str):
    return CliRunner().invoke(main, ["advise", *args])


@skip_unless_installed("gguf")
def test_a_workload_is_predicted_per_category_printed_and_written(tmp_path):
    out = tmp_path / "r.json"
    res = advise("--backends", "gguf", "--prompts", workload(tmp_path), "--out", str(out), *FAST)
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert f"prompts: {tmp_path / 'w.jsonl'} (3 prompts, 2 categories)" in res.output
    assert "per category: " in res.output and "overall (by tokens)" in res.output
    assert "best per category in " in res.output
    for cat in ("code", "prose"):
        assert f"\n  {cat} " in res.output
    r = json.loads(out.read_text())
    ref = r["reference"]
    assert [(c["category"], c["prompts"]) for c in ref["categories"]] == [("code", 2), ("prose", 1)]
    assert sum(c["tokens"] for c in ref["categories"]) == ref["tokens"]
    for e in r["ranking"]:
        assert set(e["by_category"]) == {"code", "prose"}
        for c in e["by_category"].values():
            assert {"predicted_tokens_per_second", "predicted_speedup", "alpha", "tokens_per_pass", "k",
                    "best_k"} <= set(c)
            assert c["k"] == e["k"] and c["predicted_tokens_per_second"] > 0
        if e["k"] == 0:
            assert all(c["predicted_speedup"] == pytest.approx(e["predicted_speedup"])
                       for c in e["by_category"].values())
    # the overall line weighs the categories by their tokens: a lookup's time (no draft, no prefill)
    # over the whole workload is the sum of each category's
    sizes = {c["category"]: c["tokens"] for c in ref["categories"]}
    for e in (e for e in r["ranking"] if e["draft"] in ("ngram", "lookup")):
        per = sum(n / e["by_category"][c]["predicted_tokens_per_second"] for c, n in sizes.items())
        assert ref["tokens"] / per == pytest.approx(e["predicted_tokens_per_second"], rel=1e-9)


@skip_unless_installed("gguf")
def test_the_default_is_the_packaged_workload_and_the_hybrid_is_ranked():
    res = advise("--backends", "gguf", "--json", *FAST)
    assert res.exit_code == 0, res.output + repr(res.exception)
    r = json.loads(res.stdout)
    packaged = read_prompts(PACKAGED_WORKLOAD)
    assert r["prompts"] == {"source": PACKAGED_WORKLOAD, "turns": "first", "chat": "auto"}
    ref = r["reference"]
    assert ref["chat"] is False  # the embedded pair has no chat template: the prompts as plain text
    assert ref["prompts"] + len(ref["unanswered"]) == len(packaged)
    assert {c["category"] for c in ref["categories"]} <= {p["category"] for p in packaged}
    assert len(ref["categories"]) >= 6
    assert ref["cut"] >= 1 and ref["cut_to"] < 512  # the long texts cut to the tiny pair's context
    drafts = {e["draft"] for e in r["ranking"]}
    assert {"gguf", "lookup+gguf", "lookup", "ngram", "none"} <= drafts
    hybrids = [e for e in r["ranking"] if e["draft"] == "lookup+gguf"]
    assert hybrids and all(isinstance(e["model_started"], bool) for e in hybrids)
    assert all(isinstance(c["model_started"], bool) for e in hybrids for c in e["by_category"].values())
    assert "lookup's drafts where it proposes" in r["hybrid"]
    text = advise("--backends", "gguf", *FAST)
    assert text.exit_code == 0
    assert (f"prompts: {PACKAGED_WORKLOAD} ({ref['prompts']} prompts, {len(ref['categories'])} categories; "
            "plain text: the target has no chat template") in text.output
    assert "lookup+gguf Q8_0 \u2192 gguf" in text.output


@skip_unless_installed("gguf")
@pytest.mark.parametrize("mode", [["--backends", "gguf"], ["--draft", "gguf", "--target", "gguf"]])
def test_chat_on_a_target_without_a_template_is_one_line(tmp_path, mode):
    out = tmp_path / "r.json"
    res = advise(*mode, "--chat", "--out", str(out), *(FAST if "--backends" in mode else []))
    assert res.exit_code == 2, res.output
    errors = [x for x in res.output.strip().splitlines() if not x.startswith("probing ")]
    assert len(errors) == 1 and errors[0].startswith("Error: --chat") and "no" in errors[0]
    assert re.search("chat.template", errors[0]) and "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize("line, says", [
    ('{"question_id": "a", "category": "x", "turns": ["ok"]}\n{not json', "line 2: is not valid JSON"),
    ('{"question_id": "a", "category": "x"}', "line 1: has no 'turns'"),
    ('{"question_id": "a", "category": 3, "turns": ["x"]}', "category 3 is not a string"),
])
def test_a_bad_workload_line_is_one_line_naming_it(tmp_path, line, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    out = tmp_path / "r.json"
    res = advise("--target", "synthetic", "--prompts", str(path), "--out", str(out))
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --prompts") and says in lines[0], lines
    assert not out.exists()


def test_prompt_and_prompts_together_are_refused(tmp_path):
    res = advise("--target", "synthetic", "--prompt", "x", "--prompts", workload(tmp_path))
    assert res.exit_code == 2 and "not both" in res.output


def test_turns_all_reads_the_conversation(tmp_path):
    path = workload(tmp_path, [{"question_id": "t", "category": "chat",
                                "turns": ["Name a colour.", {"role": "assistant", "content": "Blue."},
                                          "Name another."]}])
    args = ["--target", "synthetic", "--prompts", path, "--json", *FAST]
    first, both = (json.loads(advise(*args, "--turns", t).stdout) for t in ("first", "all"))
    assert first["reference"]["categories"] == [{"category": "chat", "prompts": 1, "tokens": 16}]
    assert both["prompts"]["turns"] == "all" and first["prompts"]["turns"] == "first"


def test_the_chat_template_writes_the_reference_where_the_target_has_one(monkeypatch):
    """chat=None: through the template where the target has one (the synthetic one is given one
    here); the reference then starts with the templated prompt."""
    from specmac.advise.workload import has_chat_template, reference
    from specmac.backends import load_backend

    target = load_backend("synthetic", None, {}, role="target")
    assert not has_chat_template(target)
    params = SamplingParams(temperature=0.0)
    plain = reference(target, ["hello"], params, 8, 0, chat=None)
    assert plain.chat is False and plain.texts[0][: plain.starts[0]] == target.encode("hello")
    monkeypatch.setattr(type(target), "apply_chat_template",
                        lambda self, p: "user: " + (p if isinstance(p, str) else p[-1]["content"]) + "\nbot:")
    chat = reference(target, ["hello"], params, 8, 0, chat=None)
    assert chat.chat is True and chat.texts[0][: chat.starts[0]] == target.encode("user: hello\nbot:")


def test_the_hybrid_drafts_from_the_lookup_where_it_proposes_and_the_model_elsewhere():
    """Greedy teacher forcing on one text of 6 positions: the lookup proposes at 0 and 4, the model
    drafts elsewhere; each step's chances are the proposer's, and only the model's steps count
    draft passes, while the tokens lookup steps wrote are fed to the model before it drafts again."""
    target_rows = [np.array([5, 6, 7, 8, 9, 4])]
    model_rows = [np.array([5, 0, 7, 8, 0, 4])]  # the model's argmax: wrong at 1 and 4
    proposals = [[[5, 6], [], [], [], [9, 4, 4], []]]
    params = SamplingParams(temperature=0.0)
    tp = Probe(Variant("target", "synthetic", None))
    tp.rows = target_rows
    hybrid = Probe(Variant("draft", "lookup+synthetic", None), [0.01], rows=model_rows, lookup=proposals)
    ch = chances(hybrid, tp, params)[0]
    assert ch[0] == [1.0, 1.0] and ch[4] == [1.0, 1.0]  # the lookup's: right, cut at the text's end
    assert ch[1] == [0.0, 1.0, 1.0, 0.0, 1.0] and ch[3] == [1.0, 0.0, 1.0]  # the model's
    steps = model_steps(hybrid)
    assert steps == [[False, True, True, True, False, True]]
    mixed = Chains.of([ch], 2, steps)
    # K = 2 walk: lookup at 0 keeps 5, 6 + the target's 7 -> 3; the model at 3 drafts 8, 0: keeps 8 + 9
    # -> 5; the model at 5 drafts nothing past the end -> 6: 3 steps, 6 tokens, 2 + 0 model drafts
    assert mixed.tokens[1] == pytest.approx(2.0) and mixed.passes[1] == pytest.approx(2 / 3)
    assert mixed.catch_up[1] == pytest.approx(3 / 3)  # the 3 tokens of the lookup step, per step
    assert Chains.of([ch], 2, True).passes[1] > mixed.passes[1]  # all model steps: more passes
    alone = Chains.of([ch], 2, False)
    assert alone.passes == [0.0, 0.0] and alone.catch_up == [0.0, 0.0]


@pytest.mark.parametrize("draft", ["lookup", "lookup+synthetic"])
def test_one_pairing_advises_lookup_and_the_hybrid_per_category(tmp_path, draft):
    res = advise("--draft", draft, "--target", "synthetic", "--prompts", workload(tmp_path), "--json",
                 "--run-tokens", "16", "--repeats", "1", "--context", "8")
    assert res.exit_code == 0, res.output + repr(res.exception)
    r = json.loads(res.stdout)
    assert [row["k"] for row in r["table"]] == list(range(1, 17))
    assert set(r["by_category"]) == {"code", "prose"}
    assert all(c["k"] == r["best_k"] and c["predicted_speedup"] > 0 for c in r["by_category"].values())
    assert (r["model_started"] is None) == (draft == "lookup")
    text = advise("--draft", draft, "--target", "synthetic", "--prompts", workload(tmp_path),
                  "--run-tokens", "16", "--repeats", "1", "--context", "8")
    assert text.exit_code == 0 and "per category at K = " in text.output


def test_by_category_prints_every_configuration(tmp_path):
    args = ["--target", "synthetic", "--prompts", workload(tmp_path), *FAST]
    r = json.loads(advise(*args, "--json").stdout)
    every = advise(*args, "--by-category").output.count("\nper category: ")
    top = advise(*args).output.count("\nper category: ")
    n_spec = sum(1 for e in r["ranking"] if e["k"])
    assert every == n_spec and 1 <= top <= 3 < n_spec
    res = advise("--draft", "synthetic", "--target", "synthetic", "--by-category")
    assert res.exit_code == 2 and "--by-category applies only to the ranking" in res.output
