"""Hostile input, as a user who tries to break specmac would give it: every case exits 2 with exactly
one line on stderr, no traceback, nothing on stdout and no file left behind (issue 14).

The categories: numbers without bounds, broken model folders (built here from the embedded pair),
text input, output paths, config and prompt files, plugins, quiet wrong behaviour. The Python API
gets the same checks (the library validates where values enter it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.backends import missing_requirements
from specmac.cli import main
from tests.support.helpers import PAIR, REPO, SYN, Case, assert_one_line_error


def broken_models(root: Path) -> dict[str, str]:
    """HF folders copied from the embedded target, each broken one way."""
    from safetensors.numpy import load_file, save_file

    from specmac import assets

    src = assets.hf_dir("target")
    out = {}

    def copy(name: str) -> Path:
        d = root / name
        shutil.copytree(src, d)
        out[name] = str(d)
        return d

    weights = load_file(str(src / "model.safetensors"))
    victim = "model.layers.0.input_layernorm.weight"
    d = copy("missing_tensor")
    save_file({k: v for k, v in weights.items() if k != victim}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    d = copy("wrong_shape")
    save_file(weights | {victim: np.zeros(3, weights[victim].dtype)}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    d = copy("extra_tensor")
    save_file(weights | {"model.layers.99.surplus.weight": np.zeros(4, np.float32)},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    d = copy("truncated")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    d = copy("gguf_renamed")
    shutil.copy(assets.gguf_file("target", "f16"), d / "model.safetensors")
    (copy("bad_config") / "config.json").write_text('{"model_type": "llama",')
    (copy("empty_config") / "config.json").write_text("")
    (copy("bad_generation_config") / "generation_config.json").write_text("{nope")
    d = copy("no_tokenizer")
    (d / "tokenizer.json").unlink()
    (d / "tokenizer_config.json").unlink()
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("hostile")
    out = broken_models(d / "models") if not missing_requirements("torch") else {}
    (d / "a_file").write_text("x")
    return out | records(d) | {"a_file": str(d / "a_file"), "root": str(d)}


def records(root: Path) -> dict[str, str]:
    """compare records (results.json) broken one field at a time, from a real synthetic run."""
    import json

    from specmac.compare import measure as cmp
    from specmac.compare.prompts import read_prompts
    from specmac.core.sampling import SamplingParams

    settings = cmp.Settings(pairs=cmp.parse_pairs(["synthetic:synthetic"]), ks=[1, 2],
                            prompts=read_prompts(None, 2), params=SamplingParams(0.0), max_tokens=8,
                            repeats=1, seed=0, warmup_tokens=2, backends={})
    good = cmp.run_compare(settings)
    out = {}
    for name, damage in {"record_missing": lambda r: r["results"][0].pop("speedup"),
                         "record_mistyped": lambda r: r["results"][0].update(k="x"),
                         "record_bad_settings": lambda r: r.update(settings=5)}.items():
        rec = json.loads(json.dumps(good, default=str))
        damage(rec)
        (root / name).mkdir()
        (root / name / "results.json").write_text(json.dumps(rec))
        out[name] = str(root / name)
    return out


MODEL_CASES = [
    (name, needle) for name, needle in [
        ("missing_tensor", "tensor model.layers.0.input_layernorm.weight is missing"),
        ("wrong_shape", "model.layers.0.input_layernorm.weight has shape (3,)"),
        ("extra_tensor", "tensor model.layers.99.surplus.weight is not part of the model"),
        ("truncated", "model.safetensors is truncated"),
        ("gguf_renamed", "is a gguf file, not safetensors"),
        ("bad_config", "config.json is not valid json"),
        ("empty_config", "config.json is not valid json"),
        ("bad_generation_config", "generation_config.json is not valid json"),
        ("no_tokenizer", "has no tokenizer"),
    ]
]
MLX_MODEL_CASES = [("missing_tensor", "model.layers.0.input_layernorm.weight"),
                   ("wrong_shape", "(3,)"), ("truncated", "is truncated"), ("gguf_renamed", "gguf file"),
                   ("empty_config", "not valid json"), ("no_tokenizer", "has no tokenizer")]

CASES = [
    Case("synthetic-with-a-model", ("run", *PAIR, "--target-model", "some/folder", "hi"),
         "synthetic backend loads no model files"),
    # 1. numbers without bounds
    Case("k-huge", ("run", *PAIR, "--k", "100000000", "hi"),
         "--k 100000000 is out of range: use an integer 1..256"),
    Case("k-range-huge", ("compare", "--pair", "synthetic:synthetic", "--k", "1-1000000000"),
         "--k '1-1000000000' is out of range"),
    Case("k-range-reversed", ("compare", "--pair", "synthetic:synthetic", "--k", "8-2"), "out of range"),
    Case("synthetic-noise-inf", ("run", *PAIR, "--draft-opt", "noise=inf", "hi"),
         "noise='inf' is not a finite"),
    Case("synthetic-noise-nan", ("run", *PAIR, "--draft-opt", "noise=nan", "hi"),
         "noise='nan' is not a finite"),
    Case("synthetic-latency-negative", ("run", *SYN, "--target-opt", "latency_ms=-5", "hi"),
         "latency_ms=-5.0 is out of range"),
    Case("synthetic-seed-negative", ("run", *SYN, "--target-opt", "seed=-1", "hi"),
         "seed=-1 is out of range"),
    Case("synthetic-n-ctx-huge", ("run", *SYN, "--target-opt", "n_ctx=1000000000", "hi"),
         "n_ctx=1000000000"),
    Case("gguf-threads-huge", ("run", "--target", "gguf", "--target-opt", "n_threads=100000", "hi"),
         "n_threads=100000 is out of range", backend="gguf"),
    Case("gguf-n-ctx-above-training", ("run", "--target", "gguf", "--target-opt", "n_ctx=100000", "hi"),
         "n_ctx=100000 is out of range", backend="gguf"),
    Case("torch-threads-huge", ("run", "--target", "torch", "--target-opt", "n_threads=100000", "hi"),
         "n_threads=100000 is out of range", backend="torch"),
    Case("advise-context-huge", ("advise", *PAIR, "--context", "100000"), "context 100000"),
    Case("draft-context-below-prompt", ("run", *PAIR, "--draft-opt", "n_ctx=4", "hello world"),
         "the draft's context window is 4"),
    Case("hub-offline-not-cached", ("run", "--target", "torch", "--target-model", "nosuchorg/nosuch", "hi"),
         "not in the local hub cache and hf_hub_offline is set", backend="torch", subprocess=True,
         env=(("HF_HUB_OFFLINE", "1"),)),
    # 3. text input
    Case("stdin-invalid-utf8", ("run", *SYN), "stdin is not utf-8 text (byte 2)", stdin=b"ab\xffcd",
         subprocess=True),
    Case("argv-invalid-utf8", ("run", *SYN, "ab\udcffcd"), "prompt is not utf-8 text (byte 2)",
         subprocess=True),
    Case("prompt-file-dev-zero", ("run", *SYN, "--prompt-file", "/dev/zero"), "larger than 8 mib"),
    Case("prompt-file-invalid-utf8", ("run", *SYN, "--prompt-file", "-"), "stdin is not utf-8 text (byte 0)",
         stdin=b"\xc3\x28", subprocess=True),
    # 4. output paths, refused before anything is measured (a measurement would fail these cases
    # only at its end)
    Case("compare-out-under-a-file", ("compare", "--pair", "synthetic:synthetic", "--out", "{a_file}/sub"),
         "is a file, not a folder"),
    Case("compare-out-is-a-file", ("compare", "--pair", "synthetic:synthetic", "--out", "{a_file}"),
         "is a file"),
    Case("probe-out-under-a-file",
         ("probe-parallelism", "--backend", "synthetic", "--out", "{a_file}/x.json"),
         "is a file, not a folder"),
    Case("probe-plot-unknown-type", ("probe-parallelism", "--backend", "synthetic", "--plot", "t.gif"),
         "--plot t.gif: .gif is not an image type"),
    Case("advise-out-under-a-file", ("advise", *PAIR, "--out", "{a_file}/x.json"), "is a file, not a folder"),
    Case("advise-plot-unknown-type", ("advise", *PAIR, "--plot", "s.bmpx"), ".bmpx is not an image type"),
    Case("report-missing-field", ("report", "{record_missing}"), "field 'speedup' is missing"),
    Case("report-mistyped-field", ("report", "{record_mistyped}"), "wrong type"),
    Case("report-settings-not-a-table", ("report", "{record_bad_settings}"), "field 'settings' is missing"),
    Case("report-out-under-a-file", ("report", "{record_missing}", "--out", "{a_file}/r"),
         "is a file, not a folder"),
    *(Case(f"torch-{name}", ("run", "--target", "torch", "--target-model", f"{{{name}}}", "hi"), needle,
           backend="torch") for name, needle in MODEL_CASES),
    *(Case(f"mlx-{name}", ("run", "--target", "mlx", "--target-model", f"{{{name}}}", "hi"), needle,
           backend="mlx") for name, needle in MLX_MODEL_CASES),
]


def _skip(case: Case) -> str | None:
    for backend in filter(None, (case.backend, "torch" if "{" in " ".join(case.args) else None)):
        if missing_requirements(backend):
            return f"the {backend} backend is not installed here"
    return None


def _params(cases):
    return [pytest.param(c, id=c.id, marks=[pytest.mark.skip(reason=r)] if (r := _skip(c)) else [])
            for c in cases]


def _listing(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs for p in d.rglob("*")}


def run_case(case: Case, files: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    args = [a.format(**files) for a in case.args]
    if case.subprocess:
        env = {k: v for k, v in os.environ.items() if k != "SPECMAC_DEBUG"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(case.env)
        argv = [os.fsencode(a) if "\udcff" not in a else a.encode("utf-8", "surrogateescape") for a in args]
        r = subprocess.run([os.fsencode(sys.executable), b"-m", b"specmac", *argv], input=case.stdin,
                           capture_output=True, env=env, cwd=cwd, timeout=300)
        return r.returncode, r.stdout.decode(), r.stderr.decode()
    result = CliRunner().invoke(main, args, input=case.stdin)
    assert isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("case", _params(CASES))
def test_hostile_input(case: Case, files, tmp_path, monkeypatch):
    monkeypatch.delenv("SPECMAC_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    before = _listing(tmp_path, Path(files["root"]))
    code, out, err = run_case(case, files, tmp_path)
    assert_one_line_error(case, code, out, err)
    assert _listing(tmp_path, Path(files["root"])) == before, "files were left behind"


# --- the Python API gets the same checks -----------------------------------------------------

@pytest.mark.parametrize("kw, needle", [
    ({"k": True}, "k True"), ({"k": 2.5}, "k 2.5"), ({"k": 0}, "k 0"), ({"k": 257}, "k 257"),
    ({"k": "fast"}, "k 'fast'"), ({"max_tokens": True}, "max_tokens True"),
    ({"max_tokens": 2.0}, "max_tokens 2.0"), ({"seed": -1}, "seed -1"),
])
def test_api_refuses_bad_values(kw, needle):
    import specmac
    from specmac.errors import BadOption

    with pytest.raises(BadOption, match=needle) as e:
        specmac.generate("hi", target="synthetic", draft="synthetic", **kw)
    assert e.value.param in kw


@pytest.mark.parametrize("opts, needle", [
    ({"noise": float("inf")}, "not a finite number"), ({"noise": -1}, "out of range"),
    ({"n_ctx": True}, "is a bool, not an integer"), ({"n_ctx": 1.5}, "is a float, not an integer"),
    ({"sharpness": "nan"}, "not a finite number"), ({"beta": [1]}, "is a list"),
])
def test_api_refuses_bad_backend_options(opts, needle):
    from specmac.backends import load_backend
    from specmac.errors import BadOption

    with pytest.raises(BadOption, match=needle):
        load_backend("synthetic", None, opts)


def test_compare_k_range_refused_before_it_is_built():
    from specmac.compare.measure import parse_ks
    from specmac.errors import BadOption

    assert parse_ks("1-4,8") == [1, 2, 3, 4, 8]
    with pytest.raises(BadOption, match="out of range"):
        parse_ks("1-10000000000000")


# --- 5. config and prompt files ----------------------------------------------------------------

@pytest.mark.parametrize("toml, needle", [
    ("[synthetic]\noptions = 5\n", "options = 5 is not a table"),
    ("[synthetic]\noptions = [1, 2]\n", "is not a table"),
    ("synthetic = 3\n", "config [synthetic] is not a table"),
    ("[synthetic]\ntarget_model = 5\n", "target_model = 5 is not a string"),
    ("[synthetic]\ncolour = 'red'\n", "unknown key 'colour'"),
    ("[synthetic]\noptions = { n_ctx = [1] }\n", "options.n_ctx = [1] is not a string, number or boolean"),
])
def test_compare_config_values_named(tmp_path, toml, needle):
    from specmac.compare import measure as cmp
    from specmac.errors import BadOption

    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(BadOption, match=re_escape(needle)) as e:
        cmp.backend_settings(cmp.read_config(str(path)))
    assert e.value.param == "config_path"


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("toml, needle", [
    ("[synthetic]\noptions = { noise = true }\n", "noise=True is a bool, not a number"),
    ("[synthetic]\noptions = { n_ctx = true }\n", "n_ctx=True is a bool, not an integer"),
    ("[synthetic]\noptions = { n_ctx = 1.5 }\n", "n_ctx=1.5 is a float, not an integer"),
])
def test_compare_config_option_types_checked_by_the_backend(tmp_path, toml, needle):
    from specmac.backends import backend_class
    from specmac.compare import measure as cmp
    from specmac.errors import BadOption

    path = tmp_path / "c.toml"
    path.write_text(toml)
    options = cmp.backend_settings(cmp.read_config(str(path)))["synthetic"]["options"]
    with pytest.raises(BadOption, match=re_escape(needle)):
        backend_class("synthetic").parse_options(options)


def test_config_and_prompts_not_utf8(tmp_path):
    from specmac.compare import measure as cmp
    from specmac.compare.prompts import read_prompts
    from specmac.errors import BadOption

    bad = tmp_path / "c.toml"
    bad.write_bytes(b"[synthetic]\noptions = { seed = 1 } # \xff\n")
    with pytest.raises(BadOption, match=r"not UTF-8 text \(byte|not valid TOML"):
        cmp.read_config(str(bad))
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(b"hello\n---\nab\xffc")
    with pytest.raises(BadOption, match=r"is not UTF-8 text \(byte 12\)"):
        read_prompts(str(prompts))


def test_duplicate_prompt_ids_refused(tmp_path):
    import json

    from specmac.compare.prompts import read_prompts
    from specmac.errors import BadOption

    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"id": "a", "text": "x"}, {"id": "b", "text": "y"},
                                {"id": "a", "text": "z"}]))
    with pytest.raises(BadOption, match="id 'a' is given twice"):
        read_prompts(str(path))
    path.write_text(json.dumps([{"id": ["a"], "text": "x"}]))
    with pytest.raises(BadOption, match="entry 0 has an id that is not a string"):
        read_prompts(str(path))


# --- 6. plugins that fail to load -------------------------------------------------------------

PLUGINS = {
    "raiseplug": ("raiseplug_mod:Backend", "raise RuntimeError('boom at import')\n", "fails to import"),
    "noattrplug": ("noattrplug_mod:Nothing", "X = 1\n", "'noattrplug_mod:Nothing' does not exist"),
    "notclassplug": ("notclassplug_mod:X", "X = 1\n", "is not a BaseBackend subclass"),
}


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    info = tmp_path / "specmac_badplugs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specmac-badplugs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[specmac.backends]\n" + "".join(f"{n} = {entry}\n" for n, (entry, _, _) in PLUGINS.items()))
    for entry, source, _ in PLUGINS.values():
        (tmp_path / f"{entry.partition(':')[0]}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", list(PLUGINS))
def test_broken_plugin_is_one_line(name, plugins):
    result = CliRunner().invoke(main, ["run", "--target", name, "hi"])
    assert_one_line_error(Case(name, (), PLUGINS[name][2]), result.exit_code, result.stdout, result.stderr)


def test_backends_lists_broken_plugins(plugins):
    result = CliRunner().invoke(main, ["backends"])
    assert result.exit_code == 0, result.output
    for name, (_, _, needle) in PLUGINS.items():
        line = next(x for x in result.stdout.splitlines() if x.startswith(name))
        assert "broken:" in line and needle in line


def test_default_compare_skips_broken_plugins(plugins):
    from specmac.backends import BUILTINS, available
    from specmac.compare.measure import parse_pairs

    if not any(available(n) for n in BUILTINS if n != "synthetic"):
        pytest.skip("no model backend is installed here, so the default compare has no pairs")
    names = {n for p in parse_pairs([]) for n in (p.draft, p.target)}
    assert names and not names & set(PLUGINS)


# --- 8. signals, a closed stdout, TERM=dumb ---------------------------------------------------

def _spawn(args: list[str], **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "SPECMAC_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.Popen([sys.executable, "-m", "specmac", *args], env=env, **kw)


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    import signal
    import time

    proc = _spawn(["run", *PAIR, "--target-opt", "latency_ms=20", "--max-tokens", "5000", "hello"],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    time.sleep(3)  # the interpreter starts and generation begins
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"finish: interrupted" in err and b"Traceback" not in err
    assert out  # what was generated before the signal


def test_closed_stdout_ends_quietly(tmp_path):
    proc = _spawn(["run", *SYN, "--target-opt", "latency_ms=1", "--max-tokens", "3000", "hello"],
                  stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, err
    assert err == b""


def test_term_dumb_means_no_colour(monkeypatch):
    from specmac.cli.app import use_color

    monkeypatch.setattr(sys, "stdout", type("Tty", (), {"isatty": lambda self: True})())
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(None, False)
    monkeypatch.setenv("TERM", "dumb")
    assert not use_color(None, False)


# --- 7. the hub, offline ----------------------------------------------------------------------

def test_unreachable_hub_fails_fast(monkeypatch):
    import socket
    import time

    from specmac.backends import hf
    from specmac.errors import ModelNotFound

    pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def refuse(*_a, **_kw):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    t0 = time.monotonic()
    with pytest.raises(ModelNotFound, match="cannot reach huggingface.co to download nosuchorg/nosuchmodel"):
        hf.resolve_model("nosuchorg/nosuchmodel", "target")
    assert time.monotonic() - t0 < 5
