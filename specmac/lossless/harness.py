"""Is the output still the target's? Speculative vs plain continuations from fixed contexts.

Design (level 3 of the proof; levels 1-2 are exact tests with the synthetic pair in tests/):

* Each method generates ``n`` independent continuations of fixed length L (default 2K + 2) after
  each context, with one fresh seed per sequence. L is well beyond K, so the tokens tested are
  accepted drafts at every draft position 1..K, corrections and bonus tokens of first and later
  steps alike (``n_by_kind`` counts them). A sequence that stops early (EOS, context window) has
  the category "end" at every later position, so EOS is tested as its own category.
* Tokens of one sequence depend on each other, so positions are never pooled into one test. The
  family is one test per position j = 1..L (a two-sample chi-square per context of the token at
  j, summed over contexts, which are independent) plus the joint distribution of the first 2 and
  3 tokens per context. The family's p-values are Holm-adjusted, valid under any dependence.
* Top-level keys: ``p_value`` is the smallest Holm-adjusted p-value (the Bonferroni p-value of
  the whole family: m x the smallest raw p); ``chi2``/``dof``/``n_categories`` are those of the
  test that sets it (named in ``decisive_test``); ``min_detectable_tv`` is the largest, over the
  positions, TV distance between the two methods' distributions of the token at one position
  after one context (one group, not the mixture of groups) that its test catches with 80% power
  at the family's 5% level.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specmac.api import Pair
from specmac.core.rejection import AcceptRule
from specmac.core.sampling import SamplingParams
from specmac.lossless.chisquare import ChiSquare, combine, holm, min_detectable_tv, two_sample

DEFAULT_CONTEXTS = ("def ", "import ", "the ", "for i in ", "class ", "return ")
DEFAULT_TOKENS = 100_000  # per method; catches every planted bug on the synthetic pair (tests)
JOINT = 3  # the joint test of the first JOINT tokens
KINDS = ("accepted", "corrected", "bonus", "target")
END = "end"  # the category of every position after a sequence stopped


def default_length(k: int) -> int:
    """Tokens per sequence: two full steps of K drafts and their bonus tokens, and more."""
    return 2 * k + 2


@dataclass
class Samples:
    """One method's continuations: seqs[c] lists the token tuples generated after context c."""

    seqs: list[list[tuple[int, ...]]]
    length: int
    kinds_at: list[Counter] = field(default_factory=list)  # [L]: kind -> count at position j

    @property
    def n_tokens(self) -> int:
        return sum(len(s) for per in self.seqs for s in per)

    def n_by_kind(self) -> dict[str, int]:
        total = sum(self.kinds_at, Counter())
        return {kind: total[kind] for kind in KINDS} | {
            "end": sum(len(s) < self.length for per in self.seqs for s in per)}

    def at(self, c: int, j: int) -> list:
        """Category of position j (0-based) of every sequence after context c."""
        return [s[j] if j < len(s) else END for s in self.seqs[c]]

    def window(self, c: int, j: int, m: int) -> list:
        """Categories of positions j..j+m-1 (0-based) together, per sequence after context c."""
        return [tuple(s[j:j + m]) + (END,) * max(0, j + m - max(j, len(s))) for s in self.seqs[c]]


def sample_continuations(pair: Pair, ctx_ids: Sequence[Sequence[int]], *, params: SamplingParams,
                         n: int, length: int, k: int, seed: int, method: int = 0,
                         rule: AcceptRule | None = None,
                         progress: Callable[[int], None] | None = None) -> Samples:
    """n sequences of ``length`` tokens after each context; ``method`` keeps the seeds of the two
    methods apart; ``rule`` plants a wrong rejection rule (tests)."""
    out = Samples([[] for _ in ctx_ids], length, [Counter() for _ in range(length)])
    for i in range(n):
        for c, ids in enumerate(ctx_ids):
            toks: list[int] = []
            s = ((seed * 1_000_003 + i) * len(ctx_ids) + c) * 2 + method
            for e in pair.stream(ids, params=params, max_tokens=length, k=k, seed=s, rule=rule):
                for t, kind in zip(e.tokens, e.kinds):
                    out.kinds_at[len(toks)][kind] += 1
                    toks.append(t)
            out.seqs[c].append(tuple(toks))
            if progress:
                progress(length)
    return out


def _test(name: str, groups: list[tuple[list, list]]) -> tuple[str, ChiSquare, int]:
    return name, combine([two_sample(a, b) for a, b in groups]), len(groups[0][0])


def compare_samples(spec: Samples, auto: Samples, *, alpha: float = 0.05, power: float = 0.8) -> dict:
    """The family of tests (per position, joint first tokens), Holm-adjusted, with its power."""
    C, L = len(spec.seqs), spec.length
    tests = [_test(f"position {j + 1}", [(spec.at(c, j), auto.at(c, j)) for c in range(C)])
             for j in range(L)]
    # neighbours: a wrong bonus row or a stale cache shows in the pair, hardly in the marginals
    tests += [_test(f"positions {j + 1},{j + 2}", [(spec.window(c, j, 2), auto.window(c, j, 2))
                                                  for c in range(C)]) for j in range(L - 1)]
    if L >= JOINT:
        tests.append(_test(f"first {JOINT} tokens", [(spec.window(c, 0, JOINT), auto.window(c, 0, JOINT))
                                                     for c in range(C)]))
    tests = [(name, t, n) for name, t, n in tests if t.dof > 0] or tests[:1]
    adjusted = holm([t.p_value for _, t, _ in tests])
    level = alpha / len(tests)  # Bonferroni level: Holm rejects at least what it rejects

    def row(name, t, n, adj):
        tv = min_detectable_tv(n, n, t.dof, level, power)
        return {"test": name, "chi2": t.chi2, "dof": t.dof, "n_categories": t.n_categories,
                "p_value": t.p_value, "p_holm": adj, "min_detectable_tv": tv}

    rows = [row(name, t, n, a) for (name, t, n), a in zip(tests, adjusted)]
    best = min(range(len(rows)), key=lambda i: (rows[i]["p_holm"], rows[i]["p_value"]))
    per_position = [r for r in rows if r["test"].startswith("position ")]
    kinds = [{kind: spec.kinds_at[j][kind] for kind in KINDS} for j in range(L)]
    for r in per_position:
        r["kinds"] = kinds[int(r["test"].split()[1]) - 1]
    return {
        "chi2": rows[best]["chi2"], "dof": rows[best]["dof"], "p_value": rows[best]["p_holm"],
        "n_categories": rows[best]["n_categories"], "decisive_test": rows[best]["test"],
        "n_tests": len(rows), "n_samples_per_method": sum(len(s) for s in spec.seqs),
        "n_sequences_per_context": len(spec.seqs[0]),
        "n_tokens_per_method": spec.n_tokens, "n_tokens_target_only": auto.n_tokens, "positions": L,
        "min_detectable_tv": max((r["min_detectable_tv"] for r in per_position), default=1.0),
        "n_by_kind": spec.n_by_kind(), "per_position": per_position,
        "joint": [r for r in rows if not r["test"].startswith("position ")],
    }


def two_sample_check(pair: Pair, *, params: SamplingParams, n_tokens: int = DEFAULT_TOKENS, k: int = 4,
                     length: int | None = None, contexts: Sequence[str] = DEFAULT_CONTEXTS,
                     greedy_tokens: int = 32, seed: int = 0, rule: AcceptRule | None = None,
                     progress: Callable[[int], None] | None = None) -> dict:
    """Both methods for about n_tokens each (rounded up to whole sequences); the Holm-adjusted
    family of chi-square tests, its power, counts by kind, and the greedy diagnosis."""
    from specmac.lossless.greedy import greedy_check

    length = length or default_length(k)
    ctx_ids = [pair.encode(c) for c in contexts]
    n = max(1, math.ceil(n_tokens / (length * len(ctx_ids))))
    kw = dict(params=params, n=n, length=length, k=k, seed=seed, progress=progress)
    spec = sample_continuations(pair, ctx_ids, method=0, rule=rule, **kw)
    auto = sample_continuations(pair.plain(), ctx_ids, method=1, **kw)
    res = compare_samples(spec, auto)
    greedy = greedy_check(pair, ctx_ids, k=k, max_tokens=greedy_tokens)
    return res | greedy | {"greedy_tokens": greedy_tokens, "contexts": list(contexts), "k": k,
                           "sampling": params.to_dict()}
