"""advise's predicted speedup S(K) next to the measured one, and --k auto vs the best fixed K.

For each pairing: `advise` (measured T_draft(1), the target's T(n) curve, acceptance from runs
on the same prompts and lengths) predicts S(K) for K = 1..16; then target-only decoding and
speculative decoding at several fixed K and at K = auto are timed on those prompts (greedy, so every
method emits the same tokens) by ``specmac.compare.measure.measure``: a discarded warm-up run of each
method, then `repeats` rounds in which every method decodes every prompt once, interleaved. Per
method and round the prompts' tokens and seconds are summed into one tokens/s; measured speedup =
median over rounds of the method / median of target-only (time inside the loop: draft + verify +
sampling, not the prompt's prefill).

Writes results/advise/<pairing>.json (with provenance), advise_vs_measured.png and README.md.
Real models from --models-dir (bench/models.py: $SPECMAC_MODELS, default ~/.cache/specmac/models);
pairings whose model or backend is missing are skipped with the reason printed.

    python bench/advise_vs_measured.py [--only NAME ...] [--repeats R] [--max-tokens N] [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac import assets
from specmac.advise.pairing import advise_pair as advise
from specmac.backends import missing_requirements
from specmac.compare.measure import (
    AUTO,
    PLAIN,
    Config,
    Loaded,
    PairSpec,
    Settings,
    aggregate,
    backend_settings,
    load_models,
    measure,
    spread,
)
from specmac.compare.results import model_files, plot_speedup, provenance, write_json
from specmac.core.policy import AdaptiveK
from specmac.core.prompts import advise_prompts
from specmac.core.replay import replay_greedy
from specmac.core.sampling import SamplingParams

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "advise"
TRACE = REPO / "tests" / "data" / "qwen_greedy_acceptance.json"
# advise's default prompts (code and prose), which advise also measures acceptance on, for as many
# tokens as the timed runs: the comparison tests the cost model, not how well one text predicts another
PROMPTS = advise_prompts()
GREEDY = SamplingParams(0.0)  # every method emits the same tokens, so the timings compare like with like


def pairings(models: Path) -> list[dict]:
    # one thread per model: on this shared 2-core machine two spinning threads were preempted so
    # often that timings were noise (see results/probes/README.md)
    q8 = {"quant": "q8_0", "n_threads": 1}
    t1 = {"n_threads": 1}
    emb = {"max_tokens": 128, "repeats": 5}
    qwen = {"target_model": str(models / QWEN_15B_GGUF), "target_options": t1, "max_tokens": 96,
            "repeats": 3, "ks": (1, 2, 4, 6, 15)}  # 15: llama.cpp's cheap 16-token pass (results/probes)
    return [
        {"name": "embedded-gguf-to-gguf", "target": "gguf", "draft": "gguf", "target_options": q8,
         "draft_options": q8, "needs": [assets.gguf_file("target", "q8_0")], **emb},
        {"name": "embedded-mlx-to-gguf", "target": "gguf", "draft": "mlx", "target_options": q8,
         "draft_options": {"dtype": "float32"}, "needs": [assets.hf_dir("draft") / "config.json"], **emb},
        {"name": "embedded-torch-to-torch", "target": "torch", "draft": "torch",
         "target_options": {"dtype": "float32", **t1}, "draft_options": {"dtype": "float32", **t1},
         "needs": [assets.hf_dir("target") / "config.json"], **emb},
        {"name": "embedded-ngram-to-gguf", "target": "gguf", "draft": "ngram", "target_options": q8,
         "needs": [assets.gguf_file("target", "q8_0")], **emb},
        {"name": "qwen0.5b-to-qwen1.5b-gguf", "target": "gguf", "draft": "gguf",
         "draft_model": str(models / QWEN_05B_GGUF), "draft_options": t1,
         "needs": [models / QWEN_15B_GGUF, models / QWEN_05B_GGUF], **qwen},
        {"name": "ngram-to-qwen1.5b-gguf", "target": "gguf", "draft": "ngram",
         "needs": [models / QWEN_15B_GGUF], **qwen},
    ]


def skip_reason(p: dict) -> str | None:
    for backend in {p["target"], p["draft"]} - {"ngram"}:
        if missing_requirements(backend):
            return f"{backend} backend not installed"
    missing = [str(f) for f in p["needs"] if not Path(f).exists()]
    return f"model not found: {missing[0]}" if missing else None


def settings_of(p: dict, ks: list[int], repeats: int) -> Settings:
    be = backend_settings(
        target_model={p["target"]: p["target_model"]} if p.get("target_model") else None,
        draft_model={p["draft"]: p["draft_model"]} if p.get("draft_model") else None,
        target_opts=[(p["target"], k, v) for k, v in p.get("target_options", {}).items()],
        draft_opts=[(p["draft"], k, v) for k, v in p.get("draft_options", {}).items()])
    return Settings(pairs=[PairSpec(p["draft"], p["target"])], ks=ks,
                    prompts=[{"id": f"p{i}", "text": t} for i, t in enumerate(PROMPTS)],
                    params=GREEDY, max_tokens=p["max_tokens"], repeats=repeats, backends=be)


def summarise(runs: list[dict], agg: dict, histories: list[list[int]] | None) -> dict:
    """tokens/s per round (the prompts' tokens / their seconds): median, min, max over rounds;
    tokens per target pass pooled over all runs; for auto, the K its steps took."""
    rounds: dict[int, list[float]] = {}
    for r in runs:
        rounds.setdefault(r["round"], [0, 0.0])
        rounds[r["round"]][0] += r["n_tokens"]
        rounds[r["round"]][1] += r["seconds"]
    rates = spread([n / s for n, s in rounds.values()])
    passes = sum(r["n_target_passes"] for r in runs)
    out = {"tokens_per_second": rates["median"], "min": rates["min"], "max": rates["max"],
           "tokens_per_pass": sum(r["n_tokens"] for r in runs) / max(passes, 1)}
    ks = [k for h in histories or [] for k in h]
    if ks:
        out["k_chosen_median"] = statistics.median(ks)
        out["share_no_drafts"] = ks.count(0) / len(ks)
    if agg["greedy_match"] is not None:  # share of (prompt, round) runs with target-only's own text
        out["same_text"] = agg["greedy_match"]
    return out


def models_of(loaded: Loaded, p: dict) -> list[str]:
    files = model_files(loaded.targets[p["target"]], p.get("target_model"), "target")
    draft = loaded.drafters[p["draft"]].backend
    if draft is not None:
        files += model_files(draft, p.get("draft_model"), "draft")
    return files


def measure_pairing(p: dict, repeats: int) -> dict:
    first = settings_of(p, [1], repeats)
    loaded = load_models(first)
    rec = advise(loaded.pair(Config(p["draft"], p["target"], 1)), params=GREEDY, prompts=PROMPTS,
                 run_tokens=p["max_tokens"])
    fixed = sorted(set(p.get("ks", (1, 2, 4, 8))) | {rec["best_k"]})
    settings = settings_of(p, [*fixed, AUTO], repeats)
    runs, interrupted = measure(settings, loaded)
    if interrupted:
        raise SystemExit("interrupted")
    agg = {a["config"]: a for a in aggregate(runs, GREEDY.greedy)}
    by_config: dict[str, list[dict]] = {}
    for r in runs:
        by_config.setdefault(r["config"], []).append(r)
    base_id = Config(PLAIN, p["target"], 0).id
    base = summarise(by_config[base_id], agg[base_id], None)
    base.pop("same_text", None)
    measured = []
    for k in [*fixed, "auto"]:
        cid = Config(p["draft"], p["target"], k).id
        histories = [r["k_steps"] for r in by_config[cid] if "k_steps" in r]  # K = auto's choices
        m = summarise(by_config[cid], agg[cid], histories or None)
        m.update(k=k, speedup=m["tokens_per_second"] / base["tokens_per_second"],
                 speedup_min=m["min"] / base["max"], speedup_max=m["max"] / base["min"])
        measured.append(m)
        print(f"  k={k}: {m['tokens_per_second']:.1f} tok/s, speedup {m['speedup']:.2f}", flush=True)
    rec.update(name=p["name"], baseline=base, measured=measured, repeats=repeats, prompts=PROMPTS,
               max_tokens=p["max_tokens"], provenance=provenance(" ".join(sys.argv), models_of(loaded, p)))
    return rec


def rebuild_outputs(out: Path) -> None:
    recs = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    series = [{"label": r["name"], "table": r["table"],
               "measured": [m for m in r["measured"] if m["k"] != "auto"]} for r in recs]
    plot_speedup(series, out / "advise_vs_measured.png",
                 title="predicted S(K) (lines) vs measured speedup (markers), greedy")
    head = (out / "README.head.md").read_text() if (out / "README.head.md").exists() else ""
    rows = ["| pairing | \u03b1 | c | target \u03b2 | predicted best K (S) | measured S at that K "
            "| measured best fixed K (S) | auto S (median K, steps without drafts) | auto / best fixed K "
            "| auto / best of fixed K and target-only |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        fixed = [m for m in r["measured"] if m["k"] != "auto"]
        auto = next(m for m in r["measured"] if m["k"] == "auto")
        best = max(fixed, key=lambda m: m["speedup"])
        at_pred = next(m for m in fixed if m["k"] == r["best_k"])
        rows.append(
            f"| {r['name']} | {r['alpha']:.2f} | {r['c']:.2f} | {r['beta']:.2f} "
            f"| {r['best_k']} ({r['predicted_speedup']:.2f}x) | {at_pred['speedup']:.2f}x "
            f"[{at_pred['speedup_min']:.2f}, {at_pred['speedup_max']:.2f}] "
            f"| {best['k']} ({best['speedup']:.2f}x) | {auto['speedup']:.2f}x "
            f"({auto.get('k_chosen_median', float('nan')):.0f}, {auto.get('share_no_drafts', 0):.0%}) "
            f"| {auto['speedup'] / best['speedup']:.2f} "
            f"| {auto['speedup'] / max(best['speedup'], 1.0):.2f} |")
    per_k = ["| pairing | K | predicted tokens/pass | measured tokens/pass | predicted S "
             "| measured S [min, max] | same text as target-only |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        for m in r["measured"]:
            row = next((row for row in r["table"] if row["k"] == m["k"]), None)
            pred = f"{row['predicted_speedup']:.2f}x" if row else "-"
            e_pred = f"{row['tokens_per_pass']:.2f}" if row else "-"
            e_meas = f"{m['tokens_per_pass']:.2f}" if m.get("tokens_per_pass") else "-"
            same = f"{m['same_text']:.0%}" if "same_text" in m else "-"
            per_k.append(f"| {r['name']} | {m['k']} | {e_pred} | {e_meas} | {pred} "
                         f"| {m['speedup']:.2f}x [{m['speedup_min']:.2f}, {m['speedup_max']:.2f}] | {same} |")
    (out / "README.md").write_text(
        f"{head}\n## Results (regenerated by bench/advise_vs_measured.py)\n\n" + "\n".join(rows)
        + "\n\n### Per K\n\n" + "\n".join(per_k) + "\n" + replay_section())


def replay_section(lengths=(64, 128, 256)) -> str:
    """--k auto against every fixed K replayed on the recorded Qwen traces (the same text for all)."""
    if not TRACE.exists():
        return ""
    data = json.loads(TRACE.read_text())
    t_pass = [t / 1e3 for t in data["target_pass_ms"]]
    t1, t2 = data["draft_pass_ms"] / 1e3, data["draft_two_token_pass_ms"] / 1e3
    lines = ["", "## Replay: `--k auto` vs every fixed K on one text", "",
             f"`{TRACE.relative_to(REPO)}` (bench/acceptance_trace.py) holds where Qwen2.5-Coder-0.5B's "
             "greedy guess agrees with the 1.5B target's own greedy text, for five prompts, and the "
             "measured pass costs. `specmac.core.replay.replay_greedy` replays any policy on it, so every "
             "policy decodes the same text (the timed runs above cannot promise that on Q4_K_M). "
             "auto / best = tokens/s of AdaptiveK / that of the best fixed K for that prompt and length, "
             "K = 0 (target only) included; one thread per model. tests/test_adaptive_replay.py holds "
             "auto against the best K >= 1 to a floor.", "",
             "| prompt | agreement | "
             + " | ".join(f"best fixed K, auto / best ({n} tokens)" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for trace in data["traces"]:
        cells = []
        for n in lengths:
            n = min(n, trace["n_tokens"])
            fixed = {k: replay_greedy(trace["match"], k, n, t_pass, t1, t2) for k in range(0, 17)}
            best = max(fixed, key=fixed.get)
            policy = AdaptiveK(horizon=n)
            policy.set_costs(t_pass, t1)
            auto = replay_greedy(trace["match"], policy, n, t_pass, t1, t2)
            cells.append(f"{best}, {auto / fixed[best]:.2f}")
        agree = trace["match"].count("1") / len(trace["match"])
        lines.append(f"| {trace['prompt'][:32]!r} | {agree:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="pairing names to (re)run; default all")
    ap.add_argument("--repeats", type=int, help="timed rounds (default per pairing)")
    ap.add_argument("--max-tokens", type=int, help="tokens per prompt (default per pairing)")
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=OUT, help=f"default {OUT.relative_to(REPO)}")
    ap.add_argument("--render-only", action="store_true",
                    help="rebuild README.md and the PNG from the JSON files in --out, measuring nothing")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for p in [] if args.render_only else pairings(args.models_dir):
        if args.only and p["name"] not in args.only:
            continue
        why = skip_reason(p)
        if why:
            print(f"skip {p['name']}: {why}", flush=True)
            continue
        print(p["name"], flush=True)
        p["max_tokens"] = args.max_tokens or p["max_tokens"]
        write_json(args.out / f"{p['name']}.json", measure_pairing(p, args.repeats or p["repeats"]))
    rebuild_outputs(args.out)


if __name__ == "__main__":
    main()
