"""A bounded load and fault test of `specmac serve` on the embedded pair (loopback, no timing asserted).

16 concurrent clients x 8 requests: non-streaming and streaming, both endpoints, with and without a
prediction, bad requests, and clients that hang up mid-stream, against a queue of 8. Every good
request gets a complete answer or a clean 503 with Retry-After, every bad one its 400; the log has
no error; afterwards the server still answers, with the greedy text it gave before (the caches
stayed consistent), and its memory has not grown beyond a loose bound.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter

import httpx
import pytest

from specmac.api import Pair
from tests.support.serving import running

pytest.importorskip("openai")

MODEL = "specmac-target-q8_0"
CLIENTS, REQUESTS = 16, 8
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "for i in range(10):"]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def one(http: httpx.Client, url: str, kind: str, prompt: str) -> str:
    """One request of ``kind``; -> its outcome ("ok", "503", "400", "left"), or raises."""
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0}
    if kind in ("chat", "chat-stream", "chat-predict"):
        path, body["messages"] = "/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/completions", prompt
    if kind == "chat-predict":
        body["prediction"] = {"type": "content", "content": prompt * 3}
    if kind == "bad":
        body["n"] = 3
    stream = kind in ("stream", "chat-stream")
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        with http.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                return check_error(r.status_code, json.loads(r.read()), r.headers)
            lines = [x for x in r.iter_lines() if x]
            assert lines[-1] == "data: [DONE]", lines[-3:]
            usage = json.loads(lines[-2].removeprefix("data: "))["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            return "ok"
    r = http.post(url + path, json=body)
    if r.status_code != 200:
        return check_error(r.status_code, r.json(), r.headers)
    out = r.json()
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] >= 1
    return "ok"


def check_error(status: int, body: dict, headers) -> str:
    assert set(body["error"]) == {"message", "type", "param", "code"}
    if status == 503:
        assert body["error"]["code"] == "queue_full" and headers["retry-after"]
        return "503"
    assert status == 400 and body["error"]["param"] == "n", body
    return "400"


def leave_early(http: httpx.Client, url: str, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "stream": True, "temperature": 0}
    with http.stream("POST", url + "/completions", json=body) as r:
        if r.status_code != 200:
            return check_error(r.status_code, json.loads(r.read()), r.headers)
        next(r.iter_lines())
    return "left"


def test_load_and_faults(caplog):
    pair = Pair.load("gguf", "gguf")
    kinds = ["plain", "stream", "chat", "chat-stream", "bad", "leave", "chat-predict", "plain"]
    outcomes: Counter = Counter()
    failures: list[BaseException] = []
    lock = threading.Lock()
    with caplog.at_level(logging.WARNING), running(pair, k=4, queue_size=8) as url:
        with httpx.Client(timeout=120) as http:
            greedy = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}
            before = http.post(url + "/completions", json=greedy).json()["choices"][0]["text"]
            rss0 = rss_mib()

            def client(c: int) -> None:
                with httpx.Client(timeout=120) as h:
                    for i in range(REQUESTS):
                        kind, prompt = kinds[(c + i) % len(kinds)], PROMPTS[(c * 3 + i) % len(PROMPTS)]
                        try:
                            got = (leave_early(h, url, prompt) if kind == "leave" else
                                   one(h, url, kind, prompt))
                        except BaseException as e:  # noqa: BLE001 (collected, re-raised below)
                            with lock:
                                failures.append(e)
                            continue
                        with lock:
                            outcomes[(kind, got)] += 1

            threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(240)
            assert not failures, failures[:3]
            assert sum(outcomes.values()) == CLIENTS * REQUESTS  # every request accounted for
            assert {got for (kind, got) in outcomes if kind == "bad"} == {"400"}
            assert any(got == "ok" for (_, got) in outcomes)
            after = http.post(url + "/completions", json=greedy).json()["choices"][0]["text"]
            assert after == before
            metrics = http.get(url.removesuffix("/v1") + "/metrics").text
            assert "specmac_queue_depth 0.0" in metrics
            assert rss_mib() - rss0 < 200, (rss0, rss_mib())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors[:3]]
    print(dict(outcomes))
