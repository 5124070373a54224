"""Greedy speculative vs greedy plain, and why they part when they do.

At temperature 0 both methods take the target's argmax, so their outputs are identical unless
the target's batched pass (which scores the drafts) and its one-token passes (plain
decoding) return different logits. In low precision they differ by round-off, and where the
target's top two logits are closer than that difference the argmax can flip: a *near-tie flip*,
expected and harmless. A mismatch where the gap is larger than the batched-vs-serial difference
at that very point cannot come from round-off: it is a bug (verdict FAIL). A target whose logits
come rounded to a 16-bit float (a bf16 or fp16 torch model) has one more: a gap of one unit of that
rounding at the top logit is a tie too: the diagnosis replays the widths of the run's passes,
which is where a kernel's rounding changes, and a 16-bit row rounds away what lies below its unit.
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
            cut: int = 0, steps: Sequence[tuple[int, int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The target's logits [V] for the token at index ``at`` of ``full``: (serial, batched).
    Serial: prompt prefill then one-token passes, as plain decoding runs. Batched: the pass
    of the speculative step that began at index ``start``, ``width`` tokens wide (causal, so the
    tokens after ``at`` only pad it to the width it had); with ``cut``, its past processed in two
    pieces split there, as a run that found ``full[:cut]`` held (an earlier turn) processed it;
    with ``steps`` (a list, maybe empty), the run's steps before it, (width of its pass, tokens it
    committed) each, replayed pass by pass after the prompt, and plain decoding's one-token passes
    after the prompt on the serial side: the cache rows each reads are then rounded as each run's
    were (a kernel's rounding follows the pass's width, not the padding's values), so a flip at a
    plain step after batched ones is measured too."""
    t, V = pair.target, pair.target.vocab.size
    pos = start - 1 - sum(n for _, n in steps or ())  # where the run's first pass begins
    t.reset()
    try:
        first = pos if steps is not None else at - 1  # prefilled; one token a pass from there
        if first > 0:
            t.prefill(full[:first])
        for j in range(first, at - 1):
            t.score([full[j]])
        serial = align_logits(t.score([full[at - 1]]), V)[0]
        if not _replayed(t, full, pos, cut, steps or ()):  # a rewind that misses its mark is
            _replayed(t, full, start - 1, cut, ())  # what is wrong: the history read in one piece
        batch = full[start - 1 : start - 1 + width]
        batched = align_logits(t.score(batch), V)[at - start]
    finally:
        t.reset()
    return serial.astype(np.float64), batched.astype(np.float64)


def _replayed(t, full: list[int], pos: int, cut: int, steps: Sequence[tuple[int, int]]) -> bool:
    """The target's cache made to hold ``full[:pos]`` (in two pieces split at ``cut``), then the
    ``steps`` after it pass by pass, each rewound to what it committed. False where a rewind left
    the cache another length than asked: then it is the rewind under test, not rounding, that the
    history would replay."""
    t.reset()
    for a, b in ((0, cut), (cut, pos)) if 0 < cut < pos else ((0, pos),):
        if b > a:
            t.prefill(full[a:b])
    for w, n in steps:
        t.score((full[pos : pos + w] + [0] * w)[:w])
        pos += n
        t.rewind(pos)
        if t.n_past != pos:
            return False
    return True


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
    target's top-2 logit gap there and the batched-vs-serial logit difference at that point.
    Both start from empty caches, as the runs it explains do: a prompt partly held from the
    generation before would be read in pieces (its last token alone at least), a rounding of its
    own that the batched-vs-serial difference at the parting does not measure."""
    events = list(pair.stream(prompt, params=GREEDY, max_tokens=max_tokens, k=k, reuse=False))
    spec = [t for e in events for t in e.tokens]
    base = pair.plain().generate(prompt, params=GREEDY, max_tokens=max_tokens, reuse=False).token_ids
    i = first_difference(spec, base)
    if i is None:
        return {"match": True}
    step_start, width = step_of(events, i)
    P = len(prompt)
    # both continuations agree before i; pad the batch with the speculative tokens after i
    full = list(prompt) + spec[: i] + (spec[i:] + base[i:] + [0] * width)[: width]
    # the run's steps before the parting one (their passes' widths, their tokens), to be replayed
    ends = np.cumsum([len(e.tokens) for e in events])
    before = [(e.n_drafted + 1, len(e.tokens)) for e, end in zip(events, ends) if end <= step_start]
    serial, batched = rows_at(pair, full, P + step_start, P + i, width, steps=before)
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
