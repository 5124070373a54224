"""An OpenAI-compatible server as compare and verify see it: where it is, which model it serves,
one request at a time (streamed, with the time each piece arrives) and the speculative counters it
reports: specmac's ``usage.speculative``, llama-server's ``timings`` (draft_n, draft_n_accepted) or
vLLM's Prometheus counters on /metrics (read before and after each request).

An endpoint is ``[LABEL=]URL[#MODEL]``: URL is the base the openai client takes (…/v1; a URL
without it is tried with it), MODEL the model to ask for (default: the first of /v1/models). API
keys are read from the environment only, so none lands in a record's command line:
``SPECMAC_ENDPOINT_KEY_<LABEL>`` (the label upper-cased, other characters as ``_``), else
``SPECMAC_ENDPOINT_KEY``. httpx is imported on first use (``pip install 'specmac[endpoint]'``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from specmac.errors import BadOption, SpecmacError

KEY_ENV = "SPECMAC_ENDPOINT_KEY"
CONNECT_S, READ_S = 10.0, 600.0
# vLLM's speculative counters (specmac serve exposes them under the same names)
VLLM_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


class EndpointError(SpecmacError):
    """A server that cannot be reached, or that answers with an error (``status``: its HTTP status)."""

    def __init__(self, message: str = "", *, param: str | None = None, status: int | None = None) -> None:
        super().__init__(message, param=param)
        self.status = status


@dataclass
class Reply:
    """One generation: its text, when its pieces arrived (seconds from the request) and its counts."""

    text: str
    n_tokens: int
    tokens_from: str  # "usage", "timings", "logprobs" or "chunks" (chunks of text: no count reported)
    ttft: float  # to the first piece of text
    seconds: float  # to the last byte
    finish_reason: str | None = None
    counters: dict | None = None  # {"source", "drafted", "accepted", "target_passes", "k"}
    pieces: list[str] | None = None  # the tokens' text, where the server returned logprobs
    top: list[dict[str, float]] | None = None  # per token: its top alternatives' logprobs


@dataclass
class Endpoint:
    label: str
    url: str  # base URL, …/v1
    model: str | None = None
    key: str | None = field(default=None, repr=False)
    card: dict = field(default_factory=dict)  # its /v1/models entry
    metrics: bool = False  # /metrics holds vLLM's speculative counters
    logprobs: bool | None = None  # it returns logprobs (None: not asked yet)
    counters_in_reply: bool | None = None  # its replies carry speculative counts (None: not seen yet)
    param: str = "endpoint"  # the parameter (flag) that named it, for errors
    _http: Any = field(default=None, repr=False)

    def public(self) -> dict:
        """What a record keeps: no key, no user:password in the URL."""
        return {"label": self.label, "url": public_url(self.url), "model": self.model, "card": self.card,
                "metrics": self.metrics}


def public_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def parse(text: str, param: str = "endpoint") -> Endpoint:
    """"[LABEL=]URL[#MODEL]" -> an Endpoint (not yet connected), its key from the environment."""
    label, sep, rest = text.partition("=")
    if not sep or re.search(r"[:/]", label):  # no label: the "=" (if any) belongs to the URL
        label, rest = "", text
    url, _, model = rest.strip().partition("#")
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is not a number, or past 65535
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise BadOption(f"{param} {text!r} is not an http(s) URL: write e.g. http://127.0.0.1:8000/v1, or "
                        "LABEL=URL", param=param)
    label = label.strip() or f"{parts.hostname}:{port}"
    env = f"{KEY_ENV}_{re.sub(r'[^A-Z0-9]', '_', label.upper())}"
    key = os.environ.get(env) or os.environ.get(KEY_ENV)
    return Endpoint(label, url.rstrip("/"), model.strip() or None, key, param=param)


def parse_all(texts: tuple[str, ...] | list[str], param: str = "endpoint") -> list[Endpoint]:
    eps = [parse(t, param) for t in texts]
    seen: set[str] = set()
    for ep in eps:
        if ep.label in seen:
            raise BadOption(f"{param}: two endpoints are labelled {ep.label!r}: give each its own, "
                            f"LABEL=URL", param=param)
        seen.add(ep.label)
    return eps


def _httpx():
    try:
        import httpx
    except ModuleNotFoundError:
        raise SpecmacError("measuring a server needs httpx: pip install 'specmac[endpoint]'") from None
    return httpx


def connect(ep: Endpoint) -> Endpoint:
    """Reach the server: its model list (the model asked for, or the first) and whether /metrics
    holds vLLM's counters. Every failure is one EndpointError naming the endpoint."""
    httpx, param = _httpx(), ep.param
    headers = {"Authorization": f"Bearer {ep.key}"} if ep.key else {}
    ep._http = httpx.Client(headers=headers, timeout=httpx.Timeout(READ_S, connect=CONNECT_S))
    tried = [ep.url] + ([] if ep.url.endswith("/v1") else [ep.url + "/v1"])
    for url in tried:
        r = _get(ep, f"{url}/models")
        if r.status_code != 404 or url == tried[-1]:
            break
    if r.status_code >= 400:
        raise EndpointError(f"{param} {ep.label} ({public_url(ep.url)}): GET /models answered "
                            f"{r.status_code} ({error_text(r)})" + (": set the key in "
                            f"{KEY_ENV}_<LABEL> or {KEY_ENV}" if r.status_code in (401, 403) else ""),
                            param=param)
    ep.url = url
    try:
        data = r.json().get("data") or []
        ids = [m["id"] for m in data]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise EndpointError(f"{param} {ep.label} ({public_url(url)}): GET /models is not an OpenAI model "
                            "list: is this an OpenAI-compatible server?", param=param) from None
    if ep.model is None and not ids:
        raise EndpointError(f"{param} {ep.label}: the server lists no model: name one, URL#MODEL",
                            param=param)
    if ep.model is not None and ids and ep.model not in ids:
        raise EndpointError(f"{param} {ep.label}: the server does not list the model {ep.model!r}; it "
                            f"serves {', '.join(map(repr, ids))}", param=param)
    ep.model = ep.model or ids[0]
    ep.card = next((m for m in data if m.get("id") == ep.model), {})
    ep.metrics = VLLM_DRAFTED in scrape(ep)
    return ep


def _get(ep: Endpoint, url: str):
    httpx, param = _httpx(), ep.param
    try:
        return ep._http.get(url)
    except httpx.HTTPError as e:
        raise EndpointError(f"{param} {ep.label} ({public_url(ep.url)}): cannot connect "
                            f"({type(e).__name__}: {e or 'no answer'}): is the server running?",
                            param=param) from None


def error_text(r) -> str:
    """The message of an error response (OpenAI's {"error": {"message"}} or FastAPI's {"detail"})."""
    try:
        body = r.json()
        err = body.get("error", body.get("detail", body))
        msg = err.get("message", err) if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = r.text
    return " ".join(str(msg).split())[:300] or r.reason_phrase


def scrape(ep: Endpoint) -> dict[str, float]:
    """The /metrics counters (summed over their labels; {} where there is none)."""
    httpx = _httpx()
    base = ep.url.removesuffix("/v1")
    try:
        r = ep._http.get(f"{base}/metrics", timeout=10)
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:
        return {}
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = re.split(r"[{\s]", line, maxsplit=1)[0], line.rsplit(None, 1)[-1]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def request_body(ep: Endpoint, *, text: str | None, messages: list[dict] | None, max_tokens: int,
                 sampling: dict, seed: int | None, stream: bool, logprobs: int) -> dict:
    """A completions (``text``) or chat (``messages``) body; sampling holds what differs from the
    OpenAI defaults (temperature always)."""
    body: dict[str, Any] = {"model": ep.model, "max_tokens": max_tokens, **sampling}
    if messages is not None:
        body["messages"] = messages
        if logprobs:
            body |= {"logprobs": True, "top_logprobs": logprobs}
    else:
        body["prompt"] = text
        if logprobs:
            body["logprobs"] = logprobs
    if seed is not None:
        body["seed"] = seed
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def complete(ep: Endpoint, *, text: str | None = None, messages: list[dict] | None = None, max_tokens: int,
             sampling: dict, seed: int | None = None, stream: bool = True, logprobs: int = 0) -> Reply:
    """One request, timed from just before it is sent. Streaming: time to the first piece of text
    and to the end; otherwise both are the whole request."""
    httpx, param = _httpx(), ep.param
    route = "/chat/completions" if messages is not None else "/completions"
    body = request_body(ep, text=text, messages=messages, max_tokens=max_tokens, sampling=sampling, seed=seed,
                        stream=stream, logprobs=logprobs)
    where = f"{param} {ep.label} ({public_url(ep.url)})"
    t0 = time.perf_counter()
    try:
        with ep._http.stream("POST", ep.url + route, json=body) as r:
            if r.status_code >= 400:
                r.read()
                raise EndpointError(f"{where}: POST {route} answered {r.status_code} ({error_text(r)})",
                                    param=param, status=r.status_code)
            if not stream:
                r.read()
                return _whole(r.json(), time.perf_counter() - t0)
            return _streamed(r.iter_lines(), t0, where, param)
    except httpx.HTTPError as e:
        raise EndpointError(f"{where}: the request failed ({type(e).__name__}: {e or 'no answer'})",
                            param=param) from None


def _streamed(lines, t0: float, where: str, param: str) -> Reply:
    text, first, chunks, usage, timings, finish = [], None, 0, None, None, None
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            obj = json.loads(data)
        except ValueError:
            raise EndpointError(f"{where}: a streamed event is not JSON: {data[:80]!r}",
                                param=param) from None
        if obj.get("error"):
            raise EndpointError(f"{where}: the stream ended with an error ({error_text_of(obj)})",
                                param=param)
        usage = obj.get("usage") or usage
        timings = obj.get("timings") or timings
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = choice.get("text") or delta.get("content") or delta.get("reasoning_content") or ""
            if piece:  # a chunk of text: a token on servers that stream one at a time
                first = first or time.perf_counter()
                text.append(piece)
                chunks += 1
            finish = choice.get("finish_reason") or finish
    end = time.perf_counter()
    n, source = token_count(usage, timings, chunks)
    return Reply("".join(text), n, source, (first or end) - t0, end - t0, finish, counters(usage, timings))


def error_text_of(obj: dict) -> str:
    err = obj.get("error")
    return str(err.get("message", err) if isinstance(err, dict) else err)[:300]


def _whole(obj: dict, seconds: float) -> Reply:
    choice = (obj.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    text = choice.get("text") if "text" in choice else msg.get("content") or ""
    pieces, top = logprob_tokens(choice.get("logprobs"))
    n, source = token_count(obj.get("usage"), obj.get("timings"), len(pieces) if pieces is not None else 0)
    if pieces is not None and source == "chunks":
        source = "logprobs"
    return Reply(text or "", n, source, seconds, seconds, choice.get("finish_reason"),
                 counters(obj.get("usage"), obj.get("timings")), pieces, top)


def logprob_tokens(lp: Any) -> tuple[list[str] | None, list[dict[str, float]] | None]:
    """(token texts, per token {alternative: logprob}) from a choice's logprobs: the completions
    shape ({"tokens", "top_logprobs"}) or the chat shape ({"content": [{"token", "top_logprobs"}]})."""
    if not isinstance(lp, dict):
        return None, None
    if isinstance(lp.get("tokens"), list):
        tops = lp.get("top_logprobs") or [{}] * len(lp["tokens"])
        return [str(t) for t in lp["tokens"]], [dict(t or {}) for t in tops]
    if isinstance(lp.get("content"), list):
        items = lp["content"]
        return ([str(i.get("token", "")) for i in items],
                [{str(a.get("token")): float(a.get("logprob")) for a in i.get("top_logprobs") or []}
                 for i in items])
    return None, None


def token_count(usage: dict | None, timings: dict | None, chunks: int) -> tuple[int, str]:
    if usage and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"], "usage"
    if timings and isinstance(timings.get("predicted_n"), int):
        return timings["predicted_n"], "timings"
    return chunks, "chunks"


def counters(usage: dict | None, timings: dict | None) -> dict | None:
    """The speculative counts a server put in its reply: specmac's usage.speculative, llama-server's
    timings; None where it reported none."""
    spec = (usage or {}).get("speculative")
    if isinstance(spec, dict) and "drafted" in spec:
        return {"source": "usage.speculative", "drafted": spec.get("drafted"),
                "accepted": spec.get("accepted"), "target_passes": spec.get("target_passes"),
                "k": spec.get("k")}
    if timings and "draft_n" in timings:
        return {"source": "timings", "drafted": timings.get("draft_n"),
                "accepted": timings.get("draft_n_accepted"), "target_passes": None, "k": None}
    return None


def metrics_counters(before: dict[str, float], after: dict[str, float]) -> dict | None:
    """vLLM's counters over one request (the difference of two /metrics reads)."""
    if VLLM_DRAFTED not in after:
        return None
    return {"source": "metrics", "drafted": int(after[VLLM_DRAFTED] - before.get(VLLM_DRAFTED, 0.0)),
            "accepted": int(after.get(VLLM_ACCEPTED, 0.0) - before.get(VLLM_ACCEPTED, 0.0)),
            "target_passes": None, "k": None}


def sampling_fields(params) -> dict:
    """A SamplingParams as request fields: temperature always, the rest where they are not off (a
    server's own defaults apply to what is not sent: llama-server's top_k 40 and min_p 0.05)."""
    out: dict[str, Any] = {"temperature": params.temperature}
    if params.top_p < 1:
        out["top_p"] = params.top_p
    if params.top_k:
        out["top_k"] = params.top_k
    if params.min_p:
        out["min_p"] = params.min_p
    return out


def close(eps: list[Endpoint]) -> None:
    for ep in eps:
        if ep._http is not None:
            ep._http.close()
