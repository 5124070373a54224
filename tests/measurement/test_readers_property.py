"""Property-based tests of the readers of user files (issue 14): whatever bytes or structure a
compare TOML, a prompts file or a results.json holds, the reader returns a well-formed value or
raises BadOption; it never raises anything else."""

from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specmac.errors import BadOption  # noqa: E402

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                    st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                    max_leaves=12)
TOML_VALUES = st.recursive(st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=8),
                                     st.floats(allow_nan=False)),
                           lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                  st.dictionaries(st.sampled_from(
                                                      ["options", "n_ctx", "noise", "target_model", "x"]),
                                                      kids, max_size=3)), max_leaves=8)


def _toml(value) -> str:
    """A minimal TOML writer for the generated tables (inline tables and arrays)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if not isinstance(value, float) or value == value else "nan"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"


@FAST
@given(st.dictionaries(st.sampled_from(["synthetic", "gguf", "x y"]),
                       st.dictionaries(st.sampled_from(["options", "draft_options", "target_model",
                                                        "draft_model", "colour"]), TOML_VALUES, max_size=3),
                       max_size=2))
def test_compare_config_reader(tmp_path, config):
    from specmac.compare import measure as cmp

    text = "".join(f"[{json.dumps(name)}]\n"
                   + "".join(f"{json.dumps(k)} = {_toml(v)}\n" for k, v in t.items())
                   for name, t in config.items())
    path = tmp_path / "c.toml"
    path.write_text(text)
    try:
        out = cmp.backend_settings(cmp.read_config(str(path)))
    except BadOption:
        return
    for table in out.values():
        for key, value in table.items():
            assert isinstance(value, dict if key.endswith("options") else str)


@FAST
@given(st.binary(max_size=200))
def test_config_reader_on_any_bytes(tmp_path, data):
    from specmac.compare import measure as cmp

    path = tmp_path / "c.toml"
    path.write_bytes(data)
    try:
        cmp.backend_settings(cmp.read_config(str(path)))
    except BadOption:
        pass


@FAST
@given(st.one_of(JSON.map(json.dumps).map(str.encode), st.binary(max_size=200)), st.booleans())
def test_prompts_reader(tmp_path, data, as_json):
    from specmac.compare.prompts import read_prompts

    path = tmp_path / ("p.json" if as_json else "p.txt")
    path.write_bytes(data)
    try:
        prompts = read_prompts(str(path))
    except BadOption:
        return
    ids = [p["id"] for p in prompts]
    assert prompts and len(set(ids)) == len(ids)
    assert all(isinstance(p["text"], str) and p["text"].strip() for p in prompts)


@pytest.fixture(scope="module")
def good_record() -> dict:
    from specmac.compare import measure as cmp
    from specmac.compare.prompts import read_prompts
    from specmac.core.sampling import SamplingParams

    settings_ = cmp.Settings(pairs=cmp.parse_pairs(["synthetic:synthetic"]), ks=[1, 2],
                             prompts=read_prompts(None, 2), params=SamplingParams(0.0), max_tokens=6,
                             repeats=1, seed=0, warmup_tokens=2, backends={})
    return json.loads(json.dumps(cmp.run_compare(settings_), default=str))


def _paths(obj, prefix=()):
    """Every (path, value) in a JSON tree, for damaging one field at a time."""
    yield prefix, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_results_reader(tmp_path_factory, good_record, data):
    """One field of a real record removed or replaced: report refuses it with BadOption (and has
    written nothing), or renders every output."""
    from specmac.compare import report

    record = json.loads(json.dumps(good_record))
    paths = [p for p, _ in _paths(record) if p and p[0] not in ("provenance", "runs")]
    path = data.draw(st.sampled_from(paths))
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(SCALARS)
    d = tmp_path_factory.mktemp("rec")
    (d / "results.json").write_text(json.dumps(record))
    out = d / "out"
    try:
        loaded = report.load_record(d)
    except BadOption:
        assert not out.exists()
        return
    written = report.render(loaded, out)
    assert {p.name for p in written} == {"summary.md", *report.PLOTS}
