"""specmac's lookup and hybrid drafts against the peers' own prompt lookup, end to end, per category.

    flock /tmp/specmac-bench.lock python bench/workload_peers.py --target-backend torch \
        --target-model DIR --target-opt dtype=bfloat16 --out results/workload_peers/torch-bf16

The packaged workload's prompts of ``--categories`` (default summarization and code editing: where
the output copies the prompt) through the target's chat template, greedy, on one target; every
configuration once per round, each round in an order rotated by one, after a discarded warm-up
round. End to end: the wall time of the whole call, prompt processing included, for specmac and
the peers alike (specmac's ``--k auto`` pass costs are timed in the warm-up round and kept, as on
a user's second run).

* specmac: plain decoding, prompt lookup (``lookup``) and the hybrid (``lookup+gguf``, the 0.5B
  Q4_K_M draft), each with ``--k auto``;
* the peers on the same weights: on a GGUF target llama-cpp-python's ``Llama`` plain and with its
  prompt-lookup draft (10 and 3 tokens), on a torch target transformers' ``generate`` plain and
  with ``prompt_lookup_num_tokens`` 3 and 10.

Writes results.json (runs, medians, provenance) and README.md (the table, the command).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir
from peers import HFGenerate, LlamaGenerate

from specmac.api import Pair
from specmac.compare.measure import rotated
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.compare.results import provenance, write_json
from specmac.core.sampling import SamplingParams
from specmac.core.sources import load_sources

GREEDY = SamplingParams(0.0)


def specmac_run(pair: Pair, k):
    def run(text: str, n: int) -> dict:
        t0 = time.perf_counter()
        g = pair.generate(text, params=GREEDY, max_tokens=n, k=k)
        wall = time.perf_counter() - t0
        return {"tokens": len(g.token_ids), "seconds": wall, "tokens_per_second": len(g.token_ids) / wall,
                "text": g.text, "target_passes": g.stats.n_target_passes,
                "steps_by_source": dict(g.stats.sources)}
    return run


def configurations(args, target: str, draft: str, topts: dict) -> tuple[dict, object]:
    tb = args.target_backend
    plain = Pair.load(tb, None, target_model=target, target_options=topts)
    vocab = plain.target.vocab
    lookup = Pair(plain.target, load_sources("lookup", target_vocab=vocab))
    hybrid = Pair(plain.target, load_sources("lookup+gguf", draft, target_vocab=vocab))
    out = {"specmac plain": specmac_run(plain.plain(), 1),
           "specmac lookup (K auto)": specmac_run(lookup, "auto"),
           "specmac lookup+gguf (K auto)": specmac_run(hybrid, "auto")}
    if tb == "gguf":
        path = Path(plain.target.resolved["path"])
        out |= {"llama-cpp-python plain": LlamaGenerate(path, None),
                "llama-cpp-python prompt lookup (10)": LlamaGenerate(path, 10),
                "llama-cpp-python prompt lookup (3)": LlamaGenerate(path, 3)}
    else:
        out |= {"transformers plain": HFGenerate(plain.target, None),
                "transformers prompt lookup (3)": HFGenerate(plain.target, 3),
                "transformers prompt lookup (10)": HFGenerate(plain.target, 10)}
    return out, plain.target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--target-backend", default="gguf", choices=["gguf", "torch"])
    ap.add_argument("--target-model", help=f"default: MODELS_DIR/{QWEN_15B_GGUF}")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--categories", default="summarization,code_editing")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--edit-tokens", type=int, default=256, help="new tokens for code editing (default 256)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/workload_peers"))
    ap.add_argument("--no-chat", action="store_true", help="the prompts' text without a chat template")
    ap.add_argument("--configs", default=None, metavar="NAME,...",
                    help="run only the configurations whose names hold one of these (specmac plain, whose "
                         "text the others are checked against, always runs): more rounds in the same time")
    args = ap.parse_args()
    target = args.target_model or str(args.models_dir / QWEN_15B_GGUF)
    draft = str(args.models_dir / QWEN_05B_GGUF)
    topts = dict(kv.split("=", 1) for kv in args.target_opt)
    cats = args.categories.split(",")
    seen: dict[str, int] = {}
    prompts = []
    for p in read_prompts(PACKAGED_WORKLOAD, turns="all"):
        if p["category"] in cats and seen.get(p["category"], 0) < args.per_category:
            seen[p["category"]] = seen.get(p["category"], 0) + 1
            prompts.append(p)
    configs, tb = configurations(args, target, draft, topts)
    if args.configs:
        configs_all = list(configs)
        wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
        configs = {name: fn for name, fn in configs.items()
                   if name == "specmac plain" or any(w in name for w in wanted)}
        if len(configs) < 2:
            ap.error(f"--configs {args.configs!r} names no configuration besides specmac plain: use parts of "
                     f"these names: {', '.join(n for n in configs_all if n != 'specmac plain')}")
    texts = {p["id"]: p["text"] if args.no_chat else tb.apply_chat_template(p.get("messages") or p["text"])
             for p in prompts}
    runs = []
    names = list(configs)
    for rnd in range(-1, args.rounds):  # -1: the warm-up round, discarded
        # round n starts at the n-th configuration, as compare's rounds do: none always runs first
        order = rotated(names, rnd) if rnd >= 0 else names
        for p in prompts:
            for name in order:
                fn = configs[name]
                n = args.edit_tokens if p["category"] == "code_editing" else args.max_tokens
                r = fn(texts[p["id"]], n if rnd >= 0 else 8)
                print(f"round {rnd} {p['id']} {name}: {r['tokens_per_second']:.2f} tok/s", file=sys.stderr,
                      flush=True)
                if rnd >= 0:
                    runs.append({"round": rnd, "prompt": p["id"], "category": p["category"], "config": name,
                                 **r})
    command = "flock /tmp/specmac-bench.lock python bench/workload_peers.py " + shlex.join(sys.argv[1:])
    table = medians(runs, prompts, list(configs))
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"format": "specmac.bench.workload_peers/1",
              "provenance": provenance(command, [target, draft]),
              "settings": {k: str(v) for k, v in vars(args).items()}, "target_opt": args.target_opt,
              "target_resolved": {
                  k: v for k, v in tb.resolved.items() if k != "path"},
              "prompt_tokens": {i: len(tb.encode(t)) for i, t in texts.items()}, "medians": table,
              "runs": runs}
    write_json(args.out / "results.json", record)
    (args.out / "README.md").write_text(readme(record, command, list(configs)), "utf-8")
    print((args.out / "README.md").read_text())


def is_peer_lookup(name: str) -> bool:
    return "lookup" in name and not name.startswith("specmac")


def medians(runs: list[dict], prompts: list[dict], names: list[str]) -> list[dict]:
    """Per category and configuration: the median end-to-end tokens/s over rounds and prompts, its
    range, whether every text equals specmac's plain text for the same prompt and round, and its
    ratio to the best peer lookup of the same prompt and round (``vs_peer_rounds``: the machine
    drifts between rounds, less within one)."""
    plain = {(r["prompt"], r["round"]): r["text"] for r in runs if r["config"] == "specmac plain"}
    best_peer: dict[tuple, float] = {}
    for r in runs:
        if is_peer_lookup(r["config"]):
            key = (r["prompt"], r["round"])
            best_peer[key] = max(best_peer.get(key, 0.0), r["tokens_per_second"])
    out = []
    for cat in dict.fromkeys(p["category"] for p in prompts):
        for name in names:
            rs = [r for r in runs if r["category"] == cat and r["config"] == name]
            tps = [r["tokens_per_second"] for r in rs]
            out.append({"category": cat, "config": name, "tokens_per_second": statistics.median(tps),
                        "min": min(tps), "max": max(tps),
                        "tokens": statistics.median(r["tokens"] for r in rs),
                        "same_text_as_plain": all(r["text"] == plain[(r["prompt"], r["round"])] for r in rs),
                        "vs_peer_rounds": [r["tokens_per_second"] / best_peer[(r["prompt"], r["round"])]
                                           for r in rs if (r["prompt"], r["round"]) in best_peer]})
    return out


def readme(record: dict, command: str, names: list[str]) -> str:
    s, rows = record["settings"], record["medians"]
    opts = "".join(f", {kv}" for kv in record["target_opt"])
    lines = [f"# Prompt lookup end to end: specmac against the peers ({s['target_backend']} "
             f"`{Path(s['target_model'] if s['target_model'] != 'None' else QWEN_15B_GGUF).name}`{opts})", "",
             "```bash", command, "```", "",
             "Prompts of the packaged workload ("
             + ", ".join(f"{k}: {v} tokens" for k, v in record["prompt_tokens"].items()) + ")"
             f" through the chat template, greedy, {s['max_tokens']} new tokens "
             f"({s.get('edit_tokens', s['max_tokens'])} for code editing), {s['rounds']} rounds "
             "after a discarded warm-up round, every configuration once a round, the order rotated by one "
             "each round. tokens/s end to end (prompt "
             "processing included), median [min, max]; 'vs plain' against the fastest plain decoder here; "
             "'vs best peer' against the best of the peers' prompt lookup; 'per round' against the best peer "
             "lookup of the same prompt and round, median [min, max]. "
             f"git {record['provenance'].get('git_sha')}.", "",
             "| category | configuration | tokens/s | vs plain | vs best peer lookup | per round "
             "| same text as plain |",
             "|---|---|---:|---:|---:|---:|---|"]
    for cat in dict.fromkeys(r["category"] for r in rows):
        here = [r for r in rows if r["category"] == cat]
        plain = max(r["tokens_per_second"] for r in here if "plain" in r["config"])
        peer = max((r["tokens_per_second"] for r in here if is_peer_lookup(r["config"])), default=None)
        for r in here:
            vs_peer = f"{r['tokens_per_second'] / peer:.2f}x" if peer else "-"
            cell = f"{r['tokens_per_second']:.1f} [{r['min']:.1f}, {r['max']:.1f}]"
            ratio = r["tokens_per_second"] / plain
            pr = r.get("vs_peer_rounds") or []
            rounds = f"{statistics.median(pr):.2f}x [{min(pr):.2f}, {max(pr):.2f}]" if pr else "-"
            lines.append(f"| {cat} | {r['config']} | {cell} | {ratio:.2f}x | {vs_peer} | {rounds} | "
                         f"{r['same_text_as_plain']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
