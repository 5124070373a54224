"""Per-token cost of greedy decoding through MLXBackend (score([t]) loop) vs mlx-lm's generate_step.

The ratio is what the specmac contract (numpy logits back on every call, no async pipelining) costs
over mlx-lm's own loop on the same weights. Prints one JSON record.

    python bench/backend_overhead_mlx.py [--model FOLDER] [--tokens 64] [--repeats 3]
(from the repository root, with specmac installed: pip install -e . or PYTHONPATH=.)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import mlx.core as mx
from mlx_lm.generate import generate_step

from specmac import assets
from specmac.backends import library_version, load_backend

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def time_backend(backend, prompt: list[int], n: int) -> tuple[float, list[int]]:
    """Seconds for n greedy tokens after the prefill, and the tokens."""
    backend.reset()
    out = [int(backend.prefill(prompt).argmax())]
    backend.sync()
    t0 = time.perf_counter()
    while len(out) < n + 1:
        out.append(int(backend.score([out[-1]])[0].argmax()))
    backend.sync()
    return time.perf_counter() - t0, out


def time_generate_step(model, prompt: list[int], n: int) -> tuple[float, list[int]]:
    """The same with mlx-lm's generator (greedy by default); its first token closes the prefill."""
    steps = generate_step(mx.array(prompt), model, max_tokens=n + 1)
    out = [int(next(steps)[0])]
    t0 = time.perf_counter()
    out += [int(tok) for tok, _ in steps]
    mx.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF folder; default the embedded target, else /tmp/mlxdev/tiny")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default=None, help="backend dtype option (default: the backend's)")
    args = ap.parse_args()
    embedded = (assets.hf_dir("target") / "config.json").is_file()
    model = args.model or (None if embedded else "/tmp/mlxdev/tiny")
    backend = load_backend("mlx", model, {"dtype": args.dtype} if args.dtype else {})
    prompt = backend.encode(PROMPT)
    time_backend(backend, prompt, 4), time_generate_step(backend.model, prompt, 4)  # warm up
    ours, ref = [], []
    for _ in range(args.repeats):  # interleaved, so background load hits both alike
        ours.append(time_backend(backend, prompt, args.tokens))
        ref.append(time_generate_step(backend.model, prompt, args.tokens))
    # checked after timing: same weights, same greedy rule -> same tokens
    same = all(o[1] == r[1] for o, r in zip(ours, ref))
    ms_ours = statistics.median(t for t, _ in ours) / args.tokens * 1e3
    ms_ref = statistics.median(t for t, _ in ref) / args.tokens * 1e3
    print(json.dumps({
        "bench": "backend_overhead_mlx", "model": backend.model_id, "options": backend.resolved,
        "tokens": args.tokens, "repeats": args.repeats,
        "ms_per_token_specmac": round(ms_ours, 4), "ms_per_token_mlx_lm": round(ms_ref, 4),
        "ratio": round(ms_ours / ms_ref, 3), "same_tokens": same,
        "ms_all_specmac": [round(t * 1e3, 2) for t, _ in ours],
        "ms_all_mlx_lm": [round(t * 1e3, 2) for t, _ in ref],
        "mlx": library_version("mlx"), "mlx_lm": library_version("mlx-lm"),
        "machine": platform.platform(),
    }, indent=2))
    if not same:
        raise SystemExit("greedy tokens differ from mlx-lm's: the timings compare different work")


if __name__ == "__main__":
    main()
