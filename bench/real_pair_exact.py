"""The lookup and a model on every backend pairing of the real pair: greedy output equal to plain decoding's.

    SPECMAC_CACHE=/path/kept flock /tmp/specmac-bench.lock python bench/real_pair_exact.py \
        --models-dir /work/models --out results/real_pair_exact

The Qwen2.5-Coder 1.5B target as the F16 GGUF file on each target backend (gguf reads it as it is;
torch and mlx load specmac's own fp32 conversion of it, as ``--target torch|mlx`` does with a
.gguf), the 0.5B Q4_K_M file as the hybrid's model on each draft backend (``lookup+gguf``,
``lookup+torch``, ``lookup+mlx``; torch and mlx through the same conversion, fp32), at K = 4 and
K = auto, greedy, on packaged-workload prompts through the chat template: one where the answer
copies the prompt (a code edit: the lookup drafts) and one where it does not (a question). On these
CPU targets the costs rarely start the model, so ``K = 4m`` runs the hybrid with its model drafting
every step the lookup does not (``ModelFirst``): both halves and the switch between them.
Every run's token ids are compared with plain decoding's on the same target; the steps by source
say which half of the hybrid the check exercised (a run the model never drafted in checks only the
lookup). On fp32 and F16 targets a batched pass and a one-token pass have agreed to the argmax on
every text measured here (results/workloads_f16_auto: 28 of 28), so a difference points to a bug
before rounding (docs/losslessness.md).

Writes results.json (every run, provenance) and README.md (the table, the command). A check of
output, not a timing: there is no figure; tokens/s are kept in results.json only as a note. A run
that parts from plain is diagnosed by ``specmac.lossless.greedy.diagnose`` (a near-tie flip, or a
bug). ``--plant`` shows the check's power: with a target whose batched passes return each row one
position late, every run that drafted must part from plain (results/real_pair_exact/planted).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from models import QWEN_05B_GGUF, add_models_dir

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.compare.results import provenance, write_json
from specmac.core.drafters import ModelDrafter
from specmac.core.lookup import LookupDrafter
from specmac.core.planner import Planner
from specmac.core.sampling import SamplingParams
from specmac.lossless.greedy import diagnose

TARGET_F16 = "qwen2.5-coder-1.5b-instruct-f16.gguf"
GREEDY = SamplingParams(0.0)


class ModelFirst(Planner):
    """A planner whose model drafts every step the lookup does not (``K = 4m``): where the costs
    would choose a plain step (on these targets, most steps outside a copy), the model drafts K.
    Which source drafts does not change what the target accepts, so this checks the model and the
    switching between the sources on every pairing, where the costs would rarely start it."""

    def choose(self, record, offers, behind, room):
        source, width = super().choose(record, offers, behind, room)
        model = next(iter(behind), None)
        if source is None and model is not None and room:
            return model, min(self.k, room)
        return source, width


def report(args, runs: list[dict], chosen: list[dict], target_file: Path, draft_file: Path) -> list[str]:
    """Write results.json and README.md for the runs so far (after every run: a long check that is
    stopped keeps what it checked)."""
    command = "python bench/real_pair_exact.py " + shlex.join(sys.argv[1:])
    write_json(args.out / "results.json", {"format": "specmac.bench.real_pair_exact/1",
                                           "provenance": provenance(command, [target_file, draft_file]),
                                           "runs": runs})
    checked = [r for r in runs if r["draft"] != "none"]
    same = sum(r["same"] for r in checked)
    lines = ["# The lookup and a model on every backend pairing of the real pair: greedy output against "
             "plain", "",
             f"`{command}`", "",
             f"Qwen2.5-Coder 1.5B `{TARGET_F16}` as the target (gguf as it is; torch and mlx: specmac's fp32 "
             f"conversion of it), the 0.5B `{QWEN_05B_GGUF}` as the hybrid's model (fp32 conversion on torch "
             f"and mlx); greedy, {args.max_tokens} new tokens, prompts {', '.join(p['id'] for p in chosen)} "
             "through the chat template; K 4m: K = 4 with the model drafting every step the lookup does not. "
             "Steps by source: which half of the hybrid drafted (a run "
             "whose model never drafted checked only its lookup half); drafted and kept: all its drafts.", "",
             *(["**Planted bug** (`--plant`): the target's batched passes return each row one position "
                "late; every run that drafted must part from plain.", ""] if args.plant else []),
             f"**{same} of {len(checked)} runs give plain decoding's token ids.**", "",
             "| target | hybrid | K | prompt | same ids as plain | steps by source | drafted | kept |",
             "|---|---|---|---|---|---|---:|---:|"]
    for r in checked:
        lines.append(f"| {r['target']} | {r['draft']} | {r['k']} | {r['prompt']} | {r['same']} | "
                     + ", ".join(f"{s} {n}" for s, n in r["steps_by_source"].items())
                     + f" | {r['n_drafted']} | {r['n_accepted']} |")
    (args.out / "README.md").write_text("\n".join(lines + [""]), "utf-8")
    return lines


def plant(target) -> None:
    """A planted bug (``--plant``): the target's passes over more than one token return each row one
    position late, the off-by-one a mis-indexed verification makes; one-token passes, and so plain
    decoding's steps, are untouched. Every run that verified a draft must then part from plain."""
    base = type(target)

    class Planted(base):
        def score(self, tokens):
            rows = base.score(self, tokens)
            return rows if len(tokens) < 2 else np.roll(rows, 1, axis=0)

    target.__class__ = Planted


def check_target(args, tname: str, chosen: list[dict], target_file: Path, draft_file: Path,
                 runs: list[dict]) -> None:
    """Plain decoding, then every hybrid run, on one target (freed on return, before the next loads)."""
    t0 = time.perf_counter()
    target = load_backend(tname, str(target_file), None, role="target")
    if args.plant:
        plant(target)
    print(f"target {tname}: loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    ids = {p["id"]: target.encode(target.apply_chat_template(p.get("messages") or p["text"])) for p in chosen}
    plain = {}
    for p in chosen:
        g = Pair(target).generate(ids[p["id"]], params=GREEDY, k=1, max_tokens=args.max_tokens)
        plain[p["id"]] = g.token_ids
        runs.append({"target": tname, "draft": "none", "k": None, "prompt": p["id"], "same": True,
                     "n_tokens": len(g.token_ids), "tokens_per_second": g.stats.tokens_per_second})
    for dname in args.drafts.split(","):
        t0 = time.perf_counter()
        model = ModelDrafter(load_backend(dname, str(draft_file), None, role="draft"))
        print(f"  draft {dname}: loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        for k in args.ks.split(","):
            for p in chosen:
                model.trim(0)
                pair = Pair(target, [LookupDrafter(), model])
                kk = k if k == "auto" else int(k.rstrip("m"))
                if k.endswith("m"):
                    kk = ModelFirst(pair.sources, k=int(k.rstrip("m")))
                g = pair.generate(ids[p["id"]], params=GREEDY, k=kk, max_tokens=args.max_tokens)
                s = g.stats.to_dict()
                row = {"target": tname, "draft": f"lookup+{dname}", "k": k, "prompt": p["id"],
                       "same": g.token_ids == plain[p["id"]], "n_tokens": s["n_tokens"],
                       "n_drafted": s["n_drafted"], "n_accepted": s["n_accepted"],
                       "steps_by_source": s["steps_by_source"], "tokens_per_second": s["tokens_per_second"]}
                if not row["same"] and not args.plant:  # where and why: a near-tie flip, or a bug
                    model.trim(0)
                    row["parting"] = diagnose(pair, ids[p["id"]], k=kk, max_tokens=args.max_tokens)
                runs.append(row)
                print(f"  {tname} lookup+{dname} k={k} {p['id']}: same={row['same']} "
                      f"steps {row['steps_by_source']}", file=sys.stderr, flush=True)
                report(args, runs, chosen, target_file, draft_file)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--targets", default="gguf,torch,mlx")
    ap.add_argument("--drafts", default="gguf,torch,mlx", help="the hybrid's model backends")
    ap.add_argument("--ks", default="4,auto,4m", help="K per run; 4m: K = 4, the model drafting every step "
                    "the lookup does not (ModelFirst)")
    ap.add_argument("--prompts", default="edit-1,qa-1", help="packaged-workload prompt ids")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("results/real_pair_exact"))
    ap.add_argument("--plant", action="store_true", help="the check's power: a target whose batched passes "
                    "return each row one position late (every run that drafted must part from plain)")
    args = ap.parse_args()
    target_file, draft_file = args.models_dir / TARGET_F16, args.models_dir / QWEN_05B_GGUF
    prompts = {p["id"]: p for p in read_prompts(PACKAGED_WORKLOAD, turns="all")}
    chosen = [prompts[i] for i in args.prompts.split(",")]
    runs: list[dict] = []
    for tname in args.targets.split(","):
        check_target(args, tname, chosen, target_file, draft_file, runs)
    lines = report(args, runs, chosen, target_file, draft_file)
    print("\n".join(lines))
    checked = [r for r in runs if r["draft"] != "none"]
    if args.plant:  # the planted bug must show in every run whose target verified a draft
        sys.exit(0 if all(not r["same"] for r in checked if r["n_drafted"]) else 1)
    sys.exit(0 if all(r["same"] for r in checked) else 1)


if __name__ == "__main__":
    main()
