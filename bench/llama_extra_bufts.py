"""What llama.cpp's extra CPU buffer types (weight repacking) are worth: the gguf option extra_bufts.

    python bench/llama_extra_bufts.py [--models-dir DIR] [--repeats 5] [--out results/llama_extra_bufts]

The Qwen2.5-Coder-1.5B-Instruct Q4_K_M file (bench/lib/models.py), and Q8_0 and F16 made from it once
with llama_model_quantize (specmac.backends.gguf.requantize: cached outside the repository, see
`specmac models`). Per file, both settings are loaded side by side and measured in alternation
(the order flips every repeat): after a 32-token prefill, --decode single-token passes (decode
tokens/s) and one batched pass of --batch tokens (the verification pass of speculative decoding).
Also recorded: whether the two settings give the same logits. Writes results.json (provenance)
and README.md (table and command).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from lib.machine import take_machine
from lib.models import QWEN_15B_GGUF, add_models_dir

from specmac.backends.gguf import GGUFBackend, extra_bufts_safe, requantize
from specmac.compare.results import provenance, write_json

PROMPT = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n"


def timed_round(b: GGUFBackend, prompt: list[int], n_decode: int, batch: list[int]) -> dict:
    b.reset()
    b.prefill(prompt)
    t = prompt[-1]
    start = time.perf_counter()
    for _ in range(n_decode):
        t = int(np.argmax(b.score([t])[0]))
    decode = time.perf_counter() - start
    b.rewind(len(prompt))
    start = time.perf_counter()
    rows = b.score(batch)
    batched = time.perf_counter() - start
    return {"decode_tps": n_decode / decode, "batch_ms": 1000 * batched,
            "batch_tps": len(batch) / batched, "logits": rows}


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}


def measure_file(path: str, args) -> dict:
    backends = {s: GGUFBackend(path, extra_bufts=s, n_threads=args.threads, n_gpu_layers=0)
                for s in ("on", "off")}
    prompt = backends["on"].encode(PROMPT)[:32]
    batch = backends["on"].encode(" = [x for x in xs[1:] if x < pivot]\n    right")[: args.batch]
    runs = {s: [] for s in backends}
    for b in backends.values():  # warm-up
        timed_round(b, prompt, 2, batch)
    for r in range(args.repeats):
        for s in (("on", "off") if r % 2 == 0 else ("off", "on")):
            runs[s].append(timed_round(backends[s], prompt, args.decode, batch))
    gap = float(np.abs(runs["on"][0]["logits"] - runs["off"][0]["logits"]).max())
    same_argmax = bool((runs["on"][0]["logits"].argmax(1) == runs["off"][0]["logits"].argmax(1)).all())
    out = {"file": path, "batch_tokens": len(batch), "max_abs_logit_gap": gap, "same_argmax": same_argmax}
    for s, rs in runs.items():
        out[s] = {k: spread([x[k] for x in rs]) for k in ("decode_tps", "batch_ms", "batch_tps")}
    for b in backends.values():
        b.close()
    return out


def readme(record: dict) -> str:
    lines = ["# llama.cpp extra CPU buffer types (weight repacking): on vs off", "",
             "```bash", record["provenance"]["command"], "```", "",
             f"Machine: {record['provenance']['machine']['processor']}, {record['threads']} threads, "
             f"default native llama-cpp-python {record['provenance']['libraries']['llama-cpp-python']} "
             "build "
             f"(auto on this build: extra_bufts={'on' if record['auto_on'] else 'off'}). "
             f"Medians of {record['repeats']} interleaved repeats, [min-max] in brackets; decode = "
             f"{record['decode']} single-token passes after a 32-token prefill, batch = one pass of "
             f"{record['batch']} tokens. A shared machine: other processes ran meanwhile.", "",
             "| file | extra_bufts | decode tok/s | batched pass ms | batched tok/s | on/off decode | "
             "on/off batched | same argmax | max abs logit gap |",
             "|---|---|---|---|---|---|---|---|---|"]
    def cell(f, s, k, fmt):
        d = f[s][k]
        return f"{d['median']:{fmt}} [{d['min']:{fmt}}-{d['max']:{fmt}}]"

    for f in record["files"]:
        ratio_d = f["on"]["decode_tps"]["median"] / f["off"]["decode_tps"]["median"]
        ratio_b = f["off"]["batch_ms"]["median"] / f["on"]["batch_ms"]["median"]
        for s in ("on", "off"):
            extra = (f"| {ratio_d:.2f}x | {ratio_b:.2f}x | {f['same_argmax']} | "
                     f"{f['max_abs_logit_gap']:.3g} |" if s == "on" else "| | | | |")
            lines.append(f"| {f['name']} | {s} | {cell(f, s, 'decode_tps', '.1f')} | "
                         f"{cell(f, s, 'batch_ms', '.0f')} | {cell(f, s, 'batch_tps', '.1f')} {extra}")
    lines += ["", "A max abs logit gap of 0 means llama.cpp repacked none of that file's weights on this "
              "CPU: the same kernels ran both ways, so its on/off ratios are run-to-run noise of a shared "
              "machine (see the ranges). Where weights are repacked the logits differ slightly (other "
              "kernels), while the greedy argmax agreed here. Turning extra_bufts off (what auto does "
              "on builds with AMX) costs the on/off decode ratio of the repacked files."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_models_dir(ap)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/llama_extra_bufts"))
    args = ap.parse_args()
    take_machine()
    source = args.models_dir / QWEN_15B_GGUF
    files = {"Q4_K_M": str(source), "Q8_0": str(requantize(source, "q8_0")[0]),
             "F16": str(requantize(source, "f16")[0])}
    results = []
    for name, path in files.items():
        print(f"{name}: {path}", file=sys.stderr, flush=True)
        results.append(measure_file(path, args) | {"name": name})
    record = {"provenance": provenance(shlex.join(["python", *sys.argv]), list(files.values())),
              "auto_on": extra_bufts_safe(), "repeats": args.repeats, "decode": args.decode,
              "batch": args.batch, "threads": args.threads, "files": results}
    write_json(args.out / "results.json", record)
    (args.out / "README.md").write_text(readme(record))
    print(readme(record))


if __name__ == "__main__":
    main()
