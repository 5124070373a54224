"""The CLI: every bad input is one line on stderr and exit 2 (in-process and in a real subprocess),
the JSON contracts of run and verify, --version, backends, --help imports no ML framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac import backends as registry_module
from specmac.backends import missing_requirements
from specmac.cli import main
from tests.support.helpers import PAIR, REPO, SYN, Case, assert_one_line_error, cli_env

SMOLLM = Path.home() / ".cache/specmac/models/SmolLM2-135M-Instruct.Q4_1.gguf"
ML_MODULES = ("torch", "mlx", "mlx_lm", "llama_cpp", "transformers", "safetensors")

# simulates a machine without mlx: find_spec reports it missing (nothing else changes)
HIDE_MLX = ("import importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'mlx' else real(n, *a)")


CASES = [
    Case("unknown-target", ("run", "--target", "nosuch", "hi"), "'nosuch' is not a backend"),
    Case("unknown-draft", ("run", *SYN, "--draft", "nosuch", "hi"), "--draft 'nosuch' is not a backend"),
    Case("backend-not-installed", ("run", "--target", "mlx", "hi"), "needs mlx: pip install",
         setup="hide-mlx"),
    Case("plugin-framework-missing", ("run", "--target", "fakeplug", "hi"),
         "fakeplug backend needs specmac_fakeplug_framework", setup="plugin"),
    Case("model-path-missing", ("run", "--target", "gguf", "--target-model", "{missing}", "hi"),
         "not found", backend="gguf"),
    Case("not-a-gguf", ("run", "--target", "gguf", "--target-model", "{random_gguf}", "hi"),
         "is not a gguf file", backend="gguf"),
    Case("truncated-gguf", ("run", "--target", "gguf", "--target-model", "{truncated_gguf}", "hi"),
         "cannot load", backend="gguf"),
    Case("hf-folder-without-config", ("run", "--target", "torch", "--target-model", "{empty_dir}", "hi"),
         "has no config.json", backend="torch"),
    Case("incompatible-vocab-synthetic", ("run", *PAIR, "--draft-opt", "vocab_size=40", "hi"),
         "tokenizers differ"),
    Case("incompatible-vocab-real", ("run", "--target", "gguf", "--target-model", "{real_gguf}",
                                     "--draft", "synthetic", "hi"),
         "tokenizers differ", backend="gguf", setup="real-gguf"),
    Case("empty-prompt", ("run", *SYN, ""), "prompt is empty"),
    Case("empty-stdin", ("run", *SYN), "prompt is empty"),
    Case("prompt-longer-than-context", ("run", *SYN, "--target-opt", "n_ctx=4", "a longer prompt"),
         "context window is 4"),
    Case("k-zero", ("run", *PAIR, "--k", "0", "hi"), "--k 0 is out of range"),
    Case("k-negative", ("run", *PAIR, "--k", "-2", "hi"), "--k -2 is out of range"),
    Case("k-not-a-number", ("run", *PAIR, "--k", "four", "hi"), "--k 'four' is not a number"),
    Case("temperature-negative", ("run", *SYN, "--temperature", "-1", "hi"), "--temperature"),
    Case("temperature-not-a-number", ("run", *SYN, "--temperature", "hot", "hi"), "--temperature"),
    Case("top-p-zero", ("run", *SYN, "--top-p", "0", "hi"), "--top-p"),
    Case("top-p-above-one", ("run", *SYN, "--top-p", "1.5", "hi"), "--top-p"),
    Case("top-k-negative", ("run", *SYN, "--top-k", "-3", "hi"), "--top-k"),
    Case("min-p-one", ("run", *SYN, "--min-p", "1", "hi"), "--min-p"),
    Case("max-tokens-zero", ("run", *SYN, "--max-tokens", "0", "hi"), "--max-tokens"),
    Case("draft-opt-unknown-key", ("run", *PAIR, "--draft-opt", "colour=red", "hi"),
         "--draft-opt: unknown option 'colour'"),
    Case("draft-opt-wrong-type", ("run", *PAIR, "--draft-opt", "vocab_size=many", "hi"),
         "vocab_size='many' is not a valid int"),
    Case("draft-opt-not-key-value", ("run", *PAIR, "--draft-opt", "vocab_size", "hi"),
         "is not key=value"),
    Case("target-opt-out-of-range", ("run", *SYN, "--target-opt", "vocab_size=1", "hi"),
         "vocab_size=1 is out of range"),
    Case("prompt-file-missing", ("run", *SYN, "--prompt-file", "{missing}"), "does not exist"),
    Case("prompt-file-is-a-folder", ("run", *SYN, "--prompt-file", "{empty_dir}"), "is a directory"),
    Case("prompt-file-not-text", ("run", *SYN, "--prompt-file", "{random_gguf}"), "is not UTF-8 text"),
    Case("chat-without-template", ("run", *SYN, "--chat", "hi"),
         "--chat: the target (synthetic) has no chat template"),
    Case("ngram-with-draft-model", ("run", *SYN, "--draft", "ngram", "--draft-model", "x", "hi"),
         "takes no draft model"),
    Case("unknown-option", ("run", *SYN, "--temprature", "1", "hi"), "no such option"),
    Case("unknown-command", ("rnu", "hi"), "no such command 'rnu'"),
    Case("verify-without-draft", ("verify", *SYN), "verify needs a draft"),
    Case("verify-too-few-tokens", ("verify", *PAIR, "--tokens", "10"), "--tokens 10 is too few"),
    Case("temperature-underflows", ("run", *SYN, "--temperature", "1e-320", "hi"),
         "--temperature 1e-320 is out of range: use 0 (greedy) or a number >= 1e-06"),
    Case("seed-negative-run", ("run", *SYN, "--seed", "-1", "hi"), "--seed"),
    Case("seed-negative-verify", ("verify", *PAIR, "--seed", "-5"), "--seed"),
    Case("baseline-without-draft", ("run", *SYN, "--baseline", "hi"), "add --draft"),
]


def _skip_reason(case: Case) -> str | None:
    if case.backend and missing_requirements(case.backend):
        return f"the {case.backend} backend is not installed here"
    if case.setup == "real-gguf" and _real_gguf() is None:
        return "no real GGUF model here (embedded pair not built, SmolLM2 not materialised)"
    return None


def _params():
    out = []
    for c in CASES:
        reason = _skip_reason(c)
        out.append(pytest.param(c, id=c.id, marks=[pytest.mark.skip(reason=reason)] if reason else []))
    return out


def _real_gguf() -> Path | None:
    from specmac import assets

    for path in (assets.gguf_file("target", "q8_0"), SMOLLM):
        if path.is_file():
            return path
    return None


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Bad model files and a plugin whose framework is missing."""
    d = tmp_path_factory.mktemp("cli")
    (d / "random.gguf").write_bytes(os.urandom(4096))
    (d / "truncated.gguf").write_bytes(_truncated_gguf())
    (d / "empty_model").mkdir()
    plugin = d / "plugin"
    info = plugin / "specmac_fakeplug-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specmac-fakeplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specmac.backends]\nfakeplug = specmac_fakeplug:FakeBackend\n")
    (plugin / "specmac_fakeplug.py").write_text("import specmac_fakeplug_framework  # not installed\n")
    real = _real_gguf()
    return {"missing": str(d / "no" / "such" / "model.gguf"), "random_gguf": str(d / "random.gguf"),
            "truncated_gguf": str(d / "truncated.gguf"), "empty_dir": str(d / "empty_model"),
            "real_gguf": str(real), "plugin": str(plugin)}


def _truncated_gguf() -> bytes:
    """A valid GGUF header that promises tensors and metadata, cut off after the first key."""
    import struct

    key = b"general.architecture"
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 5)  # version 3, 1 tensor, 5 key-value pairs
    return head + struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)  # a string, but no value


def _args(case: Case, files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in case.args]


# --- the bad-input matrix ----------------------------------------------------------------------

@pytest.mark.parametrize("case", _params())
def test_bad_input_cli_runner(case: Case, files, monkeypatch):
    monkeypatch.delenv("SPECMAC_DEBUG", raising=False)
    if case.setup == "hide-mlx":
        real = registry_module.importlib.util.find_spec
        monkeypatch.setattr(registry_module.importlib.util, "find_spec",
                            lambda n, *a: None if n == "mlx" else real(n, *a))
    if case.setup == "plugin":
        monkeypatch.syspath_prepend(files["plugin"])
    result = CliRunner().invoke(main, _args(case, files), input="")
    assert isinstance(result.exception, SystemExit), result.exception  # not an unexpected error
    assert_one_line_error(case, result.exit_code, result.stdout, result.stderr)


def _run_subprocess(case: Case, files: dict[str, str]) -> subprocess.CompletedProcess:
    env = cli_env()
    cmd = [sys.executable, "-m", "specmac"]
    if case.setup == "hide-mlx":
        cmd = [sys.executable, "-c", f"{HIDE_MLX}; from specmac.cli import main; main(prog_name='specmac')"]
    if case.setup == "plugin":
        env["PYTHONPATH"] = os.pathsep.join([files["plugin"], env["PYTHONPATH"]])
    return subprocess.run(cmd + _args(case, files), input="", capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def subprocess_results(files) -> dict[str, subprocess.CompletedProcess]:
    """Every runnable case as a real process, a few at a time (each pays the interpreter start)."""
    runnable = [c for c in CASES if _skip_reason(c) is None]
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(lambda c: _run_subprocess(c, files), runnable)
        return {c.id: r for c, r in zip(runnable, done)}


@pytest.mark.parametrize("case", _params())
def test_bad_input_subprocess(case: Case, subprocess_results):
    r = subprocess_results[case.id]
    assert_one_line_error(case, r.returncode, r.stdout, r.stderr)


def test_matrix_is_wide():
    assert len(CASES) >= 15
    assert len({c.id for c in CASES}) == len(CASES)


def test_debug_shows_the_traceback_of_a_user_error():
    r = subprocess.run([sys.executable, "-m", "specmac", "run", *PAIR, "--k", "0", "hi"],
                       capture_output=True, text=True, env=cli_env(SPECMAC_DEBUG="1"), cwd=REPO, timeout=120)
    assert r.returncode == 2
    assert "Traceback" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == "Error: --k 0 is out of range: use an integer 1..256 or 'auto'"


def test_unexpected_error_keeps_its_traceback():
    boom = ("import specmac.cli.runner as r\n"
            "def run(*a, **k): raise RuntimeError('a bug, not a user error')\n"
            "r.run = run\nfrom specmac.cli import main\nmain(prog_name='specmac')")
    r = subprocess.run([sys.executable, "-c", boom, "run", *PAIR, "hi"], capture_output=True, text=True,
                       env=cli_env(), cwd=REPO, timeout=120)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "RuntimeError: a bug, not a user error" in r.stderr


# --- JSON contracts -----------------------------------------------------------------------------

RUN_KEYS = {"text", "token_ids", "n_tokens", "k", "acceptance_rate", "tokens_per_target_pass",
            "per_position_acceptance", "tokens_per_second", "seconds"}


def _invoke(args: list[str], **kw):
    result = CliRunner().invoke(main, args, **kw)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def test_run_json_speculative():
    r = _invoke(["run", *PAIR, "--k", "4", "--max-tokens", "64", "--seed", "0", "--json", "hello"])
    out = json.loads(r.stdout)
    assert RUN_KEYS <= set(out)
    assert out["n_tokens"] == len(out["token_ids"]) == 64 and out["k"] == 4
    assert len(out["per_position_acceptance"]) == 4
    assert 0 <= out["acceptance_rate"] <= 1 and 1 <= out["tokens_per_target_pass"] <= 5
    assert out["tokens_per_second"] > 0 and out["seconds"] > 0
    assert out["finish_reason"] == "length"


@pytest.mark.parametrize("draft", [[], ["--draft", "none"]])
def test_run_json_target_only_has_the_same_keys(draft):
    r = _invoke(["run", *SYN, *draft, "--max-tokens", "16", "--json", "hello"])
    out = json.loads(r.stdout)
    assert RUN_KEYS <= set(out)
    assert out["acceptance_rate"] is None and out["tokens_per_target_pass"] is None
    assert out["per_position_acceptance"] is None and out["n_tokens"] == 16


def test_run_same_seed_same_text_on_both_paths():
    """Greedy speculative output equals greedy target-only output (synthetic is exact)."""
    spec = json.loads(_invoke(["run", *PAIR, "--max-tokens", "40", "--json", "hello"]).stdout)
    base = json.loads(_invoke(["run", *SYN, "--max-tokens", "40", "--json", "hello"]).stdout)
    assert spec["token_ids"] == base["token_ids"]


def test_run_baseline_reports_speedup():
    r = _invoke(["run", *PAIR, "--target-opt", "latency_ms=2", "--baseline", "--max-tokens", "24",
                 "--json", "hello"])
    out = json.loads(r.stdout)
    assert out["baseline"]["n_tokens"] == 24 and out["baseline"]["acceptance_rate"] is None
    assert out["speedup"] == pytest.approx(out["tokens_per_second"] / out["baseline"]["tokens_per_second"])


def test_run_text_and_stats_block(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    r = _invoke(["run", *PAIR, "--max-tokens", "32", "--prompt-file", str(prompt), "--baseline"])
    assert len(r.stdout) == 33 and "\x1b[" not in r.stdout  # 32 one-char tokens and a newline
    err = r.stderr
    for needle in ("32 tokens in", "tokens/s", "acceptance", "tokens per target pass",
                   "per-position acceptance:", "time: draft", "verify", "other", "speedup"):
        assert needle in err, needle


def test_run_adaptive_k():
    """A parallel target and a cheap, good draft: drafting pays, and auto drafts."""
    pays = ["--target-opt", "latency_ms=2", "--draft-opt", "latency_ms=0.1", "--draft-opt", "noise=0.1"]
    r = _invoke(["run", *PAIR, *pays, "--k", "auto", "--max-tokens", "48", "--json", "hi"])
    out = json.loads(r.stdout)
    assert out["k"] == "auto" and out["n_tokens"] == 48 and 0 <= out["acceptance_rate"] <= 1
    assert sum(out["k_steps"]) > 0 and out["k_policy"]["policy"] == "auto"


def test_run_adaptive_k_drafts_nothing_when_no_k_pays():
    """A serial target and a draft as slow as it: the stats say auto chose plain decoding."""
    slow = ["--draft-opt", "latency_ms=2", "--target-opt", "latency_ms=2", "--target-opt", "beta=1.0"]
    r = _invoke(["run", *PAIR, *slow, "--k", "auto", "--max-tokens", "12", "hi"])
    assert "K per step: 12 steps at 0  (0 = no drafts: none was predicted to beat a plain step" in r.stderr
    assert "pass costs: target: " in r.stderr and "not counted)" in r.stderr  # what auto paid first


def test_run_reads_stdin():
    piped = json.loads(_invoke(["run", *SYN, "--max-tokens", "8", "--json"], input="hello").stdout)
    argued = json.loads(_invoke(["run", *SYN, "--max-tokens", "8", "--json", "hello"]).stdout)
    assert piped["prompt"] == "hello" and piped["token_ids"] == argued["token_ids"]


VERIFY_KEYS = ("chi2", "dof", "p_value", "n_categories", "n_samples_per_method", "n_tokens_per_method",
               "positions", "min_detectable_tv", "greedy_agreement", "greedy_tokens", "contexts", "k",
               "sampling", "n_by_kind", "per_position", "joint", "decisive_test", "n_tests",
               "greedy_mismatches", "verdict")


def test_verify_json_keys_and_every_kind_of_token_tested():
    r = _invoke(["verify", *PAIR, "--temperature", "1", "--tokens", "6000", "--json"])
    out = json.loads(r.stdout)
    for key in VERIFY_KEYS:
        assert key in out, key
    assert out["positions"] == 10 and out["n_samples_per_method"] == 600  # 100 x 6 contexts x 10 tokens
    assert 5000 < out["n_tokens_per_method"] <= 6000 and out["greedy_agreement"] == 1.0
    kinds = out["n_by_kind"]
    assert min(kinds["accepted"], kinds["corrected"], kinds["bonus"]) > 100, kinds
    assert sum(kinds[x] for x in ("accepted", "corrected", "bonus", "target")) == out["n_tokens_per_method"]
    assert out["per_position"][0]["kinds"]["accepted"] > 0  # position 1 holds draft tokens
    assert len(out["per_position"]) == 10 and out["n_tests"] <= 10 + 9 + 1  # tests with dof 0 are left out
    assert 0 < out["min_detectable_tv"] < 1 and out["verdict"].startswith("PASS")


def test_verify_text_has_table_and_plain_verdict():
    r = _invoke(["verify", *PAIR, "--tokens", "3000"])
    out = r.stdout
    assert "p-value" in out and "min detectable TV" in out and "greedy agreement" in out
    assert "tokens tested" in out and "bonus" in out
    assert "Can detect: with 80% power, a shift of total variation >=" in out
    assert "not diluted over the mixture" in out and "Cannot detect:" in out


def _res(**kw) -> dict:
    return {"p_value": 0.5, "min_detectable_tv": 0.05, "positions": 3, "dof": 40,
            "n_categories": 41, "contexts": ["a", "b"], "greedy_agreement": 1.0} | kw


_TIE = {"match": False, "first_difference": 6, "top2_gap": 0.01, "batched_vs_serial": 0.03,
        "near_tie": True, "context": 0}


@pytest.mark.parametrize("res, head", [
    (_res(), "PASS"), (_res(p_value=1e-6), "FAIL"), (_res(p_value=0.02), "INCONCLUSIVE"),
    (_res(dof=0, n_categories=1, p_value=1.0), "NO VERDICT"),
    (_res(greedy_agreement=0.5, greedy_mismatches=[_TIE]), "PASS"),
    (_res(greedy_agreement=0.5, greedy_mismatches=[_TIE | {"near_tie": False, "top2_gap": 2.0}]), "FAIL")])
def test_verdict_branches(res, head):
    from specmac.cli.render import verdict

    text = verdict(res)
    assert text.startswith(head)
    assert ("0.050" in text) == (head != "NO VERDICT")  # the detectable TV, wherever there was a test


def test_verdict_explains_greedy_disagreement_and_few_categories():
    from specmac.cli.render import verdict

    text = verdict(_res(greedy_agreement=0.5, dof=4, n_categories=5, greedy_mismatches=[_TIE]))
    assert "Greedy, context 1: part at token 7: near-tie flip" in text and "Only 5 categories" in text


# --- version, backends, help --------------------------------------------------------------------

def test_version_lists_installed_backend_libraries():
    from specmac.backends import library_version

    out = _invoke(["--version"]).stdout
    assert out.startswith("specmac ")
    for lib in ("numpy", "mlx", "mlx-lm", "llama-cpp-python", "torch", "transformers"):
        v = library_version(lib)
        assert (f"{lib} {v}" in out) == (v is not None), lib


def test_backends_lists_plugins_and_why_one_is_not_installed(files, monkeypatch):
    monkeypatch.syspath_prepend(files["plugin"])
    rows = {r["name"]: r for r in json.loads(_invoke(["backends", "--json"]).stdout)}
    assert rows["synthetic"]["installed"] and rows["synthetic"]["devices"] == ["cpu"]
    assert not rows["fakeplug"]["installed"]
    assert "specmac_fakeplug_framework" in rows["fakeplug"]["problem"]
    text = _invoke(["backends"]).stdout
    assert "fakeplug" in text and "not installed" in text


def test_no_command_shows_the_help():
    r = CliRunner().invoke(main, [])
    assert "Usage:" in r.output and "Commands:" in r.output and "run" in r.output


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["verify", "--help"]])
def test_help_imports_no_ml_framework(args):
    code = (f"import sys\nfrom specmac.cli import main\n"
            f"main({args!r}, prog_name='specmac', standalone_mode=False)\n"
            f"print('LOADED', sorted(m for m in {ML_MODULES!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Usage: specmac" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "LOADED []"


# --- the streaming decoder ----------------------------------------------------------------------

def _stream(pieces: list[bytes], strip_leading_space: bool = False):
    """A TextStream over a toy tokenizer whose token i is pieces[i] (UTF-8 may split across tokens)."""
    import io

    from specmac.cli.runner import TextStream

    def decode(ids):
        text = b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")
        return text.lstrip(" ") if strip_leading_space else text  # as SentencePiece decoders do

    out = io.StringIO()
    return TextStream(decode, color=False, out=out), out, decode


def test_stream_holds_back_a_split_character():
    pieces = [b"h", b"\xc3", b"\xa9", b" w"]
    stream, out, decode = _stream(pieces)
    stream.push([0, 1], ["target"] * 2)
    assert out.getvalue() == "h"  # half of "é" is not shown as U+FFFD
    stream.push([2, 3], ["target"] * 2)
    stream.finish([0, 1, 2, 3])
    assert out.getvalue() == "hé w" == decode([0, 1, 2, 3])


def test_stream_keeps_leading_spaces_of_later_tokens():
    pieces = [b" Hello", b" world", b" again"]
    stream, out, decode = _stream(pieces, strip_leading_space=True)
    for i in range(3):
        stream.push([i], ["accepted"])
    assert out.getvalue() == "Hello world again" == decode([0, 1, 2])


def test_stream_finish_prints_what_was_never_pushed():
    """Ctrl-C can land between counting a step and printing it: finish() catches up."""
    stream, out, _ = _stream([b"a", b"b", b"c"])
    stream.push([0], ["target"])
    stream.finish([0, 1, 2])
    assert out.getvalue() == "abc"


@pytest.mark.skipif(bool(missing_requirements("gguf")), reason="the embedded pair runs on the gguf backend")
def test_baseline_runs_at_the_threads_of_its_run(monkeypatch):
    """--baseline is measured like its run: right after it, at the CPU threads the run used, even
    where the load would now fit another count; the stats say so (or say that it was not)."""
    from specmac import api
    from specmac.backends import threads

    later = []  # the load changes once the run is over: a fit now would choose 1 thread
    monkeypatch.setattr(threads, "choose", lambda default: (1, "1 (busy)") if later else (2, "2 (quiet)"))
    monkeypatch.setattr(threads.Fitter, "_look", lambda self: None)  # no refit inside a run
    plain = api.Pair.plain
    monkeypatch.setattr(api.Pair, "plain", lambda self, *a, **kw: later.append(1) or plain(self, *a, **kw))
    res = CliRunner().invoke(main, ["run", "--draft", "gguf", "--max-tokens", "12", "--baseline", "--json",
                                    "def add(a, b):"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    counts = out["baseline"]["thread_counts"]
    assert counts["run"]["start"]["target"] == counts["run"]["end"]["target"] == 2
    assert counts["baseline"]["target"] == 2, counts  # not refitted to the new load
    from specmac.cli.render import stats_block

    assert any(line.startswith("baseline measured like the run") for line in stats_block(out, True))
    counts["baseline"]["target"] = 1  # as a refitted baseline would have been
    assert any(line.startswith("baseline NOT at the run's CPU threads") for line in stats_block(out, True))
