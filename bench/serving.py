"""Servers under the workloads people give them, through the official openai client on 127.0.0.1.

    python bench/serving.py --models-dir M --out results/serving/MACHINE/q4_k_m
    python bench/serving.py --models-dir M --target M/qwen2.5-coder-1.5b-instruct-f16.gguf --out DIR
    python bench/serving.py --models-dir M --target-backend torch --target-opt dtype=bfloat16 \\
        --target M/qwen2.5-coder-1.5b-instruct-hf-bf16 --out DIR
    (the folder: specmac models convert M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --dtype bfloat16 \\
        --out M/qwen2.5-coder-1.5b-instruct-hf-bf16)
    python bench/serving.py --scenarios streams --streams 1,2,4,8 ...   # one scenario

Scenarios (``--scenarios``, default all), streaming and greedy throughout:
  * chat: a system message holding a 60-line Python file, then six short questions (48 tokens each),
    each answer appended to the history as a chat window does;
  * agent: ten tool calls, each a tool output (a file of specmac's, ~150-400 tokens) appended to a
    growing context and a question about it (32 tokens each);
  * streams: N concurrent clients (``--streams``, default 1,2,4,8), each asking two different
    questions in turn (64 tokens each): aggregate tokens/s, median and 95th-percentile latency and
    time to first token, and, for specmac, what its passes held (streams per pass, drafts per step,
    tokens per pass, from its /metrics).
Each server is a process of its own. For the streams scenario they are all started first and take
turns at each N, the order reversed from one N and one round to the next (``--alternate per-n``, the
default: a drift of the machine over minutes falls on all alike); otherwise, and for the other
scenarios, each is started, measured on every scenario and stopped before the next starts, the
servers alternating round by round. The servers: ``specmac serve`` with no draft, the prompt
lookup alone, the 0.5B draft and lookup+gguf (K auto, ``--parallel`` the largest N), lookup+gguf
one request at a time (``--parallel 1``, as before batching); on a GGUF target
``llama_cpp.server`` on the same file (extra CPU buffer types off where llama.cpp issue 20824 needs
it, every CPU), on a torch folder ``transformers serve --continuous-batching`` on the same folder.
Per turn or request: time to first token (the first content), total time, prompt and cached tokens
where the server reports them, the text; the server process's resident memory after each scenario.
The target's T(n) (``specmac probe-parallelism``) is recorded beside. Writes results.json, README.md
and PNGs. Takes the machine's benchmark lock (bench/lib/machine.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
from lib.machine import take_machine
from lib.models import add_models_dir

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QUESTIONS = ["What does this module do, in one sentence?", "Which function is the entry point?",
             "Is there any error handling?", "What would you rename, and why?",
             "Which line would you test first?", "Summarise the module's public names."]
TOOL_FILES = ["specmac/errors.py", "specmac/vocab.py", "specmac/core/rejection.py",
              "specmac/core/runstats.py",
              "specmac/serve/metrics.py", "specmac/core/sources.py", "specmac/backends/held.py",
              "specmac/compare/workloads.py", "specmac/files.py", "specmac/cli/textin.py"]


N_CTX = 8192  # every server's context window, in tokens (the agent's context reaches ~4,400)


def chat_turns(source: str) -> list[dict]:
    """The chat scenario's turns: (messages added before the turn, max tokens)."""
    system = {"role": "system", "content": f"You answer questions about this file:\n```python\n{source}```"}
    turns = [{"add": [system, {"role": "user", "content": QUESTIONS[0]}], "max_tokens": 48}]
    return turns + [{"add": [{"role": "user", "content": q}], "max_tokens": 48} for q in QUESTIONS[1:]]


def agent_turns() -> list[dict]:
    """The agent scenario's turns: a tool output and a question about it, ten times."""
    system = {"role": "system", "content": "You are a coding agent. Tools return files; answer briefly."}
    turns = []
    for i, f in enumerate(TOOL_FILES):
        text = "\n".join((ROOT / f).read_text().splitlines()[:60])
        ask = {"role": "user", "content": f"Tool output (read_file {f}):\n{text}\n\nWhat is this file for?"}
        turns.append({"add": ([system] if i == 0 else []) + [ask], "max_tokens": 32})
    return turns


STREAM_QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a Python generator is, with a short example.",
    "How do I read a CSV file with the standard library?",
    "What is the difference between a list and a tuple?",
    "Write a function that merges two sorted lists.",
    "Explain Python's GIL in two sentences.",
    "How do I time a function call in Python?",
    "Write a class for a stack with push, pop and peek.",
    "What does `if __name__ == '__main__':` do?",
    "Write a function that counts the words in a text file.",
    "Explain list comprehensions with an example.",
    "How do I sort a dictionary by its values?",
    "Write a function that returns the n-th Fibonacci number iteratively.",
    "What is a context manager? Show one.",
    "How do I make an HTTP GET request with the standard library?",
    "Write a function that flattens a nested list."]
COUNTERS = ("llamacpp:n_decode_total", "specmac_generated_tokens_total", "specmac_batch_size_sum",
            "specmac_batch_size_count", "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")
BY_SOURCE = ("specmac_steps_total", "specmac_step_draft_tokens_total", "specmac_step_accepted_tokens_total")


def ask_streaming(client, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed request: time to the first content, total seconds, text, usage."""
    t0, first, text, usage = time.perf_counter(), None, "", None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text += chunk.choices[0].delta.content
            chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    return {"ttft": (first or end) - t0, "seconds": end - t0, "text": text, "chunks": chunks,
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cached_tokens": None if details is None else getattr(details, "cached_tokens", None)}


def concurrent(base: str, model: str, n: int, per_client: int = 2, max_tokens: int = 64) -> dict:
    """n clients at once, each asking ``per_client`` different questions in turn."""
    import openai

    out: list = [None] * (n * per_client)

    def client(c: int) -> None:
        cl = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=1800)
        for j in range(per_client):
            i = c * per_client + j
            q = STREAM_QUESTIONS[i % len(STREAM_QUESTIONS)]
            out[i] = ask_streaming(cl, model, [{"role": "user", "content": q}], max_tokens)
    before = scrape(base)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = scrape(base)
    done = [r for r in out if r is not None]
    tokens = sum(r["completion_tokens"] or r["chunks"] for r in done)  # chunks: a server without usage
    counters = {k: after[k] - before.get(k, 0.0) for k in after}
    return {"n": n, "requests": out, "wall_s": wall, "tokens": tokens, "tokens_per_second": tokens / wall,
            "counters": counters or None}


def scrape(base: str) -> dict[str, float]:
    """specmac's pass counters from /metrics (empty for a server without them)."""
    try:
        text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS or name.partition("{")[0] in BY_SOURCE:
            out[name] = float(value)
    return out


def converse(base: str, model: str, turns: list[dict]) -> list[dict]:
    """Run the turns through the openai client (streaming, greedy); per turn: ttft, seconds, tokens."""
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    history, out = [], []
    for turn in turns:
        history += turn["add"]
        out.append(ask_streaming(client, model, history, turn["max_tokens"]))
        history.append({"role": "assistant", "content": out[-1]["text"]})
    return out


def memory(base: str, model: str, pid: int, n: int) -> dict:
    """n conversations, each a system prompt of its own (the start of a file of this repository) and
    one short turn: the server's resident memory and its store's size (/metrics) every tenth."""
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    files = sorted((ROOT / "specmac").rglob("*.py"))
    samples = [{"conversations": 0, "rss_mib": rss_mib(pid), "store_bytes": 0.0}]
    for c in range(n):
        text = "\n".join(files[c % len(files)].read_text().splitlines()[:15])
        msgs = [{"role": "system", "content": f"Conversation {c}. You answer about this file:\n{text}"},
                {"role": "user", "content": "What is it for?"}]
        ask_streaming(client, model, msgs, 4)
        if (c + 1) % 10 == 0:
            metrics = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=10).text
            size = next((float(ln.split()[-1]) for ln in metrics.splitlines()
                         if ln.startswith("specmac_store_bytes ")), float("nan"))
            samples.append({"conversations": c + 1, "rss_mib": rss_mib(pid), "store_bytes": size})
    return {"samples": samples}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children, MiB (from /proc)."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _children(pid: int) -> list[int]:
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def servers(a) -> dict[str, list[str]]:
    """name -> the command that starts it on port {port} (each serves the same target weights)."""
    py, m = sys.executable, a.models_dir
    target, draft = a.target or str(m / TARGET), str(m / DRAFT)
    topts = [x for o in a.target_opt for x in ("--target-opt", o)]
    spec = [py, "-m", "specmac", "serve", "--port", "{port}", "--target", a.target_backend,
            "--target-model", target, *topts, "--model-name", "m", "--log-level", "warning",
            "--ctx-size", str(N_CTX)]  # the agent's context outgrows specmac's default of 2048
    if a.cache_ram is not None:
        spec += ["--cache-ram", str(a.cache_ram)]
    wide = [*spec, "--parallel", str(a.parallel)]
    both = ["--draft", "lookup+gguf", "--draft-model", draft, "--k", "auto"]
    out = {"specmac none": [*wide, "--draft", "none"],
           "specmac gguf": [*wide, "--draft", "gguf", "--draft-model", draft, "--k", "auto"],
           "specmac lookup": [*wide, "--draft", "lookup", "--k", "auto"],
           "specmac lookup+gguf": [*wide, *both],
           "specmac lookup+gguf (one at a time)": [*spec, "--parallel", "1", *both]}
    if a.target_backend == "gguf":
        here = str(Path(__file__).resolve())
        out["llama_cpp.server"] = [py, here, "--llama-server", target, "{port}"]
    else:
        dtype = dict(o.split("=", 1) for o in a.target_opt).get("dtype", "auto")
        out["transformers serve"] = ["transformers", "serve", target, "--host", "127.0.0.1",
                                     "--port", "{port}", "--continuous-batching", "--device", "cpu",
                                     "--dtype", dtype]
    return {k: v for k, v in out.items() if not a.servers or k in a.servers.split(",")}


def llama_server(model: str, port: int) -> None:
    """llama-cpp-python's own server on ``model``: its extra CPU buffer types as specmac's gguf backend
    chooses them (off where ggml was built with AMX: llama.cpp issue 20824), and every CPU, as
    specmac uses them (its default takes half)."""
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from specmac.backends.gguf_files import peer_defaults

    n = os.cpu_count() or 1
    with peer_defaults():
        app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=port),
                         model_settings=[ModelSettings(model=model, model_alias="m", n_ctx=N_CTX,
                                                       n_threads=n, n_threads_batch=n, verbose=False)])
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Live:
    """A server started on a port of its own, answering, its model loaded (one request made)."""

    def __init__(self, name: str, command: list[str]):
        port = free_port()
        cmd = [c.replace("{port}", str(port)) for c in command]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.base = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 900  # a first k="auto" run measures the target's curve
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{name} ended before it served: {self.proc.stderr.read()[-2000:]}")
                try:
                    r = httpx.get(self.base + "/models", timeout=2)
                    if r.status_code == 200:
                        data = r.json().get("data") or []
                        named = any(d.get("id") == "m" for d in data) or not data
                        self.model = "m" if named else data[0]["id"]
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start")
                time.sleep(1)
            import openai  # a first request: a server that loads its model lazily has loaded it

            warm = openai.OpenAI(base_url=self.base, api_key="unused", max_retries=0, timeout=1800)
            ask_streaming(warm, self.model, [{"role": "user", "content": "Hello"}], 2)
        except BaseException:
            self.stop()
            raise

    def run(self, sname: str, work) -> dict:
        """One scenario's measurement (for streams: each N of ``work`` in turn)."""
        if sname == "streams":
            return {"streams": [concurrent(self.base, self.model, n) for n in work], "rss_mib": self.rss()}
        if sname == "memory":
            return memory(self.base, self.model, self.proc.pid, work)
        return {"turns": converse(self.base, self.model, work), "rss_mib": self.rss()}

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(name: str, command: list[str], scenarios: dict[str, list]) -> dict:
    """Start the server, measure it on every scenario, stop it."""
    live = Live(name, command)
    try:
        return {sname: live.run(sname, work) for sname, work in scenarios.items()}
    finally:
        live.stop()


def streams_per_n(plan: dict[str, list[str]], ns: list[int], rounds: int, say) -> list[dict]:
    """The streams scenario with every server up at once, alternating server by server at each N
    (the order reversed from one N to the next and from one round to the next), so a drift of the
    machine over minutes falls on every server alike: -> one run per server and round."""
    live: dict[str, Live] = {}
    try:
        for name, command in plan.items():  # one at a time: a starting server measures its curve
            live[name] = Live(name, command)
        runs = []
        for r in range(rounds):
            got: dict[str, list] = {name: [] for name in plan}
            for j, n in enumerate(ns):
                order = list(plan) if (r + j) % 2 == 0 else list(plan)[::-1]
                for name in order:
                    got[name].append(concurrent(live[name].base, live[name].model, n))
                    say(f"r{r} {name:36s} N={n}: {got[name][-1]['tokens_per_second']:.1f} tok/s")
            runs += [{"server": name, "scenario": "streams", "round": r, "streams": got[name],
                      "rss_mib": live[name].rss(), "alternated": "per N"} for name in plan]
        return runs
    finally:
        for x in live.values():
            x.stop()


def probe_curve(a) -> dict | None:
    """The target's T(n), n = 1..32, as ``specmac probe-parallelism`` times it (None if it fails)."""
    target = a.target or str(a.models_dir / TARGET)
    opts = [x for o in a.target_opt for x in ("--opt", o)]
    cmd = [sys.executable, "-m", "specmac", "probe-parallelism", "--backend", a.target_backend,
           "--model", target, *opts, "--n-max", "32", "--json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"probe-parallelism failed: {r.stderr[-500:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--llama-server"]:
        return llama_server(argv[1], int(argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_models_dir(ap)
    ap.add_argument("--target", help=f"the target's model (default MODELS_DIR/{TARGET})")
    ap.add_argument("--target-backend", default="gguf")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--servers", help="comma-separated names of the servers to run (default all)")
    ap.add_argument("--scenarios", default="chat,agent,streams",
                    help="comma-separated: chat, agent, streams, memory")
    ap.add_argument("--conversations", type=int, default=100, help="the memory scenario's conversations")
    ap.add_argument("--cache-ram", type=int, help="specmac's --cache-ram, MiB (default its own)")
    ap.add_argument("--streams", default="1,2,4,8", help="the concurrent clients of the streams scenario")
    ap.add_argument("--parallel", type=int, help="specmac's --parallel (default the most streams)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--alternate", choices=["per-n", "per-server"], default="per-n",
                    help="streams: every server up at once, taking turns at each N (default), or each "
                         "server started, measured at every N and stopped in turn, as the other scenarios")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from specmac.compare.results import provenance

    ns = [int(x) for x in a.streams.split(",")]
    a.parallel = a.parallel or max(ns)
    source = "\n".join((ROOT / "specmac/core/sampling.py").read_text().splitlines()[:60]) + "\n"
    every = {"chat": chat_turns(source), "agent": agent_turns(), "streams": ns, "memory": a.conversations}
    scenarios = {k: every[k] for k in a.scenarios.split(",")}
    plan = servers(a)
    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    command = shlex.join(["python", "bench/serving.py", *argv])
    take_machine(command)
    curve = probe_curve(a) if "streams" in scenarios else None

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if a.alternate == "per-n" and "streams" in scenarios and len(plan) > 1:
        runs += streams_per_n(plan, scenarios.pop("streams"), a.repeats, say)
    for r in range(a.repeats if scenarios else 0):
        order = list(plan) if r % 2 == 0 else list(plan)[::-1]
        for name in order:
            res = measure(name, plan[name], scenarios)
            for sname, v in res.items():
                runs.append({"server": name, "scenario": sname, "round": r, **v})
                if sname == "memory":
                    last = v["samples"][-1]
                    say(f"r{r} {name:36s} memory: {last['conversations']} conversations, RSS "
                        f"{last['rss_mib']:.0f} MiB, store {last['store_bytes'] / 2**20:.1f} MiB")
                elif sname == "streams":
                    line = " ".join(f"N={x['n']}: {x['tokens_per_second']:.1f}" for x in v["streams"])
                    say(f"r{r} {name:36s} streams tok/s {line}")
                else:
                    total = sum(t["seconds"] for t in v["turns"])
                    say(f"r{r} {name:36s} {sname:6s} total {total:7.1f} s  ttft "
                        + " ".join(f"{t['ttft']:.1f}" for t in v["turns"]))
    record = {"provenance": provenance(command, [a.target or a.models_dir / TARGET, a.models_dir / DRAFT]),
              "servers": {k: shlex.join(v) for k, v in plan.items()}, "curve": curve, "runs": runs}
    (a.out / "results.json").write_text(json.dumps(record, indent=1))
    (a.out / "README.md").write_text(report(record))
    if any(r["scenario"] in ("chat", "agent") for r in runs):
        plot(record, a.out / "turns.png")
    if any(r["scenario"] == "streams" for r in runs):
        plot_streams(record, a.out / "streams.png")
    print((a.out / "README.md").read_text())


def med(xs):
    return float(np.median(xs)) if len(xs) else float("nan")


def q95(xs):
    return float(np.percentile(xs, 95)) if len(xs) else float("nan")


def report(record: dict) -> str:
    runs = record["runs"]
    names = list(dict.fromkeys(r["server"] for r in runs))
    prov = record["provenance"]
    lines = ["# Servers under conversations and concurrent streams", "",
             f"`{prov['command']}`", "",
             f"{prov['machine'].get('processor')}; commit {prov['git_sha']}; greedy, streaming, the official "
             "openai client on 127.0.0.1. Medians over the rounds; the range in brackets.", ""]
    for sname in dict.fromkeys(r["scenario"] for r in runs if r["scenario"] in ("chat", "agent")):
        sub = [r for r in runs if r["scenario"] == sname]
        n_turns = len(sub[0]["turns"])
        lines += [f"## {sname} ({n_turns} turns)", "",
                  "| server | ttft, turn 1 | ttft, turns 2+ (median) | total | cached tokens, last turn "
                  "| RSS MiB |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name in names:
            rs = [r for r in sub if r["server"] == name]
            if not rs:
                continue
            totals = [sum(t["seconds"] for t in r["turns"]) for r in rs]
            first = [r["turns"][0]["ttft"] for r in rs]
            later = [med([t["ttft"] for t in r["turns"][1:]]) for r in rs]
            cached = rs[0]["turns"][-1]["cached_tokens"]
            span = f"[{min(later):.2f}, {max(later):.2f}]"
            lines.append(f"| {name} | {med(first):.2f} s | {med(later):.2f} s {span} | "
                         f"{med(totals):.1f} s [{min(totals):.1f}, {max(totals):.1f}] | "
                         f"{'-' if cached is None else cached} | {med([r['rss_mib'] for r in rs]):.0f} |")
        lines.append("")
    mem = [r for r in runs if r["scenario"] == "memory"]
    if mem:
        lines += ["## Memory across conversations", "",
                  "Each conversation a system prompt of its own (a file's first 15 lines) and one 4-token "
                  "answer; the server's resident memory and its store's size (specmac_store_bytes) every "
                  "tenth.", "",
                  "| server | round | " + " | ".join(f"after {s['conversations']}" for s in mem[0]["samples"])
                  + " |", "|---|---:|" + "---:|" * len(mem[0]["samples"])]
        for r in mem:
            cells = [f"{s['rss_mib']:.0f} MiB (store {s['store_bytes'] / 2**20:.0f})" for s in r["samples"]]
            lines.append(f"| {r['server']} | {r['round']} | " + " | ".join(cells) + " |")
        lines.append("")
    sub = [r for r in runs if r["scenario"] == "streams"]
    if sub:
        lines += streams_report(sub, names, record.get("curve"))
    return "\n".join(lines)


def streams_report(sub: list[dict], names: list[str], curve: dict | None) -> list[str]:
    ns = [x["n"] for x in sub[0]["streams"]]
    lines = ["## Concurrent streams", "",
             "N clients at once, each asking two different questions in turn (64 tokens each). Aggregate "
             "tokens/s: all answers' tokens over the wall time; latency and time to first token over every "
             "request of every round (median / 95th percentile). "
             + ("The servers were up at once and took turns at each N." if sub[0].get("alternated")
                else "Each server was started, measured at every N and stopped in turn."), "",
             "| server | " + " | ".join(f"tokens/s at N={n}" for n in ns) + f" | at N={ns[-1]}: latency "
             "p50 / p95 | time to first token p50 / p95 |",
             "|---|" + "---:|" * len(ns) + "---:|---:|"]
    for name in names:
        rs = [r for r in sub if r["server"] == name]
        if not rs:
            continue
        cells = []
        for j in range(len(ns)):
            tps = [r["streams"][j]["tokens_per_second"] for r in rs]
            cells.append(f"{med(tps):.1f} [{min(tps):.1f}, {max(tps):.1f}]")
        reqs = [q for r in rs for q in r["streams"][-1]["requests"] if q]
        lat, ttft = [q["seconds"] for q in reqs], [q["ttft"] for q in reqs]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {med(lat):.1f} / {q95(lat):.1f} s | "
                     f"{med(ttft):.1f} / {q95(ttft):.1f} s |")
    lines += ratios(sub, names, ns, PLAIN[:1])
    if sum(any(r["server"] == n for r in sub) for n in PLAIN) > 1:  # a peer's server beside it
        lines += ratios(sub, names, ns, PLAIN)
    lines += ["", "What specmac's passes held (its /metrics, summed over the rounds): streams stepping per "
              "pass, drafts per drafting step, tokens written per target pass; steps by the source that "
              "drafted them, with the drafts they verified and how many were accepted.", "",
              "| server | N | streams per pass | drafts per step | tokens per pass "
              "| steps by source (drafts, accepted) |",
              "|---|---:|---:|---:|---:|---|"]
    for name in names:
        rs = [r for r in sub if r["server"] == name and r["streams"][0].get("counters")]
        for j, n in enumerate(ns):
            c: dict[str, float] = {}
            for r in rs:
                for k, v in (r["streams"][j]["counters"] or {}).items():
                    c[k] = c.get(k, 0.0) + v
            if not c:
                continue
            per_pass = c.get("specmac_batch_size_sum", 0) / max(c.get("specmac_batch_size_count", 0), 1)
            drafts = c.get("vllm:spec_decode_num_draft_tokens_total", 0) / max(
                c.get("vllm:spec_decode_num_drafts_total", 0), 1)
            tokens = c.get("specmac_generated_tokens_total", 0) / max(c.get("llamacpp:n_decode_total", 0), 1)
            lines.append(f"| {name} | {n} | {per_pass:.2f} | {drafts:.2f} | {tokens:.2f} | {by_source(c)} |")
    alone = [r for r in sub if r["server"].endswith("(one at a time)")]
    if alone:
        others = [n for n in names if n.startswith("specmac") and n != alone[0]["server"]]
        lines += ["", "Answers equal to the one-at-a-time server's answer to the same question (greedy): "
                  + ", ".join(f"{name} {same_texts(sub, name, alone)}" for name in others) + "."]
    if curve:
        t = dict(zip(curve.get("n", []), curve.get("batched_ms", [])))
        shown = ", ".join(f"T({n}) {t[n]:.0f}" for n in (1, 2, 4, 8, 16, 32) if n in t)
        lines += ["", f"The target's pass over n tokens (specmac probe-parallelism, ms): {shown}."]
    return lines + [""]


PLAIN = ("specmac none", "llama_cpp.server", "transformers serve")  # the servers that decode plainly


def ratios(sub: list[dict], names: list[str], ns: list[int], plain: Sequence[str]) -> list[str]:
    """Each other server's aggregate tokens/s over the fastest of the ``plain`` servers in the same
    round and N: the median over the rounds, each round's in parentheses (nothing where none of
    them ran)."""
    ran = [n for n in plain if any(r["server"] == n for r in sub)]
    others = [n for n in names if n not in ran and any(r["server"] == n for r in sub)]
    if not ran or not others:
        return []
    base: dict[tuple[int, int], float] = {}
    for r in sub:
        if r["server"] in ran:
            for j, x in enumerate(r["streams"]):
                base[r["round"], j] = max(base.get((r["round"], j), 0.0), x["tokens_per_second"])
    what = ran[0] if len(ran) == 1 else "the fastest of " + ", ".join(ran)
    lines = ["", f"Against {what} in the same round (its tokens/s = 1):", "",
             "| server | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---:|" * len(ns)]
    for name in others:
        rs = [r for r in sub if r["server"] == name]
        cells = []
        for j in range(len(ns)):
            x = [r["streams"][j]["tokens_per_second"] / base[r["round"], j] for r in rs
                 if (r["round"], j) in base]
            cells.append(f"{med(x):.2f} (" + ", ".join(f"{v:.2f}" for v in x) + ")")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def by_source(c: dict[str, float]) -> str:
    """'lookup 40 (52, 20), none 300' from the per-source counters ('' where the server had none)."""
    out = []
    for key, steps in sorted(c.items(), key=lambda kv: -kv[1]):
        if key.startswith("specmac_steps_total{"):
            label = key[key.index("{"):]
            drafts = c.get(f"specmac_step_draft_tokens_total{label}", 0)
            accepted = c.get(f"specmac_step_accepted_tokens_total{label}", 0)
            source = label.split('"')[1]
            out.append(f"{source} {steps:.0f}" + (f" ({drafts:.0f}, {accepted:.0f})" if drafts else ""))
    return ", ".join(out)


def same_texts(sub: list[dict], name: str, alone: list[dict]) -> str:
    """How many of ``name``'s answers equal the one-at-a-time server's answer to the same question."""
    ref = {}
    for r in alone:
        for x in r["streams"]:
            for i, q in enumerate(x["requests"]):
                if q:
                    ref[STREAM_QUESTIONS[i % len(STREAM_QUESTIONS)]] = q["text"]
    got = [(STREAM_QUESTIONS[i % len(STREAM_QUESTIONS)], q["text"]) for r in sub if r["server"] == name
           for x in r["streams"] for i, q in enumerate(x["requests"]) if q]
    return f"{sum(ref.get(k) == t for k, t in got)}/{len(got)}"


def plot_streams(record: dict, path: Path) -> None:
    from specmac.compare.results import pyplot, save_figure

    plt = pyplot()
    sub = [r for r in record["runs"] if r["scenario"] == "streams"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["server"] for r in sub):
        rs = [r for r in sub if r["server"] == name]
        ns = [x["n"] for x in rs[0]["streams"]]
        tps = [med([r["streams"][j]["tokens_per_second"] for r in rs]) for j in range(len(ns))]
        ax.plot(ns, tps, marker="o", label=name)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def plot(record: dict, path: Path) -> None:
    from specmac.compare.results import pyplot, save_figure

    plt = pyplot()
    runs = record["runs"]
    scen = list(dict.fromkeys(r["scenario"] for r in runs if r["scenario"] in ("chat", "agent")))
    fig, axes = plt.subplots(1, len(scen), figsize=(6 * len(scen), 4))
    for ax, sname in zip(np.atleast_1d(axes), scen):
        for name in dict.fromkeys(r["server"] for r in runs):
            rs = [r for r in runs if r["server"] == name and r["scenario"] == sname]
            ttft = np.median([[t["ttft"] for t in r["turns"]] for r in rs], axis=0)
            ax.plot(np.arange(1, len(ttft) + 1), ttft, marker="o", label=name)
        ax.set_title(sname)
        ax.set_xlabel("turn")
        ax.set_ylabel("time to first token, s")
        ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
