"""Replay specmac's drafters and planner over recorded greedy texts on measured costs: no model runs.

    python bench/replay.py                       # results/replay/README.md (every curve recorded)
    PYTHONPATH=OTHER_CHECKOUT python bench/replay.py --out DIR   # the same replay of another checkout
    python bench/replay.py record [--models-dir M] --target-model M/TARGET [--target-backend torch \
        --target-opt dtype=bfloat16] --texts results/replay/texts_NAME.json    # record a target's texts
    specmac probe-parallelism --backend gguf --model M/TARGET --n-max 33 --repeats 3 \
        --out results/replay/curves/NAME-n33.json                         # record a target's T(n)

A greedy run's text does not depend on the draft, so what the drafters would propose, and how much
the target would accept, can be replayed over the plain output. The recorded texts
(results/replay/texts*.json: per prompt of the packaged workload, the target's greedy output and the
0.5B draft's teacher-forced greedy guess of every output token) are served by two numpy backends:
the target returns the recorded next token, the draft its recorded guess. A simulated clock
advances by the costs measured on a real machine: the target's pass over n tokens from
results/replay/curves (``specmac probe-parallelism`` records, n = 1..33), the draft's pass as a
share of the target's one-token pass, its prefill at ``--prefill-ms`` a token. Everything else is
specmac's own code, unchanged: the loop, the sources and the planner (``k="auto"``, started from
those same costs), so the replay predicts what a change to the planner does on every category and
target in seconds. It is a prediction, not a measurement: it leaves out the machine's noise, the
loop's own work and the draft's contention with the target. Run on another checkout
(``PYTHONPATH``) it replays that one's planner the same way.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np

CLOCK = [0.0]
time.perf_counter = lambda: CLOCK[0]  # noqa: E731  (before specmac is imported: its loop's clock)

import specmac  # noqa: E402
import specmac.api  # noqa: E402
from specmac.backends import BaseBackend  # noqa: E402
from specmac.core.sampling import SamplingParams  # noqa: E402
from specmac.vocab import Vocab  # noqa: E402

OUT = Path("results/replay")
CURVES = OUT / "curves"
# target -> (T(n) record, the draft's pass as a share of the target's one-token pass, texts)
TARGETS = {"q4-epyc": ("gguf Q4_K_M, AMD EPYC", "qwen1.5b-gguf-q4_k_m-n33.json", 0.76, "texts.json"),
           "f16-epyc": ("gguf F16, AMD EPYC", "qwen1.5b-gguf-f16-n33.json", 0.27, "texts_f16.json"),
           "bf16-epyc": ("torch bf16, AMD EPYC", "qwen1.5b-torch-bf16-n33.json", 0.10,
                         "texts_torch_bf16.json"),
           "q4-xeon": ("gguf Q4_K_M, Intel Xeon AMX", "qwen1.5b-gguf-q4_k_m-xeon-amx-n33.json", 0.47,
                       "texts.json"),
           "f16-xeon": ("gguf F16, Intel Xeon AMX", "qwen1.5b-gguf-f16-xeon-amx-n33.json", 0.27,
                        "texts_f16.json"),
           "bf16-xeon": ("torch bf16, Intel Xeon AMX", "qwen1.5b-torch-bf16-xeon-amx-n33.json", 0.23,
                         "texts_torch_bf16.json")}
DRAFTS = ["model", "ngram", "lookup", "hybrid"]
NEW = not hasattr(specmac.api.Pair, "timed_auto_policy")  # this checkout's planner or the one before


class Replay(BaseBackend):
    """A backend that serves one recorded text: row p of a pass predicts the token after position
    p as ``guess`` says where the cache holds the recorded text up to p (else its last guess), and
    each pass advances the simulated clock by ``cost(n)``."""

    def __init__(self, name: str, vocab: Vocab, truth: list[int], guess: dict[int, int], cost) -> None:
        self.name, self.vocab, self.truth, self.guess, self.cost = name, vocab, truth, guess, cost
        self.n_ctx, self.tokens, self.ok = 1 << 20, [], 0  # ok: the cache's recorded prefix

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def score(self, tokens):
        rows = np.full((len(tokens), self.vocab.size), -1e9, np.float32)
        for i, t in enumerate(tokens):
            p = len(self.tokens)
            self.tokens.append(int(t))
            if self.ok == p and p < len(self.truth) and self.truth[p] == t:
                self.ok = p + 1
            rows[i, self.guess.get(p + 1, 0) if self.ok == p + 1 else 0] = 0.0
        CLOCK[0] += self.cost(len(tokens))
        return rows

    def rewind(self, n_past: int) -> None:
        del self.tokens[n_past:]
        self.ok = min(self.ok, n_past)

    def encode(self, text):
        raise NotImplementedError

    def decode(self, ids):
        return ""


def load(texts_file: Path) -> tuple[list[dict], Vocab, int]:
    """The recorded texts with their ids mapped onto a compact vocabulary (EOS last)."""
    texts = json.loads(texts_file.read_text())["texts"]
    ids = sorted({t for x in texts for t in (*x["prompt"], *x["output"], *x["draft_guess"])})
    index = {t: i for i, t in enumerate(ids)}
    eos = len(ids)
    for x in texts:
        for key in ("prompt", "output", "draft_guess"):
            x[key] = [index[t] for t in x[key]]
    vocab = Vocab([f"t{i}".encode() for i in range(eos)] + [b""], eos_ids=frozenset({eos}),
                  special_ids=frozenset({eos}), n_logits=eos + 1)
    return texts, vocab, eos


def sources(kind: str, draft):
    """The draft sources of ``kind`` in this checkout's terms (a list, or the old single drafter)."""
    if NEW:
        from specmac.core.drafters import ModelDrafter, NgramDrafter
        from specmac.core.lookup import LookupDrafter

        return {"plain": lambda: [], "model": lambda: [ModelDrafter(draft)],
                "ngram": lambda: [NgramDrafter()],
                "lookup": lambda: [LookupDrafter()],
                "hybrid": lambda: [LookupDrafter(), ModelDrafter(draft)]}[kind]()
    from specmac.core.hybrid import HybridDrafter

    from specmac.core.drafters import ModelDrafter, NgramDrafter, PlainDecoding
    from specmac.core.lookup import LookupDrafter

    return {"plain": lambda: PlainDecoding(), "model": lambda: ModelDrafter(draft),
            "ngram": lambda: NgramDrafter(),
            "lookup": lambda: LookupDrafter(),
            "hybrid": lambda: HybridDrafter(LookupDrafter(), ModelDrafter(draft), "lookup+replay")}[kind]()


def patch_costs(curve: list[float], t_draft: float, prefill: float) -> None:
    """k="auto" starts from the replay's costs instead of timing the replay backends."""
    if NEW:
        import specmac.tuning.calibration as cal
        from specmac.core.costs import Costs

        def measure_costs(target, drafts, width, **_):
            c = Costs(curve[:width + 1] if target is not None else None, {n: t_draft for n in drafts},
                      {n: prefill for n in drafts}, note="replay")
            return c, cal.Kept()

        cal.measure_costs = measure_costs
        return
    import specmac.core.calibration as cal
    from specmac.core.policy import AdaptiveK

    def adaptive_policy(target, draft, *, horizon=None, n_prompt=None, k_max=16, **_):
        p = AdaptiveK(k_max=k_max, horizon=horizon)
        p.set_costs(curve[:k_max + 1], t_draft if draft is not None else 0.0)
        if draft is not None and n_prompt:
            p.set_prefill(prefill, n_prompt)
        return p

    cal.adaptive_policy = adaptive_policy
    cal.cached_prefill_per_token = lambda backend: prefill


def replay_text(x: dict, vocab: Vocab, eos: int, curve: list[float], t_draft: float, prefill: float) -> dict:
    """Seconds of decoding the text plainly and with each drafter (the target's prefill excluded)."""
    n = 256 if x["category"] == "code_editing" else 96
    truth = [*x["prompt"], *x["output"]]
    nxt = {p: (truth[p] if p < len(truth) else eos) for p in range(1, len(truth) + 1)}
    g0 = len(x["prompt"])
    guess = {g0 + j: t for j, t in enumerate(x["draft_guess"])}

    def t_cost(k: int) -> float:
        return curve[k - 1] if k <= len(curve) else curve[-1] + (curve[-1] - curve[-2]) * (k - len(curve))

    target = Replay("replay", vocab, truth, nxt, t_cost)
    draft = Replay("draft", vocab, truth, guess, lambda k: max(t_draft, k * prefill))
    out = {}
    # every drafter from empty caches, as its own run would start (a hybrid after the model draft
    # would find the draft holding the prompt, its prefill already paid); a checkout that keeps no
    # caches between generations takes no ``reuse``
    fresh = {"reuse": False} if "reuse" in inspect.signature(specmac.api.Pair.stream).parameters else {}
    for kind in ["plain", *DRAFTS]:
        pair = specmac.api.Pair(target, sources(kind, draft))
        g = pair.generate(x["prompt"], params=SamplingParams(0.0), k="auto" if kind != "plain" else 1,
                          max_tokens=n, **fresh)
        if g.token_ids != x["output"][:n]:
            raise AssertionError(f"{x['id']} {kind}: the replay wrote another text than the recorded one")
        out[kind] = {"seconds": g.stats.seconds, "sources": dict(g.stats.sources)}
    return out


def record(models_dir: Path, out: Path, target_model: str, backend: str = "gguf",
           options: dict | None = None) -> None:
    """For every prompt of the packaged workload (through the chat template): the target's greedy
    output (96 new tokens, 256 for a code edit) and the 0.5B draft's greedy guess of every output
    token given the text before it (one teacher-forced pass)."""
    from specmac.api import Pair
    from specmac.backends import load_backend
    from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
    from specmac.compare.results import provenance

    draft_model = models_dir / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    pair = Pair.load(backend, "none", target_model=target_model, target_options=options)
    draft = load_backend("gguf", str(draft_model), None, role="draft")
    texts = []
    for p in read_prompts(PACKAGED_WORKLOAD, turns="all"):
        ids = pair.target.encode(pair.target.apply_chat_template(p.get("messages") or p["text"]))
        n = 256 if p["category"] == "code_editing" else 96
        output = [int(t) for t in pair.generate(ids, params=SamplingParams(0.0), k=1, max_tokens=n).token_ids]
        full, guesses = ids + output, []
        draft.reset()
        draft.prefill(full[:len(ids) - 1])
        for i in range(len(ids) - 1, len(full) - 1, 64):  # guess j is output[j]'s, given ids + output[:j]
            guesses += [int(t) for t in np.argmax(draft.score(full[i:min(i + 64, len(full) - 1)]), axis=1)]
        texts.append({"id": p["id"], "category": p["category"], "prompt": ids, "output": output,
                      "draft_guess": guesses})
        print(p["id"], len(ids), len(output), file=sys.stderr, flush=True)
    out.write_text(json.dumps({"provenance": provenance(None, [target_model, draft_model]), "texts": texts}))


def checkout(path: Path) -> str:
    """The replayed checkout's commit, and whether its tree held changes not committed."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "specmac")
    return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes to specmac/" if dirty else "")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        from lib.models import add_models_dir  # after the clock's patch above, as every specmac import

        ap = argparse.ArgumentParser(description=record.__doc__.split("\n")[0])
        ap.add_argument("record")
        add_models_dir(ap)
        ap.add_argument("--target-model", required=True)
        ap.add_argument("--target-backend", default="gguf")
        ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
        ap.add_argument("--texts", type=Path, required=True, help="the JSON file to write")
        a = ap.parse_args(argv)
        return record(a.models_dir, a.texts, a.target_model, a.target_backend,
                      dict(o.split("=", 1) for o in a.target_opt) or None)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="folder for results.json and README.md")
    ap.add_argument("--prefill-ms", type=float, default=5.0, help="the draft's prefill, ms a token")
    ap.add_argument("--targets", default="all", help="comma-separated names of TARGETS (default all)")
    a = ap.parse_args(argv)
    names = list(TARGETS) if a.targets == "all" else a.targets.split(",")
    here = checkout(Path(specmac.__file__).parent.parent)
    rec = {"checkout": here, "prefill_ms": a.prefill_ms, "targets": {}}
    for name in names:
        title, curve_file, share, texts_file = TARGETS[name]
        curve = [ms / 1e3 for ms in json.loads((CURVES / curve_file).read_text())["batched_ms"]]
        texts, vocab, eos = load(OUT / texts_file)
        patch_costs(curve, share * curve[0], a.prefill_ms / 1e3)
        rows = {x["id"]: {"category": x["category"], **replay_text(x, vocab, eos, curve, share * curve[0],
                                                                  a.prefill_ms / 1e3)} for x in texts}
        rec["targets"][title] = rows
        print(name, file=sys.stderr, flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(rec, indent=1))
    (a.out / "README.md").write_text(report(rec, " ".join(["python", "bench/replay.py", *argv])))
    print((a.out / "README.md").read_text())


def report(record: dict, command: str) -> str:
    lines = ["# Drafters replayed over recorded greedy texts (a prediction, not a measurement)", "",
             f"`{command}` (checkout {record['checkout']}; the draft's prefill {record['prefill_ms']:g} ms a "
             "token). Per category: plain decoding's time over each drafter's (K auto), summed over the "
             "category's texts; the hybrid's steps by source.", ""]
    for name, rows in record["targets"].items():
        lines += [f"## {name}", "", "| category | model | ngram | lookup | hybrid | hybrid / best of plain, "
                  "model, lookup | hybrid steps |", "|---|---:|---:|---:|---:|---:|---|"]
        cats = dict.fromkeys(r["category"] for r in rows.values())
        for cat in cats:
            rs = [r for r in rows.values() if r["category"] == cat]
            plain = sum(r["plain"]["seconds"] for r in rs)
            sp = {d: plain / sum(r[d]["seconds"] for r in rs) for d in DRAFTS}
            steps: dict[str, int] = {}
            for r in rs:
                for s, k in r["hybrid"]["sources"].items():
                    steps[s] = steps.get(s, 0) + k
            rel = sp["hybrid"] / max(1.0, sp["model"], sp["lookup"])
            lines.append(f"| {cat} | " + " | ".join(f"{sp[d]:.2f}x" for d in DRAFTS) + f" | {rel:.2f} | "
                         + ", ".join(f"{s} {k}" for s, k in sorted(steps.items())) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
