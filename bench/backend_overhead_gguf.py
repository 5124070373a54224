"""Per-token overhead of specmac's gguf backend vs llama-cpp-python's own ``Llama.generate`` loop.

Both decode greedily from the same prompt with the same threads; the backend copies each logit row
to numpy and takes the argmax there, ``Llama.generate`` samples inside llama.cpp. Also times one
``score`` of 8 tokens against 8 single-token calls. Prints JSON; the greedy tokens of the two loops
are compared after timing.

    python bench/backend_overhead_gguf.py --model path/to/model.gguf [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import time

import numpy as np
from llama_cpp import Llama

from specmac.backends import library_version
from specmac.backends.gguf import GGUFBackend

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def backend_loop(b: GGUFBackend, prompt: list[int], n: int) -> tuple[list[int], float]:
    """Greedy decode n tokens; -> tokens, seconds per token after the first."""
    b.reset()
    tok = int(np.argmax(b.prefill(prompt)))
    out, t0 = [tok], time.perf_counter()
    for _ in range(n - 1):
        tok = int(np.argmax(b.score([tok])[0]))
        out.append(tok)
    return out, (time.perf_counter() - t0) / (n - 1)


def llama_loop(llm: Llama, prompt: list[int], n: int) -> tuple[list[int], float]:
    out, t0 = [], 0.0
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if len(out) == 1:
            t0 = time.perf_counter()
        if len(out) == n:
            break
    return out, (time.perf_counter() - t0) / (n - 1)


def batched_vs_serial(b: GGUFBackend, prompt: list[int], n: int, repeats: int) -> dict:
    """Median seconds of score(n tokens) and of n score([t]) calls, after the same prefill."""
    b.reset()
    b.prefill(prompt)
    base, toks = b.n_past, prompt[:n]
    batched, serial = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows_b = b.score(toks)
        batched.append(time.perf_counter() - t0)
        b.rewind(base)
        t0 = time.perf_counter()
        rows_s = np.concatenate([b.score([t]) for t in toks])
        serial.append(time.perf_counter() - t0)
        b.rewind(base)
    tb, ts = statistics.median(batched), statistics.median(serial)
    return {"n": n, "batched_ms": tb * 1e3, "serial_ms": ts * 1e3, "serial_over_batched": ts / tb,
            "max_abs_diff": float(np.abs(rows_b - rows_s).max()),
            "argmax_flips": int((rows_b.argmax(-1) != rows_s.argmax(-1)).sum())}


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a .gguf file (default: the embedded target)")
    ap.add_argument("--quant", default="f16", help="GGUF type of the embedded target")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    opts = {"quant": a.quant} | ({"n_threads": a.threads} if a.threads else {})
    b = GGUFBackend(a.model, **opts)
    r = b.resolved
    llm = Llama(r["path"], n_ctx=r["n_ctx"], n_batch=r["n_batch"], n_ubatch=r["n_ubatch"],
                n_threads=r["n_threads"], n_threads_batch=r["n_threads_batch"],
                n_gpu_layers=r["n_gpu_layers"], flash_attn=r["flash_attn"] == "on", verbose=False)
    prompt = b.encode(PROMPT)
    backend_loop(b, prompt, 8)  # warm up both
    llama_loop(llm, prompt, 8)
    ours, theirs = [], []
    for _ in range(a.repeats):  # interleaved, so background load hits both alike
        toks_b, tb = backend_loop(b, prompt, a.tokens)
        toks_l, tl = llama_loop(llm, prompt, a.tokens)
        ours.append(tb)
        theirs.append(tl)
    mb, ml = statistics.median(ours), statistics.median(theirs)
    result = {
        "model": r["path"], "model_sha256": sha256(r["path"]), "n_threads": r["n_threads"],
        "n_gpu_layers": r["n_gpu_layers"], "tokens": a.tokens, "repeats": a.repeats,
        "backend_ms_per_token": mb * 1e3, "llama_generate_ms_per_token": ml * 1e3,
        "overhead_ms_per_token": (mb - ml) * 1e3, "overhead_fraction": (mb - ml) / ml,
        "spread_ms": {"backend": [min(ours) * 1e3, max(ours) * 1e3],
                      "llama_generate": [min(theirs) * 1e3, max(theirs) * 1e3]},
        "same_greedy_tokens": toks_b == toks_l,
        "score_8_vs_8_single": batched_vs_serial(b, prompt, 8, a.repeats),
        "llama_cpp_python": library_version("llama-cpp-python"), "machine": platform.machine(),
        "processor": platform.processor(), "system": platform.system(),
    }
    print(json.dumps(result, indent=2))
    b.close()


if __name__ == "__main__":
    main()
