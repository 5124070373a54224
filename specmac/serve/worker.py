"""The worker: one thread owns the pair and runs one generation at a time, in FIFO order.

Backends are not thread-safe and a pair has one KV cache per model, so every model call happens
on this thread. Requests wait in a bounded queue (full: ``ApiError`` 503 with Retry-After); each
``Job`` carries the request and an asyncio queue that the worker fills, from its thread, with
("start", n_prompt) | ("text", piece) | ("done", finish_reason, usage) | ("error", ApiError).
A job whose client has gone (``job.cancel``) stops at the next step: leaving the loop's
iterator closes it, and the loop's ``finally`` rewinds both caches.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
import threading
import time
from typing import Any

from specmac.api import Pair
from specmac.core.planner import Planner
from specmac.core.runstats import RunStats
from specmac.errors import ContextOverflow, SpecmacError
from specmac.serve.metrics import Metrics
from specmac.serve.schema import ApiError, GenRequest
from specmac.serve.text import FALLBACK_FORMAT, TextOut, fallback_chat

log = logging.getLogger("specmac.serve")
FINISH = {"eos": "stop", "length": "length", "context": "length"}
RETRY_AFTER_S = 1


class Job:
    """One request on its way through the worker."""

    def __init__(self, req: GenRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.req, self.loop = req, loop
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()
        self.t0 = time.perf_counter()
        self.checked = time.monotonic()  # when the route last checked that the client is still there

    def put(self, *item: Any) -> None:
        """From the worker thread: hand an item to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            self.cancel.set()


class Worker:
    def __init__(self, pair: Pair, *, k: int | str, queue_size: int, metrics: Metrics,
                 planner: Planner | None = None) -> None:
        self.pair, self.k, self.metrics = pair, k, metrics
        self.planners: dict[int | str, Planner] = {k: planner} if planner is not None else {}
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.thread = threading.Thread(target=self._run, name="specmac-worker", daemon=True)
        self.chat_template = self._has_chat_template()

    def _has_chat_template(self) -> bool:
        try:
            self.pair.target.apply_chat_template([{"role": "user", "content": "hi"}])
        except SpecmacError:
            log.warning("the target has no chat template: /v1/chat/completions formats messages as "
                        "%s (see docs/serve.md)", FALLBACK_FORMAT)
            return False
        return True

    def planner(self, k: int | str) -> Planner:
        """The server's planner for ``k``, made once (k 0: no sources, plain decoding; "auto" times
        the pair's passes the first time, kept on disk), its costs refined by every request since."""
        if k not in self.planners:
            self.planners[k] = Planner([], k=1) if k == 0 else self.pair.planner(k)
        return self.planners[k]

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise ApiError(503, f"the server's queue is full ({self.queue.maxsize} requests waiting): retry "
                                f"in {RETRY_AFTER_S} s", type="server_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        self.metrics.queue_depth.set(self.queue.qsize())

    def stop(self, timeout: float = 30.0) -> None:
        """After the last request: end the thread (it finishes the job it is on first)."""
        if self.thread.is_alive():
            self.queue.put(None, timeout=timeout)
            self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            self.metrics.queue_depth.set(self.queue.qsize())
            if job is None:
                return
            if job.cancel.is_set():  # its client left while it waited
                self.metrics.cancelled.inc()
                continue
            self.metrics.busy.set(1)
            try:
                self._generate(job)
            except ApiError as e:
                job.put("error", e)
            except Exception:  # a bug: the traceback goes to the log, the client gets a 500
                log.exception("generation failed")
                job.put("error", ApiError(500, "internal error while generating: see the server's log",
                                          type="server_error", code="internal_error"))
            finally:
                self.metrics.busy.set(0)

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """The request's prompt as token ids: chat messages through the target's template (or
        the documented fallback), text encoded, ids taken as they are."""
        target = self.pair.target
        if req.chat:
            m = req.messages
            text = target.apply_chat_template(m) if self.chat_template else fallback_chat(m)
            return self.pair.encode(text)
        return self.pair.encode(req.prompt)

    def _generate(self, job: Job) -> None:
        req, target = job.req, self.pair.target
        field = "messages" if req.chat else "prompt"
        try:
            ids = self.prompt_ids(req)
        except SpecmacError as e:
            raise ApiError(400, f"{field}: {e}", param=field) from None
        if len(ids) >= target.n_ctx:
            raise ApiError(400, f"{field}: the prompt has {len(ids)} tokens but this model's context window "
                                f"is {target.n_ctx} (room for the answer included): shorten it",
                           param=field, code="context_length_exceeded")
        k = self.k if req.k is None else req.k
        pair = self.pair if k != 0 else self.pair.plain()
        predicted = pair.prediction_drafter(req.prediction) if req.prediction is not None and k != 0 else None
        max_tokens = req.max_tokens or target.n_ctx  # the loop stops at the context window first
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        stats = RunStats(k=k)
        steps = pair.stream(ids, params=req.params, max_tokens=max_tokens, k=self.planner(k), seed=seed,
                            prediction=predicted)
        out, finish, started = TextOut(target.decode, req.stop), None, False
        try:
            for event in steps:
                if not started:
                    job.put("start", len(ids))
                    self.metrics.ttft.observe(time.perf_counter() - job.t0)
                    started = True
                stats.add(event)
                piece = out.push(event.tokens, final=event.finish_reason is not None)
                if piece:
                    job.put("text", piece)
                if out.stopped:
                    finish = "stop"
                    break
                if event.finish_reason:
                    finish = FINISH[event.finish_reason]
                if job.cancel.is_set():
                    self.metrics.cancelled.inc()
                    break
        except SpecmacError as e:
            if started:
                raise
            code = "context_length_exceeded" if isinstance(e, ContextOverflow) else "invalid_value"
            raise ApiError(400, f"{field}: {e}", param=field, code=code) from None
        finally:
            steps.close()  # the loop's finally: both caches back in step
        usage = make_usage(len(ids), stats, k, predicted.usage() if predicted is not None else None)
        self.metrics.record_run(usage)
        if self.pair.store is not None:
            self.metrics.record_store(self.pair.store.info())
        job.put("done", finish or "length", usage)


def make_usage(n_prompt: int, stats: RunStats, k: int | str, prediction: dict | None) -> dict:
    """OpenAI's usage object, with specmac's ``speculative`` beside it."""
    d = prediction or {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_tokens,
            "total_tokens": n_prompt + stats.n_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
            "completion_tokens_details": {"accepted_prediction_tokens": d["accepted_prediction_tokens"],
                                          "rejected_prediction_tokens": d["rejected_prediction_tokens"]},
            "speculative": {"drafted": stats.n_drafted, "accepted": stats.n_accepted,
                            "target_passes": stats.n_target_passes, "k": k}}
