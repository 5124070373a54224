"""The package's layers, read from its own imports with ast (imports inside functions included).

Top to bottom, one sub-package each: CLI (and the server) -> measurement -> API -> tuning (what a
run measures of the machine before it starts) -> core (pure numpy) -> backends -> types (errors,
vocabularies, the embedded pair's files). A module imports only from its own layer or below, no
module imports in a circle, only backend modules import an ML framework, modules stay small, and
the core touches no file, no environment and no clock but the loop's step timer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "specmac"
FRAMEWORKS = {"torch", "mlx", "mlx_lm", "llama_cpp", "transformers", "gguf", "accelerate", "safetensors"}
MAX_LINES = 400

# Each sub-package is one layer; rank: higher = higher layer. A module's layer is its package's.
LAYERS = {
    "cli": ("cli", 5), "serve": ("cli", 5), "__main__": ("cli", 5),
    "probes": ("measurement", 4), "advise": ("measurement", 4), "compare": ("measurement", 4),
    "lossless": ("measurement", 4),
    "api": ("api", 3),
    "tuning": ("tuning", 2.5), "store": ("store", 2.5),
    "core": ("core", 2),
    "backends": ("backends", 1),
    "errors": ("types", 0), "vocab": ("types", 0), "files": ("types", 0), "assets": ("types", 0),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(mod: str) -> tuple[str, int]:
    top = mod.split(".")[1]
    assert top in LAYERS, f"{mod}: specmac.{top} is no layer: put the module in a layer's package"
    return LAYERS[top]


def imports(mod: str) -> tuple[set[str], set[str]]:
    """(specmac modules imported, frameworks imported) anywhere in the module."""
    path = MODULES[mod]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
              "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))  # an import by string is an import
    ours, frameworks = set(), set()
    for name in found:
        if name.split(".")[0] in FRAMEWORKS:
            frameworks.add(name.split(".")[0])
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name not in (mod, "specmac"):  # the package face (__version__) is exempt
            ours.add(name)
    return ours, frameworks


GRAPH = {m: imports(m) for m in MODULES if m != "specmac"}


def upward(mod: str, graph: dict) -> list[str]:
    rank = layer(mod)[1]
    return [f"{dep} ({layer(dep)[0]})" for dep in sorted(graph[mod][0]) if layer(dep)[1] > rank]


def circle(graph: dict) -> list[str] | None:
    """One import circle of ``graph`` (module -> (imports, frameworks)), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for dep in sorted(graph[m][0]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, path + [dep])):
                return found
        state[m] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_every_module_has_a_layer():
    for mod in GRAPH:
        layer(mod)


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_imports_point_down(mod):
    bad = upward(mod, GRAPH)
    assert not bad, f"{mod} ({layer(mod)[0]}) imports from a higher layer: {', '.join(bad)}"


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_only_backends_import_frameworks(mod):
    frameworks = GRAPH[mod][1]
    if layer(mod)[0] != "backends":
        assert not frameworks, f"{mod} imports {sorted(frameworks)}: only backend modules may"


def test_no_import_circle():
    found = circle(GRAPH)
    assert found is None, "import circle: " + " -> ".join(found or [])


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_modules_stay_small(mod):
    n = len(MODULES[mod].read_text("utf-8").splitlines())
    assert n <= MAX_LINES, f"{mod} has {n} lines: split it by job (at most ~400)"


def test_the_checks_have_power():
    """A planted upward import and a planted circle are caught, so the checks above can fail."""
    planted = {**GRAPH, "specmac.core.loop": ({"specmac.api"}, set()),
               "specmac.api": ({"specmac.core.loop"}, set())}
    assert upward("specmac.core.loop", planted) == ["specmac.api (api)"]
    assert circle(planted) is not None
    assert circle({"a": ({"b"}, set()), "b": ({"c"}, set()), "c": ({"a"}, set())}) == ["a", "b", "c", "a"]


def test_an_import_by_string_is_seen(tmp_path):
    """importlib.import_module("specmac.x") counts as an import, so a circle made by strings is seen."""
    src = 'import importlib\nimportlib.import_module("specmac.api")\n'
    found = {str(n.args[0].value) for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "import_module"}
    assert found == {"specmac.api"}


def test_the_top_folder_stays_small():
    top = [p.name for p in PKG.glob("*.py")]
    assert len(top) <= 8, f"specmac/ holds {len(top)} modules ({', '.join(sorted(top))}): put them in layers"


# what only the layers above the core may do: files, the environment, /proc, the clock
IMPURE = {"open(": "opens a file", "os.environ": "reads the environment", "/proc": "reads /proc",
          "Path(": "builds a file path", "getenv": "reads the environment", "perf_counter": "reads a clock",
          "time.time": "reads a clock", "monotonic": "reads a clock"}


def impure(text: str) -> list[str]:
    return [why for needle, why in IMPURE.items() if needle in text]


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m.startswith("specmac.core")))
def test_the_core_touches_no_file_environment_or_clock(mod):
    """The core is the algorithm: pure numpy. Its one clock is the loop's step timer, a parameter
    (``speculative_steps(clock=time.perf_counter)``), so a replay can run it on recorded costs."""
    text = MODULES[mod].read_text("utf-8")
    if mod == "specmac.core.loop":
        text = text.replace("clock: Callable[[], float] = time.perf_counter", "")
    assert not impure(text), f"{mod} {', '.join(impure(text))}: that belongs to the tuning layer or above"


def test_the_purity_check_has_power():
    assert impure('import os\nx = os.environ["HOME"]') == ["reads the environment"]
    assert impure("t = time.perf_counter()") == ["reads a clock"]
    assert impure('Path("/proc/loadavg").read_text()') == ["reads /proc", "builds a file path"]
