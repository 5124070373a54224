"""The backend contract, written once and run on every installed backend (embedded pair).

In CI all three CPU backends are installed, so nothing here skips there.
"""

from __future__ import annotations

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.core.drafters import ModelDrafter
from specmac.core.sampling import SamplingParams
from specmac.errors import VocabMismatch
from tests.support.helpers import skip_unless_installed

ALL = ("synthetic", "mlx", "gguf", "torch")
REAL = ("mlx", "gguf", "torch")
# options that make each backend compute in full precision on the CPU
EXACT = {"synthetic": {}, "mlx": {"dtype": "float32"}, "gguf": {"quant": "f16"},
         "torch": {"dtype": "float32", "device": "cpu"}}
# batched vs serial and rewind tolerance on logits, per backend at the EXACT options
TOL = {"synthetic": 0.0, "mlx": 1e-3, "gguf": 2e-2, "torch": 1e-3}
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def needs(name):
    return pytest.param(name, marks=skip_unless_installed(name))


_cache: dict = {}


def get(name: str, role: str = "target"):
    key = (name, role)
    if key not in _cache:
        _cache[key] = load_backend(name, None, EXACT[name], role=role)
    b = _cache[key]
    b.reset()
    return b


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_score_shape_and_cache(name):
    b = get(name)
    ids = b.encode(PROMPT)
    out = b.score(ids)
    assert out.dtype == np.float32
    assert out.shape == (len(ids), b.vocab.n_logits)
    assert b.n_past == len(ids)
    assert b.vocab.n_logits >= b.vocab.size
    assert b.vocab.eos_ids


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_batched_equals_serial(name):
    b = get(name)
    ids = b.encode(PROMPT)
    b.score(ids[:4])
    batched = b.score(ids[4:12])
    b.rewind(4)
    serial = np.concatenate([b.score([t]) for t in ids[4:12]])
    np.testing.assert_allclose(batched, serial, atol=TOL[name], rtol=0)
    assert (batched.argmax(-1) == serial.argmax(-1)).all()


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_rewind_then_rescore_equals_fresh(name):
    b = get(name)
    ids = b.encode(PROMPT)
    fresh = b.score(ids)
    b.rewind(3)
    assert b.n_past == 3
    b.score([ids[3] + 1 if ids[3] + 1 < b.vocab.size else 0])  # a wrong turn, then rewind it
    b.rewind(3)
    again = b.score(ids[3:])
    np.testing.assert_allclose(again, fresh[3:], atol=TOL[name], rtol=0)


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_prefill_is_last_row_of_score(name):
    b = get(name)
    ids = b.encode(PROMPT)
    last = b.prefill(ids)
    assert b.n_past == len(ids)
    b.reset()
    full = b.score(ids)
    np.testing.assert_allclose(last, full[-1], atol=TOL[name], rtol=0)


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_encode_decode_round_trip(name):
    b = get(name)
    text = "import os\nprint(os.path.join('a', 'b'))"
    if name == "synthetic":
        text = "print os 42"
    assert b.decode(b.encode(text)) == text


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_special_tokens_are_not_rendered(name):
    """One rule on every backend: decode renders no special token (EOS, BOS, control tokens)."""
    b = get(name)
    ids = b.encode("print os 42" if name == "synthetic" else "x = 1")
    special = sorted(b.vocab.special_ids | b.vocab.eos_ids)
    assert special, f"{name}'s vocabulary names no special token"
    assert b.decode([*ids, *special]) == b.decode(ids)


@pytest.mark.parametrize("name", [needs(n) for n in ALL])
def test_info_records_options(name):
    info = get(name).info()
    assert info["backend"] == name
    assert isinstance(info["options"], dict) and info["options"]
    assert info["vocab"]["fingerprint"]


@pytest.mark.parametrize("draft", [needs(n) for n in REAL])
@pytest.mark.parametrize("target", [needs(n) for n in REAL])
def test_greedy_speculative_equals_target_greedy(draft, target):
    pair = Pair(get(target), ModelDrafter(get(draft, "draft")))
    base = Pair(get(target))
    greedy = SamplingParams(0.0)
    for k in (1, 4):
        spec = pair.generate("def fibonacci(n):", params=greedy, max_tokens=24, k=k)
        ref = base.generate("def fibonacci(n):", params=greedy, max_tokens=24, k=k)
        assert spec.token_ids == ref.token_ids, (draft, target, k)
        assert spec.stats.n_drafted > 0
    sampled = pair.generate("def ", params=SamplingParams(1.0), max_tokens=32, k=4, seed=1)
    s = sampled.stats
    assert 0 <= s.acceptance_rate <= 1 and 1 <= s.tokens_per_target_pass <= 5
    assert s.n_tokens == len(sampled.token_ids) <= 32


def both(a, b):
    return pytest.param(a, b, marks=[skip_unless_installed(a), skip_unless_installed(b)])


@pytest.mark.parametrize("a,b", [both("torch", "mlx"), both("torch", "gguf"), both("mlx", "gguf")])
def test_same_weights_agree_across_backends(a, b):
    x, y = get(a), get(b)
    ids = x.encode(PROMPT)
    assert y.encode(PROMPT) == ids
    lx, ly = x.score(ids), y.score(ids)
    n = min(x.vocab.size, y.vocab.size)
    tol = 0.05 if "gguf" in (a, b) else 1e-3  # F16 weights vs fp32
    np.testing.assert_allclose(lx[:, :n], ly[:, :n], atol=tol, rtol=0)
    assert (lx[:, :n].argmax(-1) == ly[:, :n].argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("name", [needs(n) for n in REAL])
def test_incompatible_vocab_fails_clearly(name):
    with pytest.raises(VocabMismatch, match="differ"):
        Pair.load(target=name, draft="synthetic", target_options=EXACT[name])
