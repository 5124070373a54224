"""Is the output still the target's? Speculative vs autoregressive samples from fixed contexts.

Each sample is the first ``length`` tokens generated after one context, with its own seed, so
samples are independent; a category is (context, token sequence). The same target serves both
methods, so only the decoding procedure differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specmac.api import Pair
from specmac.drafters import Drafter
from specmac.sampling import SamplingParams
from specmac.stats import min_detectable_tv, two_sample

DEFAULT_CONTEXTS = ("def ", "import ", "the ", "for i in ", "class ", "return ")


def two_sample_check(pair: Pair, *, params: SamplingParams, n_tokens: int, k: int = 4,
                     length: int = 3, contexts: Sequence[str] = DEFAULT_CONTEXTS,
                     greedy_tokens: int = 32, seed: int = 0,
                     progress: Callable[[int], None] | None = None) -> dict:
    """Run both methods for n_tokens each; return chi-square, power and greedy agreement."""
    baseline = Pair(pair.target, Drafter())
    ctx_ids = [pair.encode(c) for c in contexts]
    n_samples = max(1, n_tokens // length)
    spec, auto = [], []
    for i in range(n_samples):
        c = i % len(ctx_ids)
        for p, out in ((pair, spec), (baseline, auto)):
            g = p.generate(ctx_ids[c], params=params, max_tokens=length, k=k,
                           seed=seed * 1_000_003 + 2 * i + (p is baseline))
            out.append((c, tuple(g.token_ids)))
        if progress:
            progress(length)
    test = two_sample(spec, auto)
    greedy = SamplingParams(0.0)
    same = sum(pair.generate(ids, params=greedy, max_tokens=greedy_tokens, k=k).token_ids
               == baseline.generate(ids, params=greedy, max_tokens=greedy_tokens, k=k).token_ids
               for ids in ctx_ids)
    return {
        "chi2": test.chi2, "dof": test.dof, "p_value": test.p_value,
        "n_categories": test.n_categories, "n_samples_per_method": n_samples,
        "n_tokens_per_method": n_samples * length, "tokens_per_sample": length,
        "min_detectable_tv": min_detectable_tv(len(spec), len(auto), test.dof),
        "greedy_agreement": same / len(ctx_ids), "greedy_tokens": greedy_tokens,
        "contexts": list(contexts), "k": k, "sampling": params.to_dict(),
    }
