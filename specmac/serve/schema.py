"""Request bodies -> a checked ``GenRequest``, or an ``ApiError`` naming the JSON field.

The OpenAI fields specmac serves are read here, with their types and ranges; fields that would
change the output in a way specmac does not implement (``logprobs``, ``tools``, ``n`` > 1, ...) are
refused with a 400 that names them, never silently ignored. Unknown fields are refused too, as
OpenAI's API does, except a few that carry no meaning for the output (``user``, ``metadata``, ...).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from specmac.core.costs import K_LIMIT
from specmac.core.prediction import prediction_text
from specmac.core.sampling import SamplingParams
from specmac.errors import SpecmacError

MAX_STOPS = 4  # as OpenAI
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options"}
# fields specmac does not implement: refused unless given their "off" value
REFUSED_UNLESS = {"logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []),
                  "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
                  "response_format": (None, {"type": "text"}), "frequency_penalty": (None, 0),
                  "presence_penalty": (None, 0), "logit_bias": (None, {}), "echo": (None, False),
                  "suffix": (None, ""), "best_of": (None, 1), "audio": (None,),
                  "modalities": (None, ["text"]), "reasoning_effort": (None,), "web_search_options": (None,)}
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "stop", "seed", "n",
          "top_k", "min_p", "speculative", "prediction", "sampler"}
CHAT = COMMON | {"messages", "max_completion_tokens"}
COMPLETION = COMMON | {"prompt"}
ROLES = {"system", "developer", "user", "assistant"}


class ApiError(Exception):
    """An OpenAI-shaped error: HTTP status, message, type, param (the JSON field), code."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


@dataclass
class GenRequest:
    """One checked request. ``prompt`` is text or token ids (completions), ``messages`` a chat."""

    chat: bool
    model: str
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    max_tokens: int | None = None  # None: up to the context window
    params: SamplingParams = field(default_factory=lambda: SamplingParams(1.0))
    stop: list[str] = field(default_factory=list)
    seed: int | None = None  # None: a fresh one per request
    k: int | str | None = None  # None: the server's --k; 0: no drafting
    prediction: str | None = None
    stream: bool = False
    include_usage: bool = False


def parse(body: Any, *, chat: bool, model_id: str) -> GenRequest:
    """A JSON body of /v1/chat/completions (``chat``) or /v1/completions -> GenRequest."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_type")
    allowed = CHAT if chat else COMPLETION
    for key, value in body.items():
        if key in REFUSED_UNLESS:
            if not any(_same(value, off) for off in REFUSED_UNLESS[key]):
                raise bad(key, f"is not supported by specmac serve: remove {key!r} from the request",
                          "unsupported_parameter")
        elif key not in allowed and key not in IGNORED:
            raise bad(key, "is not a recognized request field: remove it", "unrecognized_parameter")
    model = _get(body, "model", str, required=True)
    if model != model_id:
        raise ApiError(404, f"model: the model {model!r} does not exist; this server serves {model_id!r} "
                            "(see GET /v1/models)", param="model", code="model_not_found")
    req = GenRequest(chat=chat, model=model)
    if chat:
        req.messages = _messages(body.get("messages"))
    else:
        req.prompt = _prompt(body.get("prompt"))
    req.stream = bool(_get(body, "stream", bool) or False)
    opts = _get(body, "stream_options", dict)
    if opts is not None:
        if not req.stream:
            raise bad("stream_options", "is only allowed with stream: true")
        req.include_usage = bool(_get(opts, "include_usage", bool, prefix="stream_options.") or False)
    mt = _get(body, "max_tokens", int)
    if chat and body.get("max_completion_tokens") is not None:
        mt = _get(body, "max_completion_tokens", int)
    if mt is not None and mt < 1:
        raise bad("max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens",
                  f"{mt} is out of range: use an integer >= 1")
    req.max_tokens = mt
    n = _get(body, "n", int)
    if n not in (None, 1):
        raise bad("n", f"{n} is not supported: specmac serve writes one choice per request (n = 1)",
                  "unsupported_value")
    req.params = _params(body)
    req.stop = _stop(body.get("stop"))
    req.seed = _get(body, "seed", int)
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise bad("seed", f"{req.seed} is out of range: use an integer in [0, 2**63)")
    req.k = _speculative(body.get("speculative"))
    if body.get("prediction") is not None:
        req.prediction = _prediction(body["prediction"])
    return req


def _same(value: Any, off: Any) -> bool:
    """value is the field's "off" value (False is not 0, and 0 is not False)."""
    if off is None or value is None:
        return value is off
    return value == off and isinstance(value, bool) == isinstance(off, bool)


def _get(obj: dict, key: str, typ: type, required: bool = False, prefix: str = "") -> Any:
    value = obj.get(key)
    if value is None:
        if required:
            raise bad(prefix + key, "is required", "missing_required_parameter")
        return None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if typ is float else
          isinstance(value, int) and not isinstance(value, bool) if typ is int else isinstance(value, typ))
    if not ok:
        names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
                 list: "an array"}
        raise bad(prefix + key, f"{value!r} is {_kind(value)}, not {names[typ]}", "invalid_type")
    if typ is float and not math.isfinite(value):
        raise bad(prefix + key, f"{value!r} is not a finite number")
    return value


def _kind(value: Any) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number", dict: "an object",
            list: "an array"}.get(type(value), type(value).__name__)


def _params(body: dict) -> SamplingParams:
    t = _get(body, "temperature", float)
    if t is not None and not 0 <= t <= 2:
        raise bad("temperature", f"{t} is out of range: use a number in [0, 2] (0 is greedy)")
    kw = {"temperature": 1.0 if t is None else float(t)}
    for key, typ in (("top_p", float), ("top_k", int), ("min_p", float)):
        v = _get(body, key, typ)
        if v is not None:
            kw[key] = v
    sampler = _get(body, "sampler", str)
    if sampler is not None:
        if "sampler" not in {f.name for f in dataclasses.fields(SamplingParams)}:
            raise bad("sampler", "is not supported by this build of specmac: remove it",
                      "unsupported_parameter")
        kw["sampler"] = sampler
    try:
        return SamplingParams(**kw)
    except SpecmacError as e:
        raise bad(e.param or "temperature", str(e).removeprefix(f"{e.param} ")) from None


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", "must be a string or an array of strings", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad("stop", f"has {len(stops)} strings: give at most {MAX_STOPS}")
    if any(s == "" for s in stops):
        raise bad("stop", "an empty stop string would stop before the first token: remove it")
    return stops


def _speculative(spec: Any) -> int | str | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - {"k"}:
        raise bad("speculative", 'must be an object {"k": 0 | N | "auto"}', "invalid_type")
    k = spec.get("k")
    if k is None:
        return None
    if k == "auto":
        return k
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= K_LIMIT:
        raise bad("speculative.k", f"{k!r} is out of range: use 0 (no drafts), an integer 1..{K_LIMIT} or "
                                   '"auto"')
    return k


def _prediction(pred: Any) -> str:
    if not isinstance(pred, dict) or pred.get("type") != "content" or "content" not in pred:
        raise bad("prediction", 'must be {"type": "content", "content": "..."} (a string or text parts)',
                  "invalid_type")
    try:
        return prediction_text(pred["content"])
    except TypeError as e:
        raise bad("prediction.content", str(e), "invalid_type") from None


def _prompt(prompt: Any) -> str | list[int]:
    if prompt is None:
        raise bad("prompt", "is required", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", "is empty: give at least one character of text")
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(x, (str, list)) for x in prompt):
        raise bad("prompt", "has several prompts: specmac serve takes one per request", "unsupported_value")
    raise bad("prompt", "must be a string or an array of token ids", "invalid_type")


def _messages(messages: Any) -> list[dict]:
    if messages is None:
        raise bad("messages", "is required", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty array of messages", "invalid_type")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with a role and content", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role", f"{role!r} is not supported: use one of {', '.join(sorted(ROLES))}",
                      "unsupported_value")
        for key in m:
            if key not in ("role", "content", "name"):
                raise bad(f"{where}.{key}", "is not supported by specmac serve: remove it",
                          "unsupported_parameter")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad(f"{where}.content", "only text parts ({'type': 'text', 'text': ...}) are supported",
                          "unsupported_value")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"{where}.content", "must be a string or an array of text parts", "invalid_type")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out
