"""The scheduler: one thread owns the pair and runs every generation, several at once.

Backends are not thread-safe, so every model call happens on this thread. The pair holds up to
``parallel`` sequences (``Pair.lanes``: a lane of the target each, with its own draft caches);
each active request has one, and every pass of the target serves them all: requests join and leave
between passes (continuous batching), a new prompt is processed in chunks beside the running
streams' steps, and the planner shares the pass's cheap width between their drafts
(``specmac.core.loop.pass_streams``). Admission is first come, first served; requests wait in a
bounded queue (full: ``ApiError`` 503 with Retry-After). Each ``Job`` carries the request and an
asyncio queue that the scheduler fills, from its thread, with ("start", n_prompt) |
("text", piece) | ("done", finish_reason, usage) | ("error", ApiError). A job whose client has gone
(``job.cancel``) stops at the next pass and its lane is freed; its caches are left holding its text.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from specmac.api import Lane, Pair
from specmac.backends.threads import give_up_openmp_pools
from specmac.core.drafters import common_prefix
from specmac.core.loop import Event, Stream, pass_streams
from specmac.core.planner import Planner
from specmac.core.prediction import PredictionDrafter
from specmac.core.runstats import RunStats
from specmac.errors import ContextOverflow, SpecmacError
from specmac.serve.metrics import Metrics
from specmac.serve.schema import ApiError, GenRequest
from specmac.serve.text import FALLBACK_FORMAT, TextOut, fallback_chat
from specmac.tuning.timing import time_shared_drafting

log = logging.getLogger("specmac.serve")
FINISH = {"eos": "stop", "length": "length", "context": "length"}
RETRY_AFTER_S = 1
# prompt tokens processed in one pass while other streams generate: their next token waits for the
# chunk, so a long prompt joins without stalling them for its whole length (alone, it is read at once)
PREFILL_CHUNK = 64


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


@dataclass
class Running:
    """A job with a lane: its stream, its text so far and its counts."""

    job: Job
    lane: Lane
    stream: Stream
    text: TextOut
    stats: RunStats
    k: int | str
    n_prompt: int
    field: str
    prediction: PredictionDrafter | None = None
    started: bool = False
    finish: str | None = None  # why it ended ("cancelled": its client left), once it has
    t_first: float = 0.0  # when its first tokens came (time.perf_counter), and how many
    n_first: int = 0


class Worker:
    def __init__(self, pair: Pair, *, k: int | str, queue_size: int, metrics: Metrics,
                 planner: Planner | None = None, parallel: int = 1,
                 prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.pair, self.k, self.metrics = pair, k, metrics
        self.planners: dict[int | str, Planner] = {k: planner} if planner is not None else {}
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.thread = threading.Thread(target=self._run, name="specmac-worker", daemon=True)
        self.chat_template = self._has_chat_template()
        self.lanes = pair.lanes(parallel)
        if planner is not None:  # what drafting for several streams at once costs here, from the start
            time_shared_drafting(self.lanes, planner.costs)
        self.prefill_chunk = prefill_chunk
        self.active: list[Running] = []

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
        """Start the scheduler's thread: from here on every pass runs there, so the calling thread
        (which loaded and timed the models) gives up its CPU threads first."""
        give_up_openmp_pools()
        self.thread.start()

    def submit(self, job: Job) -> None:
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise ApiError(503, f"the server's queue is full ({self.queue.maxsize} requests waiting): retry "
                                f"in {RETRY_AFTER_S} s", type="server_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        self.metrics.record_queue(self.queue.qsize(), len(self.active))

    def stop(self, timeout: float = 30.0) -> None:
        """After the last request: end the thread (it finishes the jobs it holds first)."""
        if self.thread.is_alive():
            self.queue.put(None, timeout=timeout)
            self.thread.join(timeout)

    # --- the scheduler -------------------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while True:
            while not stopping and len(self.active) < len(self.lanes):  # admit, first come first served
                try:
                    job = self.queue.get(block=not self.active)
                except queue.Empty:
                    break
                self.metrics.record_queue(self.queue.qsize(), len(self.active))
                if job is None:
                    stopping = True
                elif job.cancel.is_set():  # its client left while it waited
                    self.metrics.cancelled.inc()
                else:
                    self._admit(job)
            if not self.active:
                if stopping:
                    return
                continue
            self.metrics.record_queue(self.queue.qsize(), len(self.active))
            self._pass()

    def _admit(self, job: Job) -> None:
        try:
            self.active.append(self._open(job))
        except ApiError as e:
            job.put("error", e)
        except Exception:  # a bug: the traceback goes to the log, the client gets a 500
            log.exception("starting a generation failed")
            job.put("error", internal_error())

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """The request's prompt as token ids: chat messages through the target's template (or
        the documented fallback), text encoded, ids taken as they are."""
        target = self.pair.target
        if req.chat:
            m = req.messages
            text = target.apply_chat_template(m) if self.chat_template else fallback_chat(m)
            return self.pair.encode(text)
        return self.pair.encode(req.prompt)

    def _lane_for(self, ids: list[int]) -> Lane:
        """The free lane holding the longest prefix of ``ids`` (a conversation's earlier turns),
        else the one used longest ago (its sequence goes to the store, if worth keeping)."""
        busy = {id(r.lane) for r in self.active}
        free = [lane for lane in self.lanes if id(lane) not in busy]
        def held(lane: Lane) -> int:
            h = lane.target.held
            return common_prefix(h, ids, len(ids) - 1) if h is not None else 0
        return max(free, key=lambda lane: (held(lane), -lane.used))

    def _open(self, job: Job) -> Running:
        req, target = job.req, self.pair.target
        field_name = "messages" if req.chat else "prompt"
        try:
            ids = self.prompt_ids(req)
        except SpecmacError as e:
            raise ApiError(400, f"{field_name}: {e}", param=field_name) from None
        if len(ids) >= target.n_ctx:
            raise ApiError(400, f"{field_name}: the prompt has {len(ids)} tokens but this model's context "
                                f"window is {target.n_ctx} (room for the answer included): shorten it",
                           param=field_name, code="context_length_exceeded")
        k = self.k if req.k is None else req.k
        predicted = None
        if req.prediction is not None and k != 0:
            predicted = self.pair.prediction_drafter(req.prediction)
        max_tokens = req.max_tokens or target.n_ctx  # the loop stops at the context window first
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        lane = self._lane_for(ids)
        try:
            stream = self.pair.start(lane, ids, params=req.params, max_tokens=max_tokens, k=self.planner(k),
                                     seed=seed, prediction=predicted)
        except SpecmacError as e:
            code = "context_length_exceeded" if isinstance(e, ContextOverflow) else "invalid_value"
            raise ApiError(400, f"{field_name}: {e}", param=field_name, code=code) from None
        if self.pair.store is not None:
            self.metrics.record_store(self.pair.store.info())
        return Running(job, lane, stream, TextOut(target.decode, req.stop), RunStats(k=k), k, len(ids),
                       field_name, predicted)

    def _chunks(self) -> dict[int, int]:
        """Prompt tokens each stream still reading its prompt processes in the next pass: all of it
        when no stream is generating, else ``prefill_chunk`` tokens in all, first come first served."""
        generating = any(not r.stream.pending for r in self.active)
        budget = self.prefill_chunk if generating else None
        out = {}
        for i, r in enumerate(self.active):
            n = len(r.stream.pending)
            if n:
                out[i] = n if budget is None else min(n, budget)
                budget = None if budget is None else budget - out[i]
        return out

    def _pass(self) -> None:
        active = self.active
        for r in active:
            if r.job.cancel.is_set():
                r.finish = "cancelled"
        self._close([r for r in active if r.finish])
        active = self.active
        if not active:
            return
        planner = self.planners.get(self.k) or active[0].stream.planner
        try:
            events = pass_streams(active[0].lane.target, [r.stream for r in active], planner, self._chunks())
        except Exception as e:  # the pass itself failed: every stream in it ends
            self._fail(active, e)
            return
        self.metrics.record_pass(sum(isinstance(e, Event) for e in events))
        for r, event in zip(active, events):
            if isinstance(event, BaseException):
                self._fail([r], event)
            elif event is not None:
                self._emit(r, event)
        self._close([r for r in self.active if r.finish])

    def _emit(self, r: Running, event: Event) -> None:
        if not r.started:
            r.job.put("start", r.n_prompt)
            r.t_first, r.n_first = time.perf_counter(), len(event.tokens)
            self.metrics.record_first_token(r.t_first - r.job.t0)
            r.started = True
        if r.prediction is not None:
            r.prediction.settle(event.source, event.n_drafted, event.n_accepted)
        r.stats.add(event)
        self.metrics.record_step(event)
        piece = r.text.push(event.tokens, final=event.finish_reason is not None)
        if piece:
            r.job.put("text", piece)
        if r.text.stopped:
            r.finish = "stop"
        elif event.finish_reason:
            r.finish = FINISH[event.finish_reason]
        elif r.job.cancel.is_set():
            r.finish = "cancelled"

    def _close(self, done: list[Running]) -> None:
        """Streams that finished (or were cancelled): caches left holding their text, usage told,
        lanes freed."""
        for r in done:
            self.active.remove(r)
            try:
                r.stream.close()
            finally:
                self._settle(r)
            if r.finish == "cancelled":
                self.metrics.cancelled.inc()
            usage = make_usage(r.n_prompt, r.stats, r.k, r.prediction.usage() if r.prediction else None,
                               r.stream.record.note)
            self.metrics.record_run(usage)
            log.info(request_line(r, time.perf_counter()))
            r.job.put("done", r.finish if r.finish != "cancelled" else "length", usage)

    def _fail(self, failed: list[Running], e: BaseException) -> None:
        for r in failed:
            if r in self.active:
                self.active.remove(r)
            try:
                r.stream.close()
            except Exception:
                log.exception("closing a failed stream failed")
            if isinstance(e, ApiError):
                r.job.put("error", e)
            elif isinstance(e, SpecmacError) and not r.started:
                code = "context_length_exceeded" if isinstance(e, ContextOverflow) else "invalid_value"
                r.job.put("error", ApiError(400, f"{r.field}: {e}", param=r.field, code=code))
            else:
                log.error("generation failed", exc_info=e)
                r.job.put("error", internal_error())

    def _settle(self, r: Running) -> None:
        planner = r.stream.planner
        if planner.kept is not None:
            from specmac.tuning.calibration import settle

            planner.settled = settle(planner.costs, planner.kept)


def request_line(r: Running, now: float) -> str:
    """One line per request, as llama-server's timings: tokens in and out, time to the first token
    (queue and prompt included), tokens/s after it, drafts accepted of drafted, why it ended."""
    s, after = r.stats, now - r.t_first
    rate = (s.n_tokens - r.n_first) / after if r.started and after > 0 and s.n_tokens > r.n_first else None
    first = f"{1e3 * (r.t_first - r.job.t0):.0f} ms" if r.started else "-"
    return (f"{'chat' if r.field == 'messages' else 'completion'}: {r.n_prompt} prompt tokens "
            f"({s.cached_tokens} cached), {s.n_tokens} out, first token {first}, "
            f"{'-' if rate is None else f'{rate:.1f}'} tokens/s after it, "
            f"drafts {s.n_accepted}/{s.n_drafted} accepted, k {r.k}, finish {r.finish}"
            + (f"; {r.stream.record.note}" if r.stream.record.note else ""))


def internal_error() -> ApiError:
    return ApiError(500, "internal error while generating: see the server's log", type="server_error",
                    code="internal_error")


def make_usage(n_prompt: int, stats: RunStats, k: int | str, prediction: dict | None, note: str = "") -> dict:
    """OpenAI's usage object, with specmac's ``speculative`` beside it (``note``: the planner's, why
    the draft model was not started, where it says so)."""
    d = prediction or {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_tokens,
            "total_tokens": n_prompt + stats.n_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
            "completion_tokens_details": {"accepted_prediction_tokens": d["accepted_prediction_tokens"],
                                          "rejected_prediction_tokens": d["rejected_prediction_tokens"]},
            "speculative": {"drafted": stats.n_drafted, "accepted": stats.n_accepted,
                            "target_passes": stats.n_target_passes, "k": k,
                            "draft_caught_up_tokens": stats.draft_caught_up}
            | ({"note": note} if note else {})}
