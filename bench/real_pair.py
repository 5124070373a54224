"""A real draft/target pair on mixed backends: Qwen2.5-Coder 0.5B -> 1.5B (Q4_K_M GGUF target).

    python bench/real_pair.py [--models-dir DIR] [--drafts gguf,mlx,torch] [--out results/real_qwen]

Models (bench/models.py: $SPECMAC_MODELS, default ~/.cache/specmac/models):
../shared/models/materialize.sh DIR qwen (official GGUF files, SHA-256 checked) and, for the mlx and
torch drafts, bench/convert_gguf_to_hf.py of the 0.5B file into DIR/qwen2.5-coder-0.5b-instruct-hf.
For each draft backend: the vocabulary check, then speculative decoding at K = --k and
target-only decoding of the same target, at T = 0 and T = 1, measured by ``specmac.compare.measure``
(a discarded warm-up run each, then rounds of prompt x repeat in which the two alternate, so drift
hits both alike). Per temperature: median acceptance and tokens per target pass over the runs
(one run = one prompt, one repeat), median and range of tokens/s, speedup = median tokens/s of
speculative / median of target-only, and at T = 0 whether every speculative run gave the target's
own greedy text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_05B_HF, QWEN_15B_GGUF, add_models_dir

from specmac.backends import load_backend
from specmac.compare.measure import PLAIN, Config, Loaded, PairSpec, Settings, aggregate, measure
from specmac.compare.results import provenance, write_json
from specmac.core.sampling import SamplingParams
from specmac.core.sources import load_sources

PROMPTS = ["def quicksort(xs):", "# Read a CSV file and print the mean of each column\nimport csv\n"]


def draft_source(name: str, models: Path, threads: int) -> tuple[Path, dict]:
    """The draft model of a backend and its options: the GGUF file for gguf, its HF conversion otherwise."""
    if name == "gguf":
        return models / QWEN_05B_GGUF, {"n_threads": threads}
    return models / QWEN_05B_HF, ({"n_threads": threads} if name == "torch" else {})


def measure_draft(loaded: Loaded, name: str, args: argparse.Namespace) -> dict:
    """Speculative (K = args.k) and target-only runs at T = 0 and T = 1, with compare's measuring."""
    (drafter,) = loaded.drafters[name]
    row = {"draft": name, "target": "gguf", "vocab_check": "compatible",
           "draft_info": drafter.backend.info(), "k": args.k}
    prompts = [{"id": f"p{i}", "text": t} for i, t in enumerate(PROMPTS)]
    spec_id, base_id = Config(name, "gguf", args.k).id, Config(PLAIN, "gguf", 0).id
    for temp in (0.0, 1.0):
        settings = Settings(pairs=[PairSpec(name, "gguf")], ks=[args.k], prompts=prompts,
                            params=SamplingParams(temp), max_tokens=args.max_tokens, repeats=args.repeats)
        runs, interrupted = measure(settings, loaded)
        if interrupted:
            raise SystemExit("interrupted")
        agg = {a["config"]: a for a in aggregate(runs, settings.params.greedy)}
        spec, base = agg[spec_id]["tokens_per_second"], agg[base_id]["tokens_per_second"]
        spec_runs = [r for r in runs if r["config"] == spec_id]
        row[f"T{temp:g}"] = {  # acceptance and tokens per pass: medians over runs, as tokens/s
            "acceptance_rate": statistics.median(r["n_accepted"] / r["n_drafted"]
                                                 for r in spec_runs if r["n_drafted"]),
            "tokens_per_target_pass": statistics.median(r["n_tokens"] / r["n_target_passes"]
                                                        for r in spec_runs),
            "spec_tokens_per_s": spec["median"],
            "spec_tokens_per_s_range": [spec["min"], spec["max"]],
            "target_only_tokens_per_s": base["median"],
            "target_only_tokens_per_s_range": [base["min"], base["max"]],
            "speedup": spec["median"] / base["median"],
            "greedy_identical": agg[spec_id]["greedy_match"] == 1.0 if settings.params.greedy else None,
        }
        print(name, f"T={temp:g}", row[f"T{temp:g}"], flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_models_dir(ap, "--models")
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
    m = args.models_dir
    target_file = m / QWEN_15B_GGUF
    target = load_backend("gguf", str(target_file), {"n_threads": args.threads})
    records, used = [], [target_file]
    for name in args.drafts.split(","):
        model, options = draft_source(name, m, args.threads)
        # loaded one at a time (two fp32 0.5B drafts at once would double the memory); raises on a
        # vocabulary mismatch
        drafter = load_sources(name, str(model), options, target_vocab=target.vocab)
        records.append(measure_draft(Loaded({"gguf": target}, {name: drafter}), name, args))
        used.append(model)
        del drafter
    out = {"provenance": provenance(" ".join(sys.argv), models=list(dict.fromkeys(used))),
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
