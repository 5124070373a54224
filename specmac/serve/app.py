"""The ASGI app (starlette): OpenAI's routes over the worker, errors in OpenAI's shape.

Every route answers JSON; every failure is {"error": {"message", "type", "param", "code"}} with a
4xx (the request) or 5xx (the server: a full queue is a 503 with Retry-After), and a bug's
traceback goes to the log, never to the client. Generation requests wait for the worker's first
item before answering, so a bad prompt (too long, ids outside the vocabulary) is a 400 even when
streaming was asked for; after that a stream is server-sent events ending in ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specmac.serve.schema import ApiError, GenRequest, parse
from specmac.serve.worker import Job, Worker

log = logging.getLogger("specmac.serve")
MAX_BODY = 8 << 20  # bytes of a request body; a prompt past any context window is far smaller
POLL_S = 0.25  # how often a waiting, non-streaming request checks that its client is still there


class ClientGone(Exception):
    pass


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(worker: Worker, *, model_id: str, api_key: str | None = None, max_body: int = MAX_BODY,
               config: dict | None = None) -> Starlette:
    """The app for one worker (which owns the pair). ``config``: what /v1/models says is served."""
    metrics, created = worker.metrics, int(time.time())

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "invalid API key: send the server's key as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    async def read_json(request: Request):
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > max_body:
            raise too_large(max_body)
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > max_body:
                raise too_large(max_body)
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON ({e}): send a JSON object",
                           code="invalid_json") from None

    def endpoint(name: str, fn: Callable[[Request], Awaitable[Response]]):
        async def handle(request: Request) -> Response:
            try:
                if name not in ("health",):
                    check_auth(request)
                response = await fn(request)
            except ApiError as e:
                response = error_response(e)
            metrics.requests.labels(name, str(response.status_code)).inc()
            return response
        return handle

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "queue_depth": worker.queue.qsize()})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        if request.path_params["model"] != model_id:
            raise ApiError(404, f"model: the model {request.path_params['model']!r} does not exist; this "
                                f"server serves {model_id!r}", param="model", code="model_not_found")
        return JSONResponse(model_card())

    def model_card() -> dict:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "specmac",
                "specmac": config or {}}

    async def prometheus(request: Request) -> Response:
        data, kind = metrics.exposition()
        return Response(data, media_type=kind)

    async def generate(request: Request, chat: bool) -> Response:
        name = "chat" if chat else "completions"
        req = parse(await read_json(request), chat=chat, model_id=model_id)
        job = Job(req, asyncio.get_running_loop())
        worker.submit(job)
        try:
            first = await next_item(job, request)
            if first[0] == "error":
                raise first[1]
            if req.stream:
                return StreamingResponse(sse(job, req, name), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            text = []
            while True:
                item = await next_item(job, request)
                if item[0] == "text":
                    text.append(item[1])
                elif item[0] == "error":
                    raise item[1]
                else:
                    _, finish, usage = item
                    metrics.latency.labels(name).observe(time.perf_counter() - job.t0)
                    return JSONResponse(response_body(req, "".join(text), finish, usage))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; counted in the metrics
        except BaseException:
            job.cancel.set()
            raise

    async def sse(job: Job, req: GenRequest, name: str) -> AsyncIterator[str]:
        rid, now = response_id(req), int(time.time())
        usage_key = {"usage": None} if req.include_usage else {}

        def chunk(choice: dict | None, **extra) -> str:
            obj = {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
                   "created": now, "model": req.model, "choices": [choice] if choice else [], **usage_key,
                   **extra}
            return f"data: {json.dumps(obj)}\n\n"

        def piece(text: str | None, finish: str | None, role: bool = False) -> dict:
            if req.chat:
                delta = ({"role": "assistant", "content": ""} if role else
                         {"content": text} if text is not None else {})
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        try:
            if req.chat:
                yield chunk(piece(None, None, role=True))
            while True:
                item = await job.items.get()
                if item[0] == "text":
                    yield chunk(piece(item[1], None))
                elif item[0] == "error":
                    yield f"data: {json.dumps(item[1].body())}\n\n"
                    return
                else:
                    _, finish, usage = item
                    yield chunk(piece(None, finish))
                    if req.include_usage:
                        yield chunk(None, usage=usage)
                    yield "data: [DONE]\n\n"
                    metrics.latency.labels(name).observe(time.perf_counter() - job.t0)
                    return
        finally:  # also when the client went away mid-stream: the worker stops at the next step
            job.cancel.set()

    async def next_item(job: Job, request: Request) -> tuple:
        """The worker's next item; every POLL_S (also while items keep coming) the client is checked."""
        while True:
            now = time.monotonic()
            if now - job.checked >= POLL_S:
                job.checked = now
                if await request.is_disconnected():
                    job.cancel.set()
                    raise ClientGone()
            try:
                return await asyncio.wait_for(job.items.get(), timeout=POLL_S)
            except asyncio.TimeoutError:
                pass

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        what = "route" if exc.status_code == 404 else "method"
        msg = f"no such {what}: {request.method} {request.url.path} (see docs/serve.md for the endpoints)"
        return error_response(ApiError(exc.status_code, msg, code=f"http_{exc.status_code}"))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(500, "internal server error: see the server's log",
                                       type="server_error", code="internal_error"))

    @asynccontextmanager
    async def lifespan(app: Starlette):
        worker.start()
        try:
            yield
        finally:  # uvicorn has finished the requests in flight (SIGTERM drains): end the worker
            await asyncio.get_running_loop().run_in_executor(None, worker.stop)

    routes = [Route("/health", endpoint("health", health)),
              Route("/v1/models", endpoint("models", models)),
              Route("/v1/models/{model:path}", endpoint("models", model)),
              Route("/metrics", endpoint("metrics", prometheus)),
              Route("/v1/completions", endpoint("completions", completions), methods=["POST"]),
              Route("/v1/chat/completions", endpoint("chat", chat_completions), methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})


def too_large(max_body: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {max_body >> 20} MiB: send a shorter prompt",
                    code="request_too_large")


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def response_id(req: GenRequest) -> str:
    return ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex[:24]


def response_body(req: GenRequest, text: str, finish: str, usage: dict) -> dict:
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": response_id(req), "object": "chat.completion" if req.chat else "text_completion",
            "created": int(time.time()), "model": req.model, "choices": [choice], "usage": usage}
