"""Conversations through OpenAI-compatible servers: does each turn pay only for its new tokens?

    python bench/conversations.py --models-dir M --out results/conversations/MACHINE/q4_k_m
    python bench/conversations.py --models-dir M --target M/qwen2.5-coder-1.5b-instruct-f16.gguf --out DIR
    python bench/conversations.py --models-dir M --target-backend torch --target-opt dtype=bfloat16 \\
        --target M/qwen2.5-coder-1.5b-instruct-hf-bf16 --out DIR

Two scenarios through the official ``openai`` client, streaming, greedy, the answers appended to
the history as a chat window or an agent appends them:
  * chat: a system message holding a 60-line Python file, then six short questions (48 tokens each);
  * agent: ten tool calls, each a tool output (a file of specmac's, ~150-400 tokens) appended to a
    growing context and a question about it (32 tokens each).
Each server is a process of its own on 127.0.0.1, started, measured on both scenarios and stopped
before the next starts; the servers alternate round by round. The servers: ``specmac serve`` with
no draft, the 0.5B draft and lookup+gguf (K auto); on a GGUF target ``llama_cpp.server`` on the same
file (extra CPU buffer types off, as llama.cpp issue 20824 needs on some CPUs), on a torch folder
``transformers serve --continuous-batching`` on the same folder. Per turn: time to first token
(the first content), total time, prompt and cached tokens where the server reports them; the
server process's resident memory after each scenario. Writes results.json, README.md and a PNG.
Takes the benchmark lock of bench/ab.py.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LOCK = Path(tempfile.gettempdir()) / "specmac-bench.lock"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QUESTIONS = ["What does this module do, in one sentence?", "Which function is the entry point?",
             "Is there any error handling?", "What would you rename, and why?",
             "Which line would you test first?", "Summarise the module's public names."]
TOOL_FILES = ["specmac/errors.py", "specmac/vocab.py", "specmac/core/rejection.py",
              "specmac/core/runstats.py",
              "specmac/serve/metrics.py", "specmac/core/sources.py", "specmac/backends/held.py",
              "specmac/compare/workloads.py", "specmac/files.py", "specmac/cli/textin.py"]


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


def converse(base: str, model: str, turns: list[dict]) -> list[dict]:
    """Run the turns through the openai client (streaming, greedy); per turn: ttft, seconds, tokens."""
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    history, out = [], []
    for turn in turns:
        history += turn["add"]
        t0, first, text, usage = time.perf_counter(), None, "", None
        stream = client.chat.completions.create(model=model, messages=history, max_tokens=turn["max_tokens"],
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        end = time.perf_counter()
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        out.append({"ttft": (first or end) - t0, "seconds": end - t0, "text": text,
                    "prompt_tokens": getattr(usage, "prompt_tokens", None),
                    "completion_tokens": getattr(usage, "completion_tokens", None),
                    "cached_tokens": None if details is None else getattr(details, "cached_tokens", None)})
        history.append({"role": "assistant", "content": text})
    return out


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
            "--target-model", target, *topts, "--model-name", "m", "--log-level", "warning"]
    out = {"specmac none": [*spec, "--draft", "none"],
           "specmac gguf": [*spec, "--draft", "gguf", "--draft-model", draft, "--k", "auto"],
           "specmac lookup+gguf": [*spec, "--draft", "lookup+gguf", "--draft-model", draft, "--k", "auto"]}
    if a.target_backend == "gguf":
        here = str(ROOT / "bench" / "conversations.py")
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
    from llama_cpp import llama as llama_module
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from specmac.backends.gguf_files import extra_bufts_safe

    lib, safe = llama_module.llama_cpp, extra_bufts_safe()
    defaults = lib.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = safe
        return p

    lib.llama_model_default_params = params
    n = os.cpu_count() or 1
    app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=port),
                     model_settings=[ModelSettings(model=model, model_alias="m", n_ctx=4096, n_threads=n,
                                                   n_threads_batch=n, verbose=False)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def measure(name: str, command: list[str], scenarios: dict[str, list[dict]]) -> dict:
    port = free_port()
    cmd = [c.replace("{port}", str(port)) for c in command]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 900  # a first k="auto" run measures the target's curve
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} ended before it served: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(base + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start")
            time.sleep(1)
        out = {}
        for sname, turns in scenarios.items():
            out[sname] = {"turns": converse(base, "m", turns), "rss_mib": rss_mib(proc.pid)}
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--llama-server"]:
        return llama_server(argv[1], int(argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", type=Path, default=Path(os.environ.get("SPECMAC_MODELS", "models")))
    ap.add_argument("--target", help=f"the target's model (default MODELS_DIR/{TARGET})")
    ap.add_argument("--target-backend", default="gguf")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--servers", help="comma-separated names of the servers to run (default all)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from specmac.compare.results import provenance

    source = "\n".join((ROOT / "specmac/core/sampling.py").read_text().splitlines()[:60]) + "\n"
    scenarios = {"chat": chat_turns(source), "agent": agent_turns()}
    plan = servers(a)
    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for r in range(a.repeats):
            order = list(plan) if r % 2 == 0 else list(plan)[::-1]
            for name in order:
                res = measure(name, plan[name], scenarios)
                for sname, v in res.items():
                    runs.append({"server": name, "scenario": sname, "round": r, **v})
                    total = sum(t["seconds"] for t in v["turns"])
                    print(f"r{r} {name:22s} {sname:6s} total {total:7.1f} s  ttft "
                          + " ".join(f"{t['ttft']:.1f}" for t in v["turns"]), file=sys.stderr, flush=True)
    command = shlex.join(["python", "bench/conversations.py", *argv])
    record = {"provenance": provenance(command, [a.target or a.models_dir / TARGET, a.models_dir / DRAFT]),
              "servers": {k: shlex.join(v) for k, v in plan.items()}, "runs": runs}
    (a.out / "results.json").write_text(json.dumps(record, indent=1))
    (a.out / "README.md").write_text(report(record))
    plot(record, a.out / "turns.png")
    print((a.out / "README.md").read_text())


def med(xs):
    return float(np.median(xs)) if xs else float("nan")


def report(record: dict) -> str:
    runs = record["runs"]
    names = list(dict.fromkeys(r["server"] for r in runs))
    lines = ["# Conversations: time to first token and total time per turn", "",
             f"`{record['provenance']['command']}`", "",
             f"{record['provenance']['machine'].get('processor')}; commit {record['provenance']['git_sha']}; "
             "greedy, streaming, the official openai client. Medians over the rounds; the range in "
             "brackets.", ""]
    for sname in dict.fromkeys(r["scenario"] for r in runs):
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
    return "\n".join(lines)


def plot(record: dict, path: Path) -> None:
    from specmac.compare.results import _pyplot, save_figure

    plt = _pyplot()
    runs = record["runs"]
    scen = list(dict.fromkeys(r["scenario"] for r in runs))
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
