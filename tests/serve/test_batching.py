"""`specmac serve --parallel` through the official openai client on 127.0.0.1 (a real uvicorn, the
embedded pair at F16): concurrent requests share each pass and every answer equals the same
request served alone (greedy, and sampled by seed with the coupled sampler), with no draft and with
a draft; with no draft the server's own counters show fewer passes than tokens. A bounded load and
fault test: 32 clients, some leaving mid-stream, against a queue of 8: every request answered or
refused with 503, every answer whole and equal to its request's answer alone, memory flat across
rounds, no error in the log.
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

openai = pytest.importorskip("openai")

MODEL = "specmac-target-f16"
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "for i in range(10):", "SELECT name FROM",
           "The three laws"]


def metric(url: str, name: str) -> float:
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ")
               or ln.startswith(name + "{"))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def ask_all(url: str, bodies: list[dict]) -> list[str]:
    """The requests sent at once, one client thread each; -> their texts, in order."""
    out: list = [None] * len(bodies)
    clients = [openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120) for _ in bodies]
    start = threading.Barrier(len(bodies))  # sent together: a client made late would come alone

    def one(i: int) -> None:
        try:
            start.wait(60)
            out[i] = clients[i].completions.create(**bodies[i]).choices[0].text
        except BaseException as e:  # noqa: BLE001 (reported below)
            out[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not [x for x in out if isinstance(x, BaseException)], out
    return out


@pytest.fixture(scope="module")
def pairs():
    return {"none": Pair.load("gguf", None, target_options={"quant": "f16"}),
            "gguf": Pair.load("gguf", "gguf", target_options={"quant": "f16"})}


@pytest.mark.parametrize("draft, k", [("none", 0), ("gguf", 4), ("gguf", "auto")])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_concurrent_requests_equal_each_served_alone(pairs, draft, k, sampled):
    extra = {"temperature": 0.8, "seed": 11, "extra_body": {"sampler": "coupled"}} if sampled else \
        {"temperature": 0}
    bodies = [{"model": MODEL, "prompt": p, "max_tokens": 24, **extra} for p in PROMPTS[:4]]
    with running(pairs[draft], k=k, queue_size=8, parallel=1) as url:
        alone = [ask_all(url, [b])[0] for b in bodies]
    with running(pairs[draft], k=k, queue_size=8, parallel=4) as url:
        passes0 = metric(url, "llamacpp:n_decode_total")
        tokens0 = metric(url, "specmac_generated_tokens_total")
        together = ask_all(url, bodies)
        passes = metric(url, "llamacpp:n_decode_total") - passes0
        tokens = metric(url, "specmac_generated_tokens_total") - tokens0
        batch = metric(url, "specmac_batch_size_sum") / max(metric(url, "specmac_batch_size_count"), 1)
        text = httpx.get(url.removesuffix("/v1") + "/metrics").text
        sources = {ln.split('"')[1] for ln in text.splitlines() if ln.startswith("specmac_steps_total{")}
        # every step counted once, under the source that drafted it (the streams' steps of every pass),
        # and the drafts by source add up to the drafts verified
        steps = (metric(url, "specmac_steps_total"), metric(url, "specmac_batch_size_sum"))
        drafted = (metric(url, "specmac_step_draft_tokens_total"),
                   metric(url, "vllm:spec_decode_num_draft_tokens_total"))
    assert together == alone
    assert steps[0] == steps[1] > 0 and drafted[0] == drafted[1], (steps, drafted)
    assert sources <= {"none", *(s.name for s in pairs[draft].sources)}, sources
    assert batch > 1.5  # the passes were shared
    if draft == "none" and not sampled:
        assert tokens >= 2.5 * passes, (tokens, passes)


def one(http: httpx.Client, url: str, prompt: str, stream: bool) -> tuple[str, str | None]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    if not stream:
        r = http.post(url + "/completions", json=body)
        if r.status_code != 200:
            return check_503(r.status_code, r.json(), r.headers), None
        return "ok", r.json()["choices"][0]["text"]
    with http.stream("POST", url + "/completions", json=body | {"stream": True}) as r:
        if r.status_code != 200:
            return check_503(r.status_code, json.loads(r.read()), r.headers), None
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    pieces = [json.loads(x.removeprefix("data: "))["choices"] for x in lines[:-1]]
    return "ok", "".join(c[0]["text"] for c in pieces if c)


def leave(http: httpx.Client, url: str, prompt: str) -> tuple[str, None]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "stream": True, "temperature": 0}
    with http.stream("POST", url + "/completions", json=body) as r:
        if r.status_code != 200:
            return check_503(r.status_code, json.loads(r.read()), r.headers), None
        next(r.iter_lines())
    return "left", None


def check_503(status: int, body: dict, headers) -> str:
    assert status == 503 and set(body["error"]) == {"message", "type", "param", "code"}, (status, body)
    assert body["error"]["code"] == "queue_full" and headers["retry-after"]
    return "503"


def test_load_with_clients_leaving_mid_stream(pairs, caplog):
    clients, rounds = 32, 2
    outcomes: Counter = Counter()
    failures: list[BaseException] = []
    texts: dict[str, set] = {p: set() for p in PROMPTS}
    lock = threading.Lock()
    rss = []
    with caplog.at_level(logging.WARNING), running(pairs["gguf"], k=4, queue_size=8, parallel=4) as url:
        with httpx.Client(timeout=120) as http:
            alone = {p: one(http, url, p, False)[1] for p in PROMPTS}

            def client(c: int) -> None:
                prompt = PROMPTS[c % len(PROMPTS)]
                with httpx.Client(timeout=120) as h:
                    try:
                        got, text = (leave(h, url, prompt) if c % 4 == 3 else one(h, url, prompt, c % 2 == 0))
                    except BaseException as e:  # noqa: BLE001 (collected, re-raised below)
                        with lock:
                            failures.append(e)
                        return
                with lock:
                    outcomes[got] += 1
                    if text is not None:
                        texts[prompt].add(text)

            for _ in range(rounds):
                threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(300)
                rss.append(rss_mib())
            assert not failures, failures[:3]
            assert sum(outcomes.values()) == clients * rounds
            assert outcomes["ok"] > 0
            for p, seen in texts.items():  # no stream corrupted: each answer is its request's alone
                assert seen <= {alone[p]}, (p, seen, alone[p])
            assert one(http, url, PROMPTS[0], False)[1] == alone[PROMPTS[0]]
            assert metric(url, "specmac_queue_depth") == 0
            assert rss[-1] - rss[0] < 100, rss
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors[:3]]
    print(dict(outcomes), rss)
