"""What a run's steps cost per width, against the pass costs ``--k auto`` measured before it.

    SPECMAC_CACHE=$(mktemp -d) flock /tmp/specmac-bench.lock python bench/step_costs.py \
        --models-dir /work/models --draft lookup --categories rag --out results/step_costs/q4_rag_lookup

Runs one drafter with ``--k auto`` over the prompts of the packaged workload's categories (through
the chat template, greedy, ``--rounds`` times) and records every step's target time (the pass and
the loop's work on its rows) by its width n. The table puts each width's median beside the curve
the policy started from (``specmac.core.calibration``: timed at a 16-token context), both as
seconds and as a ratio to T(1). The curve is the probe's; how the run corrects it for widths it has
not timed (``specmac.core.estimate``) is what this measures: whether a run slower than the probe
is slower by a difference (every width the same milliseconds) or by a ratio.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np
from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.api import Pair
from specmac.compare.results import provenance, write_json
from specmac.core.policy import FixedK
from specmac.core.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.core.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--target-backend", default="gguf")
    ap.add_argument("--target-model", help="default: MODELS_DIR/the 1.5B Q4_K_M file")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--draft", default="lookup", help="lookup, ngram, gguf, lookup+gguf, ...")
    ap.add_argument("--categories", default="rag")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--plain", action="store_true",
                    help="also decode every prompt plainly, in turn: one-token steps at the same contexts")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    target_model = args.target_model or str(args.models_dir / QWEN_15B_GGUF)
    model_draft = args.draft not in ("lookup", "ngram")
    pair = Pair.load(args.target_backend, args.draft, target_model=target_model,
                     draft_model=str(args.models_dir / QWEN_05B_GGUF) if model_draft else None,
                     target_options=dict(o.split("=", 1) for o in args.target_opt) or None)
    cats = args.categories.split(",")
    prompts = [p for p in read_prompts(PACKAGED_WORKLOAD) if p["category"] in cats]
    steps, curve = collections.defaultdict(list), None
    for r in range(args.rounds):
        for p in prompts:
            ids = pair.target.encode(pair.target.apply_chat_template(p["text"]))
            policy = pair.timed_auto_policy(args.max_tokens, len(ids))
            inner = getattr(policy, "inner", policy)
            if curve is None:
                curve = inner.costs.curve()[: inner.costs.measured + 1].tolist()
            for k in ([policy, FixedK(0)] if args.plain else [policy]):  # FixedK(0): plain steps
                for ev in pair.stream(ids, k=k, max_tokens=args.max_tokens, params=SamplingParams(0.0)):
                    steps[ev.n_drafted + 1].append(ev.t_target + ev.t_other)
            print(p["id"], "round", r + 1, file=sys.stderr, flush=True)
    t1 = float(np.median(steps[1])) if steps.get(1) else None
    rows = [{"width": n, "steps": len(v), "median_s": float(np.median(v)), "probe_s": curve[n],
             "ratio_to_run_t1": float(np.median(v)) / t1 if t1 else None,
             "probe_ratio": curve[n] / curve[1], "over_probe": float(np.median(v)) / curve[n]}
            for n, v in sorted(steps.items()) if n < len(curve)]
    command = "python bench/step_costs.py " + " ".join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "results.json", {"format": "specmac.bench.step_costs/1",
                                           "provenance": provenance(command, [target_model]),
                                           "probe_curve_s": curve, "rows": rows})
    name = Path(target_model).name
    lines = [f"# A run's steps by width against the probe's curve ({args.draft} on {name})",
             "", f"`{command}`", "",
             f"Categories {args.categories}, {len(prompts)} prompts, {args.rounds} rounds, greedy, K auto, "
             f"{args.max_tokens} new tokens{', each prompt decoded plainly too' if args.plain else ''}. "
             "Step: the target's pass and the loop's work on its rows.", "",
             "| width n | steps | run median ms | probe ms | run / probe | run T(n)/T(1) | probe T(n)/T(1) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['width']} | {r['steps']} | {r['median_s'] * 1e3:.1f} | {r['probe_s'] * 1e3:.1f} | "
              f"{r['over_probe']:.2f} | {r['ratio_to_run_t1'] or float('nan'):.2f} | {r['probe_ratio']:.2f} |"
              for r in rows]
    (args.out / "README.md").write_text("\n".join([*lines, ""]), "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
