"""A conversation pays only for its new tokens: the caches keep what they hold of the next prompt,
and a store keeps other conversations' caches; the tokens are the same with or without it."""

from __future__ import annotations

import logging

import pytest

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.drafters import ModelDrafter
from specmac.core.lookup import LookupDrafter
from specmac.core.sampling import SamplingParams
from specmac.store import Entry, SequenceStore
from specmac.store.disk import DiskTier
from tests.support.helpers import skip_unless_installed

GREEDY = SamplingParams(0.0)
COUPLED = SamplingParams(1.0, sampler="coupled")


class Counting(SyntheticBackend):
    """A synthetic backend that counts the tokens its passes process."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.processed = 0

    def score(self, tokens):
        self.processed += len(tokens)
        return super().score(tokens)


def counting_pair(store=None):
    target, draft = Counting(role="target"), Counting(role="draft")
    return Pair(target, [LookupDrafter(), ModelDrafter(draft)], store=store), target, draft


def turns(pair, first, n=3, params=GREEDY, **kw):
    """A conversation of ``n`` turns: each prompt the last one, its answer and a new message."""
    prompt, outs = list(first), []
    for i in range(n):
        g = pair.generate(prompt, params=params, max_tokens=16, seed=7, k=4, **kw)
        outs.append(g)
        prompt = prompt + g.token_ids + pair.encode(f" and then, {i}?")
    return outs


def test_the_next_turn_processes_only_its_new_tokens():
    pair, target, draft = counting_pair()
    first = pair.encode("tell me about the weather on mars and venus, please. " * 6)
    g1 = pair.generate(first, params=GREEDY, max_tokens=16, k=4)
    second = first + g1.token_ids + pair.encode(" and on jupiter?")
    target.processed = draft.processed = 0
    g2 = pair.generate(second, params=GREEDY, max_tokens=16, k=4)
    new = len(second) - g2.stats.cached_tokens
    assert g2.stats.cached_tokens >= len(first) and new < 30
    # the target: the new tokens, then its passes; the draft: its catch-up is the new tokens too
    assert target.processed <= new + g2.stats.n_tokens + g2.stats.n_drafted + g2.stats.n_target_passes
    assert draft.processed <= new + 2 * g2.stats.n_drafted + g2.stats.n_target_passes
    again = Pair(Counting(role="target"), [LookupDrafter(), ModelDrafter(Counting(role="draft"))])
    assert again.generate(second, params=GREEDY, max_tokens=16, k=4, reuse=False).token_ids == g2.token_ids
    assert again.generate(second, params=GREEDY, max_tokens=16, k=4, reuse=False).stats.cached_tokens == 0


def test_the_stats_say_what_the_draft_caught_up_on():
    """The draft's processing per turn is in the stats: the prompt on the first turn, the new tokens
    (not the conversation) on the next."""
    pair = Pair(Counting(role="target"), ModelDrafter(Counting(role="draft")))
    first = pair.encode("tell me about the weather on mars and venus, please. " * 6)
    g1 = pair.generate(first, params=GREEDY, max_tokens=16, k=4)
    second = first + g1.token_ids + pair.encode(" and on jupiter?")
    g2 = pair.generate(second, params=GREEDY, max_tokens=16, k=4)
    assert g1.stats.draft_caught_up >= len(first) - 1
    new = len(second) - g2.stats.cached_tokens
    assert 0 < g2.stats.draft_caught_up <= new + g2.stats.n_tokens < len(first)
    fresh = Pair(Counting(role="target"), ModelDrafter(Counting(role="draft")))
    g = fresh.generate(second, params=GREEDY, max_tokens=16, k=4, reuse=False)
    assert g.stats.draft_caught_up >= len(second) - 1


@pytest.mark.parametrize("params", [GREEDY, COUPLED], ids=["greedy", "coupled"])
def test_the_same_tokens_with_reuse_and_without(params):
    first = SyntheticBackend().encode("a conversation about cats and dogs and birds. " * 5)
    reused = turns(counting_pair()[0], first, params=params)
    fresh = turns(counting_pair()[0], first, params=params, reuse=False)
    assert [g.token_ids for g in reused] == [g.token_ids for g in fresh]
    assert all(g.stats.cached_tokens > 0 for g in reused[1:])
    assert all(g.stats.cached_tokens == 0 for g in fresh)


FP = [("gguf", {"quant": "f16"}), ("torch", {"dtype": "float32"}), ("mlx", None)]  # the fp32 / F16 weights


@pytest.mark.parametrize("name, opts", FP)
@pytest.mark.parametrize("params", [GREEDY, COUPLED], ids=["greedy", "coupled"])
def test_the_same_tokens_with_reuse_and_without_on_every_backend(name, opts, params):
    """The embedded pair's fp32 / F16 weights: a prompt processed in pieces (a turn at a time)
    gives the same tokens as in one piece."""
    mark = skip_unless_installed(name)
    if mark.args[0]:
        pytest.skip(mark.kwargs["reason"])
    target = load_backend(name, None, opts, role="target")
    draft = load_backend(name, None, opts, role="draft")
    pair = Pair(target, [LookupDrafter(), ModelDrafter(draft)])
    first = target.encode("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n")
    reused = turns(pair, first, params=params)
    fresh = turns(pair, first, params=params, reuse=False)
    assert [g.token_ids for g in reused] == [g.token_ids for g in fresh]
    assert reused[-1].stats.cached_tokens > len(first)


def test_interleaved_conversations_each_find_their_own_cache():
    store = SequenceStore(1 << 20)
    pair = counting_pair(store)[0]
    a = pair.encode("conversation A: tell me about cats and dogs. " * 4)
    b = pair.encode("conversation B: what is the weather on mars? " * 4)
    def gen(p):
        return pair.generate(p, params=GREEDY, max_tokens=12)

    ga, gb = gen(a), gen(b)
    a2, b2 = a + ga.token_ids + pair.encode(" more please"), b + gb.token_ids + pair.encode(" and venus")
    ga2, gb2 = gen(a2), gen(b2)
    assert ga2.stats.cached_tokens >= len(a) and gb2.stats.cached_tokens >= len(b)
    assert store.hits == 2 and store.info()["entries"] == 1  # A's cache, saved while B is live
    fresh = counting_pair()[0]
    assert fresh.generate(a2, params=GREEDY, max_tokens=12, reuse=False).token_ids == ga2.token_ids
    assert fresh.generate(b2, params=GREEDY, max_tokens=12, reuse=False).token_ids == gb2.token_ids
    small = SequenceStore(100)  # too small for either: evicted, both still answered the same
    tight = counting_pair(small)[0]
    assert [tight.generate(p, params=GREEDY, max_tokens=12).token_ids for p in (a, b, a2, b2)] == \
        [ga.token_ids, gb.token_ids, ga2.token_ids, gb2.token_ids]
    assert small.evictions >= 2 and small.info()["entries"] == 0


def test_the_store_keeps_the_most_recent_within_its_budget():
    from specmac.backends import Saved

    def entry(tokens, nbytes=100):
        return Entry(tuple(tokens), {"target": Saved(tuple(tokens), None, nbytes)})

    store = SequenceStore(250)
    store.put(entry([1, 2, 3]))
    store.put(entry([7, 8]))
    store.put(entry([1, 2, 3, 4]))  # grew from [1, 2, 3]: replaces it
    assert list(store.entries) == [(7, 8), (1, 2, 3, 4)] and store.nbytes == 200
    assert store.best([1, 2, 3, 4, 5])[1] == 4 and store.best([9]) is None
    store.put(entry([5, 6]))  # over budget: the least recently used goes
    assert list(store.entries) == [(1, 2, 3, 4), (5, 6)] and store.evictions == 1
    store.put(entry([9], nbytes=1000))  # larger than the budget: not kept
    assert (9,) not in store.entries and store.evictions == 2
    taken = store.take(store.best([5, 6, 0])[0])
    assert taken.tokens == (5, 6) and store.hits == 1 and store.nbytes == 100


def test_the_disk_tier_is_whole_or_absent_and_never_foreign(tmp_path, caplog):
    def saved_pair():
        t, d = Counting(role="target"), Counting(role="draft")
        return {"target": t, "synthetic": d}

    backends = saved_pair()
    disk = DiskTier(tmp_path, backends, budget=1 << 20)
    t = backends["target"]
    t.score([1, 2, 3, 4])
    disk.put(Entry((1, 2, 3, 4), {"target": t.save()}))
    assert disk.best([1, 2, 3, 4, 5])[1] == 4
    got = disk.take(disk.best([1, 2, 3, 4, 5])[0])
    assert got.saved["target"].tokens == (1, 2, 3, 4) and disk.info()["entries"] == 0
    # a write cut off (no entry.json) and a corrupt file: skipped, refused with one line, removed
    disk.put(Entry((5, 6), {"target": Saved5()}))
    folder = disk.index[(5, 6)]
    next(f for f in folder.iterdir() if f.name != "entry.json").write_bytes(b"changed")
    with caplog.at_level(logging.WARNING, logger="specmac.store"):
        bad = disk.take(disk.best([5, 6])[0])
    assert bad.saved == {} and disk.refused == 1 and "cannot be used" in caplog.text
    (disk.root / "half").mkdir()
    (disk.root / "half" / "target.none").write_bytes(b"")
    again = DiskTier(tmp_path, backends, budget=1 << 20)
    assert not (again.root / "half").exists() and again.index == {}
    # another model's (another option) entries live elsewhere and are never read
    other = {"target": Counting(role="target", seed=1), "synthetic": Counting(role="draft")}
    assert DiskTier(tmp_path, other, budget=1 << 20).root != disk.root


class Saved5:
    """A saved synthetic cache of two tokens (its state is its tokens)."""

    tokens, state, nbytes = (5, 6), None, 16


# --- the identity checks have power: planted reuse and restore bugs change the tokens -----------

def _gguf_f16_pair(store):
    mark = skip_unless_installed("gguf")
    if mark.args[0]:
        pytest.skip(mark.kwargs["reason"])
    t = load_backend("gguf", None, {"quant": "f16"}, role="target")
    d = load_backend("gguf", None, {"quant": "f16"}, role="draft")
    return Pair(t, [LookupDrafter(), ModelDrafter(d)], store=store)


def _two_chats_and_an_edit(pair, reuse=True) -> list[list[int]]:
    """Two conversations interleaved (each restored from the store in turn), then the first one's
    answer edited halfway (a regenerated turn: the cache holds tokens past where the prompt parts)."""
    def gen(ids):
        return pair.generate(ids, params=GREEDY, max_tokens=16, k=4, seed=7, reuse=reuse).token_ids

    a = pair.encode("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n")
    b = pair.encode("class Stack:\n    def __init__(self):\n        self.items = []\n\n"
                    "    def push(self, x):\n")
    ga, gb = gen(a), gen(b)
    ga2 = gen(a + ga + pair.encode("\n\ndef sub(a, b):\n"))
    gb2 = gen(b + gb + pair.encode("\n\n    def pop(self):\n"))
    ga3 = gen(a + ga[: len(ga) // 2] + pair.encode("  # edited\n\ndef div(a, b):\n"))
    return [ga, gb, ga2, gb2, ga3]


def _overclaim(monkeypatch):
    """The loop trusts one token more of the held prefix than matches the prompt."""
    from specmac.core import loop

    real = loop.common_prefix
    monkeypatch.setattr(loop, "common_prefix", lambda a, b, cap: min(real(a, b, cap) + 1, cap, len(a)))


def _restore_short(monkeypatch):
    """A restore that loses the last cell of the saved sequence while ``held`` says it is there."""
    import llama_cpp

    from specmac.backends.gguf import GGUFBackend

    real = GGUFBackend.restore

    def restore(self, saved):
        real(self, saved)
        if saved.tokens:
            llama_cpp.llama_memory_seq_rm(self._mem, self._seq, len(saved.tokens) - 1, len(saved.tokens))
    monkeypatch.setattr(GGUFBackend, "restore", restore)


@pytest.mark.parametrize("plant", [None, _overclaim, _restore_short],
                         ids=["honest", "overclaim", "restore-short"])
def test_the_identity_check_catches_planted_reuse_bugs(plant, monkeypatch):
    """On the embedded F16 pair (whose logits read the whole context, unlike the synthetic pair's
    last two tokens): reused caches give the fresh run's tokens, and each planted bug does not
    (different tokens, or llama.cpp refusing a cache with a hole in it)."""
    fresh = _two_chats_and_an_edit(_gguf_f16_pair(None), reuse=False)
    pair = _gguf_f16_pair(SequenceStore(1 << 30))
    if plant is None:
        assert _two_chats_and_an_edit(pair) == fresh
        assert pair.store.hits >= 2
        return
    plant(monkeypatch)
    try:
        got = _two_chats_and_an_edit(pair)
    except RuntimeError as e:  # llama.cpp's decode refuses the hole
        assert "llama_decode failed" in str(e)
        return
    assert got != fresh


@pytest.mark.parametrize("plant", [None, _overclaim], ids=["honest", "overclaim"])
def test_verify_exact_over_turns_catches_a_planted_reuse_bug(plant, monkeypatch):
    """`specmac verify --exact --turns 3` on the embedded F16 pair: each turn reuses what the
    caches hold of the conversation and matches its twin from empty caches; with the loop trusting
    one token too many of the held prefix, a turn parts and the parting is a pipeline error, not
    a near-tie flip of round-off."""
    from specmac.lossless.exact import exact_check, verdict

    if plant is not None:
        plant(monkeypatch)
    res = exact_check(_gguf_f16_pair(None), params=COUPLED, n_sequences=6, length=16, k=4, turns=3)
    reused = [s["cached_tokens"] for s in res["sequences"] if s["turn"] > 1]
    if plant is None:
        assert len(reused) == 4 and all(n > 0 for n in reused), res["sequences"]
        assert res["n_failures"] == 0 and res["n_identical"] == 6, res["partings"]
    else:
        assert res["n_failures"] > 0, res["partings"]
        assert verdict(res).startswith("FAIL") and "pipeline error" in verdict(res)
