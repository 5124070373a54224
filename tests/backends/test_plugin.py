"""A backend from another package, installed the way pip installs one (a module and a dist-info
folder with an entry point in group ``specmac.backends``), is listed, probed and ranked by advise
with no change to specmac."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = '''
from specmac.backends import BaseBackend
from specmac.backends.synthetic import SyntheticBackend


class DemoBackend(SyntheticBackend):
    """The synthetic backend under another name: same weights, so one precision group with it."""

    name = "demo"


class NativeBackend(SyntheticBackend):
    """A plugin that says nothing about its precisions: the contract's default, one variant."""

    name = "native"
    variants = classmethod(BaseBackend.variants.__func__)
    source_name = classmethod(BaseBackend.source_name.__func__)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / "specmac_demo_plugin.py").write_text(PLUGIN)
    info = root / "specmac_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specmac-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specmac.backends]\ndemo = specmac_demo_plugin:DemoBackend\n"
                                           "native = specmac_demo_plugin:NativeBackend\n")
    return root


def specmac(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "specmac", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)


def test_an_installed_plugin_is_listed_with_its_distribution(site):
    res = specmac(site, "backends", "--json")
    assert res.returncode == 0, res.stderr
    assert {"demo", "native"} <= {b["name"] for b in json.loads(res.stdout)}
    assert "specmac-demo-plugin 0.1" in specmac(site, "--version").stdout


@pytest.mark.parametrize("name", ["demo", "native"])
def test_advise_ranks_an_installed_plugin(site, name):
    res = specmac(site, "advise", "--backends", name, "--json", "--k-max", "4", "--run-tokens", "16")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    targets = {e["target"] for e in r["ranking"]}
    drafts = {e["draft"] for e in r["ranking"]}
    assert targets == {name} and {name, "ngram", "none"} <= drafts
    precision = "float32" if name == "demo" else "native"
    assert {e["target_dtype"] for e in r["ranking"]} == {precision}
    assert [e["rank"] for e in r["ranking"]] == list(range(1, len(r["ranking"]) + 1))
