"""The hybrid drafter (LOOKUP+BACKEND): exact on every pairing, its choices, what it records."""

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.cli import main
from specmac.compare.settings import parse_pair
from specmac.core.costs import K_MAX
from specmac.core.drafters import ModelDrafter, split_hybrid
from specmac.core.hybrid import HybridDrafter
from specmac.core.hybrid_policy import HybridPolicy
from specmac.core.lookup import LookupDrafter
from specmac.core.policy import AdaptiveK, FixedK
from specmac.core.sampling import SamplingParams
from specmac.errors import BadOption
from tests.conftest import skip_unless_installed

GREEDY = SamplingParams(0.0)
MODELS = ["gguf", "mlx", "torch"]
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef add("


def _skip(*names):
    for n in names:
        mark = skip_unless_installed(n)
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])


def _opts(name):
    return {"dtype": "float32"} if name == "torch" else None  # the fp32 / F16 embedded weights


@pytest.mark.parametrize("target", MODELS)
@pytest.mark.parametrize("draft", MODELS)
def test_greedy_hybrid_equals_plain_on_every_embedded_pairing(draft, target):
    _skip(draft, target)
    pair = Pair.load(target, f"lookup+{draft}", target_options=_opts(target), draft_options=_opts(draft))
    assert isinstance(pair.drafter, HybridDrafter) and pair.drafter.backend.name == draft
    spec = pair.generate(PROMPT, params=GREEDY, k=4, max_tokens=40)
    plain = pair.plain().generate(PROMPT, params=GREEDY, k=1, max_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert sum(spec.stats.sources.values()) == spec.stats.n_target_passes
    assert spec.stats.n_drafted > 0


def test_ngram_plus_is_the_same_hybrid_and_auto_is_exact():
    _skip("gguf")
    pair = Pair.load("gguf", "ngram+gguf")
    assert isinstance(pair.drafter, HybridDrafter) and pair.drafter.label == "ngram+gguf"
    spec = pair.generate(PROMPT, params=GREEDY, k="auto", max_tokens=40)
    assert spec.token_ids == pair.plain().generate(PROMPT, params=GREEDY, k=1, max_tokens=40).token_ids


class Costs:
    """A HybridPolicy stand-in: a target curve, a draft pass, a prefill rate, tokens left."""

    adaptive = True

    def __init__(self, t1=1.0, beta=0.0, td=0.1, prefill=0.0, left=100):
        self._curve = t1 * (1 + beta * (np.arange(K_MAX + 2) - 1.0))
        self._curve[0] = t1
        self.td, self.rate, self.left = td, prefill, left

    def curve(self):
        return self._curve

    def t_draft1(self):
        return self.td

    def tokens_left(self):
        return self.left

    def prefill_s(self, n):
        return n * self.rate

    def timed(self):
        return True

    def lookup_cap(self):
        return K_MAX


def hybrid(**costs):
    model = ModelDrafter(load_backend("synthetic", None, None, role="draft"))
    h = HybridDrafter(LookupDrafter(), model, name="lookup+synthetic")
    h.cost = Costs(**costs)
    return h


def test_choice_follows_costs_and_acceptance():
    h = hybrid()
    for _ in range(10):
        h.lookup.bets.observe("sure", 6, 6, False)  # sure matches kept whole
        h.lookup.bets.observe("short", 0, 6, True)  # short ones rejected at once
    assert h.choose(50, 8, 6, "sure")[0] == "lookup"
    assert h.choose(50, 8, 0, "sure")[0] == "synthetic"  # no match: the model
    assert h.choose(50, 8, 6, "short")[0] == "synthetic"  # a match that is rarely kept
    # on a serial target (every width costs its tokens) with a costly draft nothing pays
    h = hybrid(beta=1.0, td=0.5)
    assert h.choose(50, 8, 0, "short") == ("none", 0)


def test_prefill_of_a_long_prompt_keeps_the_model_off_a_short_run():
    # a draft pass costs 0.1 of the target's; its prefill 0.02 of a pass per token
    long_short = hybrid(prefill=0.02, left=8)
    assert long_short.choose(2000, 8, 0, "short") == ("none", 0)  # 40 passes of prefill for 8 tokens
    long_long = hybrid(prefill=0.02, left=4000)
    assert long_long.choose(2000, 8, 0, "short") == ("none", 0)  # the lookup is tried first
    long_long.tokens = {"lookup": 0, "other": HybridDrafter.explore}  # ... and wrote nothing
    assert long_long.choose(2000, 8, 0, "short")[0] == "synthetic"  # paid back over a long run
    assert not long_short.model_started


def test_prefill_is_paid_back_only_over_what_the_model_would_draft():
    # the same long run, but the lookup wrote the text so far (a copy): the model's prefill would be
    # paid back over the few tokens the lookup leaves it, so it is not started
    copying = hybrid(prefill=0.02, left=4000)
    copying.tokens = {"lookup": 1000, "other": 0}
    assert copying.choose(2000, 8, 0, "short") == ("none", 0)
    assert "tokens it would draft for" in copying.k_choice
    answering = hybrid(prefill=0.02, left=4000)
    answering.tokens = {"lookup": 0, "other": 1000}
    assert answering.choose(2000, 8, 0, "short")[0] == "synthetic"
    cheap = hybrid(prefill=0.0001, left=4000)  # a prefill cheaper than the wait: no waiting
    assert cheap.choose(2000, 8, 0, "short")[0] == "synthetic"


def test_the_wait_for_the_lookup_is_kept_only_where_the_prefill_costs_more():
    # the wait is explore plain steps (t1 = 1 s each); a prefill of 50 tokens at 0.04 s is 2 s:
    # cheaper than the wait, so the model starts at once; at 0.1 s a token (5 s) the lookup goes first
    assert hybrid(prefill=0.04, left=4000).choose(50, 8, 0, "short")[0] == "synthetic"
    assert hybrid(prefill=0.1, left=4000).choose(50, 8, 0, "short") == ("none", 0)


def test_model_steps_are_predicted_from_the_posterior_not_the_point_estimate():
    h = hybrid()
    h.acc["model"] = [7.0, 10.0]  # acceptance ~ Beta(7, 3)
    ks = np.arange(1, 17)
    grid = np.linspace(0.0, 1.0, 200001)
    dens = grid ** 6 * (1 - grid) ** 2
    dens /= np.trapezoid(dens, grid)
    want = [np.trapezoid(dens * np.sum(grid[None, :] ** np.arange(k + 1)[:, None], 0), grid) for k in ks]
    assert h.model_steps(ks)[0] == pytest.approx(want, rel=1e-4)
    point = np.array([np.sum(0.7 ** np.arange(k + 1)) for k in ks])
    assert np.all(h.model_steps(ks)[0][3:] > point[3:] + 0.05)  # the tail of a draft kept in runs


@pytest.mark.parametrize("beta,td", [(0.0, 0.1), (0.1, 0.1), (0.05, 0.3), (0.6, 0.05)])
def test_a_model_step_is_chosen_as_the_model_drafts_own_policy_chooses_it(beta, td):
    """Where the lookup has nothing, the hybrid's model steps are the model draft's: the same K as
    AdaptiveK for the same acceptance counts and costs (the same prior, a catch-up pass with the
    chance that all K are kept), so the hybrid is not wider or narrower than the model draft alone."""
    h = hybrid(beta=beta, td=td)
    policy = AdaptiveK(k_max=16)
    policy.set_costs(list(h.cost.curve()[1:18]), td)
    assert h.acc["model"] == pytest.approx([policy.acc, policy.trials])  # the same prior
    seen = set()
    for acc, trials in [(2, 4), (9, 10), (30, 31), (60, 61), (19, 20), (5, 12), (40, 48)]:
        h.acc["model"] = [float(acc), float(trials)]
        policy.acc, policy.trials = float(acc), float(trials)
        want = policy._best()
        assert h.choose(1, 16, 0, "short") == (("synthetic", want) if want else ("none", 0)), (acc, trials)
        seen.add(want)
    assert len(seen) >= 3  # the grid spans narrow and wide choices


def test_tokens_are_counted_by_the_source_that_wrote_them():
    # the passes' simulated latencies, not the machine's noise, make the choices (with no latency a
    # numpy pass takes ~20 us: after the gguf tests the lookup sometimes won no step)
    pair = Pair.load("synthetic", "lookup+synthetic", target_options={"latency_ms": 2.0},
                     draft_options={"latency_ms": 1.0})
    g = pair.generate("abcdefgh" * 8, params=GREEDY, k=4, max_tokens=24)
    h = pair.drafter
    assert h.tokens["lookup"] > 0
    # every token but the last step's is credited to the step that wrote it
    assert h.tokens["lookup"] + h.tokens["other"] <= g.stats.n_tokens + 1
    assert h.tokens["lookup"] + h.tokens["other"] >= g.stats.n_tokens - 2 * 4 - 1


def test_run_records_steps_by_source():
    pair = Pair.load("synthetic", "lookup+synthetic", target_options={"latency_ms": 0.0})
    text = "abcdefgh" * 8
    g = pair.generate(text, params=GREEDY, k=4, max_tokens=24)
    assert g.stats.sources.get("lookup", 0) > 0
    assert sum(g.stats.sources.values()) == g.stats.n_target_passes
    assert g.to_dict()["steps_by_source"] == g.stats.sources
    info = pair.drafter.info()
    assert info["drafter"] == "lookup+synthetic"
    assert set(info["steps_by_source"]) == {"lookup", "synthetic", "none"}


def test_hybrid_policy_wraps_fixed_and_auto():
    pair = Pair.load("synthetic", "lookup+synthetic")
    fixed = pair.policy(3, 16)
    assert isinstance(fixed, HybridPolicy) and isinstance(fixed.inner, FixedK) and fixed.next_k() == 3
    assert pair.policy(fixed) is fixed
    auto = pair.timed_auto_policy(16, 10)
    assert isinstance(auto, HybridPolicy) and auto.adaptive and auto.next_k() == auto.inner.k_max


def test_names_parse_everywhere():
    assert split_hybrid("lookup+gguf") == ("lookup", "gguf") and split_hybrid("gguf") is None
    for bad in ("foo+gguf", "lookup+", "lookup+gguf+mlx"):
        with pytest.raises(BadOption):
            split_hybrid(bad)
    assert parse_pair("lookup+synthetic:synthetic").draft_backend == "synthetic"
    assert parse_pair("lookup:synthetic").draft == "lookup"
    for bad in ("lookup+nope:synthetic", "foo+synthetic:synthetic", "lookup:lookup"):
        with pytest.raises(BadOption):
            parse_pair(bad)
    with pytest.raises(BadOption, match="model backend"):
        Pair.load("synthetic", "lookup+ngram")


def test_cli_run_and_compare_take_a_hybrid(tmp_path):
    res = CliRunner().invoke(main, ["run", "--draft", "lookup+synthetic", "--target", "synthetic", "--k", "3",
                                    "--max-tokens", "12", "--json", "abcabcabcabc"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["run", "--draft", "foo+synthetic", "--target", "synthetic", "x"])
    assert res.exit_code == 2 and "LOOKUP+BACKEND" in res.output
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", "--pair", "lookup+synthetic:synthetic",
                                    "--pair", "lookup:synthetic",
                                    "--k", "3", "--repeats", "1", "--n-prompts", "2", "--max-tokens", "12",
                                    "--draft-opt", "synthetic:noise=0.2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "steps by source" in (out / "summary.md").read_text()


def test_the_lookup_bets_no_wider_than_the_lookup_alone_would():
    """Under k="auto" the lookup's width is capped by the K policy the lookup alone would run under
    (fed the lookup's and the plain steps): a copied stretch's proposals make the bets' survival ~1
    at every depth, but the lookup's verified bets keep nothing, so it bets narrow, as the lookup
    alone would (uncapped: the whole match)."""
    from specmac.core.loop import Event

    curve = [1.0 + 0.1 * (n - 1) for n in range(1, K_MAX + 2)]
    inner = AdaptiveK(k_max=K_MAX, horizon=400)
    inner.set_costs(curve, 0.1)
    h = HybridDrafter(LookupDrafter(), ModelDrafter(load_backend("synthetic", None, None, role="draft")))
    policy = HybridPolicy(inner, h, horizon=400, prefill_per_token=0.0)
    h.acc["model"] = [1.0, 50.0]  # a model that is rarely kept: the choice is the lookup's or none
    for _ in range(20):
        h.lookup.bets.observe("short", 16, 16, False)  # every proposal of the stretch kept whole

    cap = policy.lookup_cap()  # at the prior: a few drafts pay on this curve
    assert 1 <= cap <= 4 and h.choose(0, K_MAX, 16, "short") == ("lookup", cap)
    for _ in range(8):  # the lookup's own bets, each rejected at its first draft
        policy.update(Event(tokens=[1], kinds=["corrected"], k=cap, n_drafted=cap, n_accepted=0, t_draft=0.0,
                            t_target=curve[cap], t_other=0.0, source="lookup"))
    assert policy.lookup_cap() <= 1 and h.choose(0, K_MAX, 16, "short")[1] <= 1
    policy.lookup_policy = None  # uncapped, the bets alone: the whole match, 15 wide
    assert h.choose(0, K_MAX, 16, "short") == ("lookup", 16)
    fixed = HybridPolicy(FixedK(4), h, horizon=400, prefill_per_token=0.0)  # a fixed K: the user's width
    assert fixed.lookup_policy is None and fixed.lookup_cap() == K_MAX


def test_a_doubted_t1_probe_gets_its_plain_step():
    pair = Pair.load("synthetic", "lookup+synthetic")
    policy = pair.timed_auto_policy(16, 10)
    assert policy.next_k() == policy.inner.k_max
    policy.inner.costs.t1_doubted = True  # what AdaptiveK sets when wider passes beat T(1) by half
    assert policy.next_k() == 0
    policy.inner.costs.n_seen[1] = 1  # the plain step was timed
    assert policy.next_k() == policy.inner.k_max


@pytest.mark.parametrize("draft", ["lookup", "lookup+synthetic"])
@pytest.mark.parametrize("k", [3, "auto"])
def test_lookup_and_hybrid_are_seed_exact_under_the_coupled_sampler(draft, k):
    """The coupled sampler hands every drafter its noise: lookup and the hybrid (whose model drafts
    with it) emit plain decoding's tokens at the same seed."""
    from specmac.api import Pair
    from specmac.core.sampling import SamplingParams

    params = SamplingParams(1.0, sampler="coupled")
    prompt = "ab ab ab ab ab ab ab ab"
    pair = Pair.load("synthetic", draft)
    plain = pair.plain().generate(prompt, params=params, max_tokens=48, seed=5).token_ids
    assert pair.generate(prompt, params=params, max_tokens=48, seed=5, k=k).token_ids == plain


def _extending(beta=0.0, td=0.1):
    """A hybrid whose model step was just chosen (E(K) 2.5 tokens, 0.3 s of draft), its model kept
    9 of 10 drafts, and sure matches kept whole: (the hybrid, the text, the model's drafts) where
    the drafts lead into a stretch the text holds (1 2 3 4 5 6 ... repeated)."""
    h = hybrid(beta=beta, td=td)
    h.acc["model"] = [9.0, 10.0]
    for _ in range(10):
        h.lookup.bets.observe("sure", 6, 6, False)
        h.lookup.bets.observe("short", 6, 6, False)
    h._model_step = (2.5, 0.3)
    return h, [1, 2, 3, 4, 5, 6, 7, 8] * 3 + [1, 2], [3, 4]


def test_model_drafts_that_lead_into_a_copied_stretch_are_extended_where_the_width_is_cheap():
    h, seq, drafts = _extending(beta=0.0)  # every width costs one pass (torch bf16 on a CPU, nearly)
    ext = h._extension(seq, drafts, 16)
    assert len(ext) >= 4 and ext == ([5, 6, 7, 8, 1, 2, 3, 4] * 4)[:len(ext)]
    assert (h.lookup.last_match, h.lookup.last_kind) == (0, "weak")  # the lookup's own last proposal kept
    assert h.lookup.index.tokens == seq  # its index holds the committed text, not the model's drafts
    assert h._extension(seq, drafts, 5) == ext[:3]  # within the loop's k: the run's tokens left, the context
    assert h._extension(seq, drafts, 2) == []
    h, seq, drafts = _extending(beta=1.0)  # every token of a pass costs a pass (a serial target)
    assert h._extension(seq, drafts, 16) == []
    h, seq, _ = _extending(beta=0.0)
    assert h._extension(seq, [9, 9], 16) == []  # no match of min_match tokens after the drafts
    h._model_step = None  # the model was not what the step chose
    assert h._extension(seq, drafts, 16) == []


def test_an_extended_proposal_is_learnt_as_the_models_drafts_and_the_extensions_apart():
    h, seq, drafts = _extending()
    h.choose = lambda *a: ("synthetic", 2)  # the model's step, 2 drafts
    h.model.propose = lambda s, k, *a, **kw: (list(drafts), None)
    h.model_started, h.t_model = True, [0.1]
    got, q = h.propose(seq, 8, GREEDY, None, 16)
    assert got[:2] == drafts and len(got) > 2 and q is None
    ext = got[2:]
    h.propose([*seq, *drafts, ext[0], 0], 8, GREEDY, None, 16)  # the target kept the drafts and 1 more
    assert h.acc["model"] == pytest.approx([0.97 * 9 + 2, 0.97 * 10 + 2])  # the model's 2, no rejection
    assert h.extended["kept"] == 1 and h.extended["steps"] >= 1 and h.extended["proposed"] >= len(ext)


def _narrow_model_steps(monkeypatch, width=2):
    """The hybrid's model steps drafted 2 wide, whatever the costs say, so that a step with k = 8
    has room to extend them (a test of the extension, not of the choice)."""
    choose = HybridDrafter.choose

    def narrow(self, *a):
        source, w = choose(self, *a)
        return (source, min(w, width)) if source == self.model_source else (source, w)

    monkeypatch.setattr(HybridDrafter, "choose", narrow)


def _extended_pair(target, draft):
    """(the pair, the steps the model's drafts were extended in): on a flat curve (every width one
    pass, the draft's pass a hundredth), a fixed K of 8."""
    h = HybridDrafter(LookupDrafter(), ModelDrafter(draft), name=f"lookup+{draft.name}")
    h.cost = Costs(t1=1.0, beta=0.0, td=0.01, left=None)
    seen = []
    extension = h._extension
    h._extension = lambda *a: seen.append(extension(*a)) or seen[-1]
    return Pair(target, h), seen


@pytest.mark.parametrize("planted", [False, True])
def test_extended_proposals_keep_the_targets_distribution(monkeypatch, planted):
    """The rejection rule over a model's drafts and the lookup's extension of them: the target's
    distribution exactly (level 2, tests/exact.py). The draft is the target (all its drafts are
    kept), so the extension is reached; planted, the extension's rows carry no draft probability
    (its tokens are accepted without the rule), and the test fails."""
    from specmac.backends.synthetic import SyntheticBackend
    from specmac.core import hybrid as hybrid_module
    from tests.exact import level2

    _narrow_model_steps(monkeypatch)
    if planted:
        class NoRows(hybrid_module.ChainedRows):
            def __getitem__(self, i):
                n = len(self.first)
                return self.first[i] if i < n else np.zeros(len(self.second[i - n]))

        monkeypatch.setattr(hybrid_module, "ChainedRows", NoRows)
    kw = {"vocab_size": 6, "seed": 3, "eos_bias": -3.0, "sharpness": 0.5}
    pair, seen = _extended_pair(SyntheticBackend(role="target", **kw),
                                SyntheticBackend(role="draft", noise=0.0, **kw))
    p = level2(pair, SamplingParams(1.0), FixedK(8), n=1000, prompts=[[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])["p"]
    assert sum(map(len, seen)) > 150  # extension tokens proposed over the 1000 sequences
    assert (p < 1e-6) if planted else (p > 1e-3), p


@pytest.mark.parametrize("target,draft", [("torch", "gguf"), ("gguf", "torch")])
def test_greedy_extended_proposals_equal_plain_on_the_embedded_pair(monkeypatch, target, draft):
    _skip(target, draft)
    _narrow_model_steps(monkeypatch)
    t = load_backend(target, None, _opts(target), role="target")
    pair, seen = _extended_pair(t, load_backend(draft, None, _opts(draft), role="draft"))
    spec = pair.generate(PROMPT, params=GREEDY, k=FixedK(8), max_tokens=40)
    assert any(seen) and pair.drafter.extended["steps"] > 0
    assert spec.token_ids == pair.plain().generate(PROMPT, params=GREEDY, k=1, max_tokens=40).token_ids


def test_the_stats_say_how_often_the_lookup_extended_the_models_drafts():
    import json

    from specmac.cli.render import stats_block

    res = CliRunner().invoke(main, ["run", "--target", "synthetic", "--draft", "lookup+synthetic", "--k", "4",
                                    "--max-tokens", "8", "--json", "abcdefgh" * 8])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert r["k_policy"]["hybrid"]["extended"] == {"steps": 0, "proposed": 0, "kept": 0}  # a fixed K: never
    assert not any("extended" in line for line in stats_block(r, True))
    r["k_policy"]["hybrid"]["extended"] = {"steps": 3, "proposed": 7, "kept": 5}
    want = "the lookup extended the model's drafts in 3 steps: 7 tokens proposed, 5 kept"
    assert want in stats_block(r, True)


def test_under_auto_the_hybrid_weighs_the_lookups_weak_matches_too():
    """Under k="auto" the lookup proposes its matches under min_match too, and the hybrid's choice
    prices them against the model and a plain step (as the lookup's own bets do when it runs
    alone); under a fixed K, which no costs weigh, it proposes none."""
    curve = [1.0 + 0.02 * (n - 1) for n in range(1, K_MAX + 2)]  # a wide pass costs about one token
    inner = AdaptiveK(k_max=K_MAX, horizon=400)
    inner.set_costs(curve, 0.5)
    model = ModelDrafter(load_backend("synthetic", None, None, role="draft"))
    h = HybridDrafter(LookupDrafter(min_match=3), model)
    HybridPolicy(inner, h, horizon=400, prefill_per_token=0.0)
    h.acc["model"] = [1.0, 50.0]  # a model that is rarely kept: the choice is the lookup's or none
    seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs: a weak match
    drafts = h.propose(seq, K_MAX, GREEDY, np.random.default_rng(0), 100)[0]
    assert h.lookup.priced and h.lookup.last_kind == "weak"
    assert h.source == "lookup" and drafts and drafts == [7, 8, 9, 1][:len(drafts)]
    HybridPolicy(FixedK(4), h, horizon=400, prefill_per_token=0.0)  # the next run: a fixed K
    h.trim(0)
    assert not h.lookup.priced and h.lookup.draft(seq, 4)[0] == []


def test_a_lookup_step_counts_as_the_lookups_only_where_it_beats_a_started_model_too():
    """The share of the text the model would draft for (its prefill is paid back over it) counts a
    lookup step as the lookup's only where the lookup would have been chosen over a started model
    too: a weak bet taken while the model's prefill was still to be paid is a step the model would
    have taken; a copied stretch is the lookup's."""
    rng = np.random.default_rng(0)
    weak = hybrid(prefill=1.0, left=4000)  # a prefill of 6 s: the lookup is tried alone first
    weak.lookup.priced = True
    weak.acc["model"] = [9.0, 10.0]  # a model that would be kept far
    seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs: a weak match
    assert weak.propose(seq, 8, GREEDY, rng, 100)[0] and weak.source == "lookup"
    weak.propose([*seq, 7, 8], 8, GREEDY, rng, 100)
    assert weak.tokens == {"lookup": 0, "other": 2}
    copy = hybrid(prefill=1.0, left=4000)
    copy.acc["model"] = [1.0, 10.0]  # a model that is rarely kept
    for _ in range(10):
        copy.lookup.bets.observe("sure", 8, 8, False)  # copied stretches, kept whole
    seq = [3, 4, 5, 6, 7, 8, 9, 2, 0, 3, 4, 5, 6, 7, 8, 9]  # a 7-token match: a sure one
    assert copy.propose(seq, 8, GREEDY, rng, 100)[0] and copy.source == "lookup"
    copy.propose([*seq, 2, 0, 3], 8, GREEDY, rng, 100)
    assert copy.tokens == {"lookup": 2, "other": 1}  # two drafts kept, and the target's own token


def test_a_lookup_step_writes_only_the_drafts_it_had_kept():
    """A lookup step that won is credited with the drafts the target kept, not with the target's own
    token: a bet rejected at once wrote nothing of the lookup's, so failed bets do not shrink the
    share of the text the model would draft for (its prefill is paid back over it)."""
    rng = np.random.default_rng(0)
    h = hybrid(prefill=1.0, left=4000)
    h.acc["model"] = [1.0, 10.0]  # a model that is rarely kept: the lookup wins its steps
    for _ in range(10):
        h.lookup.bets.observe("sure", 8, 8, False)
    seq = [3, 4, 5, 6, 7, 8, 9, 2, 0, 3, 4, 5, 6, 7, 8, 9]  # a sure match: it proposes 2, 0, 3, ...
    # five drafts kept and the target's token; then a bet rejected at once; then no match (no lookup)
    for committed, source in (([2, 0, 3, 4, 5, 6], "lookup"), ([1], "lookup"), ([7], "none")):
        h.propose(seq, 8, GREEDY, rng, 100)
        assert h.source == source
        seq = [*seq, *committed]
    h.propose(seq, 8, GREEDY, rng, 100)
    assert h.tokens == {"lookup": 5, "other": 3}
    assert h.model_share() == pytest.approx(4 / 10)


def test_a_started_model_that_pays_takes_the_step_from_a_weak_lookup_bet():
    """A 1-2-token match's guess competes with a plain step, not with a started model that pays:
    the same step goes to the lookup while the model is not started, and to the model once it is,
    though the guess's own rate is the higher; a match of min_match tokens or more still competes."""
    h = hybrid()  # every width costs one pass, a model pass 0.1 of it
    h.acc["model"] = [1.0, 4.0]  # a model kept a quarter of the time: it pays, barely
    for _ in range(10):
        h.lookup.bets.observe("weak", 3, 3, False)  # weak guesses kept whole so far
        h.lookup.bets.observe("short", 3, 3, False)
    assert h.choose(0, 8, 3, "weak") == ("lookup", 3)
    h.model_started = True
    assert h.choose(0, 8, 3, "weak")[0] == "synthetic"
    assert h.choose(0, 8, 3, "short") == ("lookup", 3)
    h.acc["model"] = [0.0, 50.0]  # a model that does not pay: the guess beats a plain step again
    assert h.choose(0, 8, 3, "weak") == ("lookup", 3)
