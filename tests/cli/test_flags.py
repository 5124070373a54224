"""The pair flags a newcomer from llama.cpp types: -m/-md/-n/-c, a model alone implying its backend,
one line saying which role falls back to the embedded tiny model, -c in every message about n_ctx."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specmac import assets
from specmac.cli import main
from specmac.cli.flags import model_backend
from specmac.errors import VocabMismatch
from tests.support.helpers import PAIR, SYN, Case, assert_one_line_error, skip_unless_installed

DRAFT_GGUF, TARGET_GGUF = str(assets.gguf_file("draft")), str(assets.gguf_file("target"))
gguf_only = skip_unless_installed("gguf")


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def run_json(*args: str) -> tuple[dict, str]:
    res = invoke("run", "--json", *args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    return json.loads(res.stdout), res.stderr


def test_a_model_names_its_backend(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "qwen2"}')
    (tmp_path / "mlxq").mkdir()
    (tmp_path / "mlxq" / "config.json").write_text('{"quantization": {"group_size": 64, "bits": 4}}')
    (tmp_path / "weights.bin").write_bytes(b"GGUF")
    assert model_backend("qwen-0.5b.Q4_K_M.GGUF") == "gguf"  # not there yet: the name says it
    assert model_backend("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:qwen-0.5b-q4_k_m.gguf") == "gguf"
    assert model_backend(str(tmp_path / "weights.bin")) == "gguf"  # a file is a GGUF: folders are HF
    assert model_backend(str(tmp_path / "hf")) == "torch"
    assert model_backend(str(tmp_path / "mlxq")) == "mlx"
    assert model_backend("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "torch"


@gguf_only
def test_draft_and_target_models_alone_make_a_gguf_pair():
    """-m and -md, short, side by side, with no --draft: llama.cpp's -m/-md."""
    r, err = run_json("-m", TARGET_GGUF, "-md", DRAFT_GGUF, "-n", "6", "def f(")
    assert r["draft"]["backend"] == "gguf" and r["target"]["backend"] == "gguf"
    assert (r["target"]["model"], r["draft"]["model"]) == (TARGET_GGUF, DRAFT_GGUF)
    assert r["n_drafted"] > 0 and r["n_tokens"] <= 6
    assert "embedded" not in err


@gguf_only
def test_one_model_says_which_role_is_the_embedded_one():
    r, err = run_json("-md", DRAFT_GGUF, "-n", "4", "def f(")
    assert r["draft"]["backend"] == "gguf"
    assert "specmac: no -m/--target-model: the target is the embedded tiny target model" in err
    r, err = run_json("-m", TARGET_GGUF, "--draft", "gguf", "-n", "4", "def f(")
    assert "no -md/--draft-model: the draft is the embedded tiny draft model" in err
    _, err = run_json("-m", TARGET_GGUF, "-n", "4", "def f(")  # plain decoding: nothing falls back
    assert "embedded" not in err


@gguf_only
@pytest.mark.parametrize("args, needle", [
    (("-md", DRAFT_GGUF), "the draft model and the embedded tiny target have different tokenizers (no "
                          "-m/--target-model): add -m/--target-model"),
    (("-m", TARGET_GGUF, "--draft", "gguf"), "add -md/--draft-model with a model of the target's family"),
])
def test_a_foreign_model_beside_the_embedded_one_names_the_missing_flag(monkeypatch, args, needle):
    def differ(*_a, **_kw):
        raise VocabMismatch("draft and target tokenizers differ on 4096 of 4096 shared ids")

    monkeypatch.setattr("specmac.core.sources.check_compatible", differ)
    res = invoke("run", *args, "hi")
    assert_one_line_error(Case("fallback", (), needle), res.exit_code, res.stdout, res.stderr)


@gguf_only
def test_a_tokenizer_mismatch_of_two_given_models_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr("specmac.core.sources.check_compatible",
                        lambda *_a, **_kw: (_ for _ in ()).throw(VocabMismatch("tokenizers differ")))
    res = invoke("run", "-m", TARGET_GGUF, "-md", DRAFT_GGUF, "hi")
    assert_one_line_error(Case("both", (), "tokenizers differ"), res.exit_code, res.stdout, res.stderr)
    assert "embedded" not in res.stderr


def test_ctx_size_sets_both_windows_and_an_option_wins_for_its_role():
    r, _ = run_json(*PAIR, "-c", "64", "-n", "2", "hi")
    assert r["target"]["n_ctx"] == r["draft"]["n_ctx"] == 64
    r, _ = run_json(*PAIR, "--ctx-size", "64", "--target-opt", "n_ctx=32", "-n", "2", "hi")
    assert (r["target"]["n_ctx"], r["draft"]["n_ctx"]) == (32, 64)
    r, _ = run_json(*SYN, "--draft", "ngram", "-c", "48", "-n", "2", "hi")  # no draft model: the target's
    assert r["target"]["n_ctx"] == 48


def test_max_tokens_short_flag():
    r, _ = run_json(*SYN, "--target-opt", "eos_bias=-100", "-n", "5", "hi")
    assert r["n_tokens"] == 5 and r["finish_reason"] == "length"


@pytest.mark.parametrize("case", [
    Case("prompt-over-ctx", ("run", *SYN, "-c", "4", "a longer prompt"),
         "context window is 4: shorten it or raise -c/--ctx-size"),
    Case("prompt-over-draft-ctx", ("run", *PAIR, "--draft-opt", "n_ctx=4", "a longer prompt"),
         "the draft's context window is 4: shorten it or raise -c/--ctx-size"),
    Case("ctx-too-small", ("run", *SYN, "-c", "1", "hi"), "--ctx-size"),
    Case("ctx-above-range", ("run", *SYN, "-c", str(1 << 21), "hi"), "-c/--ctx-size 2097152: option n_ctx"),
    Case("verify-ctx", ("verify", *PAIR, "-c", "8", "--length", "20"), "context window (8 tokens"),
    Case("ngram-with-a-draft-model", ("run", *SYN, "--draft", "ngram", "-md", "x.gguf", "hi"),
         "takes no draft model"),
], ids=lambda c: c.id)
def test_ctx_and_model_mistakes_are_one_line(case):
    res = invoke(*case.args)
    assert_one_line_error(case, res.exit_code, res.stdout, res.stderr)


@pytest.mark.parametrize("command", ["run", "verify", "serve", "advise", "compare"])
def test_every_command_that_loads_a_pair_takes_the_short_flags(command):
    help_text = invoke(command, "--help").stdout
    for flag in ("-m, --target-model", "-md, --draft-model", "-c, --ctx-size"):
        assert flag in help_text, (command, flag)
    if command in ("run", "compare"):
        assert "-n, --max-tokens" in help_text


@gguf_only
def test_compare_takes_models_as_run_does(tmp_path):
    """-md and -m as paths make run's pair (and ngram) in front of the target; -c and -n as in run."""
    res = invoke("compare", "-md", DRAFT_GGUF, "-m", TARGET_GGUF, "--k", "2", "--repeats", "1",
                 "--n-prompts", "1", "-n", "4", "-c", "256", "--json", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["settings"]["pairs"] == ["gguf:gguf", "ngram:gguf"] and r["settings"]["max_tokens"] == 4
    target, draft = r["backends"]["target:gguf"], r["backends"]["draft:gguf"]
    assert (target["model"], draft["model"]) == (TARGET_GGUF, DRAFT_GGUF)
    assert target["n_ctx"] == draft["n_ctx"] == 256


def test_compare_model_flag_mistakes(tmp_path):
    out = ["--out", str(tmp_path / "o")]
    for args, needle in ((("-m", "a.gguf", "-m", "b.gguf"), "--target-model is given twice as a path"),
                         (("--draft-model", "gguf"), "is not PATH or BACKEND=PATH")):
        res = invoke("compare", "--pair", "synthetic:synthetic", *args, *out)
        assert_one_line_error(Case("compare", (), needle), res.exit_code, res.stdout, res.stderr)


def test_ctx_size_overrides_a_profiles_windows(tmp_path):
    path = tmp_path / "p.json"
    res = invoke("advise", "--backends", "synthetic", "--k-max", "2", "--run-tokens", "8", "-c", "300",
                 "--save", str(path), "--json")
    assert res.exit_code == 0, res.output
    assert '"n_ctx": "300"' in path.read_text()  # the profile keeps advise's -c, as --*-opt n_ctx=300
    r, _ = run_json("--profile", str(path), "-c", "64", "-n", "2", "hi")
    assert r["target"]["n_ctx"] == 64 and (r["draft"].get("n_ctx") in (None, 64))
