"""Serve a loaded pair with uvicorn: bind, build the app, run until SIGTERM/Ctrl-C, drain.

On SIGTERM (or Ctrl-C) uvicorn stops listening, so new connections are refused, lets the requests
in flight finish, then the app's lifespan ends the worker. ``serve`` returns 0 after a SIGTERM;
uvicorn re-raises the signal it caught once it is done, which a handler installed here absorbs.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from pathlib import Path

import uvicorn

from specmac.api import Pair
from specmac.core.planner import Planner
from specmac.serve.app import MAX_BODY, create_app
from specmac.serve.metrics import Metrics
from specmac.serve.worker import Worker

log = logging.getLogger("specmac.serve")


def model_name(pair: Pair) -> str:
    """The id /v1/models reports: the target file's or folder's name, or the embedded model's id."""
    mid = pair.target.model_id or pair.target.name
    if mid.startswith("embedded:"):
        return f"specmac-{mid.removeprefix('embedded:')}"
    name = Path(mid).name
    return name.removesuffix(".gguf") or mid


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def make_server(pair: Pair, sock: socket.socket, *, k: int | str = "auto", queue_size: int = 16,
                api_key: str | None = None, model_id: str | None = None, max_body: int = MAX_BODY,
                config: dict | None = None, log_level: str = "info",
                own_logging: bool = True, planner: Planner | None = None,
                parallel: int = 1) -> uvicorn.Server:
    """A uvicorn server for the pair on ``sock``; ``server.run(sockets=[sock])`` serves.
    ``own_logging`` False leaves logging to the caller (everything propagates to the root logger).
    ``parallel``: the most requests generated at once, sharing each pass (where the target can)."""
    worker = Worker(pair, k=k, queue_size=queue_size, metrics=Metrics(), planner=planner, parallel=parallel)
    app = create_app(worker, model_id=model_id or model_name(pair), api_key=api_key, max_body=max_body,
                     config=config)
    cfg = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_keep_alive=5,
                         access_log=log_level == "debug",
                         **({} if own_logging else {"log_config": None}))
    return uvicorn.Server(cfg)


def serve(pair: Pair, sock: socket.socket, **kw) -> int:
    """Serve until SIGTERM or Ctrl-C; 0 after a SIGTERM (in-flight requests finished)."""
    server = make_server(pair, sock, **kw)
    got: list[int] = []
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the SIGTERM it caught once it has drained: it lands here, not in click's handler
        signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    server.run(sockets=[sock])
    return 0
