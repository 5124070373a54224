"""advise's ranking of whole configurations: enumeration, shared measurements, the ranking itself."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.advise.predict import Pricing, alpha_needed
from specmac.advise.variants import variants
from specmac.cli import main
from tests.support.helpers import skip_unless_installed

KEYS = {"draft", "target", "draft_dtype", "target_dtype", "k", "predicted_tokens_per_second",
        "predicted_speedup", "reason", "group", "rank", "alpha"}


def rank(*args: str) -> dict:
    res = CliRunner().invoke(main, ["advise", "--json", *args])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return json.loads(res.stdout)


def check_ranking(r: dict) -> None:
    rows = r["ranking"]
    assert rows and all(KEYS <= set(e) for e in rows)
    assert [e["rank"] for e in rows] == list(range(1, len(rows) + 1))
    groups = list(dict.fromkeys(e["group"] for e in rows))
    for g in groups:
        mine = [e for e in rows if e["group"] == g]
        assert rows.index(mine[-1]) - rows.index(mine[0]) == len(mine) - 1  # a group is contiguous
        tps = [e["predicted_tokens_per_second"] for e in mine]
        assert tps == sorted(tps, reverse=True)
        plain = [e for e in mine if e["k"] == 0]
        assert plain and max(e["predicted_speedup"] for e in plain) == pytest.approx(1.0)
        assert mine[0]["reason"] is None and all(e["reason"] for e in mine[1:])  # every loser says why


def test_a_paying_draft_ranks_first_with_its_k():
    """A parallel target and a cheap, faithful draft: the draft at a wide K beats plain decoding."""
    r = rank("--target", "synthetic", "--target-opt", "latency_ms=2", "--draft-opt", "latency_ms=0.1",
             "--draft-opt", "noise=0.1")
    check_ranking(r)
    top = r["ranking"][0]
    assert top["draft"] in ("synthetic", "lookup+synthetic")
    assert top["k"] >= 4 and top["predicted_speedup"] > 2
    assert {e["draft"] for e in r["ranking"]} == {"synthetic", "lookup+synthetic", "ngram", "lookup", "none"}


def test_losers_say_why_in_the_papers_terms():
    """A serial target: the model draft loses because verification is serial (beta); plain
    decoding or a model-free lookup (no draft pass; a lookup step shares the loop's own cost) ranks first."""
    r = rank("--target", "synthetic", "--target-opt", "latency_ms=2", "--target-opt", "beta=1.0",
             "--draft-opt", "latency_ms=1")
    check_ranking(r)
    assert r["ranking"][0]["draft"] in ("none", "ngram", "lookup")
    model = next(e for e in r["ranking"] if e["draft"] == "synthetic")
    assert "verification serial: \u03b2 = " in model["reason"]


def test_alpha_needed_and_the_acceptance_reason():
    costs = Pricing(step=[1.0 * (1 + 0.2 * (n - 1)) for n in range(1, 10)], t_draft=0.1)
    need = alpha_needed(costs, 8)
    assert 0 < need < 1
    plain = costs.tps(0.0, 0)
    assert max(costs.tps(need + 0.01, k) for k in range(1, 9)) > plain  # pays just above it
    assert max(costs.tps(need - 0.01, k) for k in range(1, 9)) <= plain  # not just below
    serial = Pricing(step=[float(n) for n in range(1, 10)], t_draft=0.5)
    assert alpha_needed(serial, 8) is None  # even a perfect draft cannot pay


def test_a_run_pays_the_drafts_prefill_once():
    """Predictions are for runs of run_tokens: the draft's prefill of the prompt is paid once per
    run (plain decoding pays none of it), so a draft that pays in steady state can lose a short run;
    the reason says from how many tokens it pays."""
    from specmac.advise.predict import why

    steady = Pricing(step=[1.0, 1.1, 1.2], t_draft=0.05)
    run = Pricing(step=steady.step, t_draft=0.05, t_prefill=4.0, run_tokens=10)
    x = steady.tps(0.9, 2)
    assert run.tps(0.9, 2, steady=True) == pytest.approx(x)
    assert run.tps(0.9, 2) == pytest.approx(10 / (4.0 + 10 / x))  # once per run, not per step
    assert run.tps(0.0, 0) == steady.tps(0.0, 0) == 1.0  # plain decoding: no draft, no prefill
    n = run.tokens_to_pay(0.9, 2)
    assert n == pytest.approx(4.0 / (1.0 - 1 / x))
    assert Pricing(run.step, 0.05, 4.0, int(n) + 1).tps(0.9, 2) > 1.0 > Pricing(run.step, 0.05, 4.0,
                                                                                int(n) - 1).tps(0.9, 2)
    from specmac.advise.predict import Chains
    chains = Chains.of([[[1.0] * (10 - i) for i in range(10)]], k_max=2, model=True)  # all accepted
    slow = Pricing(step=run.step, t_draft=0.05, t_prefill=10.0, run_tokens=10)
    assert slow.tps(chains, 2) < 1.0 < slow.tps(chains, 2, steady=True)
    reason = why(slow, chains, beta=0.1, k_max=2, k=2)
    assert reason.startswith("the draft's prefill of the prompt (10000 ms) outweighs what 10 tokens gain")


def test_variants_of_a_model():
    embedded = variants([None], "target", ["synthetic"])
    assert [(v.backend, v.precision) for v in embedded] == [("synthetic", "float32")]


@skip_unless_installed("gguf")
def test_a_gguf_file_names_its_type():
    from specmac.backends.gguf import gguf_type

    assert gguf_type("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert gguf_type("target-f16.gguf") == "F16" and gguf_type("x.gguf") == "GGUF"


@skip_unless_installed("gguf")
@skip_unless_installed("torch")
def test_the_embedded_pair_ranks_with_no_model_flags():
    r = rank("--backends", "gguf,torch", "--k-max", "4", "--run-tokens", "16")
    check_ranking(r)
    labels = {e["target_label"] for e in r["ranking"]}
    assert {"gguf Q8_0", "gguf F16", "torch float32", "torch bfloat16"} <= labels
    # acceptance is measured once per (draft, target) variant pair, from logits alone
    assert len(r["acceptance"]) == len(r["drafts"]) * len(r["targets"])
    assert all(0 <= a["alpha"] <= 1 for a in r["acceptance"])
    assert np.isfinite([e["predicted_tokens_per_second"] for e in r["ranking"]]).all()
    # a model draft's prefill of the prompts is measured (the n-gram lookup has none)
    assert all(d["prefill_ms"] > 0 for d in r["drafts"] if d["backend"] not in ("ngram", "lookup"))


def test_chains_walk_the_text_as_the_loop_does():
    """Steps are predicted along the reference text as the loop walks it: a run of easy tokens is
    crossed in one step (acceptance is correlated), the next step starts where the last one ended,
    no step drafts past the text's end, an n-gram lookup drafts only what it finds, and a model
    draft that keeps all K pays one catch-up pass."""
    from specmac.advise.predict import Chains

    text = [[1, 1, 0, 1, 1], [1, 0, 1, 1], [0, 1, 1], [1, 1], [1]]  # chances to the text's end
    model = Chains.of([text], k_max=2, model=True)
    assert model.alpha == pytest.approx(4 / 5)
    # K = 1: steps at 0 (keeps 1 + 1), 2 (rejected: 1), 3 (1 + 1), 5 = end; K = 2: steps at 0
    # (2 kept + 1), 3 (only 1 draft is left to write: 1 + 1)
    assert model.tokens == pytest.approx([5 / 3, 5 / 2])
    assert model.passes == pytest.approx([(2 + 1 + 2) / 3, (3 + 1) / 2])  # K, + 1 after keeping all K
    assert model.width[1] == pytest.approx([0, 1 / 2, 1 / 2])  # the last step is 2 wide, not 3
    iid = Pricing(step=[1.0, 1.5, 2.0], t_draft=0.1)
    assert iid.tps(model, 2) == pytest.approx(2.5 / (2 * 0.1 + (1.5 + 2.0) / 2))
    # stop 11's average over the start positions that see K drafts predicted 2.25 tokens at K = 2

    ngram = Chains.of([[[], [1], [1, 0], [], []]], k_max=2, model=False)
    # K = 2: steps at 0 (no lookup: 1), 1 (1 + 1), 3 (none), 4 (none)
    assert ngram.tokens[1] == pytest.approx(5 / 4)
    assert ngram.passes == [0.0, 0.0]  # a lookup costs no pass
    assert ngram.width[1] == pytest.approx([3 / 4, 1 / 4, 0])


def test_sampled_chains_carry_the_chance_of_each_start():
    """Sampled, the walk's steps start at random positions: its expected steps per text match a
    simulation of the loop walking the same chances."""
    from specmac.advise.predict import Chains

    rng = np.random.default_rng(0)
    n = 12
    text = [list(rng.uniform(0.2, 0.95, n - i)) for i in range(n)]
    got = Chains.of([text], k_max=4, model=True)
    for k in (1, 3, 4):
        steps = []
        for _ in range(20_000):
            i = s = 0
            while i < n:
                d = min(k, n - i - 1)
                j = 0
                while j < d and rng.random() < text[i][j]:
                    j += 1
                i, s = i + j + 1, s + 1
            steps.append(s)
        assert got.tokens[k - 1] == pytest.approx(n / np.mean(steps), rel=0.01)


def test_greedy_chains_predict_the_loops_passes_exactly():
    """At T = 0 the loop's steps are determined by the target's text: the chains of that text,
    teacher-forced, predict exactly the tokens per target pass the loop then makes (averaging the
    chains over every start position instead predicted 7.95 at K = 8 here; the loop makes 5.16)."""
    from specmac.advise.measure import Probe, _rows, reference_texts
    from specmac.advise.predict import acceptance
    from specmac.advise.variants import Variant
    from specmac.api import Pair
    from specmac.backends import load_backend
    from specmac.core.drafters import ModelDrafter
    from specmac.core.sampling import SamplingParams

    target = load_backend("synthetic", None, {"eos_bias": -8}, role="target")
    draft = load_backend("synthetic", None, {"noise": 0.7, "eos_bias": -8}, role="draft")
    params, n = SamplingParams(temperature=0.0), 40
    prompts = ["def f(x):", "the quick brown", "for i in", "import os"]
    texts, starts = reference_texts(target, prompts, params, n, seed=0)
    rows = {b: _rows(b, texts, starts, params, target.vocab.size) for b in (target, draft)}
    chains = acceptance(Probe(Variant("draft", "synthetic", None), rows=rows[draft]),
                        Probe(Variant("target", "synthetic", None), rows=rows[target]), params, 8)
    assert 0.5 < chains.alpha < 1 and chains.tokens[7] < 6  # rejections, within runs of K = 8
    pair = Pair(target, ModelDrafter(draft))
    for k in range(1, 9):
        runs = [pair.generate(prompt, params=params, max_tokens=n, k=k).stats for prompt in prompts]
        measured = sum(r.n_tokens for r in runs) / sum(r.n_target_passes for r in runs)
        assert chains.tokens[k - 1] == pytest.approx(measured, rel=1e-9), k


def test_the_loops_overhead_is_timed_apart_from_the_pass(monkeypatch):
    """advise adds the loop's own work per step to every width's pass. It is timed apart from the
    pass: a step's time less the probe's T(1) also measured how the pass's speed moved between the
    two timings (47.7 ms on a 124 ms torch bf16 pass once, which made every drafted step of that
    target look 48 ms slower than it ran). Here the pass slows by 20 ms after the probe."""
    import specmac.advise.measure as ar
    from specmac.backends import load_backend
    from specmac.core.sampling import SamplingParams

    target = load_backend("synthetic", None, {"latency_ms": 5.0}, role="target")
    probed = ar.pass_costs

    def probe_then_slow_down(*a, **kw):
        out = probed(*a, **kw)
        target.resolved["latency_ms"] = 25.0
        return out

    monkeypatch.setattr(ar, "pass_costs", probe_then_slow_down)
    params = SamplingParams(0.0)
    texts, starts = ar.reference_texts(target, ["def f(x):"], params, 8, seed=0)
    target.resolved["latency_ms"] = 5.0
    probe = ar.probe_target(variants([None], "target", ["synthetic"])[0], target, 2, params, texts, starts,
                            target.vocab.size)
    assert probe.t_pass[0] < 0.015 and probe.t_step < 0.005


def test_a_near_tie_of_k_goes_to_the_smaller_k():
    """Where S(K) is flat at the top, the ranking takes the smallest K predicted within 2% of the
    best (its tokens/s beside it), not the argmax of differences finer than the prediction."""
    from specmac.advise.predict import K_TIE, best

    flat = Pricing(step=[1.0] * 10, t_draft=0.0)
    speeds = [1.5, 2.0, 2.50, 2.51, 2.52, 2.53]  # tokens/s at K = 1..6: flat from K = 3
    flat.tps = lambda alpha, k, steady=False: speeds[k - 1]  # type: ignore[method-assign]
    assert best(flat, 0.5, 6) == (6, 2.53)  # the control: the argmax
    assert best(flat, 0.5, 6, K_TIE) == (3, 2.50)
    assert best(flat, 0.5, 6, 0.001) == (6, 2.53)  # 2.52 is not within 0.1% of 2.53


def test_advise_predicts_the_coupled_samplers_acceptance():
    """Under --sampler coupled advise predicts acceptance from the coupled race, which is lower than
    the rejection rule's sum min(p, q) and at least (1 - TV) / (1 + TV); over the top ids of a large
    vocabulary it matches the exact race on the whole one."""
    from specmac.advise.predict import coupled_rate
    from specmac.core.rejection import coupled_acceptance

    rng = np.random.default_rng(0)
    p, q = (rng.dirichlet(np.full(300, 0.05)) for _ in range(2))
    overlap = np.minimum(p, q).sum()
    tv = 1 - overlap
    exact = coupled_acceptance(p, q)
    assert (1 - tv) / (1 + tv) - 1e-12 <= exact <= overlap + 1e-12
    assert coupled_rate(p, q) == pytest.approx(exact, abs=0.02)
    r = rank("--backends", "synthetic", "--k-max", "4", "--run-tokens", "16", "--temperature", "1",
             "--sampler", "coupled")
    rejection = rank("--backends", "synthetic", "--k-max", "4", "--run-tokens", "16", "--temperature", "1")
    alpha = {(a["draft"], a["target"]): a["alpha"] for a in r["acceptance"]}
    alpha_rej = {(a["draft"], a["target"]): a["alpha"] for a in rejection["acceptance"]}
    model = next(k for k in alpha if not k[0].startswith("ngram"))
    assert alpha[model] < alpha_rej[model]
