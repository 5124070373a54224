"""A real draft/target pair on mixed backends: Qwen2.5-Coder 0.5B -> 1.5B (Q4_K_M GGUF target).

    python bench/real_pair.py --models ~/.cache/specmac/models --out results/real_qwen

Models: ../shared/models/materialize.sh DIR qwen (official GGUF files, SHA-256 checked) and,
for the mlx and torch drafts, bench/convert_gguf_to_hf.py of the 0.5B file into DIR/<name>-hf.
For each draft backend: the vocabulary check, acceptance at K=4 (T=0 and T=1) and tokens/s
against target-only decoding, measured side by side (A B A B ...) in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.drafters import ModelDrafter, NoDraft
from specmac.results import provenance, write_json
from specmac.sampling import SamplingParams
from specmac.vocab import check_compatible

PROMPTS = ["def quicksort(xs):", "# Read a CSV file and print the mean of each column\nimport csv\n"]
DRAFT_05 = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TARGET_15 = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def run(pair: Pair, params: SamplingParams, max_tokens: int, k: int, seed: int) -> list:
    return [pair.generate(p, params=params, max_tokens=max_tokens, k=k, seed=seed) for p in PROMPTS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=Path, default=Path("~/.cache/specmac/models").expanduser())
    ap.add_argument("--out", type=Path, default=Path("results/real_qwen"))
    ap.add_argument("--drafts", default="gguf,mlx,torch")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot-only", action="store_true", help="re-render table and PNG from results.json")
    args = ap.parse_args()
    if args.plot_only:
        return render(json.loads((args.out / "results.json").read_text()), args.out)
    m = args.models.expanduser()
    target = load_backend("gguf", str(m / TARGET_15), {"n_threads": args.threads})
    drafts = {
        "gguf": lambda: load_backend("gguf", str(m / DRAFT_05), {"n_threads": args.threads}, role="draft"),
        "mlx": lambda: load_backend("mlx", str(m / "qwen2.5-coder-0.5b-instruct-hf"), role="draft"),
        "torch": lambda: load_backend("torch", str(m / "qwen2.5-coder-0.5b-instruct-hf"),
                                      {"n_threads": args.threads}, role="draft"),
    }
    base = Pair(target, NoDraft())
    records = []
    for name in args.drafts.split(","):
        db = drafts[name]()
        check_compatible(db.vocab, target.vocab)  # raises on mismatch
        pair = Pair(target, ModelDrafter(db))
        row = {"draft": name, "target": "gguf", "vocab_check": "compatible",
               "draft_info": db.info(), "k": args.k}
        for temp in (0.0, 1.0):
            params = SamplingParams(temp)
            spec_tps, base_tps, acc, tpp, same = [], [], [], [], []
            for r in range(args.repeats):  # interleaved: drift hits both alike
                s = run(pair, params, args.max_tokens, args.k, seed=r)
                b = run(base, params, args.max_tokens, args.k, seed=r)
                spec_tps += [g.stats.tokens_per_second for g in s]
                base_tps += [g.stats.tokens_per_second for g in b]
                acc += [g.stats.acceptance_rate for g in s]
                tpp += [g.stats.tokens_per_target_pass for g in s]
                same += [gs.token_ids == gb.token_ids for gs, gb in zip(s, b)]
            row[f"T{temp:g}"] = {
                "acceptance_rate": statistics.median(acc),
                "tokens_per_target_pass": statistics.median(tpp),
                "spec_tokens_per_s": statistics.median(spec_tps),
                "spec_tokens_per_s_range": [min(spec_tps), max(spec_tps)],
                "target_only_tokens_per_s": statistics.median(base_tps),
                "target_only_tokens_per_s_range": [min(base_tps), max(base_tps)],
                "speedup": statistics.median(spec_tps) / statistics.median(base_tps),
                "greedy_identical": all(same) if temp == 0 else None,
            }
            print(name, f"T={temp:g}", row[f"T{temp:g}"], flush=True)
        records.append(row)
        del pair, db
    out = {"provenance": provenance(models=[m / TARGET_15, m / DRAFT_05]),
           "target_info": target.info(), "prompts": PROMPTS, "max_tokens": args.max_tokens,
           "repeats": args.repeats, "records": records}
    write_json(args.out / "results.json", out)
    render(out, args.out)


def render(out: dict, folder: Path) -> None:
    """table.md (the README table) and speedup.png from the results record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = out["records"]
    lines = ["| draft -> target | T | acceptance | tokens/pass | spec tok/s | target-only tok/s | speedup |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        for t in ("T0", "T1"):
            x = r[t]
            lines.append(f"| {r['draft']} -> gguf | {t[1:]} | {x['acceptance_rate']:.1%} | "
                         f"{x['tokens_per_target_pass']:.2f} | {x['spec_tokens_per_s']:.1f} | "
                         f"{x['target_only_tokens_per_s']:.1f} | {x['speedup']:.2f}x |")
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    names = [f"{r['draft']} -> gguf" for r in records]
    for i, t in enumerate(("T0", "T1")):
        ax.bar([j + 0.38 * i for j in range(len(records))], [r[t]["speedup"] for r in records], 0.38,
               label=f"temperature {t[1:]}")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="target only (1.0)")
    ax.set_xticks([j + 0.19 for j in range(len(records))], names)
    ax.set_ylabel("speedup over target-only (median tokens/s ratio)")
    ax.set_xlabel("draft backend -> target backend")
    ax.set_title(f"Qwen2.5-Coder 0.5B -> 1.5B Q4_K_M, K={records[0]['k']}, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "speedup.png", dpi=120)


if __name__ == "__main__":
    main()
