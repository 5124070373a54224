"""probe-parallelism, the serial control, advise and the result records, on every installed backend."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specmac.backends import load_backend, missing_requirements
from specmac.backends.synthetic import SyntheticBackend
from specmac.cli import main
from specmac.compare.results import plot_parallelism, plot_speedup, provenance, sha256_file, write_json
from specmac.errors import BadOption, ModelNotFound
from specmac.probes import SerialBackend, probe_parallelism, verdict
from specmac.tuning.timing import time_single

ALL = ("synthetic", "mlx", "gguf", "torch")
PROBE_KEYS = {"backend", "model", "n", "batched_ms", "serial_ms", "beta", "verdict",
              "max_abs_logit_diff", "argmax_flips"}
ADVISE_KEYS = {"best_k", "predicted_speedup", "alpha", "c", "table"}
# a few small trials: these tests check behaviour and keys, the benches measure
QUICK = ["--n-max", "6", "--context", "16", "--repeats", "2"]


def embedded(name: str, role: str = "target", **opts):
    """The embedded model on backend ``name``; skip (saying why) when it cannot be loaded here."""
    missing = missing_requirements(name)
    if missing:
        pytest.skip(f"{name} backend not installed (missing {', '.join(missing)})")
    try:
        return load_backend(name, None, opts, role=role)
    except ModelNotFound as e:
        pytest.skip(f"embedded {role} model not available for {name}: {e}")


def test_verdict_thresholds():
    assert [verdict(b) for b in (0.0, 0.249, 0.25, 0.74, 0.75, 1.2)] == [
        "parallel", "parallel", "partly serial", "partly serial", "serial", "serial"]


class VirtualClock(SyntheticBackend):
    """Advances a virtual clock by the simulated cost instead of sleeping: exact timings."""

    now = 0.0

    def _simulate_cost(self, n):
        o = self.resolved
        VirtualClock.now += o["latency_ms"] * (1 + o["beta"] * (n - 1)) / 1e3


@pytest.mark.parametrize("beta,expected", [(0.0, "parallel"), (0.1, "parallel"), (0.3, "partly serial"),
                                           (0.7, "partly serial"), (0.8, "serial"), (1.0, "serial")])
def test_probe_fit_recovers_beta_exactly(beta, expected, monkeypatch):
    monkeypatch.setattr("specmac.tuning.timing.time.perf_counter", lambda: VirtualClock.now)
    r = probe_parallelism(VirtualClock(latency_ms=4.0, beta=beta), n_max=12, context=8, repeats=2)
    assert r["beta"] == pytest.approx(beta, abs=1e-9)
    assert r["t1_ms"] == pytest.approx(4.0, rel=1e-9)
    assert r["serial_ms"] == pytest.approx([4.0 * n for n in r["n"]], rel=1e-9)
    assert r["beta_serial"] == pytest.approx(1.0, abs=1e-9)
    assert r["verdict"] == expected


@pytest.mark.parametrize("beta,expected", [(0.0, "parallel"), (0.5, "partly serial")])
def test_probe_recovers_simulated_beta_on_the_real_clock(beta, expected):
    # real sleeps: a busy machine wakes late by a few ms per call, which adds to T1 and pulls the
    # fitted beta down by T1 / (T1 + delay); the exact fit is checked on the virtual clock above
    r = probe_parallelism(SyntheticBackend(latency_ms=20.0, beta=beta), n_max=6, context=8, repeats=2)
    assert r["n"] == list(range(1, 7))
    assert r["beta"] == pytest.approx(beta, abs=0.2)
    assert r["verdict"] == expected
    assert r["max_abs_logit_diff"] == 0.0 and r["argmax_flips"] == 0


def test_serial_backend_gives_the_same_logits():
    inner = SyntheticBackend()
    ser = SerialBackend(SyntheticBackend())
    ids = inner.encode("def f(x): return x")
    np.testing.assert_array_equal(ser.score(ids), inner.score(ids))
    assert ser.n_past == len(ids)
    ser.rewind(3)
    assert ser.n_past == 3 and ser.info()["serial_control"] is True


@pytest.mark.parametrize("name", ALL)
def test_serial_control_is_flagged_serial(name):
    opts = {"latency_ms": 1.0} if name == "synthetic" else {}
    b = SyntheticBackend(**opts) if name == "synthetic" else embedded(name)
    betas = []
    for _ in range(3):  # a preempted timing on a shared machine can mislead one attempt, not three
        r = probe_parallelism(SerialBackend(b), n_max=8, context=16, repeats=5)
        assert r["serial_control"] is True
        betas.append(r["beta"])
        if r["verdict"] == "serial":
            break
    assert r["verdict"] == "serial", f"betas {betas}: the probe cannot see a serial backend"


class Perturbed(SyntheticBackend):
    """Batched passes (n > 1) come back with the argmax of every row pushed to another token."""

    def score(self, tokens):
        out = super().score(tokens)
        if len(tokens) > 1:
            rows = np.arange(len(out))
            out[rows, (out.argmax(-1) + 1) % out.shape[1]] += 100.0
        return out


def test_probe_sees_numerical_differences():
    r = probe_parallelism(Perturbed(), n_max=4, context=8, repeats=1, warmup=0)
    assert r["argmax_flips"] == 2 + 3 + 4  # every row of every batched pass with n > 1
    assert r["max_abs_logit_diff"] >= 100.0 - 1e-3
    assert r["rows_compared"] == 1 + 2 + 3 + 4


def test_probe_rejects_a_context_that_does_not_fit():
    with pytest.raises(BadOption, match="context window"):
        probe_parallelism(SyntheticBackend(n_ctx=32), n_max=16, context=20)


def test_time_single_reports_median_and_spread():
    r = time_single(SyntheticBackend(latency_ms=1.0), context=4, repeats=5)
    assert r["n"] == 5 and r["median_ms"] == pytest.approx(1.0, rel=0.5) and r["iqr_ms"] >= 0


# --- the CLI, on every installed backend ---------------------------------------------------

def invoke(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    return json.loads(res.stdout)  # stderr carries the libraries' progress bars


@pytest.mark.parametrize("name", ALL)
def test_probe_cli_json(name, tmp_path):
    if name != "synthetic":
        embedded(name)
    out = tmp_path / "probe.json"
    r = invoke(["probe-parallelism", "--backend", name, "--json", "--out", str(out), *QUICK])
    assert PROBE_KEYS <= set(r)
    assert r["backend"] == name and len(r["batched_ms"]) == len(r["serial_ms"]) == 6
    assert r["verdict"] in ("parallel", "partly serial", "serial")
    assert json.loads(out.read_text())["provenance"]["git_sha"] == r["provenance"]["git_sha"]


@pytest.mark.parametrize("name", ALL)
def test_advise_cli_json(name):
    if name != "synthetic":
        embedded(name, "draft")
        embedded(name, "target")
    r = invoke(["advise", "--draft", name, "--target", name, "--json", "--run-tokens", "24",
                "--context", "16", "--repeats", "1"])
    assert ADVISE_KEYS <= set(r)
    assert [row["k"] for row in r["table"]] == list(range(1, 17))
    assert all({"k", "tokens_per_pass", "predicted_speedup"} <= set(row) for row in r["table"])
    assert 1 <= r["best_k"] <= 16 and 0.0 <= r["alpha"] <= 1.0 and r["c"] > 0
    top = max(row["predicted_speedup"] for row in r["table"])  # best K: the smallest within 2% of the top
    assert r["best_k"] == next(row["k"] for row in r["table"] if row["predicted_speedup"] >= 0.98 * top)
    assert (r["predicted_speedup"] > 1.0) == (not r["reasons"])
    # the default set: the packaged workload (plain text: the embedded pair has no chat template)
    assert r["prompts"] == {"source": "specmac:workload", "turns": "first", "chat": "auto"}
    from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts

    workload = read_prompts(PACKAGED_WORKLOAD)
    assert r["acceptance_run"]["prompts"] + len(r["reference"]["unanswered"]) == len(workload)
    assert r["reference"]["chat"] is False and len(r["by_category"]) == len({p["category"] for p in workload})


def test_advise_pools_acceptance_over_its_prompts():
    """--prompt repeated: acceptance is counted over every prompt's reference text, not the first one's."""
    args = ["advise", "--draft", "synthetic", "--target", "synthetic", "--json", "--run-tokens", "20",
            "--context", "8", "--repeats", "1"]
    one = [invoke([*args, "--prompt", text]) for text in ("def f(x):", "Once upon a time")]
    both = invoke([*args, "--prompt", "def f(x):", "--prompt", "Once upon a time"])
    runs = [r["acceptance_run"] for r in one]
    assert both["acceptance_run"]["prompts"] == 2
    for key in ("n_tokens", "n_drafted", "n_accepted"):
        assert both["acceptance_run"][key] == pytest.approx(sum(r[key] for r in runs))


def test_advise_with_two_models_per_role_needs_the_ranking():
    res = CliRunner().invoke(main, ["advise", "--draft", "synthetic", "--target", "synthetic",
                                    "--target-model", "a", "--target-model", "b"])
    assert res.exit_code == 2 and "drop --draft to rank several" in res.output


def test_advise_says_why_when_verification_is_serial():
    # a draft pass of half a target pass: a free batched pass would pay at this acceptance (so the
    # draft is not to blame), and even a perfect one cannot pay for a serial pass unless each call
    # wastes more than a draft pass beyond its sleep (a 2 ms target with a 0.2 ms draft paid at
    # alpha ~ 1 on a machine whose sleeps overshoot by more than 0.2 ms, and advise blamed alpha)
    r = invoke(["advise", "--draft", "synthetic", "--target", "synthetic", "--json",
                "--target-opt", "latency_ms=4", "--target-opt", "beta=1.0",
                "--draft-opt", "latency_ms=2", "--run-tokens", "24", "--context", "8", "--repeats", "3",
                "--prompt", "def f(x):"])
    assert r["predicted_speedup"] < 1.0
    assert r["reasons"][0].startswith("verification serial: \u03b2 = ")


def test_why_blames_the_costs_where_only_a_copy_pays():
    """Where only an acceptance of ~1 pays, the reason is the costs, not "acceptance too low"."""
    from specmac.advise.predict import ALPHA_COPY, Chains, Pricing, alpha_needed, why_list

    step = [2.25e-3 + 2.0e-3 * n for n in range(17)]  # serial, but with 0.25 ms a call to save
    costs = Pricing(step, 0.22e-3)  # a draft pass just cheaper than what a wider pass saves
    assert ALPHA_COPY < alpha_needed(costs, 16) < 1.0
    chains = Chains.of([[[0.78] * 16 for _ in range(48)]], 16, True)  # one text, alpha 0.78
    reasons = why_list(costs, chains, 0.95, 16, 1)
    assert reasons[0].startswith("verification serial")


class PluginBackend(SyntheticBackend):
    """A backend another package would ship, found through the entry-point group."""

    name = "plugin"


def test_probe_works_on_an_entry_point_plugin(monkeypatch):
    ep = importlib.metadata.EntryPoint(name="plugin", value="test_probes:PluginBackend",
                                       group="specmac.backends")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [ep] if kw.get("group") == "specmac.backends" else real(**kw))
    r = invoke(["probe-parallelism", "--backend", "plugin", "--json", "--serial", *QUICK])
    assert r["backend"] == "plugin" and r["serial_control"] is True


# --- results: provenance, atomic JSON, plots ----------------------------------------------

def test_provenance_and_atomic_write(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    p = provenance("specmac probe", [str(model), "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"])
    assert p["command"] == "specmac probe" and p["utc"].endswith("+00:00")
    assert {"numpy", "mlx", "mlx-lm", "llama-cpp-python", "torch", "transformers"} <= set(p["libraries"])
    assert p["machine"]["cpu_count"] >= 1
    assert p["models"][0]["sha256"] == sha256_file(model) and len(p["models"][0]["sha256"]) == 64
    assert p["models"][1] == {"model": "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
                              "hub_id": "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"}
    path = tmp_path / "r.json"
    write_json(path, {"a": 1})
    bad: dict = {}
    bad["self"] = bad  # json.dump fails half way: the old file must survive, no temp file left
    with pytest.raises(ValueError):
        write_json(path, bad)
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["m.gguf", "r.json"]


X86 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16
processor\t: 1
model name\t: Other
flags\t\t: fpu
"""


def test_the_machine_record_names_the_cpu_features_that_change_kernels(monkeypatch):
    """A model name ("Intel(R) Xeon(R) Processor") does not say whether the CPU has AMX, which changes a
    torch bf16 pass's cost: the record says which of CPU_FEATURES the CPU has (the first processor's
    flags, in CPU_FEATURES' order); None where nothing is known, [] where none of them is there."""
    from specmac.compare import report, results

    amx = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8"]
    assert results._cpu_info(X86) == ("Intel(R) Xeon(R) Processor", amx)
    assert results._cpu_info("processor\t: 0\nFeatures\t: fp asimd\n") == ("", [])  # ARM: none of them
    assert results._cpu_info("processor\t: 0\n") == ("", None)  # no flags line: not known, not "none"
    real = results.machine()
    assert real["cpu_features"] is None or set(real["cpu_features"]) <= set(results.CPU_FEATURES)
    if Path("/proc/cpuinfo").is_file():  # Linux: the list is read, whatever this CPU has
        assert isinstance(real["cpu_features"], list)
    parse = results._cpu_info
    monkeypatch.setattr(results, "_cpu_info", lambda text=None: parse(X86))
    record = {"predictions": {}, "backends": {}}
    st = {"sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, "prompts": ["p"],
          "repeats": 1, "max_tokens": 8, "seed": 0, "warmup_tokens": 4}
    line = next(x for x in report._method(record, st, {}, results.machine()) if x.startswith("- Machine:"))
    assert line.startswith("- Machine: Intel(R) Xeon(R) Processor (avx2, avx512f, avx512_bf16, avx512_fp16, "
                           "amx_bf16, amx_int8), ")
    line = next(x for x in report._method(record, st, {}, {"processor": "A", "cpu_features": []})
                if x.startswith("- Machine:"))
    assert line.startswith("- Machine: A (none of avx2, ")
    line = next(x for x in report._method(record, st, {}, {"processor": "A"}) if x.startswith("- Machine:"))
    assert line.startswith("- Machine: A, ")  # an older record, or no /proc/cpuinfo: nothing said


def test_plots_write_pngs(tmp_path):
    r = probe_parallelism(SyntheticBackend(), n_max=4, context=4, repeats=1)
    a = plot_parallelism([r, r], tmp_path / "p.png")
    table = [{"k": k, "predicted_speedup": 1 + 1 / k} for k in range(1, 5)]
    b = plot_speedup([{"label": "x", "table": table, "measured": [{"k": 2, "speedup": 1.4}]}],
                     tmp_path / "s.png")
    for f in (a, b):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
