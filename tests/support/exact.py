"""Level 2 of the proof: exact distributions of the synthetic target, and the tests against them.

The synthetic target's next-token logits depend on the last two tokens only, so the marginal
distribution of the token at every position (with "end" once EOS has come) follows exactly from a
forward recursion over (previous, last) states, and the joint distribution of the first few tokens
by enumeration. ``level2`` samples whole sequences through the loop and tests per prompt the
marginal at every position, every two neighbouring tokens and the joint first tokens; the
family's p-value is Holm's (tokens of one sequence depend on each other, so the tests do too).
"""

from collections import Counter, defaultdict

import numpy as np

from specmac.api import Pair
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.costs import Costs
from specmac.core.drafters import ModelDrafter
from specmac.core.planner import Planner
from specmac.core.rejection import acceptance_probability, coupled_acceptance
from specmac.core.sampling import SamplingParams, warp
from specmac.lossless.chisquare import goodness_of_fit, holm

END = "end"
L = 10  # tokens per sequence: K up to 8 plus a bonus token and one more
PROMPTS = ([1, 2], [4], [0, 3])
JOINT = 3


def synthetic_pair(V=10, noise=1.0, eos_bias=-1.0, seed=3, sharpness=1.5, **kw):
    """A small pair whose residual max(0, p - q) has several tokens at the first positions."""
    kw |= {"vocab_size": V, "seed": seed, "eos_bias": eos_bias, "sharpness": sharpness}
    target = SyntheticBackend(role="target", **kw)
    return Pair(target, ModelDrafter(SyntheticBackend(role="draft", noise=noise, **kw)))


class FrozenCosts(Costs):
    """Costs that the run's own timings do not move: a flat target curve (every width costs one
    pass) and cheap draft models, so that a k="auto" planner drafts on numpy backends, whose draft
    costs as much as the target (measured, k="auto" would rightly draft nothing), at widths of its
    own choosing."""

    def __init__(self, models=()):
        super().__init__([1.0] * 17, {m: 0.02 for m in models}, {m: 0.0 for m in models})

    def observe(self, n, seconds):
        pass

    def observe_draft(self, name, passes, seconds, lanes=1):
        pass


def drafting_planner(pair):
    """A k="auto" planner over ``pair``'s sources on ``FrozenCosts``: its choices, not whether it
    drafts at all, are what a test of it tests."""
    return Planner(pair.sources, FrozenCosts(pair.drafts), k=None)


def exact_distribution(target, prompt, params, length):
    """{token tuple: probability}; EOS ends a sequence early (and is not part of it)."""
    dist = defaultdict(float)

    def walk(seq, prob):
        if len(seq) == length:
            dist[tuple(seq)] += prob
            return
        p = warp(target.next_logits(prompt + seq)[None], params)[0]
        for x in np.flatnonzero(p):
            if x == target.eos_id:
                dist[tuple(seq)] += prob * p[x]
            else:
                walk(seq + [int(x)], prob * p[x])

    walk([], 1.0)
    return dist


def exact_marginals(target, prompt, params, length):
    """([length] dicts {token or END: probability} of the token at each position,
    [length - 1] dicts {(x_j, x_j+1): probability} of each two neighbouring tokens)."""
    V = target.vocab.size
    prev = prompt[-2] if len(prompt) >= 2 else V  # V: "no token" (the table's extra row)
    states, ended, out, pairs = {(prev, prompt[-1]): 1.0}, 0.0, [], []
    for j in range(length):
        marg, nxt, pair = defaultdict(float), defaultdict(float), defaultdict(float)
        pair[(END, END)] = ended
        for (a, b), m in states.items():
            p = warp(target.next_logits([b] if a == V else [a, b])[None], params)[0]
            for x in np.flatnonzero(p):
                if x == target.eos_id:
                    ended += m * p[x]
                    pair[(b, END)] += m * p[x]
                else:
                    marg[int(x)] += m * p[x]
                    nxt[(b, int(x))] += m * p[x]
                    pair[(b, int(x))] += m * p[x]
        marg[END] = ended
        states = nxt
        out.append(dict(marg))
        if j:  # (x_j, x_j+1) for j >= 1
            pairs.append(dict(pair))
    return out, pairs


def sample(pair, prompt, params, k, n, seed, rule=None, length=L, noise=None):
    return [tuple(pair.generate(prompt, params=params, max_tokens=length, k=k, seed=seed * 100_003 + i,
                                rule=rule, noise=noise).token_ids) for i in range(n)]


def gof(counts: Counter, exact: dict):
    keys = sorted(set(exact) | set(counts), key=str)
    return goodness_of_fit(np.array([counts[x] for x in keys]), np.array([exact.get(x, 0.0) for x in keys]))


def level2(pair, params, k, n=1000, seed=0, rule=None, prompts=PROMPTS, length=L, noise=None) -> dict:
    """Per prompt: the marginal at each position 1..length and the joint first JOINT tokens against
    the exact distributions. Returns {"p": the family's adjusted p-value, "tests": {name: p}}.
    ``rule`` and ``noise`` plant wrong variants (the coupled sampler's noise: ``noise``)."""
    tests = {}
    for prompt in prompts:
        seqs = sample(pair, list(prompt), params, k, n, seed, rule, length, noise)
        marg, pairs = exact_marginals(pair.target, list(prompt), params, length)
        at = [[s[j] if j < len(s) else END for s in seqs] for j in range(length)]
        for j in range(length):
            tests[f"{prompt} pos {j + 1}"] = gof(Counter(at[j]), marg[j]).p_value
        for j in range(length - 1):
            tests[f"{prompt} pos {j + 1},{j + 2}"] = gof(Counter(zip(at[j], at[j + 1])), pairs[j]).p_value
        joint = exact_distribution(pair.target, list(prompt), params, JOINT)
        tests[f"{prompt} first {JOINT}"] = gof(Counter(s[:JOINT] for s in seqs), joint).p_value
    adjusted = holm(list(tests.values()))
    return {"p": min(adjusted), "tests": tests}


def first_acceptance(pair, sampler, n=4000, prompt=(1, 2)):
    """(measured, analytic, 4-sigma bound) acceptance of one draft at T = 1 after ``prompt``:
    sum_x min(p, q) for the rejection rule, the exponential race for the coupled sampler."""
    params = SamplingParams(1.0, sampler=sampler)
    p = warp(pair.target.next_logits(list(prompt))[None], params)[0]
    q = warp(pair.sources[0].backend.next_logits(list(prompt))[None], params)[0]
    expected = (coupled_acceptance(p, q) if params.coupled else
                sum(q[x] * acceptance_probability(p[x], q[x]) for x in range(len(p))))
    acc = [pair.generate(list(prompt), params=params, max_tokens=2, k=1, seed=i).stats.n_accepted
           for i in range(n)]
    return float(np.mean(acc)), float(expected), 4 * float(np.sqrt(expected * (1 - expected) / n))
