"""Record a real pair's greedy acceptance pattern and costs, for replaying --k auto offline.

For each prompt: the target's greedy continuation (target-only decoding), then the draft scores
that text in one teacher-forced pass; match[i] = 1 where the draft's argmax equals the target's
token i. Under greedy decoding that string decides every step of speculative decoding exactly: a
step at position p drafting K tokens keeps the run of 1s from p (at most K) plus one token. With
the measured costs (the target's batched pass T_t(n), n = 1..17, and the draft's one- and
two-token passes) any K policy can be replayed in milliseconds: tests/test_adaptive_replay.py
does, for AdaptiveK against every fixed K.

    python bench/acceptance_trace.py [--models-dir DIR] [--tokens 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.api import Pair
from specmac.compare.results import model_files, provenance, write_json
from specmac.core.prompts import default_prompts
from specmac.core.sampling import SamplingParams
from specmac.probes import probe_parallelism

REPO = Path(__file__).resolve().parent.parent
CODE_PROMPTS = ["import numpy as np\n\n\ndef normalize(x):\n    \"\"\"Scale x to unit length.\"\"\"\n",
                "def quicksort(xs):",
                "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_models_dir(ap)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/qwen_greedy_acceptance.json")
    args = ap.parse_args()
    one = {"n_threads": 1}  # as bench/advise_vs_measured.py: one thread per model on 2 shared cores
    target_model, draft_model = str(args.models_dir / QWEN_15B_GGUF), str(args.models_dir / QWEN_05B_GGUF)
    pair = Pair.load("gguf", "gguf", target_model=target_model, draft_model=draft_model,
                     target_options=one, draft_options=one)
    draft = pair.drafter.backend
    prompts = CODE_PROMPTS + [p["text"] for p in default_prompts() if p["kind"] == "prose"][:2]
    traces = []
    for text in prompts:
        ids = pair.encode(text)
        out = pair.plain().generate(ids, params=SamplingParams(0.0), max_tokens=args.tokens)
        toks = list(out.token_ids)
        draft.reset()
        if len(ids) > 1:
            draft.prefill(ids[:-1])
        guesses = draft.score([ids[-1], *toks[:-1]]).argmax(axis=1)
        match = "".join("1" if int(g) == t else "0" for g, t in zip(guesses, toks))
        print(f"{len(toks):4d} tokens, draft agrees on {match.count('1') / len(match):.2f}: {text[:40]!r}",
              flush=True)
        traces.append({"prompt": text, "n_tokens": len(toks), "match": match})
    t_target = probe_parallelism(pair.target, n_max=17, context=128, repeats=3)["batched_ms"]
    t_draft = probe_parallelism(draft, n_max=2, context=128, repeats=5)["batched_ms"]
    write_json(args.out, {
        "what": "greedy teacher-forced agreement of the draft with the target's own continuation; "
                "costs in ms, one thread per model",
        "target_pass_ms": t_target, "draft_pass_ms": t_draft[0], "draft_two_token_pass_ms": t_draft[1],
        "traces": traces,
        "provenance": provenance(" ".join(sys.argv), model_files(pair.target, target_model, "target")
                                 + model_files(draft, draft_model, "draft")),
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
