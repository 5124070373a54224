"""A live `specmac serve` app for tests: real uvicorn on 127.0.0.1, a free port, a background thread."""

from __future__ import annotations

import contextlib
import threading
import time

from specmac.serve.server import bind, make_server


@contextlib.contextmanager
def running(pair, **kw):
    """Serve ``pair`` (make_server's options) until the block ends; yields the base URL (…/v1)."""
    sock = bind("127.0.0.1", 0)
    server = make_server(pair, sock, log_level="warning", own_logging=False, **kw)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
