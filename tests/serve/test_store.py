"""Conversations through `specmac serve` pay only for their new tokens: the official openai client
on 127.0.0.1, two chats interleaved, the store's budget and its disk tier."""

from __future__ import annotations

import httpx
import pytest

from specmac.api import Pair
from specmac.core.sampling import SamplingParams
from specmac.serve.text import fallback_chat
from specmac.store import SequenceStore
from specmac.store.disk import DiskTier
from tests.support.serving import running

openai = pytest.importorskip("openai")

SYSTEM = "You answer questions about this code:\n" + "\n".join(f"def f{i}(x):\n    return x * {i}"
                                                               for i in range(12))


def load() -> Pair:
    """The embedded pair's F16 files: a prompt in pieces gives the tokens it gives in one."""
    f16 = {"quant": "f16"}
    return Pair.load("gguf", "lookup+gguf", target_options=f16, draft_options=f16)


def served(client) -> str:
    return client.models.list().data[0].id


def chat(client, messages, max_tokens=12):
    out = client.chat.completions.create(model=served(client), messages=messages, max_tokens=max_tokens,
                                         temperature=0)
    usage = out.usage
    return out.choices[0].message.content, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def conversation(first: str):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]


def interleave(client):
    """Two chats, their turns interleaved: (answers, cached tokens per turn) of each."""
    a, b = conversation("What does f3 return?"), conversation("Which function doubles its input?")
    answers, cached = {"a": [], "b": []}, {"a": [], "b": []}
    for turn in range(3):
        for name, msgs in (("a", a), ("b", b)):
            text, n_prompt, hit = chat(client, msgs)
            answers[name].append(text)
            cached[name].append((n_prompt, hit))
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"And f{turn + 5}?"}]
    return answers, cached


def resumed(turns) -> bool:
    """Each turn after the first found at least the whole previous prompt cached (the answer's tokens
    too, where the template re-encodes them to the same ids)."""
    return all(hit >= before for (before, _), (_, hit) in zip(turns, turns[1:]))


@pytest.fixture(scope="module")
def alone():
    """What each chat's turns answer served alone, on a pair that reuses nothing."""
    pair = load()
    answers = {}
    for name, first in (("a", "What does f3 return?"), ("b", "Which function doubles its input?")):
        msgs, answers[name] = conversation(first), []
        for turn in range(3):
            prompt = fallback_chat(msgs)  # the embedded pair has no chat template
            g = pair.generate(prompt, max_tokens=12, params=SamplingParams(0.0), reuse=False)
            text = pair.target.decode(g.token_ids)
            answers[name].append(text)
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"And f{turn + 5}?"}]
    return answers


def test_interleaved_chats_each_hit_their_own_cache(alone):
    pair = load()
    pair.store = SequenceStore(64 << 20)
    with running(pair, k=4) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        answers, cached = interleave(client)
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert answers == alone  # the same text as each request served alone
    for name in "ab":
        assert resumed(cached[name]), cached
    assert cached["a"][0][1] == 0 and 100 < cached["b"][0][1] < cached["b"][0][0]  # b: a's system prompt
    assert "specmac_store_hits_total 4.0" in metrics and "specmac_cached_prompt_tokens_total" in metrics


def test_a_budget_too_small_for_both_still_answers_the_same(alone):
    store, pair = SequenceStore(1), load()
    pair.store = store
    with running(pair, k=4) as url:
        answers, cached = interleave(openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60))
    assert answers == alone and store.evictions >= 4 and store.info()["entries"] == 0


def test_the_disk_tier_keeps_what_memory_evicted(alone, tmp_path):
    pair = load()
    pair.store = SequenceStore(1, DiskTier(tmp_path, {"target": pair.target, **pair.drafts}, 1 << 30))
    with running(pair, k=4) as url:
        answers, cached = interleave(openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60))
    assert answers == alone
    assert resumed(cached["a"]) and resumed(cached["b"]), cached
    assert pair.store.disk.info()["entries"] == 1 and pair.store.hits == 4


def test_a_server_killed_while_it_writes_leaves_a_cache_the_next_start_can_use(tmp_path):
    """A real `specmac serve` whose every displaced conversation goes to disk (no memory budget),
    SIGKILLed at random moments while conversations interleave: each next start removes what a
    cut-off write left, uses or skips every entry, and answers as a server that keeps nothing."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    def start():
        proc = subprocess.Popen([sys.executable, "-m", "specmac", "serve", "--target", "synthetic", "--draft",
                                 "synthetic", "--k", "3", "--port", "0", "--cache-ram", "0", "--cache-dir",
                                 str(tmp_path)], stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        for line in proc.stderr:
            if "http://" in line:
                return proc, line.split("http://")[1].split()[0].rstrip("/")
        raise RuntimeError("the server did not start")

    prompts = [f"conversation {c}: " + "the quick brown fox " * 20 for c in range(4)]
    want = {p: Pair.load("synthetic", "synthetic").generate(p, max_tokens=8, k=3, params=SamplingParams(0.0),
                                                            reuse=False).text for p in prompts}
    rng = random.Random(0)
    for _ in range(3):
        proc, base = start()
        try:
            client = openai.OpenAI(base_url=f"http://{base}", api_key="unused", max_retries=0, timeout=30)
            deadline = time.monotonic() + rng.uniform(0.2, 1.5)
            for i in range(40):
                p = prompts[i % len(prompts)]
                out = client.completions.create(model=served(client), prompt=p, max_tokens=8, temperature=0)
                assert out.choices[0].text == want[p]
                if time.monotonic() > deadline:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    proc, base = start()
    try:
        client = openai.OpenAI(base_url=f"http://{base}", api_key="unused", max_retries=0, timeout=30)
        for p in prompts * 2:
            out = client.completions.create(model=served(client), prompt=p, max_tokens=8, temperature=0)
            assert out.choices[0].text == want[p]
    finally:
        proc.terminate()
        proc.wait(30)
    folders = [f for f in tmp_path.glob("*/*") if f.is_dir()]
    assert folders and all((f / "entry.json").exists() for f in folders)  # no half entry left
