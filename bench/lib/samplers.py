"""The coupled sampler's price on the real pair: acceptance and tokens/s against the rejection rule.

    python bench/losslessness.py samplers [--models-dir DIR] [--out results/samplers]

Qwen2.5-Coder 0.5B Q4_K_M (gguf draft) in front of 1.5B Q4_K_M (gguf target). Per temperature (0.7
and 1), both samplers, target-only and speculative at each K, all on the same prompts and seeds,
interleaved (per repeat and prompt every configuration runs once, in one fixed order, after a
discarded warm-up run each). Under the coupled sampler every speculative run is also compared
with its target-only twin (the same seed must give the same tokens). Then the seed-exact check
(``specmac verify --exact``) on the same pair, and a microbenchmark of what the coupled sampler
adds per position for the target's 151,936-token vocabulary: the Gumbel draw (float32, one per
position, shared by draft and target) and the perturbed argmax, beside the rejection rule's warp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from lib.machine import take_machine
from lib.models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir
from specmac.api import Pair
from specmac.backends import load_backend
from specmac.compare.results import provenance, write_json
from specmac.core.drafters import ModelDrafter
from specmac.core.sampling import SamplingParams, gumbel, perturb, sample, warp
from specmac.lossless.exact import exact_check

PROMPTS = ["def quicksort(xs):",
           "# Read a CSV file and print the mean of each column\nimport csv\n",
           "class LRUCache:\n    def __init__(self, capacity):"]
SAMPLERS = ("rejection", "coupled")


def configs(ks: list[int]) -> list[tuple[str, int]]:
    """(sampler, K) in measuring order; K = 0 is target-only."""
    return [(s, k) for s in SAMPLERS for k in [0, *ks]]


def measure(pair: Pair, args: argparse.Namespace, temps: tuple[float, ...]) -> list[dict]:
    """Rounds of (temperature x prompt x configuration); after a complete round, stops once
    --budget-s has passed (the rounds kept are complete, so every configuration has as many runs)."""
    base = pair.plain()
    ids = [pair.encode(p) for p in PROMPTS[: args.n_prompts]]
    order = configs(args.ks)
    for temp in temps:
        for s, k in order:  # warm-up, not recorded
            (base if k == 0 else pair).generate(ids[0], params=SamplingParams(temp, sampler=s), k=max(k, 1),
                                                max_tokens=8, seed=0)
    runs, t0 = [], time.perf_counter()
    for r in range(args.repeats):
        for temp in temps:
            for i, prompt in enumerate(ids):
                seed = 1000 * r + i
                for s, k in order:
                    params = SamplingParams(temp, sampler=s)
                    g = (base if k == 0 else pair).generate(prompt, params=params, k=max(k, 1),
                                                            max_tokens=args.max_tokens, seed=seed)
                    st = g.stats
                    runs.append({"T": temp, "sampler": s, "k": k, "prompt": i, "round": r, "seed": seed,
                                 "n_tokens": st.n_tokens, "n_drafted": st.n_drafted,
                                 "n_accepted": st.n_accepted, "n_target_passes": st.n_target_passes,
                                 "seconds": st.seconds, "tokens_per_second": st.tokens_per_second,
                                 "token_ids": g.token_ids})
                print(f"round {r} T={temp:g} prompt {i} done, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget spent after round {r}", file=sys.stderr)
            break
    return runs


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for (temp, s, k) in dict.fromkeys((r["T"], r["sampler"], r["k"]) for r in runs):
        rs = [r for r in runs if (r["T"], r["sampler"], r["k"]) == (temp, s, k)]
        base = {(r["prompt"], r["round"]): r for r in runs if (r["T"], r["sampler"], r["k"]) == (temp, s, 0)}
        tps = [r["tokens_per_second"] for r in rs]
        row = {"T": temp, "sampler": s, "k": k, "n_runs": len(rs),
               "tokens_per_second": statistics.median(tps), "tokens_per_second_range": [min(tps), max(tps)],
               "acceptance": (sum(r["n_accepted"] for r in rs) / sum(r["n_drafted"] for r in rs)
                              if k else None),
               "tokens_per_target_pass": (sum(r["n_tokens"] for r in rs)
                                          / sum(r["n_target_passes"] for r in rs))}
        if k:
            row["speedup_vs_own_target_only"] = statistics.median(
                r["tokens_per_second"] / base[r["prompt"], r["round"]]["tokens_per_second"] for r in rs)
            if s == "coupled":
                row["identical_to_target_only"] = sum(
                    r["token_ids"] == base[r["prompt"], r["round"]]["token_ids"] for r in rs)
        rows.append(row)
    return rows


def noise_cost(V: int, n: int = 200) -> dict:
    """Median ms per position of the coupled sampler's pieces and of the rejection rule's warp."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(V) * 3).astype(np.float32)
    plain, filtered = SamplingParams(1.0, sampler="coupled"), SamplingParams(1.0, top_k=40, top_p=0.9,
                                                                             sampler="coupled")
    g = gumbel(0, 0, V)
    cases = {"gumbel draw (per position)": lambda j: gumbel(1, j, V),
             "perturbed argmax, T=1": lambda j: int(np.argmax(perturb(logits, plain, g))),
             "perturbed argmax, top-k 40 top-p 0.9": lambda j: int(np.argmax(perturb(logits, filtered, g))),
             "rejection: warp + sample, T=1": lambda j: sample(warp(logits, plain), rng),
             "rejection: warp + sample, top-k 40 top-p 0.9": lambda j: sample(warp(logits, filtered), rng)}
    out = {}
    for name, f in cases.items():
        f(0)
        ts = []
        for j in range(n):
            t = time.perf_counter()
            f(j)
            ts.append(time.perf_counter() - t)
        out[name] = {"median_ms": 1e3 * statistics.median(ts), "p25_ms": 1e3 * float(np.percentile(ts, 25)),
                     "p75_ms": 1e3 * float(np.percentile(ts, 75))}
        print(name, f"{out[name]['median_ms']:.3f} ms", file=sys.stderr, flush=True)
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/losslessness.py samplers",
                                 description=__doc__.splitlines()[0])
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=Path("results/samplers"))
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--n-prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact-sequences", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=420,
                    help="stop measuring after the round that passes it")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args(argv)
    if args.plot_only:
        return render(json.loads((args.out / "results.json").read_text()), args.out)
    take_machine()
    m = args.models_dir
    files = [m / QWEN_15B_GGUF, m / QWEN_05B_GGUF]
    target = load_backend("gguf", str(files[0]), {"n_threads": args.threads}, role="target")
    draft = load_backend("gguf", str(files[1]), {"n_threads": args.threads}, role="draft")
    pair = Pair(target, ModelDrafter(draft))
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    runs = measure(pair, args, (0.7, 1.0))
    t_measure = time.perf_counter() - t0
    exact = exact_check(pair, params=SamplingParams(1.0), n_sequences=args.exact_sequences, length=32,
                        k=max(args.ks))
    exact.pop("sequences")
    command = " ".join(["python", "bench/losslessness.py", "samplers", *argv])
    out = {"provenance": provenance(command, models=files),
           "target_info": target.info(), "draft_info": draft.info(), "prompts": PROMPTS[: args.n_prompts],
           "max_tokens": args.max_tokens, "repeats": args.repeats, "ks": args.ks,
           "measure_seconds": t_measure, "load_average_before": load_before,
           "load_average_after": os.getloadavg(), "summary": summarize(runs),
           "runs": [{k: v for k, v in r.items() if k != "token_ids"} for r in runs],
           "verify_exact": exact, "noise_cost": noise_cost(target.vocab.size),
           "vocab_size": target.vocab.size}
    write_json(args.out / "results.json", out)
    render(out, args.out)


def render(out: dict, folder: Path) -> None:
    """table.md and samplers.png from the results record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["summary"]
    lines = ["| T | sampler | K | acceptance | tokens/pass | tok/s (median, range) | vs own target-only "
             "| identical to target-only |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{r['acceptance']:.1%}" if r["acceptance"] is not None else "-"
        sp = f"{r['speedup_vs_own_target_only']:.2f}x" if r["k"] else "-"
        ident = (f"{r['identical_to_target_only']} of {r['n_runs']}" if "identical_to_target_only" in r
                 else "-")
        lo, hi = r["tokens_per_second_range"]
        lines.append(f"| {r['T']:g} | {r['sampler']} | {r['k'] or 'target-only'} | {acc} | "
                     f"{r['tokens_per_target_pass']:.2f} | {r['tokens_per_second']:.1f} "
                     f"({lo:.1f}-{hi:.1f}) | {sp} | {ident} |")
    lines += ["", f"| per position, V = {out['vocab_size']} | median ms (p25-p75) |", "|---|---|"]
    for name, c in out["noise_cost"].items():
        lines.append(f"| {name} | {c['median_ms']:.3f} ({c['p25_ms']:.3f}-{c['p75_ms']:.3f}) |")
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "acceptance", "acceptance"), (axes[1], "tokens_per_second", "tokens/s")):
        for s, off in (("rejection", -0.2), ("coupled", 0.2)):
            sel = [r for r in rows if r["sampler"] == s and (r["k"] or key == "tokens_per_second")]
            xs = np.arange(len(sel)) + off
            ax.bar(xs, [r[key] for r in sel], width=0.4, label=s)
            ax.set_xticks(np.arange(len(sel)), [f"T={r['T']:g}\n{'K=' + str(r['k']) if r['k'] else 'plain'}"
                                                for r in sel], fontsize=7)
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("Qwen2.5-Coder 0.5B -> 1.5B (Q4_K_M, llama.cpp): coupled vs rejection sampler")
    fig.tight_layout()
    fig.savefig(folder / "samplers.png", dpi=120)


if __name__ == "__main__":
    main()
