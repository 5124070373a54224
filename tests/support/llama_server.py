"""llama-cpp-python's own OpenAI server (``llama_cpp.server``) on a GGUF file, for tests.

``running(model)`` starts it in a process of its own on a free 127.0.0.1 port and yields its /v1
URL; the process is ended when the block ends. Run as ``python -m tests.support.llama_server MODEL
PORT``, it serves with llama.cpp's extra CPU buffer types as specmac's gguf backend chooses them
(off where ggml was built with AMX: llama.cpp issue 20824, a crash at the first decode otherwise).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import httpx

from tests.support.helpers import REPO, cli_env


def serve(model: str, port: int) -> None:
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from specmac.backends.gguf_files import peer_defaults

    with peer_defaults():
        app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=port),
                         model_settings=[ModelSettings(model=model, model_alias="llama", n_ctx=512,
                                                       n_threads=1, verbose=False)])
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(model: str, timeout: float = 120):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.llama_server", model, str(port)], cwd=REPO,
                            env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server ended before it served: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama_cpp.server did not start")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
