"""compare's endpoints: OpenAI-compatible servers measured on a compare run's prompts, pooled into
the same per-category table as its local configurations.

Each endpoint is warmed up once (a request of ``warmup_tokens`` for a prompt of its own, not
recorded, so no measured prompt finds a cache the warm-up left), then measured in
rounds (repeat x prompt), every round asking each endpoint once, in an order that moves on by one
every round (``rotated``, as the local configurations'); when local configurations are measured
too, the endpoints' rounds follow theirs. Every request is streamed (chat with ``--chat``, else
completions: the prompt's text, as the local targets are given it), at compare's sampling settings,
max_tokens and the round's seed. Per request: the time to the first piece of text, to the last
byte, the tokens (``usage.completion_tokens``, else llama-server's ``timings``, else the streamed
chunks) and the speculative counters the server reports (``specmac.compare.client``).

Per (endpoint, category), pooled: tokens/s is the tokens after the first over the time from the
first piece to the last (1 / time per output token, as serving benchmarks count it), end to end
the tokens over the whole requests' time (time to first token included), acceptance the accepted
over the drafted tokens of the requests that reported them. The record keeps the endpoints' runs
apart from the local ones (``endpoint_runs``), so readers of the local runs are unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from specmac.compare import client
from specmac.compare.categories import ALL
from specmac.compare.measure import rotated, spread
from specmac.compare.settings import FORMAT, Settings
from specmac.errors import SpecmacError

KIND = "endpoint"  # the "draft" of an endpoint's rows: its speculation is the server's own
# the warm-up's prompt: none of the measured ones, so no server starts them from a cache it kept
WARMUP = {"id": "warm-up", "text": "Hello", "messages": [{"role": "user", "content": "Hello"}]}


def config_id(label: str) -> str:
    return f"{KIND}:{label}"


def connect_all(endpoints: list[client.Endpoint], say: Callable[[str], None] | None = None) -> None:
    """Reach every endpoint before anything is measured or written (one line for each)."""
    for ep in endpoints:
        client.connect(ep)
        if say:
            say(f"endpoint {ep.label}: {client.public_url(ep.url)}, model {ep.model!r}")


def ask(ep: client.Endpoint, settings: Settings, prompt: dict, max_tokens: int, seed: int) -> client.Reply:
    """One streamed request for ``prompt``; vLLM's counters read around it where the server has
    them and reports none in its reply."""
    chat = settings.chat
    kw = dict(text=None if chat else prompt["text"], messages=prompt.get("messages") if chat else None,
              max_tokens=max_tokens, sampling=client.sampling_fields(settings.params), seed=seed)
    scrape = ep.metrics and ep.counters_in_reply is not True
    before = client.scrape(ep) if scrape else {}
    reply = client.complete(ep, **kw)
    if reply.counters is None and scrape:
        reply.counters = client.metrics_counters(before, client.scrape(ep))
    return reply


def measure(endpoints: list[client.Endpoint], settings: Settings,
            progress: Callable[[str], None] | None = None,
            on_round: Callable[[list[dict]], None] | None = None) -> tuple[list[dict], bool]:
    """Warm every endpoint up, then the rounds; -> (runs, interrupted: Ctrl-C keeps whole rounds)."""
    tick = progress or (lambda _desc: None)
    for ep in endpoints:
        warm = ask(ep, settings, WARMUP, min(settings.warmup_tokens, settings.max_tokens), settings.seed)
        ep.counters_in_reply = warm.counters is not None
        tick(f"warm-up {config_id(ep.label)}")
    runs: list[dict] = []
    try:
        for r in range(settings.repeats):
            for i, prompt in enumerate(settings.prompts):
                seed = settings.seed + 1000 * r + i  # as the local configurations' runs
                for ep in rotated(endpoints, r * len(settings.prompts) + i):
                    reply = ask(ep, settings, prompt, prompt.get("max_tokens", settings.max_tokens), seed)
                    runs.append(run_record(ep, prompt, r, seed, reply))
                    tick(f"{config_id(ep.label)} {prompt['id']} r{r + 1}")
                if on_round is not None:
                    on_round(runs)
    except KeyboardInterrupt:
        return runs, True
    return runs, False


def run_record(ep: client.Endpoint, prompt: dict, repeat: int, seed: int, reply: client.Reply) -> dict:
    c = reply.counters or {}
    return {"config": config_id(ep.label), "endpoint": ep.label, "prompt": prompt["id"],
            "category": prompt.get("category", ""), "round": repeat, "seed": seed,
            "n_tokens": reply.n_tokens, "tokens_from": reply.tokens_from, "ttft_s": reply.ttft,
            "latency_s": reply.seconds, "finish_reason": reply.finish_reason, "counters": reply.counters,
            "k": c.get("k"), "output_sha1": hashlib.sha1(reply.text.encode()).hexdigest()[:12]}


# --- pooling ----------------------------------------------------------------------------------

def _pooled(rs: list[dict], category: str) -> dict:
    """One row of the per-category table for one endpoint's runs (the keys of by_category's rows)."""
    tokens = sum(r["n_tokens"] for r in rs)
    after = [(r["n_tokens"] - 1, r["latency_s"] - r["ttft_s"]) for r in rs if r["n_tokens"] > 1]
    decode_s = sum(s for _, s in after)
    latency = sum(r["latency_s"] for r in rs)
    counted = [r["counters"] for r in rs if r.get("counters") and r["counters"].get("drafted") is not None]
    drafted = sum(c["drafted"] for c in counted)
    passes = [r["counters"].get("target_passes") for r in rs if r.get("counters")]
    ks = {r.get("k") for r in rs} - {None}
    return {"config": rs[0]["config"], "endpoint": rs[0]["endpoint"], "draft": KIND,
            "target": rs[0]["config"], "k": ks.pop() if len(ks) == 1 else None, "category": category,
            "n_runs": len(rs),
            "n_tokens": tokens, "seconds": decode_s,
            "tokens_per_second": sum(n for n, _ in after) / decode_s if decode_s > 0 else None,
            "end_to_end_tokens_per_second": tokens / latency if latency > 0 else None,
            "speedup": None, "end_to_end_speedup": None, "normalised_speedup": None, "n_normalised": 0,
            "acceptance_rate": sum(c["accepted"] or 0 for c in counted) / drafted if drafted else None,
            "tokens_per_target_pass": (tokens / sum(passes) if passes and len(passes) == len(rs)
                                       and None not in passes and sum(passes) else None),
            "counters_from": sorted({c["source"] for c in counted}) or None, "sources": None}


def category_rows(runs: list[dict]) -> list[dict]:
    """Per (endpoint, category) in first-seen order, then every endpoint's "all" row."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        for cat in (r.get("category") or "", ALL):
            groups.setdefault((cat, r["config"]), []).append(r)
    cats = list(dict.fromkeys(r.get("category") or "" for r in runs))
    return [_pooled(rs, cat) for c in [*cats, ALL] for (cat, _), rs in groups.items() if cat == c]


def merge_categories(local: list[dict], remote: list[dict]) -> list[dict]:
    """Both tables in one: each category's local rows, then its endpoints' rows; "all" last."""
    cats = [c for c in dict.fromkeys(r["category"] for r in [*local, *remote]) if c != ALL] + [ALL]
    return [r for c in cats for r in [*local, *remote] if r["category"] == c]


def latency_rows(local_runs: list[dict], remote_runs: list[dict]) -> list[dict]:
    """Per (configuration, category) and overall: requests, tokens per request, time to first
    token and latency (medians; a local run's latency is its prefill and decoding, its first token
    is not timed apart)."""
    rows = []
    both = [(r, r["t_prefill"] + r["seconds"], None) for r in local_runs] + \
           [(r, r["latency_s"], r["ttft_s"]) for r in remote_runs]
    cats = list(dict.fromkeys(r.get("category") or "" for r, _, _ in both))
    for cat in [*cats, ALL]:
        configs = list(dict.fromkeys(r["config"] for r, _, _ in both))
        for config in configs:
            sel = [(r, lat, ttft) for r, lat, ttft in both
                   if r["config"] == config and (cat == ALL or (r.get("category") or "") == cat)]
            if not sel:
                continue
            ttfts = [t for _, _, t in sel if t is not None]
            rows.append({"config": config, "category": cat, "n_requests": len(sel),
                         "tokens_per_request": float(np.mean([r["n_tokens"] for r, _, _ in sel])),
                         "ttft_s": spread(ttfts), "latency_s": spread([lat for _, lat, _ in sel])})
    return rows


def overall(ep: client.Endpoint, runs: list[dict]) -> dict:
    """One endpoint over all its runs: spreads of its per-request numbers, and where counts came from."""
    rs = [r for r in runs if r["endpoint"] == ep.label]
    tps = [(r["n_tokens"] - 1) / (r["latency_s"] - r["ttft_s"]) for r in rs
           if r["n_tokens"] > 1 and r["latency_s"] > r["ttft_s"]]
    return ep.public() | {"n_requests": len(rs), "tokens_per_second": spread(tps),
                          "ttft_s": spread([r["ttft_s"] for r in rs]),
                          "latency_s": spread([r["latency_s"] for r in rs]),
                          "tokens_from": sorted({r["tokens_from"] for r in rs}),
                          "counters_from": sorted({r["counters"]["source"] for r in rs if r.get("counters")})}


# --- the record -------------------------------------------------------------------------------

def empty_record(settings: Settings, command: str | None) -> dict:
    """A compare record with no local configuration, for endpoints alone."""
    from specmac.compare.results import provenance

    return {"format": FORMAT, "provenance": provenance(command, models=[]), "settings": settings.to_dict(),
            "backends": {}, "interrupted": False, "complete": True, "predictions": {}, "skipped_pairs": [],
            "results": [], "categories": [], "hybrid_checks": [], "runs": []}


def with_endpoints(record: dict, endpoints: list[client.Endpoint], runs: list[dict], *, interrupted: bool,
                   complete: bool) -> dict:
    """The compare record (local configurations, or ``empty_record``) with the endpoints' runs,
    their rows in the per-category table, the latency table and where each endpoint was."""
    out = dict(record)
    local = [r for r in record["categories"] if r.get("draft") != KIND]
    out["categories"] = merge_categories(local, category_rows(runs))
    out["latency"] = latency_rows(record["runs"], runs)
    out["endpoints"] = [overall(ep, runs) for ep in endpoints]
    out["endpoint_runs"] = runs
    out["provenance"] = dict(record["provenance"], endpoints=[ep.public() for ep in endpoints])
    out["settings"] = dict(record["settings"], endpoints=[ep.label for ep in endpoints])
    out["interrupted"] = bool(record.get("interrupted")) or interrupted
    out["complete"] = bool(record.get("complete", True)) and complete
    return out


def run_endpoints(record: dict, endpoints: list[client.Endpoint], settings: Settings, *,
                  progress: Callable[[str], None] | None = None,
                  checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Measure the endpoints after ``record``'s local rounds and return the whole record;
    ``checkpoint`` gets it after every round ("complete": false)."""
    save = None if checkpoint is None else (
        lambda runs: checkpoint(with_endpoints(record, endpoints, runs, interrupted=False, complete=False)))
    runs, interrupted = measure(endpoints, settings, progress, save)
    if not runs and not record["runs"]:
        raise SpecmacError("interrupted before the first round was complete: nothing to report")
    return with_endpoints(record, endpoints, runs, interrupted=interrupted, complete=not interrupted)
