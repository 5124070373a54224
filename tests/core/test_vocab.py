import numpy as np
import pytest

from specmac.errors import VocabMismatch
from specmac.vocab import Vocab, align_logits, check_compatible


def test_same_bytes_are_compatible_even_with_different_sizes():
    check_compatible(Vocab([b"a", b"b", b"c"], eos_ids=frozenset({2})),
                     Vocab([b"a", b"b", b"c", b"d"], eos_ids=frozenset({2})))


def test_mismatch_names_the_ids():
    with pytest.raises(VocabMismatch, match=r"differ on 1 of 3 shared ids, e\.g\. 1 \(b'b' vs b'x'\)"):
        check_compatible(Vocab([b"a", b"b", b"c"]), Vocab([b"a", b"x", b"c"]))


def test_padding_rows_are_ignored():
    # llama.cpp renders unused padding rows as b"", a converted HF tokenizer as "[PAD3]"
    hf = Vocab([b"a", b"b", b"c", b"[PAD3]"], unused_ids=frozenset({3}))
    gguf = Vocab([b"a", b"b", b"c", b""], unused_ids=frozenset({3}))
    check_compatible(hf, gguf)


def test_fingerprint_depends_on_bytes_and_specials():
    a = Vocab([b"a", b"b"], eos_ids=frozenset({1}))
    assert a.fingerprint == Vocab([b"a", b"b"], eos_ids=frozenset({1})).fingerprint
    assert a.fingerprint != Vocab([b"a", b"c"], eos_ids=frozenset({1})).fingerprint
    assert a.fingerprint != Vocab([b"a", b"b"], eos_ids=frozenset({0})).fingerprint


def test_align_logits_drops_padding_and_pads_missing_with_neg_inf():
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    assert align_logits(x, 4).shape == (1, 4)
    y = align_logits(x, 8)
    assert y.shape == (1, 8) and np.isneginf(y[0, 6:]).all()
