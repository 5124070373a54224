"""Any model file on any backend: the converters and their cache, on the embedded pair (Llama
architecture, shipped as HF folders and as GGUF files). Every test uses its own cache folder."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specmac import assets
from specmac.backends.conversion import cache
from specmac.compare.results import model_files, model_fingerprints, sha256_file
from specmac.errors import ModelNotFound
from tests.support.helpers import skip_unless_installed

HAS_GGUF_PY = importlib.util.find_spec("gguf") is not None
needs_gguf_py = pytest.mark.skipif(not HAS_GGUF_PY,
                                   reason="gguf-py not installed (pip install 'specmac[gguf]')")
needs_loader = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("gguf", "accelerate", "transformers", "torch")),
    reason="transformers' GGUF loader needs torch, transformers, gguf and accelerate "
           "(pip install 'specmac[convert]')")
EMBEDDED_META = {"description": "specmac embedded tiny model trained on CPython 3.11 stdlib sources",
                 "license": "PSF-2.0 (training data); see specmac/assets/README.md"}
IDS = [315, 286, 1318, 267, 1233, 440, 8, 78, 302, 270, 327, 295]  # "def fibonacci(n):\n    return n"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "converted"


# --- the writer (HF folder -> GGUF) -------------------------------------------------------------
@needs_gguf_py
@pytest.mark.parametrize("role", ["draft", "target"])
def test_writer_reproduces_the_shipped_f16_gguf_byte_for_byte(role, tmp_path):
    from specmac.backends.conversion.hf_to_gguf import write_gguf

    out = write_gguf(assets.hf_dir(role), tmp_path / "m.gguf", name=f"specmac-embedded-{role}",
                     **EMBEDDED_META)
    assert sha256_file(out) == sha256_file(assets.gguf_file(role, "f16"))


@needs_gguf_py
def test_writer_refuses_an_architecture_it_cannot_map(tmp_path):
    from specmac.backends.conversion.hf_to_gguf import write_gguf

    folder = tmp_path / "m"
    folder.mkdir()
    cfg = json.loads((assets.hf_dir("draft") / "config.json").read_text()) | {"model_type": "mamba"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelNotFound, match="model_type 'mamba' cannot be written as GGUF") as e:
        write_gguf(folder, tmp_path / "m.gguf")
    assert "\n" not in str(e.value)


# --- the cache ---------------------------------------------------------------------------------
def test_a_conversion_runs_once_and_carries_its_source_sha(own_cache, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"weights")
    calls = []

    def build(s: Path, out: Path) -> None:
        calls.append(s)
        (out / "model.gguf").write_bytes(s.read_bytes()[::-1])

    entry, meta = cache.converted(src, "gguf-f16", build, what="test")
    again, _ = cache.converted(src, "gguf-f16", build, what="test")
    assert again == entry and len(calls) == 1
    assert meta["source_sha256"] == sha256_file(src) and entry.parent == own_cache
    assert (entry / "model.gguf").read_bytes() == b"sthgiew"
    src.write_bytes(b"weights, retrained")  # new content: a new entry
    other, meta2 = cache.converted(src, "gguf-f16", build, what="test")
    assert other != entry and meta2["source_sha256"] == sha256_file(src) and len(calls) == 2


def test_a_failed_conversion_leaves_nothing_behind(own_cache, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"weights")

    def build(s: Path, out: Path) -> None:
        (out / "model.gguf").write_bytes(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cache.converted(src, "gguf-f16", build, what="test")
    assert list(own_cache.iterdir()) == []  # no entry, no temporary folder
    assert list(cache.entries()) == []


def test_models_command_lists_and_clears(tmp_path):
    from specmac.cli import main

    for name in ("a", "b"):
        src = tmp_path / f"{name}.bin"
        src.write_bytes(name.encode() * 100)
        cache.converted(src, "gguf-f16", lambda s, o: (o / "model.gguf").write_bytes(b"x" * 10), what="t")
    listed = json.loads(CliRunner().invoke(main, ["models", "--json"]).stdout)
    names = [e["name"] for e in listed["entries"]]
    assert len(names) == 2 and all(e["bytes"] > 10 and e["source_sha256"] for e in listed["entries"])
    r = CliRunner().invoke(main, ["models", "clear", "nope"])
    assert r.exit_code == 2 and "no cache entry named nope" in r.output
    r = CliRunner().invoke(main, ["models", "clear", names[0], "--json"])
    assert json.loads(r.stdout)["removed"] == [names[0]]
    assert [e.name for e, _ in cache.entries()] == names[1:]
    assert "removed 1 entries" in CliRunner().invoke(main, ["models", "clear", "--all"]).output
    assert "no converted models" in CliRunner().invoke(main, ["models"]).output


@pytest.mark.parametrize("mask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_an_entry_has_the_modes_of_new_files_under_the_umask(own_cache, tmp_path, mask):
    """safetensors writes through a private temporary file (0600): the entry must not keep that."""
    src = tmp_path / "src.bin"
    src.write_bytes(b"weights")

    def build(s: Path, out: Path) -> None:
        fd, name = tempfile.mkstemp(dir=out)
        os.close(fd)
        os.replace(name, out / "model.safetensors")
        (out / "sub").mkdir(mode=0o700)
        (out / "sub" / "a.json").write_text("{}")

    old = os.umask(mask)
    try:
        entry, _ = cache.converted(src, "hf-float32", build, what="test")
    finally:
        os.umask(old)
    modes = {p.relative_to(entry).as_posix(): p.stat().st_mode & 0o777 for p in [entry, *entry.rglob("*")]}
    files, folders = 0o666 & ~mask, 0o777 & ~mask
    assert modes == {".": folders, "model.safetensors": files, "sub": folders, "sub/a.json": files,
                     cache.SIDECAR: files}


@needs_loader
@pytest.mark.parametrize("bars", [False, True], ids=["pipe", "terminal"])
def test_a_conversion_shows_transformers_bars_only_on_a_terminal(capfd, monkeypatch, bars):
    """Off a terminal stderr holds specmac's one line and nothing of transformers (no bars, no warning
    that bfloat16 weights "stay quantized": they do not); its settings are put back after."""
    from safetensors import safe_open
    from transformers.utils import logging as hf_logging

    from specmac.backends.conversion.convert import gguf_to_hf

    monkeypatch.setattr(cache, "progress_bars", lambda: bars)
    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    folder, _ = gguf_to_hf(assets.gguf_file("draft", "f16"), "bfloat16")
    err = capfd.readouterr().err
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before
    assert "quantized" not in err
    if bars:
        assert "de-quantizing" in err  # the GGUF unpacking bar
    else:
        assert [x for x in err.splitlines() if not x.startswith("specmac: converting ")] == [], err
    with safe_open(folder / "model.safetensors", "pt") as f:  # plain weights, none left in GGUF blocks
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}


# --- the gguf backend on a folder, and on other types ------------------------------------------
@skip_unless_installed("gguf")
@needs_gguf_py
def test_gguf_backend_loads_a_hf_folder_as_the_shipped_f16(own_cache):
    from specmac.backends.gguf import GGUFBackend

    folder = str(assets.hf_dir("target"))
    ref, conv = GGUFBackend(None, quant="f16"), GGUFBackend(folder)
    try:
        assert conv.vocab.fingerprint == ref.vocab.fingerprint
        np.testing.assert_array_equal(conv.score(IDS), ref.score(IDS))  # same weights, same tensors
        assert conv.resolved["quant"] == "f16" and Path(conv.resolved["path"]).parent.parent == own_cache
        assert conv.resolved["source_sha256"] == cache.sha256_path(Path(folder))
        prov = model_fingerprints(model_files(conv, folder))[0]
        assert prov["converted_from"]["source_sha256"] == conv.resolved["source_sha256"]
    finally:
        ref.close()
        conv.close()


@skip_unless_installed("gguf")
def test_quant_is_recorded_only_where_it_chose_the_file(own_cache):
    from specmac.backends.gguf import GGUFBackend

    f16 = str(assets.gguf_file("target", "f16"))
    as_given, embedded, requant = GGUFBackend(f16), GGUFBackend(None), GGUFBackend(f16, quant="q8_0")
    try:
        assert "quant" not in as_given.resolved and as_given.resolved["path"] == f16
        assert embedded.resolved["quant"] == "q8_0"
        assert requant.resolved["quant"] == "q8_0" and requant.resolved["source_sha256"] == sha256_file(f16)
        gap = np.abs(requant.score(IDS) - as_given.score(IDS)).max()
        assert 0 < gap < 1.0  # Q8_0 weights: close to F16, not equal
        assert model_fingerprints([f16])[0].get("converted_from") is None
        same = GGUFBackend(f16, quant="f16")  # already F16: loaded as it is, nothing converted
        assert same.resolved["path"] == f16 and same.resolved["quant"] == "f16"
        assert [e.name for e, _ in cache.entries()] == [Path(requant.resolved["path"]).parent.name]
        same.close()
    finally:
        for b in (as_given, embedded, requant):
            b.close()


# --- torch and mlx on a GGUF file --------------------------------------------------------------
@skip_unless_installed("torch")
@needs_loader
def test_torch_backend_loads_a_gguf_file_as_its_hf_folder(own_cache):
    from specmac.backends.torch import TorchBackend

    gguf_file = str(assets.gguf_file("target", "f16"))
    ref = TorchBackend(str(assets.hf_dir("target")), device="cpu")
    conv = TorchBackend(gguf_file, device="cpu")
    assert conv.vocab.fingerprint == ref.vocab.fingerprint
    np.testing.assert_array_equal(conv.score(IDS), ref.score(IDS))  # F16 weights dequantise exactly
    assert conv.resolved["source_sha256"] == sha256_file(gguf_file)
    (entry, meta), = cache.entries()
    assert meta["variant"] == "hf-float32" and conv.resolved["path"] == str(entry)
    assert TorchBackend.peek_vocab(gguf_file).fingerprint == ref.vocab.fingerprint  # from the cache


@skip_unless_installed("mlx")
@needs_loader
def test_mlx_backend_loads_a_gguf_file(own_cache):
    from specmac.backends.mlx import MLXBackend

    gguf_file = str(assets.gguf_file("draft", "f16"))
    ref = MLXBackend(str(assets.hf_dir("draft")), device="cpu")
    conv = MLXBackend(gguf_file, device="cpu")
    assert conv.vocab.fingerprint == ref.vocab.fingerprint
    np.testing.assert_allclose(conv.score(IDS), ref.score(IDS), atol=1e-5)


# --- compare's progress off a terminal (CliRunner's stderr is not one) ---------------------------
def test_compare_prints_one_plain_progress_line_per_configuration(tmp_path):
    from specmac.cli import main

    r = CliRunner().invoke(main, ["compare", "--pair", "synthetic:synthetic", "--k", "1,2", "--n-prompts",
                                  "2", "--repeats", "2", "--max-tokens", "4", "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if "generations" in x]
    assert len(lines) == 3  # the baseline and K = 1, 2
    assert lines[-1].startswith("compare: 15/15 generations (100%)")  # 3 configs x (1 warm-up + 2 x 2)
