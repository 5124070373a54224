"""MLX-specific behaviour on a tiny random Llama written with mlx itself (the contract is in
test_contract.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specmac.backends import load_backend, missing_requirements
from specmac.errors import BadOption, BadTokens, ContextOverflow, ModelNotFound, SpecmacError

MISSING = missing_requirements("mlx")
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the mlx backend needs {', '.join(MISSING)}, "
                                                      "not installed (pip install 'specmac[mlx]')")
TEXT = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 4
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
          "max_position_embeddings": 512, "tie_word_embeddings": False, "eos_token_id": 0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Hugging Face folder: random llama weights (mlx) + a byte-level BPE tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-mlx")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=alphabet))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)
    config = CONFIG | {"vocab_size": tok.get_vocab_size() + 13}  # a padded embedding, as real models have
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def backend(folder):
    return load_backend("mlx", str(folder), {"dtype": "float32", "device": "cpu"})


def test_resolved_options_and_padded_vocab(backend, folder):
    assert backend.resolved == {"dtype": "float32", "device": "cpu", "n_ctx": 512}
    assert backend.vocab.n_logits == backend.vocab.size + 13
    assert backend.vocab.eos_ids == {0}
    assert "cpu" in type(backend).devices()
    assert type(backend).peek_vocab(str(folder), dtype="float16").fingerprint == backend.vocab.fingerprint


def test_dtype_option_casts_the_weights(backend, folder):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    half = load_backend("mlx", str(folder), {"dtype": "float16"})
    assert {v.dtype for _, v in tree_flatten(half.model.parameters())} == {mx.float16}
    assert {v.dtype for _, v in tree_flatten(backend.model.parameters())} == {mx.float32}
    ids = backend.encode(TEXT)[:24]
    backend.reset()
    full, low = backend.score(ids), half.score(ids)
    assert low.dtype == np.float32
    np.testing.assert_allclose(low, full, atol=2e-2, rtol=0)  # fp16 rounding only
    assert not np.array_equal(low, full)


def test_trim_then_rescore_equals_fresh_across_cache_growth(backend):
    # mlx-lm's KVCache grows in steps of 256: a wrong branch that crosses the boundary, trimmed
    # back, must leave exactly the state of a fresh run
    ids = (backend.encode(TEXT) * 20)[:300]
    backend.reset()
    fresh = backend.score(ids)
    backend.reset()
    backend.score(ids[:250])
    backend.score([(t + 7) % backend.vocab.size for t in ids[250:270]])
    backend.rewind(250)
    again = backend.score(ids[250:])
    np.testing.assert_allclose(again, fresh[250:], atol=1e-5, rtol=0)
    backend.rewind(0)
    assert backend.n_past == 0
    np.testing.assert_allclose(backend.score(ids[:5]), fresh[:5], atol=1e-5, rtol=0)


def test_greedy_matches_mlx_lm_generate_step(backend):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = backend.encode(TEXT)[:16]
    ref = [int(t) for t, _ in generate_step(mx.array(prompt), backend.model, max_tokens=12)]
    backend.reset()
    ours = [int(backend.prefill(prompt).argmax())]
    while len(ours) < 12:
        ours.append(int(backend.score([ours[-1]])[0].argmax()))
    assert ours == ref


def test_context_window_and_bad_calls(backend, folder):
    backend.reset()
    with pytest.raises(ContextOverflow, match="n_ctx=512"):
        backend.score([5] * 513)
    with pytest.raises(ValueError, match="cannot rewind to 3"):
        backend.rewind(3)
    with pytest.raises(BadTokens, match="ids must be in"):
        backend.score([backend.vocab.n_logits])
    assert backend.n_past == 0
    assert load_backend("mlx", str(folder), {"n_ctx": "64"}).n_ctx == 64
    with pytest.raises(BadOption, match="n_ctx=1000"):
        load_backend("mlx", str(folder), {"n_ctx": 1000})
    with pytest.raises(BadOption, match="dtype"):
        load_backend("mlx", str(folder), {"dtype": "int8"})


def test_unavailable_gpu_is_a_bad_option(folder):
    import mlx.core as mx

    if mx.is_available(mx.gpu):
        pytest.skip("this machine has an mlx GPU, so device=gpu is valid")
    with pytest.raises(BadOption, match="device=gpu is not available"):
        load_backend("mlx", str(folder), {"device": "gpu"})


def test_untrimmable_cache_is_refused_by_name():
    from mlx_lm.models.cache import ArraysCache, KVCache

    from specmac.backends.mlx import check_trimmable

    check_trimmable([KVCache(), KVCache()])
    with pytest.raises(SpecmacError, match=r"\(ArraysCache\) cannot be rewound"):
        check_trimmable([KVCache(), ArraysCache(2)])


def test_bad_folders_fail_with_one_line(tmp_path, folder):
    (tmp_path / "empty").mkdir()
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text((folder / "config.json").read_text())
    cases = {tmp_path / "nowhere": "not found", tmp_path / "empty": "no config.json",
             weightless: "no model.*safetensors"}
    for path, message in cases.items():
        with pytest.raises(ModelNotFound, match=message) as e:
            load_backend("mlx", str(path))
        assert "\n" not in str(e.value)
