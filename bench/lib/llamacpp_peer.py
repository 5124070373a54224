"""llama.cpp's own speculative decoding (its ``llama-speculative-simple`` example) as a peer of the
anatomy, on a gguf target, beside plain decoding of the same file by llama-cpp-python.

The example is not in llama-cpp-python's wheel; build it from the llama.cpp that llama-cpp-python's
sdist vendors, so that both run the same llama.cpp commit (about 10 minutes on 2 cores)::

    pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d SDIST
    tar xzf SDIST/llama_cpp_python-0.3.36.tar.gz -C SRC
    cd SRC/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \\
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build -j2 --target llama-speculative-simple

and point ``--llama-cpp-bin`` (or $SPECMAC_LLAMA_CPP_BIN) at build/bin. The example
(``--spec-type draft-simple``) drafts up to ``--spec-draft-n-max`` tokens (``--spec-draft-p-min``
at its default, 0: no early stop) and keeps a draft token where the target's sampler picks the
same token. Its time is what it reports for the prompt and the generated tokens (model loading is
excluded); llama-cpp-python's plain decoding is timed from the prompt to the last token, both on
every prompt in alternation.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from specmac.core.sampling import SamplingParams

ENV = "SPECMAC_LLAMA_CPP_BIN"
EXAMPLE = "llama-speculative-simple"
_TIMES = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"n_(drafted|accept)\s+=\s+(\d+)")


def find_example(bin_dir: str | Path | None) -> Path | None:
    """The built example, or None where it was not built (the peer is then left out, and said so)."""
    d = bin_dir or os.environ.get(ENV)
    path = Path(d).expanduser() / EXAMPLE if d else None
    return path if path is not None and os.access(path, os.X_OK) else None


def _sampling_flags(params: SamplingParams) -> list[str]:
    """The example's sampler set to the runs' sampling (its defaults add top-k 40, top-p 0.95 and
    min-p 0.05; greedy: temperature 0)."""
    if params.greedy:
        return ["--temp", "0"]
    return ["--temp", str(params.temperature), "--top-k", str(params.top_k or 0),
            "--top-p", str(params.top_p), "--min-p", str(params.min_p)]


def run_example(example: Path, target: Path, draft: Path, prompt: str, k: int, params: SamplingParams,
                max_tokens: int, threads: int = 2, seed: int = 0) -> dict:
    """One generation: tokens, seconds (prompt + generation, as the example reports them),
    drafted and accepted tokens."""
    cmd = [str(example), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple", "-p", prompt,
           "-n", str(max_tokens), "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "-t", str(threads),
           "-td", str(threads), "-c", "2048", "-s", str(seed), *_sampling_flags(params)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = res.stdout + res.stderr
    times = {m[0]: (int(m[1]), float(m[2])) for m in _TIMES.findall(log)}
    if res.returncode != 0 or "decoded" not in times:
        raise RuntimeError(f"{EXAMPLE} failed ({res.returncode}): {log[-600:]}")
    counts = {m[0]: int(m[1]) for m in _ACCEPT.findall(log)}
    return {"tokens": times["decoded"][0], "seconds": times["encoded"][1] + times["decoded"][1],
            "drafted": counts.get("drafted", 0), "accepted": counts.get("accept", 0)}


def speculative_peer(example: Path, target: Path, draft: Path, prompts: list[dict], params: SamplingParams,
                     max_tokens: int, ks: list[int]) -> list[dict]:
    """One row per K: the example's tokens/s beside llama-cpp-python's plain decoding of ``target``,
    alternating on every prompt."""
    from specmac.backends.gguf_files import peer_llama as Llama  # extra buffer types off on AMX builds

    plain = Llama(str(target), n_ctx=2048, n_threads=2, verbose=False)
    kw = {"temperature": params.temperature, "top_k": params.top_k or 0, "top_p": params.top_p,
          "min_p": params.min_p}
    keys = ("tokens", "seconds", "drafted", "accepted")
    tot = {m: dict.fromkeys(keys, 0.0) for m in ["plain", *ks]}
    for p in prompts:
        t0 = time.perf_counter()
        out = plain(p["text"], max_tokens=max_tokens, seed=0, **kw)
        tot["plain"]["tokens"] += out["usage"]["completion_tokens"]
        tot["plain"]["seconds"] += time.perf_counter() - t0
        for k in ks:
            r = run_example(example, target, draft, p["text"], k, params, max_tokens)
            for key in keys:
                tot[k][key] += r[key]
    del plain
    base = tot["plain"]["tokens"] / tot["plain"]["seconds"]
    rows = []
    for k in ks:
        n, s, drafted, accepted = (tot[k][key] for key in keys)
        rows.append({"peer": f"llama.cpp {EXAMPLE} (gguf Q4_K_M draft, --spec-draft-n-max {k})",
                     "target_tokens_per_second": base, "tokens_per_second": n / s,
                     "speedup": n / s / base, "acceptance_rate": accepted / drafted if drafted else None})
    return rows
