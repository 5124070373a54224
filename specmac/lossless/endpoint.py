"""Is a server's speculation lossless? ``verify --endpoint A --against B``: the same prompts to two
OpenAI-compatible servers (B: the same model without speculation, or as another engine runs it).

Greedy (temperature 0): each context's continuation from both, compared token by token. Where a
server returns logprobs (the completions field ``logprobs``), its tokens are the text pieces it
lists (OpenAI's API has no token ids) and the parting's near-tie check reads its top
alternatives: a parting is a *near-tie flip* when, in each server's row that says, the other
server's token is within ``tolerance`` (logprobs differ as logits do) of the top one. Where a
server returns none, the parting is located by asking both again with fewer tokens (a binary
search for the first max_tokens N at which the answers differ; a token is what the N-th adds to
the text), and without logprobs on either side it cannot be told from a near tie: a FAIL.

Sampled (T > 0): ``sequences`` continuations of ``length`` tokens per context from each server,
each with a seed of its own (the servers' seeds differ: a server checked against itself gives
independent samples), compared as the local harness compares speculative and plain decoding
(``compare_samples``: each position, each neighbouring pair, the first three jointly; Holm). A
position is a token where both servers list theirs, else a character of the text: a function of
the tokens, so the test keeps its level (it loses power where other tokens spell the same text;
two engines must render text alike). ``planned_tv`` states the power before anything is sampled.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from specmac.compare import client
from specmac.lossless.chisquare import min_detectable_tv
from specmac.lossless.greedy import first_difference
from specmac.lossless.harness import DEFAULT_CONTEXTS, Samples, compare_samples

DEFAULT_SEQUENCES = 200  # per context and server
DEFAULT_LENGTH = 10  # tokens per sampled sequence
GREEDY_TOKENS = 32
TOLERANCE = 0.1  # logprobs: a parting this close to the top choice on each side is a near tie
IN_FLIGHT = 4  # sampled requests in flight per server (servers batch them)
GREEDY = {"temperature": 0.0}


def ask(ep: client.Endpoint, prompt: str, max_tokens: int, sampling: dict, seed: int | None = None,
        logprobs: int = 2) -> client.Reply:
    """One non-streamed completion, logprobs asked of a server until it refuses them once."""
    if ep.logprobs is not False:
        try:
            r = client.complete(ep, text=prompt, max_tokens=max_tokens, sampling=sampling, seed=seed,
                                stream=False, logprobs=logprobs)
        except client.EndpointError as e:
            if ep.logprobs or e.status not in (400, 422):
                raise
            ep.logprobs = False
        else:
            ep.logprobs = r.pieces is not None
            return r
    return client.complete(ep, text=prompt, max_tokens=max_tokens, sampling=sampling, seed=seed, stream=False)


# --- greedy -------------------------------------------------------------------------------------

def greedy_check(a: client.Endpoint, b: client.Endpoint, contexts: Sequence[str] = DEFAULT_CONTEXTS, *,
                 max_tokens: int = GREEDY_TOKENS, tolerance: float = TOLERANCE) -> dict:
    rows = []
    for c, prompt in enumerate(contexts):
        ra, rb = ask(a, prompt, max_tokens, GREEDY), ask(b, prompt, max_tokens, GREEDY)
        both = ra.pieces is not None and rb.pieces is not None
        same = ra.pieces == rb.pieces if both else ra.text == rb.text
        row = {"context": c, "prompt": prompt, "match": same}
        if not same:
            row |= locate(a, b, prompt, ra, rb, max_tokens) if not both else _by_pieces(ra, rb)
            row |= near_tie(ra, rb, row["index"], row["token_a"], row["token_b"], tolerance)
        rows.append(row)
    partings = [r for r in rows if not r["match"]]
    return {"greedy_tokens": max_tokens, "contexts": list(contexts), "tolerance_logprob": tolerance,
            "greedy": rows, "n_identical": len(rows) - len(partings),
            "n_near_tie_flips": sum(r["near_tie"] is True for r in partings),
            "greedy_failures": sum(r["near_tie"] is not True for r in partings)}


def _by_pieces(ra: client.Reply, rb: client.Reply) -> dict:
    i = first_difference(ra.pieces, rb.pieces)
    return {"index": i, "position": i + 1, "token_a": _at(ra.pieces, i), "token_b": _at(rb.pieces, i),
            "char": len("".join(ra.pieces[:i])), "located_by": "logprobs"}


def _at(seq: Sequence[str], i: int) -> str | None:
    return seq[i] if i < len(seq) else None  # None: it ended (EOS) before that token


def locate(a: client.Endpoint, b: client.Endpoint, prompt: str, ra: client.Reply, rb: client.Reply,
           max_tokens: int) -> dict:
    """The first N at which the greedy answers of N tokens differ, by binary search (at lo the
    two agree, at hi they part: every step keeps that, so the answer is a parting even where a
    server's shorter answers are not prefixes of its longer ones)."""
    lo, hi = 0, max_tokens
    at_lo, at_hi = "", (ra.text, rb.text)
    while hi - lo > 1:
        m = (lo + hi) // 2
        ta, tb = ask(a, prompt, m, GREEDY).text, ask(b, prompt, m, GREEDY).text
        if ta == tb:
            lo, at_lo = m, ta
        else:
            hi, at_hi = m, (ta, tb)

    def token(text: str) -> str | None:
        if text == at_lo:
            return None  # no new text: it ended there
        return text[len(at_lo):] if text.startswith(at_lo) else text

    return {"index": hi - 1, "position": hi, "token_a": token(at_hi[0]), "token_b": token(at_hi[1]),
            "char": len(at_lo), "located_by": "max_tokens search"}


def near_tie(ra: client.Reply, rb: client.Reply, i: int, ta: str | None, tb: str | None,
             tolerance: float) -> dict:
    """In each row a server returned (its top logprobs at token i): how far the other's token is
    below the top one. Near tie (True) when both rows that say put it within ``tolerance``; None
    when neither server returned logprobs there."""
    out: dict = {"gap_a": None, "gap_b": None}
    verdicts = []
    for side, r, other in (("a", ra, tb), ("b", rb, ta)):
        if r.top is None or i >= len(r.top) or not r.top[i]:
            continue
        row = r.top[i]
        best = max(row.values())
        gap = best - row[other] if other is not None and other in row else math.inf
        out[f"gap_{side}"] = gap if math.isfinite(gap) else None
        verdicts.append(gap <= tolerance)
    out["near_tie"] = all(verdicts) if verdicts else None
    return out


# --- sampled ------------------------------------------------------------------------------------

def n_tests(length: int) -> int:
    """The family compare_samples tests: each position, each neighbouring pair, the first three."""
    return length + (length - 1) + (1 if length >= 3 else 0)


def planned_tv(n: int, length: int, n_contexts: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Before sampling: the smallest TV shift at one position after one context caught with
    ``power``, where every context has two categories there (more categories need larger shifts)."""
    return min_detectable_tv(n, n, n_contexts, alpha / n_tests(length), power)


def sample(ep: client.Endpoint, contexts: Sequence[str], sampling: dict, *, n: int, length: int, seed: int,
           method: int, pieces: bool, progress: Callable[[int], None] | None = None) -> Samples:
    """n continuations of ``length`` tokens per context (``IN_FLIGHT`` requests at a time), each as
    a tuple of its tokens' texts (``pieces``) or of its first ``length`` characters."""
    C = len(contexts)
    jobs = [(i, c) for i in range(n) for c in range(C)]

    def one(job: tuple[int, int]) -> tuple[int, tuple]:
        i, c = job
        s = ((seed * 100_003 + i * C + c) * 2 + method) % 2**31  # seeds of their own per server
        r = ask(ep, contexts[c], length, sampling, seed=s, logprobs=1 if pieces else 0)
        if pieces and r.pieces is None:
            raise client.EndpointError(f"{ep.param} {ep.label}: it stopped returning logprobs",
                                       param=ep.param)
        if progress:
            progress(1)
        return c, tuple(r.pieces[:length]) if pieces else tuple(r.text[:length])

    out = Samples([[] for _ in contexts], length, [Counter() for _ in range(length)])
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        for c, seq in pool.map(one, jobs):
            out.seqs[c].append(seq)
    return out


def sampled_check(a: client.Endpoint, b: client.Endpoint, sampling: dict, *,
                  contexts: Sequence[str] = DEFAULT_CONTEXTS, n: int = DEFAULT_SEQUENCES,
                  length: int = DEFAULT_LENGTH, seed: int = 0,
                  progress: Callable[[int], None] | None = None) -> dict:
    pieces = bool(a.logprobs and b.logprobs)
    kw = dict(n=n, length=length, seed=seed, pieces=pieces, progress=progress)
    sa = sample(a, contexts, sampling, method=0, **kw)
    sb = sample(b, contexts, sampling, method=1, **kw)
    res = compare_samples(sa, sb)
    for key in ("n_by_kind", "n_tokens_target_only"):  # the servers' own: not seen from outside
        res.pop(key, None)
    for r in res["per_position"]:
        r.pop("kinds", None)
    return res | {"unit": "token" if pieces else "character", "sequences_per_context": n, "length": length,
                  "planned_min_detectable_tv": planned_tv(n, length, len(contexts))}


# --- the whole check ----------------------------------------------------------------------------

def verdict(res: dict) -> tuple[str, bool]:
    """(plain language, failed)."""
    lines, failed = [], False
    bad = [g for g in res["greedy"] if not g["match"] and g["near_tie"] is not True]
    if bad:
        g = bad[0]
        why = ("neither server returned logprobs, so it cannot be told from a near-tie flip"
               if g["near_tie"] is None else
               f"the other's token is more than {res['tolerance_logprob']:g} (logprob) below the top choice")
        lines.append(f"FAIL (greedy): {len(bad)} of {len(res['greedy'])} contexts part; the first, context "
                     f"{g['context'] + 1} at token {g['position']} ({g['token_a']!r} vs {g['token_b']!r}): "
                     f"{why}.")
        failed = True
    else:
        flips = res["n_near_tie_flips"]
        lines.append(f"PASS (greedy): {res['n_identical']} of {len(res['greedy'])} contexts identical for "
                     f"{res['greedy_tokens']} tokens"
                     + (f"; {flips} part at near-tie flips." if flips else "."))
    s = res.get("sampled")
    if s:
        p, unit = s["p_value"], s["unit"]
        if s["dof"] < 1:
            lines.append("NO VERDICT (sampled): every position fell into one category: raise --sequences or "
                         "lower --temperature.")
        elif p < 0.001:
            lines.append(f"FAIL (sampled): the two servers' samples differ (p = {p:.2g}, "
                         f"{s['decisive_test']}): the speculative server does not sample the model's "
                         "distribution.")
            failed = True
        elif p < 0.05:
            lines.append(f"INCONCLUSIVE (sampled): p = {p:.2g} is low but not alarming: rerun with another "
                         "--seed or more --sequences.")
        else:
            lines.append(f"PASS (sampled): no difference detected (p = {p:.2g}).")
        tv, L, C, n = s["min_detectable_tv"], s["length"], len(res["contexts"]), s["sequences_per_context"]
        lines.append(f"Can detect: with 80% power, a shift of total variation >= {tv:.3f} in the "
                     f"distribution of the {unit} at any one position 1..{L} after any one of the {C} "
                     f"contexts ({n} sequences per context from each server), and shifts in neighbouring "
                     "pairs and in the first three jointly.")
        lines.append(f"Cannot detect: smaller shifts, {unit}s after {s['length']}, other prompts or sampling "
                     "settings; a server's own defaults apply to what is not sent (top_k, min_p).")
    return "\n".join(lines), failed


def lines(res: dict) -> list[str]:
    """The greedy partings, and the sampled test's numbers, one row each."""
    out = [f"greedy         {res['n_identical']} of {len(res['greedy'])} contexts identical, "
           f"{res['greedy_tokens']} tokens each"]
    partings = [g for g in res["greedy"] if not g["match"]]
    if partings:
        out += ["", "context  token  endpoint token  against token   gap (endpoint, against)  located by"]
        for g in partings:
            gaps = ", ".join("–" if x is None else f"{x:.3g}" for x in (g["gap_a"], g["gap_b"]))
            tie = {True: "near tie", False: "NOT a near tie", None: "no logprobs"}[g["near_tie"]]
            out.append(f"{g['context'] + 1:>7}  {g['position']:>5}  {g['token_a']!r:>14}  "
                       f"{g['token_b']!r:>13}  {gaps:>23}  {g['located_by']} ({tie})")
    s = res.get("sampled")
    if s:
        out += ["", f"sampled        {s['sequences_per_context']} x {len(res['contexts'])} sequences of "
                    f"{s['length']} tokens per server, compared by {s['unit']}",
                f"decisive test  {s['decisive_test']}: chi-square {s['chi2']:.1f} on {s['dof']} dof",
                f"p-value        {s['p_value']:.3g} (Holm-adjusted over {s['n_tests']} tests)"]
    return out
