"""The coupled sampler: its noise, its marginals (level 1), and seed-exactness on every pairing.

Under ``sampler="coupled"`` the speculative text must be token for token the plain-decoding text at
the same seed, whatever drafted it and whatever K. On the synthetic pair batched and one-token
passes are bitwise equal, so any parting fails; on the real backends of the embedded pair a
parting is diagnosed (specmac.lossless.exact) and fails only when it is not a near-tie flip of
the batched pass's round-off. Level 2 (exact distributions) runs with both samplers in
tests/core/test_loop.py; the planted bugs for the coupled sampler are in test_coupled_bugs.py.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from scipy import stats as sstats

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.drafters import ModelDrafter, NgramDrafter
from specmac.core.rejection import coupled_acceptance
from specmac.core.sampling import GumbelNoise, SamplingParams, gumbel, perturb, warp
from specmac.errors import BadOption
from specmac.lossless.exact import exact_check
from tests.support.exact import drafting_planner, gof
from tests.support.helpers import skip_unless_installed

SETTINGS = {"t0.7": SamplingParams(0.7, sampler="coupled"),
            "t1": SamplingParams(1.0, sampler="coupled"),
            "t0.7-topk5": SamplingParams(0.7, top_k=5, sampler="coupled"),
            "t1-topp0.9": SamplingParams(1.0, top_p=0.9, sampler="coupled"),
            "t1-topk20-topp0.8-minp0.05": SamplingParams(1.0, top_k=20, top_p=0.8, min_p=0.05,
                                                         sampler="coupled")}


def test_sampler_is_validated():
    assert SamplingParams().sampler == "rejection"
    with pytest.raises(BadOption, match="use one of rejection, coupled") as e:
        SamplingParams(1.0, sampler="gumbel")
    assert e.value.param == "sampler"
    assert not SamplingParams(0.0, sampler="coupled").coupled  # T = 0 is plain greedy


def test_noise_is_keyed_by_seed_and_position_alone():
    V = 151_936
    g = gumbel(7, 3, V)
    assert g.dtype == np.float32 and g.shape == (V,) and np.isfinite(g).all()
    assert np.array_equal(g, gumbel(7, 3, V))
    assert not np.array_equal(g, gumbel(7, 4, V)) and not np.array_equal(g, gumbel(8, 3, V))
    # Gumbel(0, 1) at float32 resolution
    assert sstats.kstest(g[:50_000].astype(np.float64), "gumbel_r").pvalue > 1e-3
    noise = GumbelNoise(7, V)
    step = noise.step(3)
    assert step[0] is noise[3] and np.array_equal(step[1], gumbel(7, 4, V))
    noise.step(4)
    assert 3 not in noise._rows  # positions before the step are forgotten


@pytest.mark.parametrize("name", list(SETTINGS))
def test_perturbed_argmax_is_a_sample_of_the_warped_distribution(name):
    """Level 1 for the coupled sampler: argmax(perturb(logits, params, g_j)) over positions j is
    distributed as warp(logits, params), zeros included (tokens cut by the filters never appear)."""
    params = SETTINGS[name]
    logits = np.random.default_rng(1).standard_normal(30).astype(np.float32) * 2
    logits[4] = -np.inf  # a masked id
    p = warp(logits, params)
    draws = Counter(int(np.argmax(perturb(logits, params, gumbel(11, j, 30)))) for j in range(20_000))
    assert all(p[t] > 0 for t in draws)
    assert gof(draws, dict(enumerate(p))).p_value > 1e-3


def test_coupled_acceptance_is_the_exponential_race():
    """The analytic rate matches Monte Carlo with the shared noise, and lies in the paper's bounds."""
    rng = np.random.default_rng(0)
    for _ in range(3):
        p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
        g = -np.log(-np.log(rng.random((100_000, 8))))
        mc = (np.argmax(np.log(p) + g, 1) == np.argmax(np.log(q) + g, 1)).mean()
        a, tv = coupled_acceptance(p, q), 0.5 * np.abs(p - q).sum()
        assert abs(mc - a) < 4 * np.sqrt(a * (1 - a) / 100_000)
        assert (1 - tv) / (1 + tv) - 1e-12 <= a <= 1 - tv + 1e-12
    assert coupled_acceptance(p, p) == pytest.approx(1.0)


# --- seed-exactness on the synthetic pair: the full grid ------------------------------------

def _synthetic(drafter: str) -> Pair:
    kw = {"vocab_size": 40, "eos_bias": -4.0}
    target = SyntheticBackend(role="target", **kw)
    draft = NgramDrafter() if drafter == "ngram" else ModelDrafter(SyntheticBackend(role="draft", **kw))
    return Pair(target, draft)


K_GRID = [*range(1, 9), "auto"]


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_synthetic_speculative_equals_target_only_at_every_k(drafter, name):
    params = SETTINGS[name]
    pair = _synthetic(drafter)
    base = pair.plain()
    # a repetitive prompt, so that the n-gram drafter proposes
    prompts = [pair.encode("abcabcabca"), pair.encode("hello world"), [3]]
    drafted = 0
    for prompt in prompts:
        for seed in (0, 1):
            want = base.generate(prompt, params=params, max_tokens=30, seed=seed).token_ids
            for k in K_GRID:
                planner = drafting_planner(pair) if k == "auto" else k
                got = pair.generate(prompt, params=params, max_tokens=30, k=planner, seed=seed)
                assert got.token_ids == want, (drafter, name, k, seed, prompt)
                drafted += got.stats.n_drafted
            plain_auto = pair.generate(prompt, params=params, max_tokens=30, k="auto", seed=seed)
            assert plain_auto.token_ids == want
    assert drafted > 0


def test_rejection_sampler_is_not_seed_exact():
    """The control: with the rejection rule the same seed gives other text at another K."""
    pair = _synthetic("model")
    params = SamplingParams(1.0)
    texts = {tuple(pair.generate([3], params=params, max_tokens=30, k=k, seed=0).token_ids)
             for k in (1, 2, 6)}
    assert len(texts) > 1


def test_api_generate_takes_the_sampler():
    import specmac

    kw = dict(target="synthetic", temperature=1.0, seed=7, max_tokens=24, sampler="coupled")
    want = specmac.generate("def ", **kw).token_ids
    assert specmac.generate("def ", draft="synthetic", k=3, **kw).token_ids == want
    assert specmac.generate("def ", draft="ngram", k=5, **kw).token_ids == want


# --- seed-exactness on the real backends of the embedded pair ----------------------------

REAL = ("mlx", "gguf", "torch")
_cache: dict = {}


def get(name: str, role: str):
    if (name, role) not in _cache:
        _cache[name, role] = load_backend(name, None, {}, role=role)
    return _cache[name, role]


def both(a, b):
    return pytest.param(a, b, marks=[skip_unless_installed(a), skip_unless_installed(b)], id=f"{a}-{b}")


# a subset of the K x settings grid per pairing, so that every K and setting occurs somewhere;
# the torch target (slowest per token) gets the shortest runs; where draft and target share a
# backend the whole plan, "auto" included (a planner that drafts at the widths it chooses), else
# every other entry
PLAN = {"gguf": [(1, "t1"), (2, "t0.7-topk5"), (3, "t1-topp0.9"), (6, "t0.7"),
                 (8, "t1-topk20-topp0.8-minp0.05"), ("auto", "t1")],
        "mlx": [(2, "t1"), (5, "t0.7-topk5"), ("auto", "t1-topp0.9")],
        "torch": [(4, "t1-topp0.9"), (7, "t0.7"), ("auto", "t1")]}


@pytest.mark.parametrize("draft,target", [both(d, t) for t in REAL for d in REAL])
def test_real_pairing_speculative_equals_target_only(draft, target):
    pair = Pair(get(target, "target"), ModelDrafter(get(draft, "draft")))
    plan = PLAN[target] if draft == target else [x for x in PLAN[target][::2] if x[0] != "auto"]
    for k, name in plan:
        planner = drafting_planner(pair) if k == "auto" else k
        res = exact_check(pair, params=SETTINGS[name], n_sequences=2, length=16 if target == "torch" else 24,
                          k=planner, seed=3)
        bad = [d for d in res["partings"] if not d["ok"]]
        assert not bad, (k, name, bad)
        assert res["n_by_kind"].get("accepted", 0) > 0, res["n_by_kind"]


@pytest.mark.parametrize("target", [pytest.param(t, marks=skip_unless_installed(t)) for t in REAL])
def test_real_target_with_ngram_drafter(target):
    pair = Pair(get(target, "target"), NgramDrafter())
    res = exact_check(pair, params=SETTINGS["t1"], n_sequences=2, length=16, k=4, seed=5,
                      contexts=("for i in range(10):\n    for i in range(10):\n        ",))
    assert not [d for d in res["partings"] if not d["ok"]], res["partings"]


# --- the command line -------------------------------------------------------------------------

def _run_ids(*args) -> list[int]:
    from click.testing import CliRunner

    from specmac.cli import main

    r = CliRunner().invoke(main, ["run", "--sampler", "coupled", "--temperature", "1", "--seed", "7",
                                  "--max-tokens", "20", "--json", *args, "def "])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["token_ids"]


@pytest.mark.parametrize("target", [pytest.param(t, marks=skip_unless_installed(t))
                                    for t in ("synthetic", "gguf", "mlx")])
def test_cli_run_prints_the_same_ids_whatever_drafts(target):
    """`specmac run --sampler coupled --seed 7`: the same token ids with no draft, a model draft at
    K = 2 and 6 and auto, and the n-gram drafter (the torch target is covered above, by the API)."""
    draft = "synthetic" if target == "synthetic" else "gguf"
    want = _run_ids("--target", target, "--draft", "none")
    for extra in (["--draft", draft, "--k", "2"], ["--draft", draft, "--k", "6"],
                  ["--draft", draft, "--k", "auto"], ["--draft", "ngram"]):
        assert _run_ids("--target", target, *extra) == want, extra


def test_cli_verify_exact_passes_the_synthetic_pair_with_json():
    from click.testing import CliRunner

    from specmac.cli import main

    r = CliRunner().invoke(main, ["verify", "--exact", "--draft", "synthetic", "--target", "synthetic",
                                  "--sequences", "6", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["n_identical"] == 6 and res["verdict"].startswith("PASS")
    assert res["sampling"]["sampler"] == "coupled"
    bad = CliRunner().invoke(main, ["verify", "--draft", "synthetic", "--target", "synthetic",
                                    "--sequences", "3"])
    assert bad.exit_code == 2 and "add --exact" in bad.output


def test_cli_verify_exact_over_turns_and_its_refusals():
    """--turns: conversations whose turns reuse the caches, said in the verdict; refused without
    --exact, beside --endpoint, and where a conversation would outgrow the context window."""
    from click.testing import CliRunner

    from specmac.cli import main

    base = ["verify", "--draft", "synthetic", "--target", "synthetic"]
    r = CliRunner().invoke(main, [*base, "--exact", "--sequences", "4", "--turns", "2", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["turns"] == 2 and [s["turn"] for s in res["sequences"]] == [1, 2, 1, 2]
    assert "2 conversations of 2 turns" in res["verdict"]
    for extra, needle in ((["--turns", "2"], "add --exact"),
                          (["--turns", "2", "--endpoint", "http://127.0.0.1:9/v1"], "not to --endpoint"),
                          (["--exact", "--turns", "100", "--length", "64"], "context window")):
        bad = CliRunner().invoke(main, [*base, *extra])
        assert bad.exit_code == 2 and needle in bad.output, (extra, bad.output)
