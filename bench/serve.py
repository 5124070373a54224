"""`specmac serve` on the real Qwen pair -> results/serve: overhead, Predicted Outputs, a peer, load.

Side by side in one run, interleaved per round (each configuration once per round, in turn):
  1. overhead: the server's tokens/s (client wall time of a non-streaming request, prompt included)
     against the library's own loop (``Pair.generate`` timed the same way) on the same configuration:
     target only (``speculative: {"k": 0}``) and the Q4_K_M 0.5B draft at a fixed K;
  2. a code edit (rewrite a file with one rename, the file as ``prediction``): tokens/s without and
     with the prediction (no draft model, and the draft model behind it), accepted/rejected
     prediction tokens, and llama-cpp-python's own server (``llama_cpp.server``) on the same
     target file, plain and with its prompt-lookup draft, where its ``server`` extra is installed;
  3. a small load test: concurrent clients, latency p50/p95 and throughput.
Greedy (temperature 0) throughout; the texts are compared with the target-only text.

    python bench/serve.py [--models-dir DIR] --out results/serve
    SPECMAC_CACHE=$(mktemp -d) python bench/serve.py --parts edit --draft-model none --skip-peers \
        --out results/prediction_k          # the edit alone, target only: K auto against K = 32

Other targets of the same weights (``--target-backend``, ``--target-model``, ``--target-opt``):
an F16 GGUF (llama_cpp.server serves the same file as the peer) or an HF folder on torch (the
peer is transformers' own ``generate`` on the same loaded model, plain and with
``prompt_lookup_num_tokens``). ``--parts`` runs some of the three parts only, ``--skip-peers``
leaves the peers out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(ROOT))  # this checkout's specmac, after bench/ (lib), before an installed one

from lib.machine import take_machine  # noqa: E402
from lib.models import add_models_dir  # noqa: E402
from lib.peers import HFGenerate  # noqa: E402

from specmac.api import Pair  # noqa: E402
from specmac.compare.results import code_measured, provenance, pyplot, save_figure, write_json  # noqa: E402
from specmac.core.sampling import SamplingParams  # noqa: E402
from specmac.serve.server import bind, make_server  # noqa: E402

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain what a Python generator is, with a short example."]
EDIT_FILE = ROOT / "specmac" / "errors.py"  # 51 lines
OLD, NEW = "ContextOverflow", "ContextTooLong"
EDIT_ASK = (f"Rename the class `{OLD}` to `{NEW}` in this file. Reply with the complete updated file in one "
            "```python block and nothing else.\n\n```python\n{file}```")
GREEDY = SamplingParams(0.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SpecmacServer:
    """An in-process `specmac serve` over ``pair`` on a free loopback port."""

    def __init__(self, pair: Pair, k) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.server = make_server(pair, self.sock, k=k, queue_size=64, log_level="warning", own_logging=False)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.model = httpx.get(self.url + "/models").json()["data"][0]["id"]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


class LlamaCppServer:
    """llama-cpp-python's OpenAI server in a subprocess (None where its extra is missing)."""

    def __init__(self, model: Path, extra: list[str]) -> None:
        port = free_port()
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", "4096",
               "--n_threads", "2", "--n_threads_batch", "2", "--host", "127.0.0.1", "--port", str(port)]
        self.proc = subprocess.Popen(cmd + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url, self.model = f"http://127.0.0.1:{port}/v1", model.name
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(self.url + "/models", timeout=5)
                return
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("llama_cpp.server did not start") from None
                time.sleep(0.5)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def post(url: str, path: str, body: dict) -> dict:
    t0 = time.perf_counter()
    r = httpx.post(url + path, json=body, timeout=600)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    out = r.json()
    choice = out["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    n = out["usage"]["completion_tokens"]
    return {"tokens": n, "seconds": wall, "tokens_per_second": n / wall, "text": text, "usage": out["usage"]}


def post_stream(url: str, path: str, body: dict) -> dict:
    """A streamed request: end-to-end seconds, time to the first text, tokens (the usage chunk where
    the server sends one, else the number of text chunks: one per token in llama_cpp.server)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0, ttft, text, chunks, usage = time.perf_counter(), None, [], 0, None
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line.removeprefix("data: "))
            usage = obj.get("usage") or usage
            for c in obj.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece is not None and (piece or c.get("finish_reason") is None):
                    chunks += 1
                    ttft = ttft if ttft is not None or not piece else time.perf_counter() - t0
                    text.append(piece)
    wall = time.perf_counter() - t0
    n = usage["completion_tokens"] if usage else chunks
    return {"tokens": n, "seconds": wall, "tokens_per_second": n / wall, "ttft_s": ttft,
            "text": "".join(text), **({"usage": usage} if usage else {})}


def library(pair: Pair, prompt: str, max_tokens: int, k) -> dict:
    t0 = time.perf_counter()
    g = pair.generate(pair.target.apply_chat_template(prompt), params=GREEDY, max_tokens=max_tokens, k=k)
    wall = time.perf_counter() - t0
    return {"tokens": len(g.token_ids), "seconds": wall, "tokens_per_second": len(g.token_ids) / wall,
            "text": g.text}


def summary(runs: list[dict]) -> dict:
    tps = [r["tokens_per_second"] for r in runs]
    out = {"tokens_per_second": statistics.median(tps), "min": min(tps), "max": max(tps), "n": len(runs),
           "tokens": statistics.median(r["tokens"] for r in runs)}
    usages = [r["usage"] for r in runs if "usage" in r]
    if usages:
        u = usages[-1]
        out["speculative"] = u.get("speculative")
        out["completion_tokens_details"] = u.get("completion_tokens_details")
    return out


def overhead(srv: SpecmacServer, pair: Pair, rounds: int, max_tokens: int, k: int) -> dict:
    runs: dict[str, list] = {}
    for r in range(rounds + 1):  # round 0: a discarded warm-up of each
        for prompt in PROMPTS[: 1 if r == 0 else None]:
            for name, spec in (("target only", 0), (f"draft K={k}", k)):
                body = {"model": srv.model, "messages": [{"role": "user", "content": prompt}],
                        "temperature": 0, "max_tokens": max_tokens, "speculative": {"k": spec}}
                a = post(srv.url, "/chat/completions", body)
                b = library(pair.plain() if spec == 0 else pair, prompt, max_tokens, k)
                if r:
                    runs.setdefault(f"{name}: server", []).append(a)
                    runs.setdefault(f"{name}: library", []).append(b)
    same = all(a["text"] == b["text"] for name in ("target only", f"draft K={k}")
               for a, b in zip(runs[f"{name}: server"], runs[f"{name}: library"]))
    return {"rows": {name: summary(r) for name, r in runs.items()}, "server_text_equals_library": same}


def edit(peers: dict, rounds: int, max_tokens: int) -> dict:
    file = EDIT_FILE.read_text()
    prediction = "```python\n" + file + "```"
    runs: dict[str, list] = {}
    for r in range(rounds + 1):  # round 0: a discarded warm-up of each (pages the weights in, calibrates)
        # a new first line per round: llama_cpp.server reuses the KV cache of a repeated prompt's
        # prefix, specmac does not, so every peer pays the same prompt processing
        ask = f"Edit request {r}.\n" + EDIT_ASK.format(file=file)
        for name, (srv, extra) in peers.items():
            if callable(srv):  # an in-process peer (transformers' generate)
                res = srv(ask, max_tokens if r else 8)
                if r:
                    runs.setdefault(name, []).append(res)
                continue
            body = {"model": srv.model, "messages": [{"role": "user", "content": ask}],
                    "temperature": 0, "max_tokens": max_tokens if r else 8, **extra}
            if "prediction" in name:
                body["prediction"] = {"type": "content", "content": prediction}
            res = post_stream(srv.url, "/chat/completions", body)
            if r:
                runs.setdefault(name, []).append(res)
    ref = [x["text"] for x in runs["specmac, target only"]]
    rows = {name: {**summary(r), "ttft_s": statistics.median(x["ttft_s"] for x in r),
                   "text_equals_target_only": [x["text"] for x in r] == ref} for name, r in runs.items()}
    return {"file": str(EDIT_FILE.relative_to(ROOT)), "file_lines": len(file.splitlines()),
            "file_sha256": hashlib.sha256(file.encode()).hexdigest(), "change": f"rename {OLD} -> {NEW}",
            "prediction_tokens_note": "the file in a ```python fence", "rows": rows,
            "renamed": all(NEW in t and OLD not in t for t in ref)}


def load_test(srv, clients: int, per_client: int, max_tokens: int, extra: dict) -> dict:
    def one(i: int) -> dict:
        body = {"model": srv.model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "temperature": 0, "max_tokens": max_tokens, **extra}
        try:
            return post(srv.url, "/chat/completions", body)
        except httpx.HTTPStatusError as e:
            return {"status": e.response.status_code}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(one, range(clients * per_client)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if "seconds" in r]
    lat = sorted(r["seconds"] for r in ok)
    q = statistics.quantiles(lat, n=20) if len(lat) >= 2 else lat * 19
    return {"clients": clients, "requests": len(results), "completed": len(ok),
            "refused": len(results) - len(ok), "latency_p50_s": statistics.median(lat),
            "latency_p95_s": q[18],
            "throughput_tokens_per_second": sum(r["tokens"] for r in ok) / wall, "wall_s": wall}


def figure(record: dict, path: Path) -> None:
    plt = pyplot()
    rows = record["edit"]["rows"]
    names = list(rows)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
    med = [rows[n]["tokens_per_second"] for n in names]
    err = [[m - rows[n]["min"] for n, m in zip(names, med)], [rows[n]["max"] - m for n, m in zip(names, med)]]
    ax.barh(names, med, xerr=err, color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s (median, min-max over rounds)")
    title = f"code edit with Predicted Outputs: {describe(record)}, 2-core CPU"
    ax.set_title(title.replace("`", ""), fontsize=9)
    save_figure(fig, path)


def describe(record: dict) -> str:
    t = record.get("target") or {"backend": "gguf", "model": TARGET, "options": {}}
    opts = ", ".join(f"{k}={v}" for k, v in t["options"].items())
    return f"{t['backend']} `{t['model']}`" + (f" ({opts})" if opts else "")


PLAIN_PEERS = ("llama_cpp.server, plain", "transformers generate, plain", "specmac, target only")


def readme(record: dict, command: str) -> str:
    """results/serve/README.md: the command, what was measured, the tables."""
    prov, s = record["provenance"], record["settings"]
    name = Path(s.get("draft_model") or DRAFT).name
    draft = "none" if s.get("draft_model") == "none" else f"`{name}` (gguf)"
    lines = [f"# specmac serve on the real Qwen pair: target {describe(record)}", "",
             "```bash", command, "```", "", f"Target {describe(record)}, draft {draft}, greedy. "
             f"{s['rounds']} rounds after a discarded warm-up of each configuration, "
             "interleaved; medians with [min, max] over runs. tokens/s is end to end, as a client sees "
             "it: request sent to last token, prompt processing included, for the server and for the "
             f"library alike. git {prov.get('git_sha')}, {prov.get('utc')}; 2-core CPU that other "
             "work shares, so absolute numbers move between runs.", ""]
    if "overhead" in record:
        ov = record["overhead"]
        lines += ["## Overhead: the server against the library's own loop, same configuration", "",
                  f"Chat prompts, {s['max_tokens']} tokens; the server's text equals the "
                  f"library's: {ov['server_text_equals_library']}.", "",
                  "| configuration | server tokens/s | library tokens/s | server / library |",
                  "|---|---|---|---|"]
        rows = ov["rows"]
        for name in dict.fromkeys(n.split(": ")[0] for n in rows):
            srv, lib = rows[f"{name}: server"], rows[f"{name}: library"]
            lines.append(f"| {name} | {_cell(srv)} | {_cell(lib)} | "
                         f"{srv['tokens_per_second'] / lib['tokens_per_second']:.3f} |")
        lines.append("")
    if "edit" in record:
        ed = record["edit"]
        plains = [n for n in PLAIN_PEERS if n in ed["rows"]]
        base = max(plains, key=lambda n: ed["rows"][n]["tokens_per_second"])
        plain = ed["rows"][base]
        lines += [f"## Code edit: `{ed['file']}` ({ed['file_lines']} lines), {ed['change']}, the file as "
                  "`prediction`", "",
                  "The prompt asks for the whole file back; the prediction is the file in a ```python fence. "
                  f"Renamed in every specmac answer: {ed['renamed']}. \"vs plain\": against the fastest "
                  f"plain decoder of the same weights measured here ({base}, "
                  f"{plain['tokens_per_second']:.1f} tokens/s); \"after first text\": tokens / (time - time "
                  "to first text), the decoding rate without the prompt's processing.", "",
                  "| server, configuration | tokens/s | vs plain | after first text | tokens | target passes "
                  "| time to first text (s) | accepted / rejected prediction tokens | text = target only |",
                  "|---|---|---|---|---|---|---|---|---|"]

        def after(r: dict) -> float:
            return r["tokens"] / max(r["tokens"] / r["tokens_per_second"] - (r["ttft_s"] or 0), 1e-9)
        for name, r in ed["rows"].items():
            spec, det = r.get("speculative") or {}, r.get("completion_tokens_details") or {}
            pred = (f"{det.get('accepted_prediction_tokens')} / {det.get('rejected_prediction_tokens')}"
                    if "prediction" in name else "-")
            ratio = r["tokens_per_second"] / plain["tokens_per_second"]
            lines.append(f"| {name} | {_cell(r)} | {ratio:.2f}x | "
                         f"{after(r):.1f} ({after(r) / after(plain):.2f}x) | {r['tokens']:.0f} | "
                         f"{spec.get('target_passes', '-')} | {r['ttft_s'] or 0:.2f} | {pred} | "
                         f"{r['text_equals_target_only']} |")
        lines.append("")
    if "load" in record:
        lines += ["## Load test", "", "| server | clients x requests | completed | refused (503) "
                  "| latency p50 / p95 (s) | throughput tokens/s |", "|---|---|---|---|---|---|"]
        for name, r in record["load"].items():
            lines.append(f"| {name} | {r['clients']} x {r['requests'] // r['clients']} | {r['completed']} | "
                         f"{r['refused']} | {r['latency_p50_s']:.1f} / {r['latency_p95_s']:.1f} | "
                         f"{r['throughput_tokens_per_second']:.1f} |")
        lines.append("")
    if "llama_cpp_server" in record:
        lines += [f"llama_cpp.server: {record['llama_cpp_server']}", ""]
    return "\n".join(lines)


def _cell(r: dict) -> str:
    return f"{r['tokens_per_second']:.1f} [{r['min']:.1f}, {r['max']:.1f}]"


def main() -> None:
    code_measured()  # the commit as the run starts: what its provenance records
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_models_dir(ap)
    ap.add_argument("--target-backend", default="gguf", help="the target's backend (gguf or torch)")
    ap.add_argument("--target-model", help=f"the target's file or folder [default: MODELS_DIR/{TARGET}]")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="a target backend option, e.g. dtype=bfloat16 (repeatable)")
    ap.add_argument("--draft-model", help=f"the gguf draft [default: MODELS_DIR/{DRAFT}]; 'none': no draft")
    ap.add_argument("--parts", default="overhead,edit,load", help="a comma list of overhead, edit, load")
    ap.add_argument("--out", default="results/serve")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--edit-max-tokens", type=int, default=480)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--load-requests", type=int, default=2, help="requests per client (4 clients)")
    ap.add_argument("--skip-peers", action="store_true",
                    help="leave out llama_cpp.server and transformers' generate (specmac's rows only)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    target = Path(args.target_model or Path(args.models_dir) / TARGET)
    draft = None if args.draft_model == "none" else Path(args.draft_model or Path(args.models_dir) / DRAFT)
    topts = dict(kv.split("=", 1) for kv in args.target_opt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/serve.py " + " ".join(sys.argv[1:])
    take_machine(command)
    pair = Pair.load(args.target_backend, "gguf" if draft else None, target_model=str(target),
                     draft_model=str(draft) if draft else None, target_options=topts)
    plain = SpecmacServer(pair.plain(), k="auto")
    spec = SpecmacServer(pair, k=args.k) if draft else None
    record = {"provenance": provenance(command, models=[target] + ([draft] if draft else [])),
              "settings": vars(args),
              "target": {"backend": args.target_backend, "model": target.name, "options": topts,
                         "resolved": {k: v for k, v in pair.target.resolved.items() if k != "path"}}}
    if "overhead" in parts and spec:
        print("overhead ...", flush=True)
        record["overhead"] = overhead(spec, pair, args.rounds, args.max_tokens, args.k)
        write_json(out / "serve.json", record)  # after each part, so that a run cut short keeps it
    peers = {"specmac, target only": (plain, {"speculative": {"k": 0}}),
             "specmac, prediction (K auto)": (plain, {}),
             "specmac, prediction (K=32)": (plain, {"speculative": {"k": 32}})}
    if spec:
        peers[f"specmac, prediction + 0.5B draft (K={args.k})"] = (spec, {})
    closers = []
    if args.skip_peers:
        pass
    elif args.target_backend == "gguf":
        try:
            import llama_cpp.server  # noqa: F401

            served = Path(pair.target.resolved["path"])  # the file loaded (a quant= option's output too)
            lc = LlamaCppServer(served, [])
            closers.append(lc)
            lcp = LlamaCppServer(served, ["--draft_model", "prompt-lookup-decoding",
                                          "--draft_model_num_pred_tokens", "10"])
            closers.append(lcp)
            peers |= {"llama_cpp.server, plain": (lc, {}), "llama_cpp.server, prompt lookup (10)": (lcp, {})}
        except (ImportError, RuntimeError) as e:
            record["llama_cpp_server"] = f"left out: {e}"
    elif args.target_backend == "torch":
        def hf(lookup: int | None):
            gen = HFGenerate(pair.target, lookup)
            return lambda ask, n: gen(pair.target.apply_chat_template(ask), n)
        peers |= {"transformers generate, plain": (hf(None), {}),
                  "transformers generate, prompt lookup (3)": (hf(3), {}),
                  "transformers generate, prompt lookup (10)": (hf(10), {})}
    try:
        if "edit" in parts:
            print("edit ...", flush=True)
            record["edit"] = edit(peers, args.rounds, args.edit_max_tokens)
            write_json(out / "serve.json", record)
        if "load" in parts:
            print("load ...", flush=True)
            n = args.load_requests
            record["load"] = {"specmac, target only": load_test(plain, 4, n, 32, {"speculative": {"k": 0}})}
    finally:
        for c in closers:
            c.close()
        plain.close()
        if spec:
            spec.close()
    write_json(out / "serve.json", record)
    if "edit" in record:
        figure(record, out / "serve.png")
    (out / "README.md").write_text(readme(record, command))
    print(json.dumps({k: v for k, v in record.items() if k != "provenance"}, indent=1, default=str))


if __name__ == "__main__":
    main()
