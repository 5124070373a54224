"""compare --endpoint and verify --endpoint against live servers on 127.0.0.1 (the embedded pair).

specmac serve with a draft and without one are the two honest endpoints; two more run the same
server over a pair with a planted rule (tests/support/planted.py): one raises the probability of a
token after every drafted step, one changes the greedy output at one index. verify passes the
honest pair, fails the skewed server at its default sample count with p < 0.01 and locates the
planted greedy parting (position and both tokens); compare writes the per-category summary for
endpoints alone and beside local configurations, and for llama_cpp.server on the same file. The
helpers the servers' answers go through (URL parsing, logprobs, counters, near ties, pooling) are
checked on hand-made answers. Bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from specmac.compare import client, endpoint
from specmac.errors import BadOption
from specmac.lossless import endpoint as lossless
from tests.support.helpers import Case, assert_one_line_error
from tests.support.serving import running

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from specmac.api import Pair  # noqa: E402
from specmac.cli import main  # noqa: E402
from specmac.core.sampling import SamplingParams  # noqa: E402
from tests.support.planted import PlantedPair, one_token, skew  # noqa: E402

PLANTED_INDEX = 5  # the greedy token the planted server changes (0-based)
WORKLOAD = [{"question_id": "c1", "category": "code", "turns": ["def add(a, b):"]},
            {"question_id": "p1", "category": "prose", "turns": ["The river"]}]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def servers():
    """{name: /v1 URL}: spec (draft, K 4), plain (no draft), skewed and one_token (planted)."""
    spec, plain = Pair.load("gguf", "gguf"), Pair.load("gguf")
    a, b = Pair.load("gguf", "gguf"), Pair.load("gguf", "gguf")
    x = a.target.encode("e")[-1]
    with running(spec, k=4) as s, running(plain, k=4) as p, \
            running(PlantedPair(a.target, a.sources, skew(x, 0.1)), k=4) as sk, \
            running(PlantedPair(b.target, b.sources, one_token(PLANTED_INDEX)), k=4) as one:
        yield {"spec": s, "plain": p, "skewed": sk, "one_token": one}


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in WORKLOAD))
    return str(path)


# --- compare --endpoint -----------------------------------------------------------------------

def test_compare_endpoint_alone_writes_the_per_category_summary(servers, workload, tmp_path):
    out = tmp_path / "cmp"
    r = invoke("compare", "--endpoint", f"spec={servers['spec']}", "--prompts", workload, "--max-tokens", "8",
               "--repeats", "2", "--warmup-tokens", "2", "--out", str(out))
    assert r.exit_code == 0, r.output
    record = json.loads((out / "results.json").read_text())
    assert record["complete"] and record["results"] == [] and record["runs"] == []
    runs = record["endpoint_runs"]
    assert len(runs) == 2 * 2 and {r["category"] for r in runs} == {"code", "prose"}
    assert all(r["n_tokens"] == 8 and r["tokens_from"] == "usage" and 0 < r["ttft_s"] <= r["latency_s"]
               for r in runs)
    assert all(r["counters"]["source"] == "usage.speculative" and r["k"] == 4 for r in runs)
    rows = [(r["category"], r["config"]) for r in record["categories"]]
    assert rows == [("code", "endpoint:spec"), ("prose", "endpoint:spec"), ("all", "endpoint:spec")]
    assert record["provenance"]["endpoints"][0]["model"] == "specmac-target-q8_0"
    summary = (out / "summary.md").read_text()
    assert "Fastest endpoint: spec" in summary and "| code | endpoint:spec | 4 | 16 |" in summary
    assert "## Per category: time to first token and latency" in summary
    assert "| **all** | endpoint:spec | 4 | 8.0 |" in summary
    assert not list(out.glob("*.png"))  # no K to plot against
    again = invoke("report", str(out), "--out", str(tmp_path / "again"))  # from the record alone
    assert again.exit_code == 0 and (tmp_path / "again" / "summary.md").read_text() == summary


def test_compare_endpoints_beside_local_configurations(servers, workload, tmp_path):
    out = tmp_path / "cmp"
    r = invoke("compare", "--pair", "gguf:gguf", "--k", "2", "--endpoint", f"spec={servers['spec']}",
               "--endpoint", servers["plain"], "--prompts", workload, "--max-tokens", "6", "--repeats", "1",
               "--warmup-tokens", "2", "--out", str(out))
    assert r.exit_code == 0, r.output
    record = json.loads((out / "results.json").read_text())
    plain_label = servers["plain"].split("//")[1].removesuffix("/v1")  # host:port
    configs = {"none:gguf", "gguf:gguf:k2", "endpoint:spec", f"endpoint:{plain_label}"}
    for cat in ("code", "prose", "all"):
        assert {r["config"] for r in record["categories"] if r["category"] == cat} == configs
        assert {r["config"] for r in record["latency"] if r["category"] == cat} == configs
    no_draft = next(r for r in record["categories"] if r["config"] == f"endpoint:{plain_label}")
    assert no_draft["acceptance_rate"] is None  # it drafted nothing
    assert len(record["runs"]) == 2 * 2 and len(record["endpoint_runs"]) == 2 * 2
    summary = (out / "summary.md").read_text()
    assert "## Best K per pairing" in summary and "## Endpoints" in summary
    assert (out / "speedup_vs_k.png").exists()


def test_compare_endpoint_on_llama_cpp_server(servers, workload, tmp_path):
    """llama_cpp.server on the embedded target file beside specmac serve on the same file."""
    pytest.importorskip("llama_cpp.server.app")
    from specmac.assets import gguf_file
    from tests.support.llama_server import running as llama_running

    out = tmp_path / "cmp"
    with llama_running(str(gguf_file("target", "q8_0"))) as url:
        r = invoke("compare", "--endpoint", f"llama={url}", "--endpoint", f"specmac={servers['plain']}",
                   "--prompts", workload, "--max-tokens", "6", "--repeats", "1", "--warmup-tokens", "2",
                   "--out", str(out))
        assert r.exit_code == 0, r.output
        greedy = invoke("verify", "--endpoint", url, "--against", url, "--temperature", "0", "--json")
    record = json.loads((out / "results.json").read_text())
    llama = [r for r in record["endpoint_runs"] if r["endpoint"] == "llama"]
    assert len(llama) == 2 and all(r["tokens_from"] == "chunks" and r["n_tokens"] == 6 for r in llama)
    assert {e["label"]: e["model"] for e in record["endpoints"]} == {"llama": "llama",
                                                                     "specmac": "specmac-target-q8_0"}
    assert "| prose | endpoint:llama |" in (out / "summary.md").read_text()
    res = json.loads(greedy.stdout)  # llama_cpp.server returns logprobs: tokens compared as it lists them
    assert greedy.exit_code == 0 and res["n_identical"] == 6
    assert res["endpoint"]["label"] == res["against"]["label"]


# --- verify --endpoint --against --------------------------------------------------------------

def test_verify_passes_a_server_against_itself_and_without_draft(servers):
    pair = ("--endpoint", servers["spec"], "--against", servers["plain"])
    greedy = invoke("verify", *pair, "--temperature", "0")
    assert greedy.exit_code == 0, greedy.output
    assert "PASS (greedy): 6 of 6 contexts identical for 32 tokens." in greedy.stdout
    sampled = invoke("verify", *pair, "--sequences", "40", "--json")
    assert sampled.exit_code == 0, sampled.output
    res = json.loads(sampled.stdout)
    assert res["sampled"]["p_value"] > 0.01 and res["sampled"]["unit"] == "character"
    assert res["sampled"]["sequences_per_context"] == 40 and "PASS (sampled)" in res["verdict"]
    same = invoke("verify", "--endpoint", servers["plain"], "--against", servers["plain"],
                  "--sequences", "20")
    assert same.exit_code == 0 and "PASS (sampled)" in same.stdout, same.output


@pytest.mark.slow
def test_verify_fails_a_planted_skew_at_the_default_sample_count(servers):
    r = invoke("verify", "--endpoint", f"skewed={servers['skewed']}", "--against", servers["plain"])
    assert r.exit_code == 1, r.output
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"Power: {lossless.DEFAULT_SEQUENCES} sequences per context")  # said up front
    assert "FAIL (sampled)" in r.stdout and "PASS (greedy)" in r.stdout  # greedy streams are left alone
    p = float(r.stdout.split("p-value")[1].split()[0])
    assert p < 0.01, r.stdout


def test_verify_locates_a_planted_greedy_parting(servers):
    r = invoke("verify", "--endpoint", servers["one_token"], "--against", servers["plain"],
               "--temperature", "0", "--json")
    assert r.exit_code == 1, r.output
    res = json.loads(r.stdout)
    plain = Pair.load("gguf")
    for g in res["greedy"]:
        ids = plain.generate(g["prompt"], params=SamplingParams(0.0), max_tokens=32, k=1).token_ids
        want = plain.target.decode(ids[:PLANTED_INDEX + 1])[len(plain.target.decode(ids[:PLANTED_INDEX])):]
        assert not g["match"] and g["position"] == PLANTED_INDEX + 1, g
        assert g["token_b"] == want and g["token_a"] != want and g["near_tie"] is None, g
        assert g["located_by"] == "max_tokens search"
    assert res["verdict"].startswith(f"FAIL (greedy): 6 of 6 contexts part; the first, context 1 at token "
                                     f"{PLANTED_INDEX + 1}")


# --- bad input ----------------------------------------------------------------------------------

DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
BAD = [
    Case("compare-not-a-url", ("compare", "--endpoint", "localhost:8000"),
         "--endpoint 'localhost:8000' is not"),
    Case("compare-bad-port", ("compare", "--endpoint", "a=http://x:99999/v1"), "is not an http(s) URL"),
    Case("compare-unreachable", ("compare", "--endpoint", DEAD), "cannot connect"),
    Case("compare-same-label", ("compare", "--endpoint", f"a={DEAD}", "--endpoint", f"a={DEAD}"),
         "two endpoints are labelled 'a'"),
    Case("verify-against-alone", ("verify", "--against", DEAD), "add --endpoint"),
    Case("verify-endpoint-alone", ("verify", "--endpoint", DEAD), "--endpoint needs --against"),
    Case("verify-unreachable", ("verify", "--endpoint", DEAD, "--against", DEAD), "cannot connect"),
    Case("verify-not-a-url", ("verify", "--endpoint", "ftp://x/v1", "--against", DEAD), "not an http(s) URL"),
    Case("verify-local-flag", ("verify", "--endpoint", DEAD, "--against", DEAD, "--draft", "gguf"),
         "--draft describes a local pair"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_bad_endpoint_input_is_one_line(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = case.args + (("--out", str(tmp_path / "out")) if case.args[0] == "compare" else ())
    r = invoke(*args)
    assert isinstance(r.exception, SystemExit), r.exception
    assert_one_line_error(case, r.exit_code, r.stdout, r.stderr)
    assert list(tmp_path.iterdir()) == [], "files were left behind"


def test_a_server_that_fails_mid_run_is_one_line(servers, workload, tmp_path):
    """A prompt the server refuses (past its context window) is its error, in one line."""
    long = tmp_path / "long.json"
    long.write_text(json.dumps(["word " * 2000]))
    r = invoke("compare", "--endpoint", servers["plain"], "--prompts", str(long),
               "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "answered 400" in r.stderr and "context window" in r.stderr, r.output
    assert not (tmp_path / "o").exists()


# --- the helpers on hand-made answers -----------------------------------------------------------

def test_endpoint_parsing_and_keys(monkeypatch):
    monkeypatch.setenv("SPECMAC_ENDPOINT_KEY", "all")
    monkeypatch.setenv("SPECMAC_ENDPOINT_KEY_MY_VLLM", "mine")
    ep = client.parse("my-vllm=https://user:pw@gpu.example:8443/v1/#Qwen/Qwen2.5")
    assert (ep.label, ep.url, ep.model, ep.key) == ("my-vllm", "https://user:pw@gpu.example:8443/v1",
                                                    "Qwen/Qwen2.5", "mine")
    assert ep.public()["url"] == "https://gpu.example:8443/v1" and "key" not in ep.public()
    other = client.parse("http://10.0.0.2:8000/v1?x=1")
    assert other.label == "10.0.0.2:8000" and other.key == "all" and other.model is None
    for bad in ("gpu:8000", "http://", "a=b", "http://x:port/v1"):
        with pytest.raises(BadOption, match="not an http"):
            client.parse(bad)


def test_logprobs_counters_and_metrics_are_read_from_either_shape():
    completions = {"tokens": [" a", "b"], "top_logprobs": [{" a": -0.1, " c": -0.15}, {"b": -1.0, "d": -3.0}]}
    chat = {"content": [{"token": " a", "top_logprobs": [{"token": " a", "logprob": -0.1}]}]}
    assert client.logprob_tokens(completions)[0] == [" a", "b"]
    assert client.logprob_tokens(chat) == ([" a"], [{" a": -0.1}])
    assert client.logprob_tokens(None) == (None, None)
    spec = {"drafted": 9, "accepted": 4, "target_passes": 5, "k": 4}
    assert client.counters({"speculative": spec}, None) == {"source": "usage.speculative", **spec}
    timings = {"draft_n": 16, "draft_n_accepted": 14, "predicted_n": 20}
    assert client.counters(None, timings)["source"] == "timings"
    assert client.counters({"completion_tokens": 3}, {"predicted_n": 3}) is None
    assert client.token_count(None, {"predicted_n": 20}, 3) == (20, "timings")
    before = {client.VLLM_DRAFTED: 10.0, client.VLLM_ACCEPTED: 4.0}
    after = {client.VLLM_DRAFTED: 18.0, client.VLLM_ACCEPTED: 9.0}
    assert client.metrics_counters(before, after) == {"source": "metrics", "drafted": 8, "accepted": 5,
                                                      "target_passes": None, "k": None}
    assert client.metrics_counters({}, {}) is None


def test_streamed_events_give_time_to_first_token_and_counts():
    events = ['data: {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}',
              'data: {"choices": [{"delta": {"content": "Hi"}, "finish_reason": null}]}', ": ping",
              'data: {"choices": [{"delta": {"content": " there"}, "finish_reason": null}]}',
              'data: {"choices": [{"delta": {}, "finish_reason": "stop"}], "timings": {"draft_n": 4, '
              '"draft_n_accepted": 3, "predicted_n": 2}}', "data: [DONE]"]
    r = client._streamed(iter(events), 0.0, "endpoint x", "endpoint")
    assert (r.text, r.n_tokens, r.tokens_from, r.finish_reason) == ("Hi there", 2, "timings", "stop")
    assert r.counters["drafted"] == 4 and 0 < r.ttft <= r.seconds
    bare = [e.replace(', "timings": {"draft_n": 4, "draft_n_accepted": 3, "predicted_n": 2}', "")
            for e in events]  # no count reported: the chunks of text, not the role's or the last
    assert client._streamed(iter(bare), 0.0, "x", "endpoint").n_tokens == 2


def test_near_tie_reads_each_servers_row():
    def reply(top):
        return client.Reply("", 1, "logprobs", 0, 0, pieces=[t for t in top[0]][:1], top=top)

    a, b = reply([{" x": -1.00, " y": -1.05}]), reply([{" y": -1.00, " x": -1.02}])
    assert lossless.near_tie(a, b, 0, " x", " y", 0.1)["near_tie"] is True
    assert lossless.near_tie(a, b, 0, " x", " y", 0.03)["near_tie"] is False  # a's row: 0.05 apart
    far = reply([{" y": -0.1, " z": -3.0}])  # the other's token is not even among its top two
    res = lossless.near_tie(a, far, 0, " x", " y", 0.1)
    assert res["near_tie"] is False and res["gap_b"] is None
    none = client.Reply("", 1, "usage", 0, 0)
    assert lossless.near_tie(none, none, 0, " x", " y", 0.1)["near_tie"] is None


def test_binary_search_finds_the_first_parting_token(monkeypatch):
    a_text, b_text = ["", "A", "AB", "ABC", "ABCD", "ABCDE"], ["", "A", "AB", "ABx", "ABxy", "ABxyz"]
    fake = {"a": a_text, "b": b_text}
    asked = []

    def ask(ep, prompt, n, sampling, seed=None, logprobs=2):
        asked.append(n)
        return client.Reply(fake[ep][n], n, "usage", 0, 0)

    monkeypatch.setattr(lossless, "ask", ask)
    full = (client.Reply(a_text[5], 5, "usage", 0, 0), client.Reply(b_text[5], 5, "usage", 0, 0))
    found = lossless.locate("a", "b", "p", *full, max_tokens=5)
    assert (found["position"], found["token_a"], found["token_b"], found["char"]) == (3, "C", "x", 2)
    assert len(asked) <= 2 * math.ceil(math.log2(5))


def test_endpoint_rows_pool_tokens_after_the_first():
    def run(cat, n, ttft, latency, drafted=None):
        c = None if drafted is None else {"source": "timings", "drafted": drafted, "accepted": drafted // 2,
                                          "target_passes": None, "k": None}
        return {"config": "endpoint:x", "endpoint": "x", "category": cat, "n_tokens": n, "ttft_s": ttft,
                "latency_s": latency, "counters": c, "k": None, "t_prefill": 0, "seconds": 0}

    runs = [run("code", 11, 0.5, 1.5, 8), run("code", 1, 0.2, 0.2, 0), run("prose", 21, 1.0, 3.0)]
    rows = {r["category"]: r for r in endpoint.category_rows(runs)}
    assert rows["code"]["tokens_per_second"] == pytest.approx(10 / 1.0)  # the 1-token run adds no rate
    assert rows["code"]["end_to_end_tokens_per_second"] == pytest.approx(12 / 1.7)
    assert rows["code"]["acceptance_rate"] == 0.5 and rows["prose"]["acceptance_rate"] is None
    assert rows["all"]["tokens_per_second"] == pytest.approx(30 / 3.0) and rows["all"]["n_runs"] == 3
    merged = endpoint.merge_categories([{"category": "code", "config": "none:gguf"},
                                        {"category": "all", "config": "none:gguf"}], list(rows.values()))
    assert [(r["category"], r["config"]) for r in merged] == [
        ("code", "none:gguf"), ("code", "endpoint:x"), ("prose", "endpoint:x"), ("all", "none:gguf"),
        ("all", "endpoint:x")]


def test_the_power_stated_up_front_is_the_harness_bound():
    tv = lossless.planned_tv(200, 10, 6)
    assert 0.1 < tv < 0.4 and lossless.planned_tv(800, 10, 6) < tv / 1.8  # ~1/sqrt(n)
    assert lossless.n_tests(10) == 20
