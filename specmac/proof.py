"""Is the output still the target's? Speculative vs autoregressive samples from fixed contexts.

Sample i runs one fresh generation of j tokens after context c and keeps only the j-th token
(j cycles over 1..length, c over the contexts), so samples are independent and every draft
position of a step (and the bonus token) is tested; a category is (context, position, token),
with "eos" when the generation stopped before position j. The same target serves both methods,
so only the decoding procedure differs. Joint distributions are tested exactly with the
synthetic pair (tests/test_loop.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specmac.api import Pair
from specmac.chisquare import min_detectable_tv, two_sample
from specmac.sampling import SamplingParams

DEFAULT_CONTEXTS = ("def ", "import ", "the ", "for i in ", "class ", "return ")


def two_sample_check(pair: Pair, *, params: SamplingParams, n_tokens: int, k: int = 4,
                     length: int | None = None, contexts: Sequence[str] = DEFAULT_CONTEXTS,
                     greedy_tokens: int = 32, seed: int = 0,
                     progress: Callable[[int], None] | None = None) -> dict:
    """Run both methods for about n_tokens each; return chi-square, power and greedy agreement."""
    baseline = pair.baseline()
    ctx_ids = [pair.encode(c) for c in contexts]
    length = length or k + 1
    spec, auto, spent, i = [], [], 0, 0
    while spent < n_tokens:
        c, j = i % len(ctx_ids), 1 + (i // len(ctx_ids)) % length
        for p, out in ((pair, spec), (baseline, auto)):
            ids = p.generate(ctx_ids[c], params=params, max_tokens=j, k=k,
                             seed=seed * 1_000_003 + 2 * i + (p is baseline)).token_ids
            out.append((c, j, ids[j - 1] if len(ids) >= j else "eos"))
        spent, i = spent + j, i + 1
        if progress:
            progress(j)
    test = two_sample(spec, auto)
    greedy = SamplingParams(0.0)
    same = sum(pair.generate(ids, params=greedy, max_tokens=greedy_tokens, k=k).token_ids
               == baseline.generate(ids, params=greedy, max_tokens=greedy_tokens, k=k).token_ids
               for ids in ctx_ids)
    return {
        "chi2": test.chi2, "dof": test.dof, "p_value": test.p_value,
        "n_categories": test.n_categories, "n_samples_per_method": len(spec),
        "n_tokens_per_method": spent, "positions": length,
        "min_detectable_tv": min_detectable_tv(len(spec), len(auto), test.dof),
        "greedy_agreement": same / len(ctx_ids), "greedy_tokens": greedy_tokens,
        "contexts": list(contexts), "k": k, "sampling": params.to_dict(),
    }
