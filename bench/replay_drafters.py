"""Replay the drafters' choices over fixed greedy texts: a prediction per category, no model runs.

    python bench/replay_drafters.py record --models-dir /work/models   # once: results/replay/texts.json
    python bench/replay_drafters.py record --target-model M/qwen2.5-coder-1.5b-instruct-f16.gguf \
        --texts texts_f16.json
    python bench/replay_drafters.py record --target-backend torch --target-opt dtype=bfloat16 \
        --target-model M/qwen2.5-coder-1.5b-instruct-hf-bf16 --texts texts_torch_bf16.json
    python bench/replay_drafters.py replay                              # results/replay/README.md
    python bench/replay_drafters.py replay --curves all    # the Xeon's curves too
    python bench/replay_drafters.py kinds                               # results/replay/kinds.md

A greedy run's text does not depend on the draft, so what a drafter would have proposed, and how
much of it the target would have kept, can be replayed over the plain output. ``record`` writes,
for every prompt of the packaged workload (through the chat template), the 1.5B Q4_K_M target's
greedy output (96 new tokens, 256 for code edits) and the 0.5B Q4_K_M draft's greedy guess of every
output token given the text before it (one teacher-forced pass): a model draft's proposal at a
position is kept as far as those guesses match. ``replay`` runs specmac's own drafters and K
policies (``--k auto``: the model draft's AdaptiveK, the lookup and n-gram bets, the hybrid)
through those texts on the measured T(n) curves of results/probes_wide, the draft pass at the
share of a target pass measured in results/workloads* and its prefill at ``--prefill-ms`` a token,
on a simulated clock. It predicts tokens per second over plain decoding per category; it is not a
measurement: it leaves out the machine's noise, the loop's own work and the draft's contention with
the target (each target replays its own texts where recorded, ``TARGETS``; else the Q4_K_M
target's stand in). It is
how a change to a drafter is weighed across categories and targets in seconds before a benchmark
(bench/workloads.py) measures it. ``kinds`` counts how far the lookup's proposals of each kind of
match were kept, depth by depth (what its bets' priors, ``LookupDrafter.PRIORS``, come from), and
replays the lookup and the hybrid under other priors beside them.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

import specmac.core.hybrid as hybrid_module
from specmac.compare.results import _pyplot, provenance, save_figure, write_json
from specmac.core.bets import Bets, common_prefix
from specmac.core.drafters import NgramDrafter
from specmac.core.hybrid import HybridDrafter
from specmac.core.hybrid_policy import HybridPolicy
from specmac.core.lookup import LookupDrafter
from specmac.core.loop import Event
from specmac.core.policy import AdaptiveK
from specmac.core.sampling import SamplingParams

OUT = Path("results/replay")
CURVES = Path("results/probes_wide")
# target -> (probe record, the draft's pass as a share of the target's, measured per drafted token in
# results/workloads, results/workloads_f16, results/workloads_torch_bf16)
# results/replay/texts_<name>.json, where recorded, holds that target's own greedy texts; else the
# Q4_K_M target's (texts.json) stand in
TARGETS = {"gguf Q4_K_M": ("qwen1.5b-gguf-q4_k_m-n33.json", 0.76, "texts.json"),
           "gguf F16": ("qwen1.5b-gguf-f16-n33.json", 0.27, "texts_f16.json"),
           "torch bf16": ("qwen1.5b-torch-bf16-n33.json", 0.10, "texts_torch_bf16.json")}
# the same targets' curves on a 2-CPU Intel Xeon with AMX (results/probes_wide/*-xeon-amx-n33.json), the
# draft's pass there 41-42 ms (results/workload_peers/xeon-amx.md): ``replay --curves all``
XEON_TARGETS = {"gguf Q4_K_M, Xeon AMX": ("qwen1.5b-gguf-q4_k_m-xeon-amx-n33.json", 0.47, "texts.json"),
                "gguf F16, Xeon AMX": ("qwen1.5b-gguf-f16-xeon-amx-n33.json", 0.27, "texts_f16.json"),
                "torch bf16, Xeon AMX": ("qwen1.5b-torch-bf16-xeon-amx-n33.json", 0.23,
                                         "texts_torch_bf16.json")}
DRAFTS = ["model", "ngram", "lookup", "hybrid"]
GREEDY = SamplingParams(0.0)


def record(models_dir: Path, out: Path, target_model: Path, backend: str = "gguf",
           options: dict | None = None) -> None:
    from specmac.api import Pair
    from specmac.backends import load_backend
    from specmac.core.prompts import PACKAGED_WORKLOAD, read_prompts

    pair = Pair.load(backend, "none", target_model=str(target_model), target_options=options)
    draft = load_backend("gguf", str(models_dir / QWEN_05B_GGUF), None, role="draft")
    texts = []
    for p in read_prompts(PACKAGED_WORKLOAD, turns="all"):
        ids = pair.target.encode(pair.target.apply_chat_template(p.get("messages") or p["text"]))
        n = 256 if p["category"] == "code_editing" else 96
        output = [int(t) for t in pair.generate(ids, params=GREEDY, k=1, max_tokens=n).token_ids]
        guesses, confidence, second = teacher_forced(draft, ids, output)
        texts.append({"id": p["id"], "category": p["category"], "prompt": ids, "output": output,
                      "draft_guess": guesses, "draft_p": confidence, "draft_guess2": second})
        print(p["id"], len(ids), len(output), file=sys.stderr, flush=True)
    write_json(out, {"provenance": provenance(None, [target_model, models_dir / QWEN_05B_GGUF]),
                     "texts": texts})


def teacher_forced(draft, ids: list[int], output: list[int]) -> tuple[list[int], list[float], list[int]]:
    """The draft's greedy guess of every output token given the text before it, its probability of
    that guess, and its second guess (one teacher-forced pass: guess j is output[j]'s, given
    ids + output[:j])."""
    full, guesses, confidence, second = ids + output, [], [], []
    draft.reset()
    draft.prefill(full[:len(ids) - 1])
    for i in range(len(ids) - 1, len(full) - 1, 64):
        rows = np.asarray(draft.score(full[i:min(i + 64, len(full) - 1)]), np.float64)
        top2 = np.argsort(-rows, axis=1, kind="stable")[:, :2]  # stable: the first of a tie, as argmax
        guesses += [int(t) for t in top2[:, 0]]
        second += [int(t) for t in top2[:, 1]]
        top = rows.max(1, keepdims=True)
        confidence += [float(c) for c in 1.0 / np.exp(rows - top).sum(1)]
    return guesses, confidence, second


def add_confidence(models_dir: Path, out: Path) -> None:
    """Add the draft's probability of each guess (``draft_p``) and its second guess (``draft_guess2``)
    to texts recorded without them; the guesses must come out as recorded."""
    from specmac.backends import load_backend

    draft = load_backend("gguf", str(models_dir / QWEN_05B_GGUF), None, role="draft")
    for _, _, name in TARGETS.values():
        path = out / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for t in data["texts"]:
            guesses, t["draft_p"], t["draft_guess2"] = teacher_forced(draft, t["prompt"], t["output"])
            if guesses != t["draft_guess"]:  # another draft file, or another llama.cpp: nothing written
                sys.exit(f"{name} {t['id']}: the draft's guesses are not the recorded ones: record again")
            print(name, t["id"], "guesses as recorded", file=sys.stderr, flush=True)
        data["draft_p_provenance"] = provenance("python bench/replay_drafters.py " + " ".join(sys.argv[1:]),
                                                [models_dir / QWEN_05B_GGUF])
        write_json(path, data)


class Clock:
    """The replay's time: what the hybrid reads as perf_counter, advanced by the simulated draft."""

    t = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.t


class ReplayedModel:
    """A model draft over a recorded text: its greedy drafts are kept as far as its recorded guesses
    match the output; each proposal advances the clock by its passes and its catching up."""

    def __init__(self, text: dict, t_pass: float, prefill: float) -> None:
        self.text, self.t_pass, self.prefill = text, t_pass, prefill
        self.seen: list[int] = []
        self.backend = type("Replayed", (), {"name": "gguf", "n_ctx": 1 << 30})()

    def max_k(self, n_seq: int) -> int:
        return 1 << 30

    def trim(self, n: int) -> None:
        del self.seen[n:]

    def stop(self, pos: int, k: int) -> int:
        """How many of the k drafts asked for at output position pos are proposed (all, here; a
        draft that stops itself says fewer)."""
        return k

    def propose(self, seq, k, params, rng, n_vocab, noise=None):
        behind = len(seq) - common_prefix(self.seen, seq, len(seq) - 1)
        out, guess = self.text["output"], self.text["draft_guess"]
        pos = len(seq) - len(self.text["prompt"])
        m = self.stop(pos, k)
        passes = k if m == k else m + 1  # a stop is seen only after the pass that scores draft m
        # the first pass feeds what the draft has not seen (a catch-up: 2 tokens, a prompt: all): no
        # cheaper than a one-token pass
        Clock.t += max(behind * self.prefill, self.t_pass) + (passes - 1) * self.t_pass
        kept = common_prefix(guess[pos:pos + m], out[pos:pos + m], m)
        drafts = (out[pos:pos + kept] + guess[pos + kept:pos + kept + 1])[:m]  # m drafts, no more
        drafts += [0] * (m - len(drafts))
        self.seen = list(seq) + (drafts if m < k else drafts[:-1])  # a stopped draft scored its last
        return drafts, None

    def info(self) -> dict:
        return {}


def auto(curve: np.ndarray, t_pass: float, horizon: int, k_max: int, n_prompt: int | None,
         prefill: float) -> AdaptiveK:
    policy = AdaptiveK(k_max=k_max, horizon=horizon)
    policy.set_costs(list(curve[1:k_max + 2]), t_pass)
    if n_prompt:
        policy.set_prefill(prefill, n_prompt)
    return policy


def replay(draft: str, text: dict, curve: np.ndarray, t_pass: float, prefill: float,
           observe=None) -> tuple[float, dict]:
    """(predicted speedup over plain decoding, steps by source) of one drafter under --k auto.
    ``observe(kind, kept, drafted, rejected)``: told every proposal the lookup's bets score."""
    prompt, out = text["prompt"], text["output"]
    n = len(out)
    model = ReplayedModel(text, t_pass, prefill)
    drafter = None
    if draft == "model":
        policy = auto(curve, t_pass, n, 16, len(prompt), prefill)
    elif draft in ("ngram", "lookup"):
        policy = auto(curve, 0.0, n, 32, None, prefill)
        drafter = NgramDrafter() if draft == "ngram" else LookupDrafter()
        drafter.bets.cost = policy
    else:
        drafter = HybridDrafter(LookupDrafter(), model, name="lookup+gguf")
        policy = HybridPolicy(auto(curve, t_pass, n, 32, len(prompt), prefill), drafter, horizon=n,
                              prefill_per_token=prefill)
    if drafter is not None:
        drafter.trim(0)
    bets = getattr(getattr(drafter, "lookup", drafter), "bets", None)
    if observe is not None and bets is not None:
        scored = bets.observe
        bets.observe = lambda *a: (observe(*a), scored(*a))
    pos, seconds, sources = 0, 0.0, collections.Counter()
    while pos < n:
        seq = prompt + out[:pos]
        k = max(0, min(policy.next_k(), n - pos - 1))
        Clock.t = 0.0
        proposer = model if drafter is None else drafter
        drafts = proposer.propose(seq, k, GREEDY, None, 1 << 30)[0] if k else []
        source = ("model" if drafter is None else getattr(drafter, "source", draft)) if drafts else "none"
        a = common_prefix(out[pos:pos + len(drafts)], drafts, len(drafts))
        new = out[pos:pos + a + 1]
        t_draft, t_target = Clock.t, float(curve[len(drafts) + 1])
        seconds += t_draft + t_target
        sources[source] += 1
        policy.update(Event(tokens=new, kinds=["accepted"] * a + ["corrected"], k=k, n_drafted=len(drafts),
                            n_accepted=a, t_draft=t_draft, t_target=t_target, t_other=0.0, source=source))
        pos += len(new)
    return n * float(curve[1]) / seconds, dict(sources)


def load_targets(out: Path, targets: dict | None = None):
    """(target, its texts' file, the texts, its curve [n] seconds of a pass over n tokens, the draft's
    pass as a share of T(1)) per target (of ``TARGETS`` unless given)."""
    for target, (probe, share, name) in (targets or TARGETS).items():
        path = out / name if (out / name).exists() else out / "texts.json"
        ms = json.loads((CURVES / probe).read_text())["batched_ms"]
        curve = np.array([ms[0], *ms], float) / 1e3
        yield target, path.name, json.loads(path.read_text())["texts"], curve, share


def kinds(out: Path, prefill: float) -> None:
    """results/replay/kinds.md: how far each kind of lookup proposal was kept, code editing apart
    (every proposal the lookup made, bet on or not), and the lookup and hybrid replayed under the
    bets' flat prior, ``LookupDrafter.PRIORS`` and the measured shares of every kind."""
    depth = 4
    tallies = {"code editing": Bets(decay=1.0), "other": Bets(decay=1.0)}  # undecayed counts by depth
    targets = list(load_targets(out))
    for _, _, texts, curve, share in targets:
        for t in texts:
            scope = "code editing" if t["category"] == "code_editing" else "other"
            replay("lookup", t, curve, share * curve[1], prefill, tallies[scope].observe)
    counts = {(scope, kind): np.array([b.reached[kind][:depth], b.kept[kind][:depth]])
              for scope, b in tallies.items() for kind in b.reached}
    shares = {k: float(c[1, 0] / c[0, 0]) for (scope, k), c in counts.items() if scope == "other" and c[0, 0]}
    adopted = dict(LookupDrafter.PRIORS)
    variants = {"0.5 every kind": {}, f"PRIORS {adopted}": adopted,
                "measured: " + str({k: round(v, 2) for k, v in sorted(shares.items())}):
                    {k: round(v, 2) for k, v in shares.items()}}
    lines = ["# The lookup's kinds of match: how far their proposals were kept (a replay)", "",
             f"`python bench/replay_drafters.py kinds` (the draft's prefill {prefill * 1e3:g} ms a token)",
             "",
             "Every proposal the lookup made over the recorded greedy texts of all three targets (bet on or "
             "not: the bets score each against the text), by kind of match: proposals that reached their "
             f"j-th draft and the share that kept it, j = 1..{depth}.", "",
             "| scope | kind | " + " | ".join(f"reached {j} | kept {j}" for j in range(1, depth + 1)) + " |",
             "|---|---|" + "---:|---:|" * depth]
    for (scope, kind), c in sorted(counts.items()):
        lines.append(f"| {scope} | {kind} | " + " | ".join(
            f"{int(c[0, j])} | {c[1, j] / c[0, j]:.2f}" if j < c.shape[1] and c[0, j] else "0 | –"
            for j in range(depth)) + " |")
    lines += ["", "Replayed under each set of priors (the rest of the kinds at 0.5): mean / lowest predicted "
              "speedup over plain decoding of the texts of each category.", ""]
    cats = list(dict.fromkeys(t["category"] for t in targets[0][2]))
    lines += ["| target | drafter | priors | " + " | ".join(cats) + " |",
              "|---|---|---|" + "---:|" * len(cats)]
    try:
        for target, _, texts, curve, share in targets:
            for draft in ("lookup", "hybrid"):
                for label, priors in variants.items():
                    LookupDrafter.PRIORS = priors
                    got = collections.defaultdict(list)
                    for t in texts:
                        got[t["category"]].append(replay(draft, t, curve, share * curve[1], prefill)[0])
                    lines.append(f"| {target} | {draft} | {label} | " + " | ".join(
                        f"{np.mean(got[c]):.2f} / {min(got[c]):.2f}" for c in cats) + " |")
    finally:
        LookupDrafter.PRIORS = adopted
    lines.append("")
    (out / "kinds.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines))


def figure(rows: list[dict], title: str):
    plt = _pyplot()
    targets = list(dict.fromkeys(r["target"] for r in rows))
    cats = list(dict.fromkeys(r["category"] for r in rows))
    fig, axes = plt.subplots(1, len(targets), figsize=(5 * len(targets), 4), sharey=False)
    for ax, target in zip(np.atleast_1d(axes), targets):
        w = 0.8 / len(DRAFTS)
        for i, d in enumerate(DRAFTS):
            ys = [next(r["speedup"] for r in rows if r["target"] == target and r["category"] == c
                       and r["draft"] == d) for c in cats]
            ax.bar(np.arange(len(cats)) + i * w, ys, w, label=d)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(cats)) + 0.4, [c.replace("_", "\n") for c in cats], fontsize=7)
        ax.set_title(target)
        ax.set_ylabel("predicted speedup over plain")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["record", "confidence", "replay", "kinds"])
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--target-model", type=Path, default=None,
                    help="record: the target whose texts to record (default the 1.5B Q4_K_M file)")
    ap.add_argument("--target-backend", default="gguf", help="record: the target's backend (gguf or torch)")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="record: a target option (dtype=bfloat16 for the torch folder)")
    ap.add_argument("--texts", default="texts.json",
                    help="record: the file under --out to write (texts_f16.json for the F16 target)")
    ap.add_argument("--curves", choices=["epyc", "all"], default="epyc",
                    help="replay: the AMD EPYC's curves (where the texts were recorded), or the "
                         "Xeon's with AMX beside them")
    ap.add_argument("--prefill-ms", type=float, default=5.0,
                    help="the draft's prefill per token (calibration.prefill_per_token measured 4.7-6.2 ms)")
    args = ap.parse_args()
    if args.step == "record":
        record(args.models_dir, args.out / args.texts, args.target_model or args.models_dir / QWEN_15B_GGUF,
               args.target_backend, dict(o.split("=", 1) for o in args.target_opt) or None)
        return
    if args.step == "confidence":
        add_confidence(args.models_dir, args.out)
        return
    hybrid_module.time = Clock  # the hybrid times its model's proposals: on the replay's clock
    if args.step == "kinds":
        kinds(args.out, args.prefill_ms / 1e3)
        return
    targets = TARGETS | (XEON_TARGETS if args.curves == "all" else {})
    rows, own = [], []
    for target, name, texts, curve, share in load_targets(args.out, targets):
        own.append(f"{target}: {name}")
        for cat in dict.fromkeys(t["category"] for t in texts):
            for d in DRAFTS:
                got = [replay(d, t, curve, share * curve[1], args.prefill_ms / 1e3)
                       for t in texts if t["category"] == cat]
                sources = sum((collections.Counter(s) for _, s in got), collections.Counter())
                rows.append({"target": target, "category": cat, "draft": d, "texts": len(got),
                             "speedup": float(np.mean([s for s, _ in got])), "sources": dict(sources)})
    command = "python bench/replay_drafters.py " + " ".join(sys.argv[1:])
    write_json(args.out / "results.json", {"format": "specmac.bench.replay/1",
                                           "provenance": provenance(command), "rows": rows})
    save_figure(figure(rows, "Predicted by replay over recorded greedy texts (K auto)"),
                args.out / "replay.png")
    lines = ["# Drafters replayed over recorded greedy texts (a prediction, not a measurement)", "",
             f"`{command}` (texts: `python bench/replay_drafters.py record`)", "",
             f"{len(texts)} prompts of the packaged workload (texts: {'; '.join(own)}); K auto; the "
             f"draft's prefill {args.prefill_ms:g} ms a token. Mean predicted speedup over plain decoding "
             "per category; the hybrid's steps by source beside it.", ""]
    for target in targets:
        lines += [f"## {target}", "", "| category | " + " | ".join(DRAFTS)
                  + " | hybrid / best of plain, model, lookup | hybrid steps |",
                  "|---|" + "---:|" * (len(DRAFTS) + 1) + "---|"]
        for cat in dict.fromkeys(r["category"] for r in rows):
            here = {r["draft"]: r for r in rows if r["target"] == target and r["category"] == cat}
            best = max(1.0, here["model"]["speedup"], here["lookup"]["speedup"])
            lines.append(f"| {cat} | " + " | ".join(f"{here[d]['speedup']:.2f}\u00d7" for d in DRAFTS)
                         + f" | {here['hybrid']['speedup'] / best:.2f} | "
                         + ", ".join(f"{k} {v}" for k, v in here["hybrid"]["sources"].items()) + " |")
        lines.append("")
    lines += ["![replay](replay.png)", ""]
    (args.out / "README.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
