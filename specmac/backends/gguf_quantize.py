"""A GGUF requantised in a child process: ``python -m specmac.backends.gguf_quantize SRC DST QUANT N``.

llama_model_quantize cannot be stopped once started (it takes no abort callback) and runs for
long on a large model; in a child, Ctrl-C or SIGTERM ends it at once: the parent kills the child
and removes its half-written output (``requantize`` in specmac.backends.gguf). The child prints
llama.cpp's first error on stderr and exits 1 when the quantisation fails.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

from specmac.errors import ModelNotFound

LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR


def run_child(src: Path, dst: Path, quant: str, ftype: int, nthread: int) -> None:
    """Requantise src to dst as ``ftype`` (a llama_ftype; ``quant`` names it) in a child process; a
    failure is a ModelNotFound with llama.cpp's reason; an interrupt kills the child and propagates."""
    proc = subprocess.Popen([sys.executable, "-m", __name__, str(src), str(dst), str(ftype), str(nthread)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=child_env())
    try:
        _, err = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM: the child goes first, then its output (by the caller)
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        reason = (err.decode(errors="replace").strip().splitlines() or ["llama.cpp gave no reason"])[-1]
        raise ModelNotFound(f"llama.cpp cannot requantise {src} to {quant} ({reason})")


def child_env() -> dict[str, str]:
    """The parent's environment, with this copy of specmac first on the path."""
    import os

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def main(argv: list[str]) -> int:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent decides; the child just stops
    import llama_cpp

    errors: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level: int, text: bytes, _user_data) -> None:
        if level == LOG_ERROR and text.strip():
            errors.append(text.decode("utf-8", errors="replace").strip())

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    src, dst, ftype, nthread = argv
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.allow_requantize = int(ftype), int(nthread), True
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        print(errors[0] if errors else "llama.cpp gave no reason", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
