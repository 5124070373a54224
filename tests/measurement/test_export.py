"""`specmac advise --export ENGINE`: advise's choice as the launch command of llama-server, vLLM,
SGLang or mlx_lm.server, every option in the engine's documented set with the documented shape of
its value, and one line of what the engine cannot express (a hybrid, --k auto, a draft on another
backend than its target, another weight format, the coupled sampler).

The mapping configuration -> export is tested on hand-made configurations of each kind; advise runs
once on the embedded pair (tiny runs) and every configuration it ranked is exported to every engine.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac import assets
from specmac.advise.engines import ENGINES, problems
from specmac.advise.export import export_choice, export_config, export_lines
from specmac.advise.profile import build_profile
from specmac.backends.conversion import cache
from specmac.cli import main
from tests.support.helpers import skip_unless_installed

PROMPT = "def add(a, b):"


def side(backend: str, precision: str, **options) -> dict:
    return {"backend": backend, "model": None, "options": options, "precision": precision,
            "source": "embedded"}


def config(kind: str, k=2, draft: str = "gguf", target: str = "gguf", sampler: str = "rejection",
           rank: int = 1) -> dict:
    """A profile's configuration over the embedded pair (its files exist in both formats)."""
    t = side("gguf", "F16", quant="f16") if target == "gguf" else side(target, "float32", dtype="float32")
    if kind == "none":
        d = {"kind": "none", "backend": "none", "model": None, "options": {}, "precision": None}
    elif kind == "lookup":
        d = {"kind": "lookup", **side(draft, "prompt"), "options": {}}
    else:
        backend = draft.split("+")[-1]
        d = {"kind": kind, **(side(draft, "Q8_0", quant="q8_0") if backend == "gguf"
                              else side(draft, "float32", dtype="float32"))}
    return {"rank": rank, "target": t, "draft": d, "k": 0 if kind == "none" else k, "sampler": sampler}


def spec_config(cmd: list[str]) -> dict:
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# --- the check itself: it fails on commands that depart from the docs ------------------------------
@pytest.mark.parametrize("engine, command, says", [
    ("llama-server", ["llama-server", "-m", "t.gguf", "--draft-max", "4"], "not a documented"),
    ("llama-server", ["llama-server", "-m", "t.gguf", "--spec-type", "draft"], "not among"),
    ("llama-server", ["llama-server", "-m", "t.gguf", "--spec-draft-n-max", "four"], "not a non-negative"),
    ("vllm", ["vllm", "serve", "t", "--speculative-config", '{"model": "d", "num_speculative_tokens": "4"}'],
     "not a JSON integer"),
    ("vllm", ["vllm", "serve", "t", "--speculative-config", '{"speculative_model": "d"}'], "not documented"),
    ("vllm", ["vllm", "serve", "t", "--speculative-config", "{'model': 'd'}"], "not JSON"),
    ("vllm", ["vllm", "serve", "--dtype", "float16"], "argument(s) before its options"),
    ("vllm", ["vllm", "serve", "t", "--dtype", "fp16"], "not one of"),
    ("sglang", ["python", "-m", "sglang.launch_server", "--model-path", "t", "--speculative-algorithm",
                "DRAFT"], "not one of"),
    ("mlx-lm", ["mlx_lm.server", "--model", "t", "--draft-model", "d", "--draft-model", "e"], "twice"),
    ("mlx-lm", ["mlx_lm.generate", "--model", "t"], "does not start with"),
])
def test_the_check_fails_on_a_command_the_docs_do_not_allow(engine, command, says):
    found = problems(engine, command)
    assert found and any(says in p for p in found), found


# --- each kind of configuration in each engine ----------------------------------------------------
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("kind, draft, target", [
    ("none", "none", "gguf"), ("lookup", "ngram", "gguf"), ("lookup", "lookup", "torch"),
    ("model", "gguf", "gguf"), ("model", "gguf", "torch"), ("model", "mlx", "gguf"),
    ("hybrid", "lookup+gguf", "gguf"), ("model", "torch", "torch")])
def test_every_export_is_documented_and_one_line(engine, kind, draft, target):
    c = config(kind, 3, draft, target)
    exp = export_config(c, engine, ranked=[c])
    assert problems(engine, exp["command"]) == []
    assert exp["cannot"] is None or "\n" not in exp["cannot"]
    assert exp["checked"] and all("@" in doc for doc in exp["checked"])  # each doc names its version
    if kind == "hybrid" or draft.split("+")[-1] not in (target, "none", "ngram", "lookup"):
        assert exp["cannot"], "a hybrid or a cross-backend draft must say what the engine cannot express"


def test_a_model_draft_and_its_k():
    c = config("model", 5)
    draft_file = str(assets.gguf_file("draft", "q8_0"))
    ls = export_config(c, "llama-server")
    assert ls["command"][:3] == ["llama-server", "-m", str(assets.gguf_file("target", "f16"))]
    assert flag(ls["command"], "--model-draft") == draft_file
    assert flag(ls["command"], "--spec-draft-n-max") == "5"
    assert flag(ls["command"], "--spec-type") == "draft-simple" and ls["cannot"] is None
    vl = export_config(c, "vllm")
    assert vl["command"][2] == str(assets.hf_dir("target")) and flag(vl["command"], "--dtype") == "float16"
    assert spec_config(vl["command"]) == {"model": str(assets.hf_dir("draft")), "method": "draft_model",
                                          "num_speculative_tokens": 5}
    sg = export_config(c, "sglang")["command"]
    assert (flag(sg, "--speculative-algorithm"), flag(sg, "--speculative-num-steps"),
            flag(sg, "--speculative-eagle-topk"), flag(sg, "--speculative-num-draft-tokens")) == (
        "STANDALONE", "5", "1", "6")
    ml = export_config(c, "mlx-lm")["command"]
    assert (flag(ml, "--draft-model"), flag(ml, "--num-draft-tokens")) == (str(assets.hf_dir("draft")), "5")


def test_lookup_and_ngram_with_their_lengths():
    ng = spec_config(export_config(config("lookup", 4, "ngram"), "vllm")["command"])
    assert ng == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                  "prompt_lookup_min": 1}
    lk = export_config(config("lookup", 4, "lookup"), "vllm")
    assert spec_config(lk["command"])["prompt_lookup_max"] == 8 and "lookup" in lk["cannot"]
    ls = export_config(config("lookup", 4, "ngram"), "llama-server")["command"]
    assert flag(ls, "--spec-type") == "ngram-simple" and flag(ls, "--spec-ngram-simple-size-m") == "4"
    assert "--model-draft" not in ls
    ml = export_config(config("lookup", 4, "lookup"), "mlx-lm")
    assert ml["command"] == ["mlx_lm.server", "--model", str(assets.hf_dir("target"))]
    assert "no n-gram" in ml["cannot"]


def test_the_hybrid_is_llama_servers_mix_elsewhere_the_better_ranked_half():
    hybrid = config("hybrid", 3, "lookup+gguf", rank=1)
    model, lookup = config("model", 2, rank=2), config("lookup", 4, "lookup", rank=3)
    ls = export_config(hybrid, "llama-server", ranked=[hybrid, model, lookup])
    assert flag(ls["command"], "--spec-type") == "ngram-simple,draft-simple"
    assert "n-gram draft wherever it finds one" in ls["cannot"]
    vl = export_config(hybrid, "vllm", ranked=[hybrid, model, lookup])
    assert spec_config(vl["command"])["method"] == "draft_model" and "model alone at K = 2" in vl["cannot"]
    vl = export_config(hybrid, "vllm", ranked=[hybrid, {**lookup, "rank": 2}, {**model, "rank": 3}])
    assert spec_config(vl["command"]) == {"method": "ngram", "num_speculative_tokens": 4,
                                          "prompt_lookup_max": 8, "prompt_lookup_min": 3}
    assert "lookup alone at K = 4, ranked 2" in vl["cannot"]
    ml = export_config(hybrid, "mlx-lm", ranked=[hybrid, lookup, model])  # no lookup in mlx-lm
    assert flag(ml["command"], "--num-draft-tokens") == "2" and "model alone" in ml["cannot"]


def test_k_auto_the_coupled_sampler_and_sampling():
    auto = {**config("model", "auto", sampler="coupled")}
    ranked = [config("model", 6)]
    exp = export_config(auto, "mlx-lm", ranked=ranked)
    assert flag(exp["command"], "--num-draft-tokens") == "6"
    assert "--k auto" in exp["cannot"] and "K = 6" in exp["cannot"] and "coupled" in exp["cannot"]
    assert "K = 3" in export_config(auto, "mlx-lm")["cannot"]  # nothing measured: the engines' default
    hot = export_config(config("model", 2), "vllm", temperature=0.8)
    assert spec_config(hot["command"])["draft_sample_method"] == "probabilistic"
    assert "probabilistic" in export_config(config("model", 2), "llama-server", temperature=0.8)["command"]


def test_a_file_the_engine_cannot_read_is_named_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))  # no conversion made
    gguf = tmp_path / "target-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    c = config("none")
    c["target"] = {**c["target"], "model": str(gguf), "options": {}, "precision": "Q4_K_M"}
    exp = export_config(c, "vllm")
    assert exp["command"][2] == "<target-q4_k_m.gguf as a Hugging Face folder>"
    assert "folder of target-q4_k_m.gguf first" in exp["cannot"]
    assert "another output distribution" in exp["cannot"]
    assert "--dtype" not in exp["command"]
    assert export_config(c, "llama-server")["command"] == ["llama-server", "-m", str(gguf)]
    entry = tmp_path / "cache" / "converted" / "target-q4_k_m-hf-float32"  # a conversion specmac made
    entry.mkdir(parents=True)
    (entry / cache.SIDECAR).write_text(json.dumps({"variant": "hf-float32", "source": str(gguf),
                                                   "source_signature": cache.signature(gguf)}))
    exp = export_config(c, "sglang")
    assert flag(exp["command"], "--model-path") == str(entry) and "first" not in exp["cannot"]


def test_an_unknown_engine_is_refused():
    with pytest.raises(Exception, match="llama-server, vllm, sglang, mlx-lm"):
        export_config(config("none"), "tgi")


@pytest.mark.skipif(importlib.util.find_spec("mlx_lm") is None, reason="mlx-lm is not installed")
def test_the_installed_mlx_lm_server_has_the_options_used():
    source = (Path(importlib.util.find_spec("mlx_lm").origin).parent / "server.py").read_text()
    for option in ENGINES["mlx-lm"].options:
        assert f'"{option}"' in source, option


# --- through advise, on the embedded pair -------------------------------------------------------
@pytest.fixture(scope="module")
def ranked():
    res = CliRunner().invoke(main, ["advise", "--backends", "gguf", "--run-tokens", "4", "--k-max", "2",
                                    "--prompt", PROMPT, "--json", "--export", "sglang"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@skip_unless_installed("gguf")
def test_advise_json_holds_the_export_of_its_first_choice(ranked):
    exp = ranked["export"]
    assert set(exp) >= {"engine", "command", "cannot", "checked", "group", "configuration"}
    assert exp["engine"] == "sglang" and problems("sglang", exp["command"]) == []
    assert exp["group"] == ranked["ranking"][0]["group"]
    assert exp == export_choice({k: v for k, v in ranked.items() if k != "export"}, "sglang")
    lines = export_lines(exp)
    assert lines[0].startswith("sglang: ") and lines[1].strip().startswith("python -m sglang.launch_server")
    assert len(lines) == 2 + bool(exp["cannot"])


@skip_unless_installed("gguf")
@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_ranked_configuration_exports_to_every_engine(ranked, engine):
    prof = build_profile({k: v for k, v in ranked.items() if k != "export"})
    kinds = set()
    for g in prof["groups"]:
        for c in g["configurations"]:
            exp = export_config(c, engine, ranked=g["configurations"])
            assert problems(engine, exp["command"]) == [], (c, exp)
            kinds.add(c["draft"]["kind"])
            if c["draft"]["kind"] == "hybrid":
                assert exp["cannot"]
    assert kinds == {"none", "lookup", "model", "hybrid"}
    assert export_choice(ranked, engine)["engine"] == engine


def test_a_bad_engine_is_one_line_before_anything_is_measured(monkeypatch):
    import specmac.advise.rank as rank

    monkeypatch.setattr(rank, "rank_configurations", lambda *a, **k: pytest.fail("measured"))
    res = CliRunner().invoke(main, ["advise", "--export", "nosuch"])
    assert res.exit_code == 2
    assert res.stderr.strip() == ("Error: --export 'nosuch' is not an engine specmac writes for: choose one "
                                  "of llama-server, vllm, sglang, mlx-lm")
    res = CliRunner().invoke(main, ["advise", "--draft", "gguf", "--export", "vllm"])
    assert res.exit_code == 2 and "--export applies only to the ranking" in res.stderr
