"""`specmac serve` through the official openai client: a live uvicorn on 127.0.0.1, the embedded pair.

Both endpoints, streaming and not; usage adds up; Predicted Outputs' accepted/rejected tokens;
stop strings that span tokens; greedy text through the server equals `specmac run --draft none`
for every installed backend (with no draft, with a draft, with a prediction); every bad request a
4xx in OpenAI's shape after which the server still serves; a client that leaves mid-stream; SIGTERM
drains and exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from tests.support.helpers import skip_unless_installed
from tests.support.serving import running

openai = pytest.importorskip("openai")

from specmac.api import Pair  # noqa: E402
from specmac.cli import main  # noqa: E402
from specmac.core.sampling import SamplingParams  # noqa: E402
from specmac.serve.server import model_name  # noqa: E402

PROMPT = "def add(a, b):"
MODEL = "specmac-target-q8_0"


@pytest.fixture(scope="module")
def pair():
    return Pair.load("gguf", "gguf")


@pytest.fixture(scope="module")
def url(pair):
    with running(pair, k=4, queue_size=8) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def run_tokens(backend: str, prompt: str, max_tokens: int) -> dict:
    """`specmac run --draft none --json`: the target-only reference."""
    res = CliRunner().invoke(main, ["run", "--target", backend, "--draft", "none", "--max-tokens",
                                    str(max_tokens), "--json", prompt])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def check_usage(usage, *, prediction: bool = False):
    u = usage if isinstance(usage, dict) else usage.model_dump()
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    spec = u["speculative"]
    assert 0 <= spec["accepted"] <= spec["drafted"]
    assert 1 <= spec["target_passes"] <= u["completion_tokens"]
    d = u["completion_tokens_details"]
    assert d["accepted_prediction_tokens"] <= spec["accepted"]
    if not prediction:
        assert d["accepted_prediction_tokens"] == d["rejected_prediction_tokens"] == 0
    return u


# --- the endpoints --------------------------------------------------------------------------

def test_models_health_metrics(url, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    base = url.removesuffix("/v1")
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    text = httpx.get(f"{base}/metrics").text
    assert "specmac_requests_total" in text and "specmac_queue_depth" in text


def test_completions_streaming_and_not_agree(client, pair):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    full = client.completions.create(**kw)
    assert full.choices[0].finish_reason == "length"
    u = check_usage(full.usage)
    assert u["completion_tokens"] == 24 and u["prompt_tokens"] == len(pair.encode(PROMPT))
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert check_usage(chunks[-1].usage)["completion_tokens"] == 24


def test_chat_streaming_and_not_agree(client):
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": PROMPT}]
    full = client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=16, temperature=0)
    assert full.choices[0].message.role == "assistant"
    check_usage(full.usage)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_one_log_line_per_request(client, caplog):
    """As llama-server's timings: tokens in and out, time to the first token, tokens/s, drafts."""
    msgs = [{"role": "user", "content": PROMPT}]
    with caplog.at_level(logging.INFO, logger="specmac.serve"):
        done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
        chat = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    lines = [r.getMessage() for r in caplog.records
             if r.name == "specmac.serve" and r.levelno == logging.INFO]
    assert len(lines) == 2, lines
    for line, kind, usage in ((lines[0], "completion", done.usage), (lines[1], "chat", chat[-1].usage)):
        u = check_usage(usage)
        spec = u["speculative"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        pattern = (rf"{kind}: {u['prompt_tokens']} prompt tokens \({cached} cached\), "
                   rf"{u['completion_tokens']} out, first token \d+ ms, (\d+\.\d|-) tokens/s after "
                   rf"it, drafts {spec['accepted']}/{spec['drafted']} accepted, k 4, finish length")
        assert re.fullmatch(pattern, line), line


def test_prediction_counts_and_exactness(client):
    # a prompt whose answer encodes back to the ids generated (def add's answer, newlines, does not:
    # its text predicts other ids from the second token on)
    msgs = [{"role": "user", "content": "Hello"}]
    plain = client.chat.completions.create(model=MODEL, messages=msgs,
                                           max_tokens=40, temperature=0, extra_body={"speculative": {"k": 0}})
    text = plain.choices[0].message.content
    assert plain.usage.model_dump()["speculative"]["drafted"] == 0  # k 0: no drafts at all
    edited = text[: len(text) // 2] + "zz" + text[len(text) // 2 + 3:]
    kw = dict(model=MODEL, messages=msgs, max_tokens=40, temperature=0,
              prediction={"type": "content", "content": edited})
    out = client.chat.completions.create(**kw)  # beside the draft model: exact, counts consistent
    assert out.choices[0].message.content == text
    check_usage(out.usage, prediction=True)
    # the prediction alone (which source drafts a step beside a model depends on the run's timings):
    # every step it can draft it does, so its tokens before the edit are accepted, the edit rejected
    with running(Pair.load("gguf"), k=4) as alone:
        out = openai.OpenAI(base_url=alone, api_key="unused", max_retries=0,
                            timeout=60).chat.completions.create(**kw)
    assert out.choices[0].message.content == text
    u = check_usage(out.usage, prediction=True)
    d = u["completion_tokens_details"]
    assert d["accepted_prediction_tokens"] > 0 and d["rejected_prediction_tokens"] > 0
    assert d["accepted_prediction_tokens"] < u["completion_tokens"]


def test_stop_string_spanning_tokens_is_never_sent(client, pair):
    ref = pair.plain().generate(PROMPT, params=SamplingParams(0), max_tokens=40)
    pieces = [pair.target.decode([t]) for t in ref.token_ids]
    i = next(j for j in range(5, len(pieces) - 1) if len(pieces[j]) >= 2 and len(pieces[j + 1]) >= 2)
    stop = pieces[i][-2:] + pieces[i + 1][:2]  # across the boundary of tokens i and i + 1
    want = ref.text[: ref.text.find(stop)]
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=["@@never@@", stop])
    full = client.completions.create(**kw)
    assert full.choices[0].text == want and full.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(**kw, stream=True))
    got = [c.choices[0].text for c in chunks]
    assert "".join(got) == want and not any(stop in g for g in got)
    assert chunks[-1].choices[0].finish_reason == "stop"


# --- greedy through the server == `specmac run --draft none` --------------------------------

@pytest.mark.parametrize("backend", [pytest.param(b, marks=skip_unless_installed(b))
                                     for b in ("gguf", "torch", "mlx")])
def test_greedy_equals_run_target_only(backend):
    ref = run_tokens(backend, PROMPT, 24)
    spec = Pair.load(backend, backend)
    edited = ref["text"].replace("self", "this", 1)
    for pair in (spec.plain(), spec):
        with running(pair, k=4) as u:
            c = openai.OpenAI(base_url=u, api_key="x", max_retries=0, timeout=120)
            for extra in ({}, {"prediction": {"type": "content", "content": edited}}):
                out = c.completions.create(model=model_name(pair), prompt=PROMPT, max_tokens=24,
                                           temperature=0, extra_body=extra)
                assert out.choices[0].text == ref["text"], ([s.name for s in pair.sources], extra)
                assert out.usage.completion_tokens == len(ref["token_ids"])


# --- bad requests: 4xx in OpenAI's shape, and the server keeps serving ----------------------

BAD = {
    "wrong type": ({"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    "unknown model": ({"prompt": PROMPT, "model": "gpt-9"}, 404, "model"),
    "n=2": ({"prompt": PROMPT, "n": 2}, 400, "n"),
    "logprobs": ({"prompt": PROMPT, "logprobs": 2}, 400, "logprobs"),
    "tools (chat)": ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400,
                     "tools"),
    "too-long prompt": ({"prompt": "def f(x): return x\n" * 400}, 400, "prompt"),
    "bad speculative": ({"prompt": PROMPT, "speculative": {"k": -1}}, 400, "speculative.k"),
    "unknown field": ({"prompt": PROMPT, "temprature": 0}, 400, "temprature"),
    "bad message role": ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_request_is_an_openai_error(url, client, name):
    body, status, param = BAD[name]
    path = "/chat/completions" if "messages" in body else "/completions"
    r = httpx.post(url + path, json={"model": MODEL, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    if name == "too-long prompt":
        assert err["code"] == "context_length_exceeded"
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_malformed_and_oversized_bodies(url, client):
    r = httpx.post(url + "/completions", content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(url + "/completions", content=b"[1, 2]")
    assert r.status_code == 400 and r.json()["error"]["message"]
    big = json.dumps({"model": MODEL, "prompt": "x" * (9 << 20)}).encode()
    r = httpx.post(url + "/completions", content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"logprobs": True})
    assert e.value.body["param"] == "logprobs"
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices[0].text


def test_api_key(pair):
    with running(pair, k=4, api_key="s3cret") as u:
        bad = openai.OpenAI(base_url=u, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        assert e.value.body["code"] == "invalid_api_key"
        assert httpx.get(u + "/models").status_code == 401  # no header at all
        good = openai.OpenAI(base_url=u, api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


# --- a client that leaves, SIGTERM ----------------------------------------------------------

def test_disconnect_mid_stream_leaves_caches_consistent(url, client, caplog):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0)
    before = client.completions.create(**kw).choices[0].text
    with caplog.at_level(logging.WARNING):
        with httpx.stream("POST", url + "/completions", json={**kw, "max_tokens": 400, "stream": True}) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # one event, then hang up
        time.sleep(0.5)
        assert client.completions.create(**kw).choices[0].text == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert cancelled(url) >= 1


def cancelled(url: str) -> float:
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    return float(next(ln for ln in metrics.splitlines() if ln.startswith("specmac_cancelled_requests_total"))
                 .split()[-1])


def test_disconnect_while_waiting_for_a_whole_answer(url, client):
    before = cancelled(url)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 480, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(url + "/completions", json=body, timeout=httpx.Timeout(60, read=0.3))
    deadline = time.monotonic() + 30
    while cancelled(url) == before:  # polled every 0.25 s, then stopped at the next step
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_sigterm_drains_and_exits_0():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "specmac", "serve", "--target", "gguf", "--port", "0",
                             "--k", "4"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        assert "http://127.0.0.1:" in line, line
        base = line.split("http://")[1].split()[0]
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 150, "temperature": 0, "stream": True}
        deadline = time.monotonic() + 60
        while True:  # the URL is printed before the models load and the app starts
            try:
                httpx.get(f"http://{base.removesuffix('/v1')}/health")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with httpx.stream("POST", f"http://{base}/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            rest = [x for x in lines if x]
        assert rest[-1] == "data: [DONE]"  # the request in flight finished
        assert json.loads(rest[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
        assert proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{base.removesuffix('/v1')}/health")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- pieces without a server ----------------------------------------------------------------

def test_chat_messages_reach_the_template_or_the_fallback(client, pair):
    from specmac.backends.synthetic import SyntheticBackend
    from specmac.serve.metrics import Metrics
    from specmac.serve.schema import parse
    from specmac.serve.text import fallback_chat
    from specmac.serve.worker import Worker

    msgs = [{"role": "system", "content": "ab"}, {"role": "user", "content": "cd"},
            {"role": "assistant", "content": "ef"}, {"role": "user", "content": "gh"}]

    class Templated(SyntheticBackend):
        def apply_chat_template(self, prompt):
            return " ".join(m["content"] for m in prompt)

    w = Worker(Pair(Templated(vocab_size=30)), k=1, queue_size=1, metrics=Metrics())
    req = parse({"model": "m", "messages": msgs}, chat=True, model_id="m")
    assert w.chat_template and w.pair.target.decode(w.prompt_ids(req)) == "ab cd ef gh"
    out = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
    assert out.usage.prompt_tokens == len(pair.encode(fallback_chat(msgs)))  # the embedded pair has none
    assert fallback_chat(msgs).endswith("user: gh\nassistant:")


def test_text_out_holds_back_partial_characters_and_stop_prefixes():
    from specmac.serve.text import TextOut

    pieces = {0: b"a", 1: "é".encode()[:1], 2: "é".encode()[1:], 3: b"S", 4: b"T", 5: b"x"}
    out = TextOut(lambda ids: b"".join(pieces[i] for i in ids).decode(errors="replace"), stops=["STOP", "Tx"])
    assert out.push([0, 1]) == "a"  # half a character waits
    assert out.push([2]) == "é"
    assert out.push([3]) == ""  # "S" may begin "STOP"
    assert out.push([4]) == ""  # "ST" too, and "T" may begin "Tx"
    assert out.push([5]) == "S" and out.stopped  # "Tx" found: cut before it
    assert out.text == "aéS"


def test_loopback_is_told_apart():
    from specmac.serve.server import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.2", "example.com"]))


def test_the_sampler_field_reaches_the_sampling_params():
    """"sampler": "coupled" makes a request's seed seed-exact; an unknown sampler is a 400 naming it."""
    from specmac.serve.schema import ApiError, parse

    req = parse({"model": "m", "prompt": "hi", "temperature": 1, "seed": 3, "sampler": "coupled"},
                chat=False, model_id="m")
    assert req.params.sampler == "coupled"
    with pytest.raises(ApiError) as e:
        parse({"model": "m", "prompt": "hi", "sampler": "nosuch"}, chat=False, model_id="m")
    assert e.value.status == 400 and e.value.param == "sampler"


@pytest.mark.parametrize("name", ["synthetic", "gguf", "torch", "mlx"])
def test_text_out_sends_the_whole_decode_one_token_at_a_time(name):
    """Decoding a window per step sends exactly what decoding the whole answer at once gives, on
    each backend's real tokenizer (multi-byte characters and leading spaces included)."""
    from specmac.backends import load_backend, missing_requirements
    from specmac.serve.text import TextOut

    if missing_requirements(name):
        pytest.skip(f"the {name} backend is not installed")
    b = load_backend(name, None, {}, role="target")
    text = "print os 42 print" if name == "synthetic" else "def f(x):\n    return 'héllo wörld ✓'  # ok\n"
    ids = [i for i in b.encode(text) if i not in b.vocab.special_ids | {b.vocab.bos_id}]
    out = TextOut(b.decode)
    sent = "".join(out.push([i], final=n == len(ids) - 1) for n, i in enumerate(ids))
    assert sent == out.text == b.decode(ids)


def test_usage_and_log_say_why_the_model_was_not_started(tmp_path, monkeypatch, caplog):
    """As `specmac run`'s "K choice" line: a long prompt the draft model would have to read first,
    for a short answer, is decoded without it, and the usage and the request's log line say why;
    a request that starts the model carries no note."""
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    pair = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 10},
                     draft_options={"latency_ms": 1, "beta": 0.3})
    prompt = "".join(f"{i:x}" for i in range(400))  # 1000+ characters: tokens here
    with running(pair, k="auto") as u, caplog.at_level(logging.INFO, logger="specmac.serve"):
        cl = openai.OpenAI(base_url=u, api_key="unused", max_retries=0, timeout=60)
        name = model_name(pair)
        long = cl.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0).usage
        short = cl.completions.create(model=name, prompt="ab", max_tokens=24, temperature=0).usage
    spec = long.model_dump()["speculative"]
    assert spec["note"].startswith("model draft not started: its prefill of") and spec["drafted"] == 0
    other = short.model_dump()["speculative"]
    assert other["drafted"] > 0 and "note" not in other
    lines = [r.getMessage() for r in caplog.records
             if r.name == "specmac.serve" and r.levelno == logging.INFO]
    assert lines[0].endswith(f"finish length; {spec['note']}") and "not started" not in lines[1], lines
