"""Seed-exact verification: each speculative sequence against its plain-decoding twin at one seed.

Under the coupled sampler the token at output position j is the argmax of the target's perturbed
row (logits / T + Gumbel noise keyed by (seed, j)), whoever drafted it, so a correct pipeline
gives, sequence by sequence, exactly the text of plain decoding at the same seed. One
sequence is a test: a stale cache, a rewind off by one, a batched pass that computes something
else, drafts misaligned with their rows or a bonus token from the wrong row shows as a parting
within a few tokens, where the chi-square harness (harness.py) needs ~10^5 tokens.

Where the two part, the target's rows for that token are recomputed from fresh caches: serial
(prefill, then a one-token pass, as plain decoding runs) and batched (the speculative
step's pass, as wide as it was, its past in two pieces where the run found the first held: a
conversation's earlier turn), both perturbed by the noise of that position. The parting is a
*near-tie flip* when each side's token is its own row's choice up to the batched-vs-serial
difference there (round-off decides it); then that difference, on the two tokens that flipped,
is held against ``tolerance`` (logits): larger is a batched pass that differs from the one-token
passes beyond round-off. Any other parting is a pipeline error.

It cannot test the rejection rule (not used here; levels 1-2 in tests/ prove it) nor what the
draft proposes: the coupled rule's output does not depend on the drafts, only its speed does.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from specmac.api import Pair
from specmac.core.rejection import AcceptRule
from specmac.core.sampling import GumbelNoise, SamplingParams, perturb
from specmac.lossless.greedy import first_difference, rows_at, step_of
from specmac.lossless.harness import DEFAULT_CONTEXTS

DEFAULT_SEQUENCES = 24
DEFAULT_LENGTH = 32
# logits: the batched-vs-serial difference on two flipped tokens accepted as round-off; fp32 and
# fp16 kernels stay far below it, llama.cpp's quantized kernels (repacking on or off) can exceed it
TOLERANCE = 0.1


def coupled(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, sampler="coupled")


def sequence_seed(seed: int, n: int) -> int:
    return (seed * 1_000_003 + n) % 2**63


def _token_value(row: np.ndarray, tok: int | None, eos: Sequence[int]) -> float:
    """A row's value of a token; None (the sequence stopped) is the best EOS id."""
    return float(row[tok] if tok is not None else max(row[e] for e in eos))


def diagnose_parting(pair: Pair, prompt: Sequence[int], events: list, spec: list[int], ref: list[int],
                     i: int, *, params: SamplingParams, seed: int, tolerance: float) -> dict:
    """Why speculative and plain decoding part at output index i (see the module docstring)."""
    t = pair.target
    V, eos = t.vocab.size, sorted(t.vocab.eos_ids)
    step_start, width = step_of(events, i)
    full = list(prompt) + spec[:i] + (spec[i:] + ref[i:] + [0] * width)[:width]
    P = len(prompt)
    cut = events[0].n_cached if events else 0  # what the run found held of the prompt: its pieces
    serial, batched = rows_at(pair, full, P + step_start, P + i, width, cut=cut)
    g = GumbelNoise(seed, V)[i]  # the true noise of position i, whatever the run used
    S, B = perturb(serial, params, g), perturb(batched, params, g)
    finite = np.isfinite(S) & np.isfinite(B)
    delta = float(np.max(np.abs(B[finite] - S[finite]))) if finite.any() else 0.0
    s_tok = spec[i] if i < len(spec) else None
    t_tok = ref[i] if i < len(ref) else None
    # a token's own value even where a filter's cutoff (rounded differently) masks it in one row
    S_raw, B_raw = serial / params.temperature + g, batched / params.temperature + g
    S_s, S_t = _token_value(S_raw, s_tok, eos), _token_value(S_raw, t_tok, eos)
    B_s, B_t = _token_value(B_raw, s_tok, eos), _token_value(B_raw, t_tok, eos)
    boundary = any(not np.isfinite(_token_value(R, tok, eos)) for R in (S, B) for tok in (s_tok, t_tok))
    top2 = np.sort(S[np.isfinite(S)])[-2:]
    # each side's token is its own row's choice, up to the batched-vs-serial difference here
    near_tie = bool(S.max() - S_t <= delta and B.max() - B_s <= delta)
    moved = abs((B_s - S_s) - (B_t - S_t)) * params.temperature  # logits, on the flipped pair
    if not near_tie:
        why = "not a near tie"
    elif moved > tolerance:
        why = "batched pass off"
    else:
        why = "near-tie flip"
    kinds = [k for e in events for k in e.kinds]
    return {"first_difference": i, "speculative_token": s_tok, "target_token": t_tok,
            "token_kind": kinds[i] if i < len(kinds) else "end",
            "margin": float(S_t - S_s), "top2_gap": float(top2[-1] - top2[0]) if len(top2) == 2 else 0.0,
            "batched_vs_serial": delta, "flipped_pair_moved_logits": float(moved),
            "support_boundary": bool(boundary), "near_tie": near_tie, "diagnosis": why,
            "ok": why == "near-tie flip"}


def exact_check(pair: Pair, *, params: SamplingParams, n_sequences: int = DEFAULT_SEQUENCES,
                length: int = DEFAULT_LENGTH, k: int | str = 4, seed: int = 0,
                contexts: Sequence[str] = DEFAULT_CONTEXTS, tolerance: float = TOLERANCE,
                reference: Pair | None = None, rule: AcceptRule | None = None,
                noise: Callable | None = None, stop_at_first_failure: bool = False,
                progress: Callable[[int], None] | None = None, turns: int = 1) -> dict:
    """n_sequences speculative sequences under the coupled sampler (contexts in turn, one seed
    each), each against the plain-decoding twin of ``reference`` (default: the same target alone);
    every parting diagnosed. ``turns`` > 1: the sequences are the turns of conversations, that many
    each (a turn's prompt: the last turn's prompt, the first half of its output and the context
    again); the
    speculative side keeps what its caches hold of the conversation (``Pair.stream``'s reuse),
    the plain side starts each turn from empty caches, so a cache reused wrongly parts the two.
    ``rule``/``noise`` plant wrong variants (tests)."""
    params = coupled(params)
    reference = reference or pair.plain()
    ctx_ids = [pair.encode(c) for c in contexts]
    kinds, partings, seqs = Counter(), [], []
    n_spec = n_ref = 0
    first_failure = None
    prompt: list[int] = []
    spec: list[int] = []
    for n in range(n_sequences):
        conv, turn = divmod(n, turns)
        c, s = (n if turns == 1 else conv) % len(ctx_ids), sequence_seed(seed, n)
        # the last answer's first half only: the caches hold text past where the prompt parts (an
        # answer a client edits, or re-sends as text that tokenizes otherwise), to be rewound
        prompt = list(ctx_ids[c]) if turn == 0 else prompt + spec[: len(spec) // 2] + list(ctx_ids[c])
        events = list(pair.stream(prompt, params=params, max_tokens=length, k=k, seed=s, rule=rule,
                                  noise=noise))
        spec = [tok for e in events for tok in e.tokens]
        kinds.update(kd for e in events for kd in e.kinds)
        ref = reference.generate(prompt, params=params, max_tokens=length, k=1, seed=s,
                                 reuse=turns == 1).token_ids
        n_spec, n_ref = n_spec + len(spec), n_ref + len(ref)
        i = first_difference(spec, ref)
        seqs.append({"context": c, "seed": s, "tokens": len(spec), "identical": i is None}
                    | ({"turn": turn + 1, "cached_tokens": events[0].n_cached if events else 0}
                       if turns > 1 else {}))
        if i is not None:
            d = diagnose_parting(pair, prompt, events, spec, ref, i, params=params, seed=s,
                                 tolerance=tolerance)
            partings.append(d | {"sequence": n, "context": c, "seed": s})
            if not d["ok"] and first_failure is None:
                first_failure = {"sequence": n, "tokens_speculative": n_spec, "tokens_target_only": n_ref}
        if progress:
            progress(len(spec))
        if first_failure and stop_at_first_failure:
            break
    return {"n_sequences": len(seqs), "length": length, "k": k, "contexts": list(contexts), "turns": turns,
            "sampling": params.to_dict(), "tolerance_logits": tolerance,
            "n_tokens_speculative": n_spec, "n_tokens_target_only": n_ref,
            "n_identical": sum(x["identical"] for x in seqs), "n_by_kind": dict(kinds),
            "partings": partings, "n_near_tie_flips": sum(d["ok"] for d in partings),
            "n_failures": sum(not d["ok"] for d in partings), "first_failure": first_failure,
            "sequences": seqs}


def verdict(res: dict) -> str:
    """Plain language: the outcome, what one-sequence comparisons see and what they cannot."""
    n, bad = res["n_sequences"], [d for d in res["partings"] if not d["ok"]]
    flips = res["n_near_tie_flips"]
    if bad:
        d = bad[0]
        if d["diagnosis"] == "batched pass off":
            why = (f"the target's batched pass differs from its one-token passes by "
                   f"{d['flipped_pair_moved_logits']:.3g} logits on the two tokens that flipped, more "
                   f"than --tolerance {res['tolerance_logits']:g}: a faulty batched kernel, or a "
                   "low-precision one that rounds differently (see `specmac probe-parallelism`)")
        else:
            why = ("the speculative token is not the target's own choice there, nor one round-off away "
                   f"(margin {d['margin']:.3g} > batched-vs-serial difference {d['batched_vs_serial']:.3g}): "
                   "a pipeline error")
        head = (f"FAIL: {len(bad)} of {n} sequences part from their plain-decoding twin; the first "
                f"(sequence {d['sequence']}, token {d['first_difference'] + 1}, a {d['token_kind']} token): "
                f"{why}.")
    else:
        turns = res.get("turns", 1)
        conv = (f" ({-(-n // turns)} conversations of {turns} turns, each turn reusing the caches of the "
                "last)" if turns > 1 else "")
        head = (f"PASS: {res['n_identical']} of {n} sequences{conv} are token for token their "
                "plain-decoding twin"
                + (f"; {flips} part at near-tie flips of the round-off of the batched pass"
                   + (" and of the prompt processed in pieces" if turns > 1 else "") + "." if flips else "."))
    kinds = res["n_by_kind"]
    tested = "Tested: " + ", ".join(f"{kinds[x]} {x}" for x in ("accepted", "corrected", "bonus", "target")
                                    if x in kinds) + f" tokens, {res['length']} per sequence."
    can = ("Can see: any systematic error of the pipeline that changes an emitted token (cache rewinds, "
           "stale or misaligned cache entries, a batched pass that computes something else, drafts "
           "misaligned with their rows, the bonus row, EOS and length bookkeeping, noise keyed by the "
           "wrong position" + (", a conversation's held cache reused wrongly from one turn to the next"
                                if res.get("turns", 1) > 1 else "") + "), within a few sequences.")
    cannot = ("Cannot see: the rejection rule (not used by the coupled sampler; the exact tests of levels "
              "1-2 prove it), and anything about the drafts themselves (the coupled rule's output does not "
              "depend on them, only its acceptance does); errors rarer than once in "
              f"{res['n_tokens_speculative']} tokens.")
    return "\n".join([head, tested, can, cannot])


def lines(res: dict) -> list[str]:
    """One row per parting."""
    turns = f", conversations of {res['turns']} turns" if res.get("turns", 1) > 1 else ""
    out = [f"sequences      {res['n_sequences']} x {res['length']} tokens{turns}, K {res['k']}, seed-exact "
           f"twins: {res['n_identical']} identical",
           f"tokens         {res['n_tokens_speculative']} speculative, "
           f"{res['n_tokens_target_only']} plain"]
    if res["partings"]:
        out += ["", "sequence  token  kind       margin  batched-vs-serial  moved (logits)  diagnosis"]
        for d in res["partings"]:
            out.append(f"{d['sequence']:>8}  {d['first_difference'] + 1:>5}  {d['token_kind']:<9}  "
                       f"{d['margin']:6.3g}  {d['batched_vs_serial']:17.3g}  "
                       f"{d['flipped_pair_moved_logits']:14.3g}  {d['diagnosis']}")
    return out
