"""Result records with provenance, atomic JSON writes and small plots.

Every record says where it came from: the command line, the git commit, the time, the versions of
python and of every backend library, the machine, and the SHA-256 of each model file it used (hub
ids are recorded as ids). matplotlib is imported inside the plot functions (Agg backend), so
importing this module needs the standard library alone.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from specmac.errors import BadOption
from specmac.files import write_json  # noqa: F401  (re-exported: the writer of every record)

REPO = Path(__file__).resolve().parents[2]


def git_sha(cwd: Path = REPO) -> str | None:
    """The commit of the checkout (with "+dirty" when tracked files changed), or None."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


_AT_START: list[str | None] = []  # the commit when this process first asked (``code_measured``)


def code_measured() -> str | None:
    """The commit of the code this process runs: the checkout as it was at the first call (every
    measuring command calls it before it measures, through ``provenance`` or directly), so a tree
    edited during a run is not recorded as what was measured."""
    if not _AT_START:
        _AT_START.append(git_sha())
    return _AT_START[0]


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_fingerprints(models: Iterable[str | Path | None]) -> list[dict]:
    """sha256 of each model file; a folder hashes its weight/config/tokenizer files; else an id.
    A converted model from specmac's cache also names its source and the source's sha256."""
    out = []
    for m in models:
        if m is None:
            continue
        p = Path(m).expanduser()
        if p.is_file():
            out.append({"model": str(m), "sha256": sha256_file(p), "bytes": p.stat().st_size})
        elif p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in
                           (".safetensors", ".json", ".gguf", ".model", ".bin", ".npz"))
            out.append({"model": str(m), "files": {f.name: sha256_file(f) for f in files}})
        else:
            out.append({"model": str(m), "hub_id": str(m)})
        source = converted_from(p)
        if source:
            out[-1]["converted_from"] = source
    return out


def converted_from(path: Path) -> dict | None:
    """The source of a model in specmac's conversion cache (its sidecar), or None."""
    from specmac.backends.conversion import cache

    entry = (path if path.is_dir() else path.parent).resolve()
    meta = cache.read_sidecar(entry) if entry.parent == cache.cache_root().resolve() else None
    if not meta:
        return None
    return {k: meta.get(k) for k in ("source", "source_sha256", "variant", "converter", "created_utc")}


def model_files(backend: Any, model: str | None, role: str = "target") -> list[str]:
    """What to fingerprint for a loaded backend: the file or folder it loaded (a converted one from
    the cache, the embedded pair's GGUF of its quant, the user's model), or the user's model (hub
    ids as ids); with no model, what the backend says its default model is (``default_files``)."""
    path = getattr(backend, "resolved", {}).get("path")
    if path and Path(path).exists():
        return [str(path)]
    if model:
        return [model]
    return type(backend).default_files(role)


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# the CPU's vector and matrix extensions that change which kernels run, and so what a pass costs and
# how it grows with its width: a model name alone (as a virtual machine reports it) says neither
CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


def machine() -> dict:
    model, features = _cpu_info()
    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor() or model, "cpu_features": features,
            "cpu_count": os.cpu_count(), "memory_bytes": memory_bytes()}


def _cpu_info(text: str | None = None) -> tuple[str, list[str] | None]:
    """(model name, the CPU_FEATURES it has) from /proc/cpuinfo's first processor; on macOS the
    brand sysctl names the chip and no feature list is known (None)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return _brand_string(), None
    model, flags = "", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and flags is None:  # x86, ARM
            flags = set(value.split())
    return model, None if flags is None else [f for f in CPU_FEATURES if f in flags]


def _brand_string() -> str:
    """The CPU's name where there is no /proc/cpuinfo (macOS: the chip's brand string), else ""."""
    if platform.system() != "Darwin":
        return ""
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


MACHINE_ENV = "SPECMAC_MACHINE"
_NOT_FAMILY = {"amd", "intel", "r", "tm", "cpu", "processor", "gen"}


def machine_label(info: dict | None = None) -> str:
    """A short name of the machine for the folder of its records ($SPECMAC_MACHINE when set): the
    CPU's family (the first word of its model name that is not a vendor or a number; an Apple chip's
    first two words) and the widest of amx, avx512 and avx2 it has, since a pass's cost and how it
    grows with its width follow the kernels those select rather than the model number. ``info``:
    {"cpu_model", "cpu_features", "machine"} (default: this machine's; the CPU's model name, since
    platform.processor() is "x86_64" or "arm" on many)."""
    if os.environ.get(MACHINE_ENV):  # letters, digits and "_" only: never ".." or a path
        return "-".join(re.findall(r"[a-z0-9_]+", os.environ[MACHINE_ENV].lower())) or "machine"
    if info is None:
        model, features = _cpu_info()
        info = {"cpu_model": model, "cpu_features": features, "machine": platform.machine()}
    words = re.findall(r"[a-z0-9]+", str(info.get("cpu_model") or "").lower())
    if words[:1] == ["apple"]:
        return "-".join(words[:2])
    family = next((w for w in words if w not in _NOT_FAMILY and not w[0].isdigit()), "")
    features = info.get("cpu_features") or []
    widest = next((name for name, flag in (("amx", "amx_bf16"), ("avx512", "avx512f"), ("avx2", "avx2"))
                   if flag in features), "")
    return "-".join(p for p in (family, widest) if p) or str(info.get("machine") or "machine").lower()


def provenance(command: str | None = None, models: Sequence[str | Path | None] = ()) -> dict:
    """Where a result came from: command, git sha, UTC time, versions, machine, model SHA-256."""
    from specmac import __version__
    from specmac.backends import libraries, library_version

    start, now = code_measured(), git_sha()
    return {
        "command": command if command is not None else " ".join(sys.argv),
        "git_sha": start,
        **({"git_sha_at_end": now} if now != start else {}),  # the tree changed during the run
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "specmac": __version__,
        "python": platform.python_version(),
        "libraries": {lib: library_version(lib) for lib in libraries()},
        "machine": machine(),
        "models": model_fingerprints(models),
    }


IMAGE_TYPES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".eps", ".ps")


def check_output(path: str | Path, param: str, *, folder: bool = False, image: bool = False) -> None:
    """Fail in a second, before anything is measured, where ``path`` could not be written at the end:
    an unknown image type, a file where a folder is needed (or the reverse), a path under a file, a
    folder without write permission. Creates nothing."""
    p = Path(path)
    if image and p.suffix.lower() not in IMAGE_TYPES:
        raise BadOption(f"{param} {path}: {p.suffix or 'no extension'} is not an image type: end the "
                        f"name with {', '.join(IMAGE_TYPES[:3])}", param=param)
    if p.exists() and p.is_dir() != folder:
        what = "a file, not a folder" if folder else "a folder, not a file"
        raise BadOption(f"{param} {path} is {what}: give another path", param=param)
    where = p if folder and p.exists() else p.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise BadOption(f"{param} {path}: {where} is a file, not a folder: give another path", param=param)
    if not os.access(where, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise BadOption(f"{param} {path}: cannot write in {where} (permission denied): give a writable "
                        "path", param=param)


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no window), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_parallelism(records: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """T(n) batched vs serial vs ideal, one panel per probe record."""
    plt = pyplot()
    cols = min(len(records), 3)
    rows = (len(records) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    for ax, r in zip(axes.flat, records):
        n = r["n"]
        for key, marker, label in (("batched", "o", "batched score(n)"), ("serial", "s", "n x score(1)")):
            ax.errorbar(n, r[f"{key}_ms"], yerr=_quartile_bars(r[f"{key}_ms"], r.get(f"{key}_quartiles_ms")),
                        marker=marker, ms=3, capsize=2, label=label)
        ax.plot(n, r["ideal_ms"], "k--", lw=1, label="ideal (free width)")
        fit = [r["t1_ms"] * (1 + r["beta"] * (x - 1)) for x in n]
        ax.plot(n, fit, ":", color="C3", lw=1.2, label=f"fit \u03b2 = {r['beta']:.2f}")
        ax.set_title(r.get("label") or f"{r['backend']}: {r['verdict']}", fontsize=9)
        ax.set_xlabel("tokens per pass n")
        ax.set_ylabel("time (ms, log scale; bars: quartiles)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(records):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def _quartile_bars(med: Sequence[float], quartiles: Sequence[Sequence[float]] | None):
    """Asymmetric error bars from [q1, q3] per point (none when the record has no quartiles)."""
    if not quartiles:
        return None
    return [[max(m - q[0], 0.0) for m, q in zip(med, quartiles)],
            [max(q[1] - m, 0.0) for m, q in zip(med, quartiles)]]


def plot_speedup(series: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """Predicted S(K) per series ({"label", "table"} with advise's table); measured points, if
    a series has "measured": [{"k", "speedup"}], are drawn as markers in the same colour."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4 + 2.6 * (len(series) > 2), 4.2))
    for i, s in enumerate(series):
        ks = [row["k"] for row in s["table"]]
        ax.plot(ks, [row["predicted_speedup"] for row in s["table"]], color=f"C{i}",
                label=f"{s['label']} (predicted)")
        meas = s.get("measured") or []
        if meas:
            ax.plot([m["k"] for m in meas], [m["speedup"] for m in meas], "o", color=f"C{i}",
                    label=f"{s['label']} (measured)")
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="break-even")
    ax.set_xlabel("draft tokens per step K")
    ax.set_ylabel("speedup over plain")
    ax.grid(alpha=0.3)
    if len(series) > 2:  # many series: the legend goes beside the axes, not over the points
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)
