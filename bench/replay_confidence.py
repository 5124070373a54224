"""Would the draft's own confidence say when to stop drafting? A replay over the recorded texts.

    python bench/replay_drafters.py confidence --models-dir /work/models   # once: adds draft_p
    python bench/replay_confidence.py                                      # results/replay/confidence.md

llama.cpp's speculative decoding stops a draft at the first token the draft model gives less than
``p_min`` (``--draft-p-min``, 0.75 by default), and transformers' assisted generation has
``assistant_confidence_threshold``. specmac's model draft is cut only by the K its policy chose
from the running acceptance. This script asks, on the recorded greedy texts of
bench/replay_drafters.py, (1) how well the draft's probability of its guess (``draft_p``: the
softmax of its teacher-forced row at the guess) predicts that the target keeps it, and (2) what
stopping by it would have made of the model draft and the hybrid under ``--k auto``, the policy's
K as the cap: at the first draft after the first whose probability is below ``p_min``, or whose
running product of probabilities (the chance, as the draft sees it, that all drafts so far are
kept) is below ``tau``. A stopped proposal pays the draft pass that showed the low probability.
Past a draft the target rejects, the recorded probabilities are the teacher-forced ones, not
those after the draft's own wrong token: a stand-in. Same clock, curves and draft costs as
bench/replay_drafters.py; a prediction, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import replay_drafters as rd

import specmac.core.hybrid as hybrid_module
from specmac.compare.results import provenance, write_json

BINS = [0.0, 0.3, 0.5, 0.75, 0.9, 1.0 + 1e-9]
RULES = [("none", 0.0), ("p_min", 0.3), ("p_min", 0.5), ("p_min", 0.75), ("p_min", 0.9),
         ("tau", 0.1), ("tau", 0.2), ("tau", 0.3), ("tau", 0.5)]


class StoppedModel(rd.ReplayedModel):
    """The replayed model draft, stopped by its own confidence (``rule``: ("p_min" | "tau", value))."""

    rule = ("none", 0.0)

    def stop(self, pos: int, k: int) -> int:
        """The first draft is always proposed; draft i (i >= 1) is not where its probability is below
        p_min, or where the running product of the probabilities up to it is below tau."""
        kind, value = self.rule
        conf, chance = self.text["draft_p"], 1.0
        for i in range(1, k):  # replay() asks for no draft past the text's end
            p = conf[pos + i]
            chance *= conf[pos + i - 1]
            if (kind == "p_min" and p < value) or (kind == "tau" and chance * p < value):
                return i
        return k


def calibration(texts: list[dict]) -> list[dict]:
    """Per bin of the draft's probability of its guess: how many guesses, the share kept, and of
    those not kept, the share whose second guess was the target's token."""
    p = np.concatenate([t["draft_p"] for t in texts])
    kept = np.concatenate([np.equal(t["draft_guess"], t["output"]) for t in texts])
    second = np.concatenate([np.equal(t["draft_guess2"], t["output"]) for t in texts])
    rows = []
    for lo, hi in [*zip(BINS, BINS[1:], strict=False), (BINS[0], BINS[-1])]:
        sel = (p >= lo) & (p < hi)
        missed = sel & ~kept
        rows.append({"bin": "all" if (lo, hi) == (BINS[0], BINS[-1]) else f"{lo:g}-{min(hi, 1.0):g}",
                     "guesses": int(sel.sum()),
                     "kept": float(kept[sel].mean()) if sel.any() else None,
                     "mean_p": float(p[sel].mean()) if sel.any() else None,
                     "missed": int(missed.sum()),
                     "second_of_missed": float(second[missed].mean()) if missed.any() else None})
    return rows


def replayed(texts: list[dict], cat: str, curve: np.ndarray, share: float, prefill: float) -> dict:
    """The mean replayed speedup of the model draft and the hybrid over one category's texts."""
    return {d: float(np.mean([rd.replay(d, t, curve, share * curve[1], prefill)[0]
                              for t in texts if t["category"] == cat])) for d in ("model", "hybrid")}


def second_guesses(texts: list[dict], cat: str) -> tuple[int, int, int]:
    """(tokens, guesses not kept, of those the ones whose second guess was the target's) in a category."""
    n = missed = second = 0
    for t in texts:
        if t["category"] == cat:
            for g, g2, o in zip(t["draft_guess"], t["draft_guess2"], t["output"], strict=True):
                n, missed, second = n + 1, missed + (g != o), second + (g != o and g2 == o)
    return n, missed, second


def target_section(target: str, name: str, cal: list[dict], cats: list[str], cells: dict,
                   texts: list[dict]) -> list[str]:
    lines = [f"## {target} ({name})", "",
             "Outside code editing: the draft's probability of its guess, how often the target's "
             "greedy token was that guess; of the guesses it was not, how often it was the draft's second.",
             "", "| draft's p | guesses | mean p | kept | not kept | second guess of those |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['bin']} | {r['guesses']} | {r['mean_p']:.2f} | {r['kept']:.2f} | {r['missed']} | "
              + (f"{r['second_of_missed']:.2f} |" if r["missed"] else "– |") for r in cal if r["guesses"]]
    lines += ["", "Per category: the guesses not kept, and how many of those the draft's second guess was.",
              "",
              "| category | tokens | not kept | second guess | share |", "|---|---:|---:|---:|---:|"]
    for cat in cats:
        n, missed, second = second_guesses(texts, cat)
        share = f"{second / missed:.2f}" if missed else "–"
        lines.append(f"| {cat} | {n} | {missed} | {second} | {share} |")
    lines += ["", "Mean replayed speedup over plain decoding per category, K auto (model draft / hybrid):",
              "", "| stop rule | " + " | ".join(cats) + " |", "|---|" + "---:|" * len(cats)]
    lines += [f"| {label} | " + " | ".join(row) + " |" for label, row in cells.items()]
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=rd.OUT)
    ap.add_argument("--prefill-ms", type=float, default=5.0, help="the draft's prefill per token")
    args = ap.parse_args()
    hybrid_module.time = rd.Clock
    rd.ReplayedModel = StoppedModel  # replay() builds its model draft from this name
    command = "python bench/replay_confidence.py " + " ".join(sys.argv[1:])
    lines = ["# The draft's confidence as a stop rule (a replay, not a measurement)", "",
             f"`{command}` (texts: `python bench/replay_drafters.py record`, then `... confidence`)", ""]
    record = {"format": "specmac.bench.replay_confidence/1", "provenance": provenance(command),
              "calibration": {}, "rows": []}
    for target, name, texts, curve, share in rd.load_targets(args.out):
        if not all("draft_p" in t and "draft_guess2" in t for t in texts):
            sys.exit(f"{name} has no draft_p: run `python bench/replay_drafters.py confidence` first")
        cal = calibration([t for t in texts if t["category"] != "code_editing"])
        record["calibration"][target] = cal
        cats, cells = list(dict.fromkeys(t["category"] for t in texts)), {}
        for kind, value in RULES:
            StoppedModel.rule = (kind, value)
            label = "none" if kind == "none" else f"{kind} {value:g}"
            cells[label] = []
            for cat in cats:
                got = replayed(texts, cat, curve, share, args.prefill_ms / 1e3)
                record["rows"].append({"target": target, "category": cat, "rule": kind, "value": value,
                                       **got})
                cells[label].append(f"{got['model']:.2f} / {got['hybrid']:.2f}")
            print(target, label, *cells[label], file=sys.stderr, flush=True)
        lines += target_section(target, name, cal, cats, cells, texts)
    write_json(args.out / "confidence.json", record)
    (args.out / "confidence.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
