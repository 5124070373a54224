"""Several sequences on one backend (``lanes``, ``score_many``), on every backend with the embedded
pair: a pass over several lanes gives each lane the rows it would get alone (exactly for llama.cpp
and MLX; torch's packed forward to float32 rounding, the argmax the same), each lane keeps and
rewinds its own sequence, lanes share the weights, and a lane's cache saves and restores into
another; greedy streams sharing passes write what each writes alone (F16 GGUF, float32 torch)."""

from __future__ import annotations

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.core.loop import Event, pass_streams
from specmac.core.sampling import SamplingParams
from tests.support.helpers import skip_unless_installed

BACKENDS = [("gguf", {"quant": "f16"}), ("torch", {"dtype": "float32"}), ("mlx", None)]
TEXTS = ["def fib(n):\n    if n < 2:\n        return", "The capital of France is Paris, and",
         "x = [1, 2, 3]\nfor i in x:\n    print", "import numpy as np\nimport torch\n"]


def need(name):
    mark = skip_unless_installed(name)
    if mark.args[0]:
        pytest.skip(mark.kwargs["reason"])


@pytest.mark.parametrize("name, opts", BACKENDS)
def test_one_pass_over_lanes_gives_each_its_own_rows(name, opts):
    need(name)
    b = load_backend(name, None, opts)
    seqs = [b.encode(t) for t in TEXTS]
    ref = []
    for s in seqs:
        b.reset()
        b.prefill(s[:-3])
        ref.append(b.score(s[-3:]))
    b.reset()
    lanes = b.lanes(4)
    assert len(lanes) == 4 and lanes[0] is b
    assert b.score_many([(lane, s[:-3], False) for lane, s in zip(lanes, seqs)]) == [None] * 4
    rows = b.score_many([(lane, s[-3:], True) for lane, s in zip(lanes, seqs)])
    for r, x in zip(ref, rows):
        assert x.shape == r.shape
        assert np.array_equal(r.argmax(-1), x.argmax(-1))
        if name == "torch":  # a wider matmul may sum float32 in another order, not more
            np.testing.assert_allclose(x, r, atol=1e-3)
        else:
            assert np.array_equal(x, r)
    assert [lane.held for lane in lanes] == seqs
    lanes[1].rewind(2)
    assert lanes[1].held == seqs[1][:2] and lanes[2].held == seqs[2] and lanes[0].held == seqs[0]
    if b.can_save:
        saved = lanes[2].save()
        lanes[3].restore(saved)
        assert lanes[3].held == seqs[2]
        again = [b.score_many([(lane, [seqs[2][0]], True)])[0] for lane in (lanes[2], lanes[3])]
        assert np.array_equal(again[0].argmax(-1), again[1].argmax(-1))


def test_torch_forwards_are_the_ones_score_many_makes():
    """What the planner prices a pass by (``forwards``) is what the pass computes: asks of unlike
    widths (a stream drafting beside three that do not) and of like widths in one forward over
    their tokens, no padding."""
    need("torch")
    b = load_backend("torch", None, {"dtype": "float32"})
    seqs = [b.encode(t) for t in TEXTS]
    lanes = b.lanes(4)
    b.score_many([(lane, s[:-4], False) for lane, s in zip(lanes, seqs)])
    shapes = []
    hook = b.model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        for widths in ([4, 1, 1, 1], [1, 1, 1, 1]):
            shapes.clear()
            b.score_many([(lane, s[-4:][:w], True) for lane, s, w in zip(lanes, seqs, widths)])
            for lane, s in zip(lanes, seqs):
                lane.rewind(len(s) - 4)
            assert sorted(n * m for n, m in shapes) == sorted(b.forwards(widths)), (widths, shapes)
    finally:
        hook.remove()
    assert b.forwards([4, 1, 1, 1]) == [7] and b.forwards([2, 2, 2, 2]) == [8]


@pytest.mark.parametrize("name, opts", [*BACKENDS, ("synthetic", None)])
def test_a_pass_returns_only_the_last_rows_asked_for(name, opts):
    """``rows`` a number n: the logits of the last n positions, those of the whole pass's last n
    (a step's pass reading a prompt's last tokens needs no rows of them); one lane alone and
    lanes of different lengths in one pass, with a prompt chunk beside them that wants none."""
    if name != "synthetic":
        need(name)
    b = load_backend(name, None, opts)
    seqs = [b.encode(t) for t in TEXTS]
    full = []
    for s in seqs:
        b.reset()
        full.append(b.score(s))
    b.reset()
    lanes = b.lanes(4)
    tails = [2, 5, 1, 0]
    rows = b.score_many([(lane, s, n) for lane, s, n in zip(lanes, seqs, tails)])
    assert rows[3] is None and [lane.held for lane in lanes] == seqs
    for r, f, n in zip(rows[:3], full, tails):
        assert r.shape == (n, f.shape[1])
        assert np.array_equal(r.argmax(-1), f[-n:].argmax(-1))
        np.testing.assert_allclose(r, f[-n:], atol=1e-3 if name == "torch" else 1e-4)
    b.reset()
    alone = b.score_many([(b, seqs[0], 3)])[0]
    np.testing.assert_allclose(alone, full[0][-3:], atol=1e-3 if name == "torch" else 1e-4)


@pytest.mark.parametrize("name, opts", BACKENDS)
def test_lanes_share_the_weights(name, opts):
    need(name)
    b = load_backend(name, None, opts)
    lanes = b.lanes(3)
    weights = {"gguf": "_model", "torch": "model", "mlx": "model"}[name]
    assert all(getattr(lane, weights) is getattr(b, weights) for lane in lanes)


@pytest.mark.parametrize("name, opts", BACKENDS)
def test_lanes_asked_for_again_start_empty(name, opts):
    """Two pairs on one backend each ask it for lanes: the second set starts empty, whatever the
    first left in the same sequences, and scores as a fresh one does."""
    need(name)
    b = load_backend(name, None, opts)
    ids = b.encode(TEXTS[0])
    first = b.lanes(2)
    want = first[1].score(ids)
    again = b.lanes(2)
    assert again[1].n_past == 0
    np.testing.assert_allclose(again[1].score(ids), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("target, opts, draft", [("gguf", {"quant": "f16"}, "gguf"),
                                                 ("torch", {"dtype": "float32"}, None),
                                                 ("torch", {"dtype": "float32"}, "torch")])
def test_greedy_streams_sharing_passes_write_what_each_writes_alone(target, opts, draft):
    need(target)
    pair = Pair.load(target, draft, target_options=opts)
    params = SamplingParams(0.0)
    ref = [pair.generate(t, params=params, max_tokens=20, k=4, seed=0, reuse=False).token_ids for t in TEXTS]
    lanes = pair.lanes(4)
    planner = pair.planner(4)
    streams = [pair.start(lane, pair.encode(t), params=params, max_tokens=20, k=planner, seed=0)
               for lane, t in zip(lanes, TEXTS)]
    out = [[] for _ in TEXTS]
    while any(not s.done for s in streams):
        live = [i for i, s in enumerate(streams) if not s.done]
        events = pass_streams(lanes[0].target, [streams[i] for i in live], planner,
                              {j: 4 for j in range(len(live))})
        for i, e in zip(live, events):
            assert not isinstance(e, Exception), e
            if isinstance(e, Event):
                out[i] += e.tokens
    assert out == ref


def test_a_torch_pass_that_fails_midway_leaves_each_lane_as_it_was():
    """An error inside the forward over several lanes (here from the attention of its third layer,
    after the first two appended every lane's new keys) leaves each lane's cache holding what it
    held before, so the same pass again gives the rows a pass that never failed gives."""
    need("torch")
    import specmac.backends.torch as tb

    b = load_backend("torch", None, {"dtype": "float32"})
    seqs = [b.encode(t) for t in TEXTS]
    lanes = b.lanes(4)
    b.score_many([(lane, s[:-2], False) for lane, s in zip(lanes, seqs[:3])])  # the fourth stays empty
    asks = [(lane, s[-2:], True) for lane, s in zip(lanes, seqs[:3])] + [(lanes[3], seqs[3], True)]
    want = b.score_many(asks)
    for lane, s in zip(lanes, seqs[:3]):
        lane.rewind(len(s) - 2)
    lanes[3].reset()
    real = tb.lanes_attention

    def failing(module, *args, **kw):
        if module.layer_idx == 2:
            raise RuntimeError("planted")
        return real(module, *args, **kw)
    tb.AttentionInterface.register(tb.LANES, failing)
    try:
        with pytest.raises(RuntimeError, match="planted"):
            b.score_many(asks)
    finally:
        tb.AttentionInterface.register(tb.LANES, real)
    assert [lane.n_past for lane in lanes] == [len(s) - 2 for s in seqs[:3]] + [0]
    assert [lane.held for lane in lanes] == [s[:-2] for s in seqs[:3]] + [[]]
    got = b.score_many(asks)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)
