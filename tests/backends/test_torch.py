"""Torch-specific behaviour of the transformers backend, on a tiny random Llama built here.

The shared contract (batched == serial, rewind, prefill, round trip) runs on the embedded pair in
test_contract.py; these tests cover options, dtypes, cache cropping and refused inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specmac.errors import BadTokens, ContextOverflow
from tests.support.helpers import skip_unless_installed

pytestmark = skip_unless_installed("torch")

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
CORPUS = [PROMPT, "import os\nprint(os.path.join('a', 'b'))\n", "for i in range(10):\n    x += i * 2\n"] * 20


def make_tiny_llama(folder, add_bos: bool = True) -> str:
    """A randomly initialised 2-layer Llama (512 logits, 300 tokens) with a byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<s>")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[0, 1])
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def load(folder, **opts):
    from specmac.backends import load_backend

    return load_backend("torch", folder, {"device": "cpu", "dtype": "float32"} | opts)


@pytest.fixture(scope="module")
def fp32(folder):
    return load(folder)


@pytest.fixture
def b(fp32):
    fp32.reset()
    return fp32


def test_vocab_padding_eos_and_options_recorded(b):
    assert (b.vocab.size, b.vocab.n_logits) == (300, 512)
    assert b.vocab.eos_ids == {0, 1}  # the tokenizer's EOS plus generation_config's list
    assert b.n_ctx == 4096  # max_position_embeddings 8192, capped
    opts = b.info()["options"]
    assert opts["device"] == "cpu" and opts["dtype"] == "float32" and opts["logits_to_keep"] is True
    assert opts["trust_remote_code"] is False


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_option_is_respected_and_close_to_fp32(folder, b, dtype):
    import torch

    low = load(folder, dtype=dtype)
    assert {p.dtype for p in low.model.parameters()} == {getattr(torch, dtype)}
    assert low.resolved["dtype"] == dtype
    ids = b.encode(PROMPT)
    ref, got = b.score(ids), low.score(ids)
    assert got.dtype == np.float32 and got.shape == ref.shape
    # logits of this random model are ~0.6 in magnitude; half precision keeps ~3 significant digits
    np.testing.assert_allclose(got, ref, atol=1e-2 if dtype == "float16" else 2e-2, rtol=0)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_batched_equals_serial_in_fp32(b):
    ids = b.encode(PROMPT)
    batched = b.score(ids)
    b.reset()
    serial = np.concatenate([b.score([t]) for t in ids])
    np.testing.assert_allclose(batched, serial, atol=1e-4, rtol=0)


def test_crop_then_rescore_equals_fresh(b):
    ids = b.encode(PROMPT)
    fresh = b.score(ids)
    b.rewind(5)
    assert b.n_past == 5 and b.cache.get_seq_length() == 5
    b.score([7, 8, 9])  # a rejected continuation
    b.rewind(5)
    assert b.cache.get_seq_length() == 5
    np.testing.assert_allclose(b.score(ids[5:]), fresh[5:], atol=1e-5, rtol=0)
    b.rewind(b.n_past)  # rewinding to where it is changes nothing
    assert b.cache.get_seq_length() == b.n_past == len(ids)


def test_prefill_computes_only_the_last_row(b):
    shapes = []  # the lm_head's output shape on each forward pass
    head = b.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    try:
        ids = b.encode(PROMPT)
        last = b.prefill(ids)
        b.reset()
        full = b.score(ids)
    finally:
        hook.remove()
    assert shapes == [(1, 1, 512), (1, len(ids), 512)]
    assert last.shape == (512,) and b.n_past == len(ids)
    np.testing.assert_allclose(last, full[-1], atol=1e-5, rtol=0)


def test_encode_adds_bos_once(b):
    ids = b.encode("x = 1")
    assert ids[0] == 1 and ids.count(1) == 1
    assert b.encode("<s>x = 1") == ids  # text from a chat template that already starts with BOS
    assert b.decode(ids[1:]) == "x = 1"


def test_score_rejects_bad_ids_and_overflow(folder, b):
    with pytest.raises(BadTokens, match="ids must be in"):
        b.score([512])
    with pytest.raises(BadTokens, match="at least one"):
        b.score([])
    small = load(folder, n_ctx=4)
    small.score([2, 3, 4])
    with pytest.raises(ContextOverflow, match="n_ctx=4"):
        small.score([5, 6])
    with pytest.raises(ValueError, match="cannot rewind"):
        small.rewind(4)


def test_bad_options_fail_with_one_line(folder):
    from specmac.backends.torch import TorchBackend
    from specmac.errors import BadOption

    with pytest.raises(BadOption, match="n_ctx=9000 is out of range"):
        load(folder, n_ctx=9000)
    with pytest.raises(BadOption, match="float64"):
        TorchBackend.parse_options({"dtype": "float64"})
    missing = {"cuda", "mps"} - set(TorchBackend.devices())
    for device in missing:
        with pytest.raises(BadOption, match=f"device={device} is not available"):
            load(folder, device=device)


def test_bad_folders_raise_model_not_found(tmp_path, folder):
    from specmac.errors import ModelNotFound

    with pytest.raises(ModelNotFound, match="not found"):
        load(str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFound, match="config.json"):
        load(str(empty))
    pickled = tmp_path / "pickled"  # config and tokenizer present, weights only as a pickle
    pickled.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (pickled / name).write_bytes((Path(folder) / name).read_bytes())
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelNotFound, match="no .safetensors") as e:
        load(str(pickled))
    assert "\n" not in str(e.value)


def test_remote_code_is_refused_by_default(tmp_path, folder):
    from specmac.backends.torch import TorchBackend
    from specmac.errors import ModelNotFound

    custom = tmp_path / "custom"
    custom.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (custom / name).write_bytes((Path(folder) / name).read_bytes())
    config = json.loads((Path(folder) / "config.json").read_text())
    config |= {"model_type": "specmac_custom", "auto_map": {
        "AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}}
    (custom / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "executed"
    (custom / "custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert TorchBackend.options["trust_remote_code"].default is False
    with pytest.raises(ModelNotFound, match="trust_remote_code"):
        load(str(custom))
    assert not marker.exists()


def test_peek_vocab_matches_loaded_vocab(folder, b):
    from specmac.backends.torch import TorchBackend

    assert TorchBackend.peek_vocab(folder).fingerprint == b.vocab.fingerprint


def test_devices_and_sync(monkeypatch, b):
    import torch

    from specmac.backends.torch import TorchBackend, default_device, synchronize

    assert "cpu" in TorchBackend.devices() and default_device() in TorchBackend.devices()
    b.sync()  # cpu: nothing queued, returns
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("cuda"))
    synchronize(torch.device("mps"))
    synchronize(torch.device("cuda"))
    synchronize(torch.device("cpu"))
    assert calls == ["mps", "cuda"]


def test_sliding_window_model_rewinds_past_its_window(tmp_path, folder):
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(folder) / name).read_bytes())
    torch.manual_seed(0)
    MistralForCausalLM(MistralConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, sliding_window=8, bos_token_id=1,
        eos_token_id=0)).save_pretrained(tmp_path)
    b = load(str(tmp_path))
    ids = b.encode(PROMPT)  # 27 tokens, over three windows
    fresh = b.score(ids)
    b.rewind(12)  # 15 tokens back, further than the window keeps
    b.score([7, 8, 9])
    b.rewind(12)
    np.testing.assert_allclose(b.score(ids[12:]), fresh[12:], atol=1e-5, rtol=0)
    b.reset()
    serial = np.concatenate([b.score([t]) for t in ids])
    np.testing.assert_allclose(serial, fresh, atol=1e-4, rtol=0)
