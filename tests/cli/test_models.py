"""`specmac models convert`: the embedded target's GGUF made into a Hugging Face folder in a cache of
the test's own, listed by `specmac models`, placed whole at --out; bad input is one line, exit 2,
and converts and writes nothing."""

from __future__ import annotations

import errno
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac import assets
from specmac.backends.conversion import cache
from specmac.cli import main
from specmac.compare.results import sha256_file
from specmac.files import umask
from tests.support.helpers import REPO, cli_env, error_lines

GGUF = assets.gguf_file("target", "f16")
needs_loader = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("gguf", "accelerate", "transformers", "torch")),
    reason="transformers' GGUF loader needs torch, transformers, gguf and accelerate "
           "(pip install 'specmac[convert]')")


def invoke(*args):
    return CliRunner().invoke(main, ["models", "convert", *map(str, args)])


def one_line(r, needle: str, converting: bool = False) -> str:
    """Exit 2, no traceback, one line; ``converting``: after the line that says a conversion began."""
    lines = error_lines(r.stderr)
    if converting:
        assert lines[0].startswith("specmac: converting "), r.stderr
        lines = lines[1:]
    assert r.exit_code == 2, f"exit {r.exit_code}: {r.stderr}"
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert needle.lower() in lines[0].lower(), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, object]:
    """One conversion for the module, with an empty folder as --out: (its folder, the result)."""
    root = tmp_path_factory.mktemp("convert")
    (root / "out").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECMAC_CACHE", str(root / "cache"))
        return root, invoke(GGUF, "--out", root / "out")


@pytest.fixture()
def in_made(made, monkeypatch) -> Path:
    monkeypatch.setenv("SPECMAC_CACHE", str(made[0] / "cache"))
    return made[0]


@needs_loader
def test_convert_makes_the_folder_once_and_models_lists_it(made, in_made):
    _, r = made
    assert r.exit_code == 0, r.output
    assert "converting" in r.stderr
    folder = Path(r.stdout.splitlines()[0])
    assert folder.parent == cache.cache_root() and (folder / "config.json").is_file()
    listed = json.loads(CliRunner().invoke(main, ["models", "--json"]).stdout)["entries"]
    assert [e["path"] for e in listed] == [str(folder)]
    assert listed[0]["source_sha256"] == sha256_file(GGUF) and "float32" in listed[0]["what"]
    again = invoke(GGUF, "--json")  # found in the cache, not made again
    assert again.exit_code == 0 and "converting" not in again.stderr
    assert json.loads(again.stdout)["path"] == str(folder) and json.loads(again.stdout)["out"] is None


@needs_loader
def test_out_is_a_loadable_folder_of_links_to_the_cached_files(made, in_made):
    from transformers import AutoModelForCausalLM

    from specmac.backends.conversion.hf_check import check_folder

    root, r = made
    folder, out = Path(r.stdout.splitlines()[0]), root / "out"
    assert r.stdout.splitlines()[-1] == f"  linked into {out}"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert all((out / p.name).stat().st_ino == p.stat().st_ino for p in folder.iterdir())
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {  # readable as a shared cache
        p.name: 0o666 & ~umask() for p in folder.iterdir()}
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary sibling left
    check_folder(out)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.vocab_size == json.loads((folder / "config.json").read_text())["vocab_size"]


@needs_loader
def test_off_a_terminal_stderr_is_the_converting_line_alone(tmp_path):
    """stderr a pipe: no progress bar, no transformers warning (a real process, as a user runs it)."""
    cmd = [sys.executable, "-m", "specmac", "models", "convert", str(assets.gguf_file("draft", "f16")),
           "--dtype", "bfloat16"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300,
                       env=cli_env(SPECMAC_CACHE=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("specmac: converting "), r.stderr


@needs_loader
def test_out_across_file_systems_is_a_copy(in_made, tmp_path, monkeypatch):
    def no_link(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr("os.link", no_link)
    r = invoke(GGUF, "--out", tmp_path / "a" / "b")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == f"  copied into {tmp_path / 'a' / 'b'}"
    folder, out = Path(r.stdout.splitlines()[0]), tmp_path / "a" / "b"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert (out / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()


@needs_loader
@pytest.mark.parametrize("err, needle", [(errno.EACCES, "cannot place the folder at --out"),
                                         (errno.ENOSPC, "no space left on the device")])
def test_a_failed_placing_leaves_no_out(in_made, tmp_path, monkeypatch, err, needle):
    def fail(src, dst, **kw):
        raise OSError(err, "no", dst)

    monkeypatch.setattr("os.link", fail)
    monkeypatch.setattr(shutil, "copy2", fail)
    one_line(invoke(GGUF, "--out", tmp_path / "out"), needle)
    assert list(tmp_path.iterdir()) == []  # neither --out nor a hidden half of it


@pytest.fixture()
def own_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _text_gguf(tmp: Path) -> list:
    (tmp / "notes.gguf").write_text("not a model\n")
    return [tmp / "notes.gguf"]


def _full_out(tmp: Path) -> list:
    (tmp / "full").mkdir()
    (tmp / "full" / "keep.txt").write_text("mine")
    return [GGUF, "--out", tmp / "full"]


def _file_out(tmp: Path) -> list:
    (tmp / "file").write_text("mine")
    return [GGUF, "--out", tmp / "file"]


def _link_out(tmp: Path) -> list:
    (tmp / "empty").mkdir()
    (tmp / "link").symlink_to(tmp / "empty")
    return [GGUF, "--out", tmp / "link"]


@pytest.mark.parametrize("args, needle", [
    (lambda t: [t / "missing.gguf"], "missing.gguf does not exist"),
    (lambda t: [assets.hf_dir("target")], "is a folder, not a GGUF file"),
    (_text_gguf, "notes.gguf is not a GGUF file"),
    (_full_out, "is not empty: give a new or empty folder"),
    (_file_out, "is not a folder: give a new or empty folder"),
    (_link_out, "is a link: give a new or empty folder"),
    (lambda t: [GGUF, "--dtype", "f8"], "'f8' is not one of"),
], ids=["missing", "folder", "not_gguf", "out_not_empty", "out_a_file", "out_a_link", "dtype"])
def test_bad_input_is_one_line_and_converts_nothing(own_cache, tmp_path, args, needle):
    given = args(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    one_line(invoke(*given), needle)
    assert not own_cache.exists()  # refused before any conversion
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@needs_loader
def test_a_gguf_transformers_cannot_read_is_one_line_and_leaves_nothing(own_cache, tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\x07" * 10)
    one_line(invoke(tmp_path / "junk.gguf", "--out", tmp_path / "out"), "transformers cannot load",
             converting=True)
    assert list(cache.scan()) == [] and not (tmp_path / "out").exists()


def test_a_missing_converter_is_the_install_hint(own_cache, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers"
                        else real(name, *a))
    one_line(invoke(GGUF), "needs transformers: pip install 'specmac[convert]'")
    assert not own_cache.exists()
