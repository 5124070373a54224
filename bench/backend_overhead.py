"""Each backend's per-token cost against its own library's generate loop, on the same weights.

    python bench/backend_overhead.py [--backends gguf,torch,mlx] [--tokens 64] [--repeats 5]
                                     [--threads 1] [--model BACKEND=PATH ...] [--out results/backend_overhead]

Measured the same way for every backend: greedy decoding from one prompt, 1 + ``tokens`` tokens,
EOS ignored, by two loops over the same model file:
- specmac: ``backend.prefill(prompt)``, then ``backend.score([t])`` with the argmax in numpy, one
  token at a time (what the speculative loop pays per target-only token);
- the library's own loop: llama-cpp-python's ``Llama.generate``, transformers' ``model.generate``
  (a streamer stamps each token), mlx-lm's ``generate_step``.
Each loop stamps the clock when a token is in hand; ms per token = (stamp of the last token -
stamp of the first) / ``tokens``, so the prompt's prefill is left out. After one warm-up of each,
the two loops alternate ``repeats`` times (A B A B ...: background load hits both alike); medians
and every repeat are recorded, and whether the two loops emitted the same tokens (they should:
same weights, same greedy rule). Each backend runs in its own process (no library's threads run
beside another's timing) with ``threads`` threads where the backend has the option (gguf, torch).
Models: the embedded target (GGUF F16 for gguf, the HF fp32 folder for torch and mlx) unless
--model names one. Writes results.json (with provenance), table.md and overhead.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from specmac.backends import BaseBackend, backend_class, library_version, load_backend
from specmac.compare.results import code_measured, model_files, provenance, save_figure, write_json

FORMAT = "specmac.backend_overhead/2"
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
BACKENDS = ("gguf", "torch", "mlx")
OPTIONS = {"gguf": {"quant": "f16"}, "torch": {"dtype": "float32"}, "mlx": {"dtype": "float32"}}
Loop = Callable[[list[int], int], list[tuple[int, float]]]  # (prompt, n tokens) -> (token, clock) each


def stamped(tokens: Iterable[int], n: int) -> list[tuple[int, float]]:
    """The first n tokens of ``tokens``, each with the clock read when it was in hand."""
    out = []
    for tok in tokens:
        out.append((int(tok), time.perf_counter()))
        if len(out) == n:
            break
    return out


def specmac_loop(b: BaseBackend) -> Loop:
    def run(prompt: list[int], n: int) -> list[tuple[int, float]]:
        def tokens():
            b.reset()
            tok = int(np.argmax(b.prefill(prompt)))
            while True:
                yield tok
                tok = int(np.argmax(b.score([tok])[0]))
        return stamped(tokens(), n)
    return run


def gguf_loop(b: BaseBackend) -> tuple[str, Loop]:
    from specmac.backends.gguf_files import peer_llama as Llama  # extra buffer types off on AMX builds

    r = b.resolved
    llm = Llama(r["path"], n_ctx=r["n_ctx"], n_batch=r["n_batch"], n_ubatch=r["n_ubatch"],
                n_threads=r["n_threads"], n_threads_batch=r["n_threads_batch"],
                n_gpu_layers=r["n_gpu_layers"], flash_attn=r["flash_attn"] == "on", verbose=False)

    def run(prompt: list[int], n: int) -> list[tuple[int, float]]:
        return stamped(llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0), n)
    return "Llama.generate", run


def torch_loop(b: BaseBackend) -> tuple[str, Loop]:
    import torch

    class Stamps:  # a transformers streamer: put() gets the prompt, then each new token
        def __init__(self) -> None:
            self.out: list[tuple[int, float]] = []
            self.prompt_seen = False

        def put(self, value) -> None:
            if self.prompt_seen:
                self.out += stamped(value.reshape(-1).tolist(), value.numel())
            self.prompt_seen = True

        def end(self) -> None:
            pass

    def run(prompt: list[int], n: int) -> list[tuple[int, float]]:
        ids = torch.tensor([prompt], device=b.device)
        streamer = Stamps()
        with torch.inference_mode():
            b.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0, streamer=streamer)
        return streamer.out
    return "model.generate", run


def mlx_loop(b: BaseBackend) -> tuple[str, Loop]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    def run(prompt: list[int], n: int) -> list[tuple[int, float]]:
        return stamped((tok for tok, _ in generate_step(mx.array(prompt), b.model, max_tokens=n)), n)
    return "mlx_lm generate_step", run


LIBRARY_LOOPS = {"gguf": gguf_loop, "torch": torch_loop, "mlx": mlx_loop}


def ms_per_token(stamps: list[tuple[int, float]]) -> float:
    return 1e3 * (stamps[-1][1] - stamps[0][1]) / (len(stamps) - 1)


def measure(name: str, model: str | None, tokens: int, repeats: int, threads: int | None) -> dict:
    """One backend: the two loops alternated ``repeats`` times after a warm-up of each."""
    opts = dict(OPTIONS.get(name, {}))
    if threads and "n_threads" in backend_class(name).options:
        opts["n_threads"] = threads
    b = load_backend(name, model, opts, role="target")
    loop_name, library = LIBRARY_LOOPS[name](b)
    ours = specmac_loop(b)
    prompt = b.encode(PROMPT)
    ours(prompt, 8), library(prompt, 8)  # warm-up: kernels, allocations, lazy compilation
    mine, theirs, same = [], [], []
    for _ in range(repeats):
        a, c = ours(prompt, tokens + 1), library(prompt, tokens + 1)
        mine.append(ms_per_token(a))
        theirs.append(ms_per_token(c))
        same.append([t for t, _ in a] == [t for t, _ in c])
    m, t = statistics.median(mine), statistics.median(theirs)
    return {"backend": name, "library_loop": loop_name, "library": b.library,
            "library_version": library_version(b.library), "model": b.model_id,
            "model_files": model_files(b, model, "target"), "options": b.resolved,
            "prompt_tokens": len(prompt), "specmac_ms_per_token": m, "library_ms_per_token": t,
            "ratio": m / t, "specmac_ms_per_token_all": mine, "library_ms_per_token_all": theirs,
            "same_tokens": all(same)}


def run_in_child(name: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--row", name, "--tokens", str(args.tokens), "--repeats",
           str(args.repeats), "--threads", str(args.threads)]
    if name in args.model:
        cmd += ["--model", f"{name}={args.model[name]}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{name}: the measuring process failed (exit {done.returncode})")
    return json.loads(done.stdout)


def render(record: dict, out: Path) -> str:
    rows = record["rows"]
    table = ["| backend | library loop | specmac ms/token | library ms/token | ratio | same tokens |",
             "|---|---|---|---|---|---|"]
    table += [f"| {r['backend']} | {r['library_loop']} | {r['specmac_ms_per_token']:.3f} "
              f"| {r['library_ms_per_token']:.3f} | {r['ratio']:.2f} | {'yes' if r['same_tokens'] else 'no'} "
              "|"
              for r in rows]
    (out / "table.md").write_text("\n".join(table) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(len(rows))
    for shift, key, label in ((-0.2, "specmac", "specmac backend"), (0.2, "library", "library's own loop")):
        med = [r[f"{key}_ms_per_token"] for r in rows]
        lo = [m - min(r[f"{key}_ms_per_token_all"]) for m, r in zip(med, rows)]
        hi = [max(r[f"{key}_ms_per_token_all"]) - m for m, r in zip(med, rows)]
        ax.bar(x + shift, med, 0.4, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(list(x), [f"{r['backend']}\n({r['library_loop']})" for r in rows])
    ax.set_ylabel("ms per generated token\n(median; bars: min-max)")
    s = record["settings"]
    ax.set_title(f"Greedy decoding, {s['tokens']} tokens, {s['threads']} thread(s), CPU", fontsize=10)
    ax.legend()
    save_figure(fig, out / "overhead.png")
    return "\n".join(table)


def parse_models(ap: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or name not in BACKENDS:
            ap.error(f"--model {item!r}: write BACKEND=PATH, BACKEND one of {', '.join(BACKENDS)}")
        out[name] = path
    return out


def main() -> None:
    code_measured()  # the commit as the run starts: what its provenance records
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all three)")
    ap.add_argument("--tokens", type=int, default=64, help="timed tokens after the first")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="n_threads of the gguf and torch backends")
    ap.add_argument("--model", action="append", default=[], metavar="BACKEND=PATH",
                    help="a model instead of the embedded target (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("results/backend_overhead"))
    ap.add_argument("--row", help=argparse.SUPPRESS)  # measure one backend in this process, print JSON
    args = ap.parse_args()
    args.model = parse_models(ap, args.model)
    if args.row:
        row = measure(args.row, args.model.get(args.row), args.tokens, args.repeats, args.threads)
        print(json.dumps(row))
        return
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        ap.error(f"--backends {args.backends!r}: choose among {', '.join(BACKENDS)}")
    rows = []
    for name in names:
        rows.append(run_in_child(name, args))
        r = rows[-1]
        print(f"{name}: {r['specmac_ms_per_token']:.3f} vs {r['library_ms_per_token']:.3f} ms/token "
              f"({r['library_loop']}), ratio {r['ratio']:.2f}, same tokens {r['same_tokens']}", flush=True)
    files = list(dict.fromkeys(f for r in rows for f in r["model_files"]))
    record = {"format": FORMAT, "provenance": provenance(" ".join(sys.argv), files),
              "settings": {"prompt": PROMPT, "tokens": args.tokens, "repeats": args.repeats,
                           "threads": args.threads, "warmup_tokens": 8},
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "results.json", record)
    print(render(record, args.out))


if __name__ == "__main__":
    main()
