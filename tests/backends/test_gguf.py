"""GGUF-specific behaviour of the llama.cpp backend (the shared contract is in test_contract.py).

Uses the embedded target (F16 and Q8_0); SPECMAC_TEST_GGUF=/path/model.gguf points the model tests
at another GGUF instead.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from specmac.errors import BadOption, ContextOverflow, ModelNotFound, SpecmacError

llama_cpp = pytest.importorskip("llama_cpp", reason="the gguf backend needs llama-cpp-python, not installed "
                                                   "(pip install 'specmac[gguf]')")

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def model_path(quant: str = "f16") -> str:
    if os.environ.get("SPECMAC_TEST_GGUF"):
        return os.environ["SPECMAC_TEST_GGUF"]
    from specmac import assets

    path = assets.gguf_file("target", quant)
    if not path.is_file():
        pytest.skip(f"the embedded {path.name} is not built yet (scripts/train_embedded.py)")
    return str(path)


@pytest.fixture(scope="module")
def gguf():
    from specmac.backends import gguf

    return gguf


@pytest.fixture(scope="module")
def backend(gguf):
    b = gguf.GGUFBackend(model_path())
    yield b
    b.close()


@pytest.fixture
def fresh(backend):
    backend.reset()
    return backend


def test_random_bytes_are_not_a_gguf(gguf, tmp_path, capfd):
    bad = tmp_path / "random.gguf"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    for load in (gguf.GGUFBackend, gguf.GGUFBackend.peek_vocab):
        with pytest.raises(ModelNotFound, match="is not a GGUF file") as e:
            load(str(bad))
        assert "\n" not in str(e.value)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("keep", [0.5, 0.0001])  # cut in the tensor data; cut in the header
def test_truncated_gguf_fails_in_one_quiet_line(gguf, tmp_path, capfd, keep):
    data = open(model_path(), "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(64, int(len(data) * keep))])
    with pytest.raises(ModelNotFound, match="cannot load .*complete GGUF") as e:
        gguf.GGUFBackend(str(cut))
    assert "\n" not in str(e.value)
    assert capfd.readouterr().err == ""  # llama.cpp's log was captured, not printed


def test_missing_path_and_folder(gguf, tmp_path):
    with pytest.raises(ModelNotFound, match="not found"):
        gguf.GGUFBackend(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFound, match="is a folder"):
        gguf.GGUFBackend(str(tmp_path))


def test_bad_options_fail_before_loading(gguf):
    with pytest.raises(BadOption, match="quant='q4_k' is not one of"):
        gguf.GGUFBackend(None, quant="q4_k")
    with pytest.raises(BadOption, match="n_ctx=0 is out of range"):
        gguf.GGUFBackend("/nonexistent.gguf", n_ctx=0)


def test_logits_only_for_requested_rows(gguf, fresh):
    ids = fresh.encode(PROMPT)[:8]

    def has_row(i):
        with gguf.captured_log():  # llama.cpp logs an error for a row it did not compute
            return bool(llama_cpp.llama_get_logits_ith(fresh._ctx, i))

    fresh.prefill(ids)
    assert [has_row(i) for i in range(len(ids))] == [False] * (len(ids) - 1) + [True]
    fresh.score(ids[:3])
    assert [has_row(i) for i in range(4)] == [True, True, True, False]


def test_prefill_longer_than_n_batch_is_chunked(gguf):
    b = gguf.GGUFBackend(model_path(), n_batch=4)
    ids = b.encode(PROMPT)
    assert len(ids) > 4
    last = b.prefill(ids)
    b.reset()
    full = b.score(ids)
    b.close()
    assert full.shape == (len(ids), b.vocab.n_logits)
    np.testing.assert_allclose(last, full[-1], atol=2e-2, rtol=0)


def test_threads_are_equal_for_single_and_batched(gguf, backend):
    r = backend.resolved
    assert r["n_threads"] == r["n_threads_batch"] >= 1
    assert llama_cpp.llama_n_threads(backend._ctx) == llama_cpp.llama_n_threads_batch(backend._ctx)
    assert llama_cpp.llama_n_threads(backend._ctx) == r["n_threads"]


def test_resolved_device_and_context(gguf, backend):
    r = backend.resolved
    assert r["n_gpu_layers"] == (-1 if gguf.gpu_offload() else 0)
    assert backend.devices()[0] == "cpu"
    assert backend.n_ctx == r["n_ctx"] <= r["n_ctx_train"] and r["n_ctx"] <= 2048
    assert r["n_batch"] == r["n_ubatch"]


def test_peek_vocab_reads_the_vocab_only(gguf, backend, monkeypatch):
    calls = []
    real = gguf.load_model

    def spy(path, n_gpu_layers=0, vocab_only=False):
        calls.append(vocab_only)
        return real(path, n_gpu_layers, vocab_only)

    monkeypatch.setattr(gguf, "load_model", spy)
    v = gguf.GGUFBackend.peek_vocab(model_path(), role="target", quant="f16")
    assert calls == [True]
    assert v.fingerprint == backend.vocab.fingerprint
    assert v.eos_ids == backend.vocab.eos_ids and v.n_logits == backend.vocab.n_logits


def test_control_tokens_are_literal_text(backend):
    v = backend.vocab
    for i in v.eos_ids:
        assert v.token_bytes[i], f"EOS id {i} has no text"
        assert backend.encode(v.token_bytes[i].decode()) == [i]  # parsed back as the special token


def test_context_overflow_and_bad_rewind(fresh):
    ids = fresh.encode(PROMPT)
    with pytest.raises(ContextOverflow, match="n_ctx"):
        fresh.score([ids[0]] * (fresh.n_ctx + 1))
    assert fresh.n_past == 0
    fresh.score(ids[:3])
    with pytest.raises(ValueError, match="cannot rewind"):
        fresh.rewind(4)


def test_chat_template_or_clear_error(backend):
    try:
        text = backend.apply_chat_template("hello there")
    except SpecmacError as e:
        assert "chat_template" in str(e)
    else:
        assert "hello there" in text


def test_q8_0_and_f16_agree_on_argmax(gguf):
    if os.environ.get("SPECMAC_TEST_GGUF"):
        pytest.skip("compares the embedded pair's two GGUF types")
    rows = []
    for quant in ("f16", "q8_0"):
        b = gguf.GGUFBackend(model_path(quant))
        rows.append(b.score(b.encode(PROMPT)))
        b.close()
    f16, q8 = rows
    assert f16.shape == q8.shape
    assert (f16.argmax(-1) == q8.argmax(-1)).mean() >= 0.9
    assert f16[-1].argmax() == q8[-1].argmax()


@pytest.mark.parametrize("safe", [False, True])
def test_the_peers_llama_takes_extra_buffer_types_as_auto_does(monkeypatch, safe):
    """llama-cpp-python's own Llama (the benchmarks' peer, tests/test_assets.py) built through
    peer_llama: extra buffer types as specmac's auto chooses them (off on an AMX build, where a
    Q8_0 or Q4_K_M load with them crashes the process), and llama.cpp's defaults left as they were."""
    from specmac.backends import gguf_files

    monkeypatch.setattr(gguf_files, "extra_bufts_safe", lambda: safe)
    defaults = llama_cpp.llama_cpp.llama_model_default_params
    llm = gguf_files.peer_llama(model_path("q8_0"), vocab_only=True, verbose=False)
    assert llm.model_params.use_extra_bufts is safe
    assert llama_cpp.llama_cpp.llama_model_default_params is defaults
