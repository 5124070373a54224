"""Greedy speculative vs greedy plain, and why they part when they do.

At temperature 0 both methods take the target's argmax, so their outputs are identical unless
the target's batched pass (which scores the drafts) and its one-token passes (plain
decoding) return different logits. In low precision they differ by round-off, and where the
target's top two logits are closer than that difference the argmax can flip: a *near-tie flip*,
expected and harmless. A mismatch where the gap is larger than the batched-vs-serial difference
at that very point cannot come from round-off: it is a bug (verdict FAIL). A target whose logits
come rounded to a 16-bit float (a bf16 or fp16 torch model) has one more: a gap of one unit of that
rounding at the top logit is a tie too, as the cache rows the run computed in passes of other
widths round differently and recomputing the one pass at the parting does not replay them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmac.api import Pair
from specmac.core.sampling import SamplingParams
from specmac.vocab import align_logits

GREEDY = SamplingParams(0.0)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where a and b differ (one ending early counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def rows_at(pair: Pair, full: list[int], start: int, at: int, width: int,
            cut: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The target's logits [V] for the token at index ``at`` of ``full``: (serial, batched).
    Serial: prompt prefill then one-token passes, as plain decoding runs. Batched: the pass
    of the speculative step that began at index ``start``, ``width`` tokens wide (causal, so the
    tokens after ``at`` only pad it to the width it had); with ``cut``, its past processed in two
    pieces split there, as a run that found ``full[:cut]`` held (an earlier turn) processed it."""
    t, V = pair.target, pair.target.vocab.size
    t.reset()
    try:
        if at > 1:
            t.prefill(full[: at - 1])
        serial = align_logits(t.score([full[at - 1]]), V)[0]
        t.reset()
        for a, b in ((0, cut), (cut, start - 1)) if 0 < cut < start - 1 else ((0, start - 1),):
            if b > a:
                t.prefill(full[a:b])
        batch = full[start - 1 : start - 1 + width]
        batched = align_logits(t.score(batch), V)[at - start]
    finally:
        t.reset()
    return serial.astype(np.float64), batched.astype(np.float64)


def step_of(events: Sequence, i: int) -> tuple[int, int]:
    """The speculative step that emitted output token i (or would have, past the end): its first
    output index and the width of its target pass."""
    step_start = 0
    for e in events:
        if step_start + len(e.tokens) > i or e is events[-1]:
            return step_start, e.n_drafted + 1
        step_start += len(e.tokens)
    return step_start, 1


def diagnose(pair: Pair, prompt: Sequence[int], *, k: int, max_tokens: int) -> dict:
    """Greedy speculative and plain continuations of ``prompt``; where they part, the
    target's top-2 logit gap there and the batched-vs-serial logit difference at that point."""
    events = list(pair.stream(prompt, params=GREEDY, max_tokens=max_tokens, k=k))
    spec = [t for e in events for t in e.tokens]
    base = pair.plain().generate(prompt, params=GREEDY, max_tokens=max_tokens).token_ids
    i = first_difference(spec, base)
    if i is None:
        return {"match": True}
    step_start, width = step_of(events, i)
    P = len(prompt)
    # both continuations agree before i; pad the batch with the speculative tokens after i
    full = list(prompt) + spec[: i] + (spec[i:] + base[i:] + [0] * width)[: width]
    serial, batched = rows_at(pair, full, P + step_start, P + i, width)
    top2 = np.sort(serial)[-2:]
    gap, delta = float(top2[1] - top2[0]), float(np.max(np.abs(batched - serial)))
    unit = rounding_unit(serial)
    near_tie = bool(gap <= max(delta, unit))
    return {"match": False, "first_difference": i, "speculative_token": spec[i] if i < len(spec) else None,
            "target_token": base[i] if i < len(base) else None, "top2_gap": gap,
            "batched_vs_serial": delta, "rounding_unit": unit, "near_tie": near_tie}


def rounding_unit(row: np.ndarray) -> float:
    """The spacing at the row's top value of the 16-bit float its values are rounded to (bf16:
    8 significant bits, fp16: 11), or 0 where they are not (fp32 logits, llama.cpp's)."""
    x = np.asarray(row, dtype=np.float32)
    top = abs(float(np.max(x)))  # where the top two logits are
    if not top or not np.isfinite(top):
        return 0.0
    if not np.any(x.view(np.uint32) & 0xFFFF):  # the low 16 bits of every value empty: bf16
        return float(2.0 ** (np.floor(np.log2(top)) - 7))
    if np.array_equal(x.astype(np.float16).astype(np.float32), x):
        return float(np.spacing(np.float16(top)))
    return 0.0


def greedy_check(pair: Pair, ctx_ids: Sequence[Sequence[int]], *, k: int, max_tokens: int) -> dict:
    """diagnose() per context: agreement, and whether any mismatch is not a near-tie flip."""
    diags = [diagnose(pair, ids, k=k, max_tokens=max_tokens) for ids in ctx_ids]
    return {"greedy_agreement": sum(d["match"] for d in diags) / len(diags),
            "greedy_mismatches": [d | {"context": c} for c, d in enumerate(diags) if not d["match"]],
            "greedy_unexplained": sum(not d["match"] and not d["near_tie"] for d in diags)}


def summary(d: dict) -> str:
    """One mismatch in words."""
    where = f"part at token {d['first_difference'] + 1}"
    gap, delta = d["top2_gap"], d["batched_vs_serial"]
    if not d["near_tie"]:
        why = f"top-2 gap {gap:.3g} > batched-vs-serial difference {delta:.3g}"
    elif gap <= delta:
        why = f"top-2 gap {gap:.3g} <= batched-vs-serial difference {delta:.3g}"
    else:
        why = f"top-2 gap {gap:.3g} within the logits' 16-bit rounding unit {d['rounding_unit']:.3g}"
    return f"{where}: {'near-tie flip' if d['near_tie'] else 'NOT a near tie'} ({why})"
