"""The embedded draft/target pair: files, hashes, and that every format loads and agrees."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from specmac import assets

MANIFEST = json.loads(assets.MANIFEST.read_text()) if assets.MANIFEST.exists() else None
PROMPT = "def fibonacci(n):\n"
SNIPPETS = [
    PROMPT,
    "import os\nimport sys\n\nclass Config(object):\n    \"\"\"Settings.\"\"\"\n",
    "\tif x is None:  # ünïcödé 日本語\r\n        return {'a': [1, 2.5e-3]}\n",
    "x = 1<|endoftext|>def f(): pass\n",
]


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _hf_tokenizer_ids(role, text):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed")
    tok = tokenizers.Tokenizer.from_file(str(assets.hf_dir(role) / "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


# ----------------------------------------------------------------------------- API and files

def test_api_paths():
    assert assets.ROLES == ("draft", "target")
    assert "f16" in assets.GGUF_TYPES and "q8_0" in assets.GGUF_TYPES
    for role in assets.ROLES:
        assert assets.hf_dir(role).is_dir()
        assert (assets.hf_dir(role) / "config.json").is_file()
        for quant in assets.GGUF_TYPES:
            assert assets.gguf_file(role, quant).is_file()
        assert assets.gguf_file(role) == assets.gguf_file(role, "q8_0")


@pytest.mark.parametrize("call", [lambda: assets.hf_dir("big"),
                                  lambda: assets.gguf_file("medium"),
                                  lambda: assets.gguf_file("draft", "q3_k")])
def test_api_bad_input_names_allowed_values(call):
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert ("draft" in msg and "target" in msg) or all(q in msg for q in assets.GGUF_TYPES)


def test_assets_module_imports_no_framework():
    code = ("import importlib.util, sys; "
            f"s = importlib.util.spec_from_file_location('a', {str(assets.__file__)!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "bad = {'numpy', 'torch', 'transformers', 'mlx', 'llama_cpp'} & set(sys.modules); "
            "assert not bad, bad; print(m.hf_dir('draft'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_manifest_lists_every_shipped_file():
    assert MANIFEST is not None, "specmac/assets/manifest.json missing"
    files = MANIFEST["files"]
    assert tuple(MANIFEST["gguf_types"]) == assets.GGUF_TYPES
    for role in assets.ROLES:
        for name in ("config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "generation_config.json"):
            assert f"{role}/{name}" in files
        for quant in assets.GGUF_TYPES:
            assert f"{role}-{quant}.gguf" in files
    total = sum(f.stat().st_size for f in assets.ASSETS_DIR.rglob("*") if f.is_file())
    assert total < 32 * 2**20, f"assets grew to {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("rel", sorted(MANIFEST["files"]) if MANIFEST else [])
def test_file_matches_manifest_sha256(rel):
    path = assets.ASSETS_DIR / rel
    entry = MANIFEST["files"][rel]
    assert path.is_file()
    assert path.stat().st_size == entry["bytes"]
    assert _sha256(path) == entry["sha256"]


def test_tokenizers_identical_across_roles():
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert ((assets.hf_dir("draft") / name).read_bytes()
                == (assets.hf_dir("target") / name).read_bytes())
    cfg = json.loads((assets.hf_dir("target") / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == cfg["eos_token"] == "<|endoftext|>"
    assert cfg["add_bos_token"] is False


# ----------------------------------------------------------------------------- transformers

@pytest.fixture(scope="module")
def torch_models():
    torch = pytest.importorskip("torch", reason="torch not installed (pip install 'specmac[torch]')")
    transformers = pytest.importorskip(
        "transformers", reason="transformers not installed (pip install 'specmac[torch]')")
    tok = transformers.AutoTokenizer.from_pretrained(str(assets.hf_dir("target")))
    models = {}
    for role in assets.ROLES:
        m = transformers.AutoModelForCausalLM.from_pretrained(str(assets.hf_dir(role)),
                                                              dtype=torch.float32)
        models[role] = m.eval()
    return torch, tok, models


def _torch_logits(torch, model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].double().numpy()


def test_hf_folder_loads_in_transformers(torch_models):
    torch, tok, models = torch_models
    assert tok.bos_token_id == tok.eos_token_id == 0
    assert tok.convert_ids_to_tokens(0) == "<|endoftext|>"
    for text in SNIPPETS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == _hf_tokenizer_ids("target", text)
        assert tok.decode(ids) == text
    for m in models.values():
        assert m.config.model_type == "llama"
        assert m.config.vocab_size == 4096 and m.config.eos_token_id == 0
    n = {role: sum(p.numel() for p in m.parameters()) for role, m in models.items()}
    assert n["draft"] < n["target"]


def test_models_have_learned_python(torch_models):
    """Held-in style snippet: loss far below uniform (ln 4096 = 8.3 nats), target < draft."""
    import numpy as np

    torch, tok, models = torch_models
    text = ("    def __init__(self, name, value=None):\n        self.name = name\n"
            "        self.value = value\n\n    def __repr__(self):\n"
            "        return '%s(%r)' % (self.__class__.__name__, self.name)\n")
    ids = [0] + tok.encode(text, add_special_tokens=False)
    losses = {}
    for role, m in models.items():
        lg = _torch_logits(torch, m, ids)[:-1]
        lg = lg - lg.max(-1, keepdims=True)
        logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        losses[role] = float(-logp[range(len(ids) - 1), ids[1:]].mean())
    assert losses["target"] < 3.0 and losses["draft"] < 4.0, losses
    assert losses["target"] < losses["draft"], losses


def test_greedy_generation_sanity(torch_models):
    torch, tok, models = torch_models
    ids = tok.encode(PROMPT, add_special_tokens=False)
    for _ in range(20):
        ids.append(int(_torch_logits(torch, models["target"], ids)[-1].argmax()))
    text = tok.decode(ids)
    assert text.startswith(PROMPT)
    cont = text[len(PROMPT):]
    assert "\n    " in cont, repr(cont)  # several lines, some indented
    assert any(w in cont for w in ("def ", "class ", "return", "if ", "self")), repr(cont)
    assert "<|endoftext|>" not in cont[:8], repr(cont)


# ----------------------------------------------------------------------------- llama.cpp

def _llama(path, **kw):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (pip install 'specmac[gguf]')")
    from specmac.backends.gguf_files import peer_llama  # extra buffer types off on AMX builds

    return peer_llama(path, n_ctx=256, n_threads=2, n_threads_batch=2, verbose=False, **kw)


@pytest.mark.parametrize("role", assets.ROLES)
@pytest.mark.parametrize("quant", assets.GGUF_TYPES)
def test_gguf_tokenizer_matches_hf(role, quant):
    lc = _llama(assets.gguf_file(role, quant), vocab_only=True)
    assert lc.n_vocab() == 4096
    assert lc.token_bos() == 0 and lc.token_eos() == 0
    for text in SNIPPETS:
        assert lc.tokenize(text.encode(), add_bos=False, special=True) == \
            _hf_tokenizer_ids(role, text)


@pytest.mark.parametrize("quant", assets.GGUF_TYPES)
def test_gguf_logits_match_torch(quant, torch_models):
    import numpy as np

    torch, tok, models = torch_models
    ids = tok.encode(PROMPT, add_special_tokens=False)
    for role in assets.ROLES:
        ref = _torch_logits(torch, models[role], ids)[-1]
        lc = _llama(assets.gguf_file(role, quant), logits_all=True)
        lc.eval(ids)
        got = np.asarray(lc.scores[len(ids) - 1], dtype=np.float64)
        tol = 0.1 if quant == "f16" else 0.5
        assert np.abs(got - ref).max() < tol, (role, quant, np.abs(got - ref).max())
        assert got.argmax() == ref.argmax()


# ----------------------------------------------------------------------------- mlx

def test_hf_folder_loads_in_mlx(torch_models):
    import numpy as np

    pytest.importorskip("mlx.core", reason="mlx not installed (pip install 'specmac[mlx]')")
    mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm not installed (pip install 'specmac[mlx]')")
    import mlx.core as mx

    torch, tok, models = torch_models
    ids = tok.encode(PROMPT, add_special_tokens=False)
    model, mtok = mlx_lm.load(str(assets.hf_dir("target")))
    assert mtok.encode(PROMPT, add_special_tokens=False) == ids
    model.set_dtype(mx.float32)
    got = np.asarray(model(mx.array([ids]))[0, -1].astype(mx.float32), dtype=np.float64)
    ref = _torch_logits(torch, models["target"], ids)[-1]
    assert np.abs(got - ref).max() < 1e-3
    assert got.argmax() == ref.argmax()
