"""summary.md's sections on endpoints (``specmac compare --endpoint``): each server's numbers, time
to first token and latency per category beside the local configurations', and how they were
measured. Read from the record alone, so ``specmac report`` redraws them."""

from __future__ import annotations

from specmac.compare.categories import ALL


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "\u2013" if v is None else f"{v:{spec}}{unit}"


def _med(stat: dict | None, key: str = "median") -> float | None:
    return stat[key] if stat else None


def headline(record: dict) -> str | None:
    """The answer of a record that measured endpoints and no local configuration (else None)."""
    eps = [e for e in record.get("endpoints") or [] if _med(e.get("tokens_per_second")) is not None]
    if not eps or record["results"]:
        return None
    top = max(eps, key=lambda e: _med(e["tokens_per_second"]))
    return (f"**Fastest endpoint: {top['label']}** ({top['model']}): {_med(top['tokens_per_second']):.1f} "
            f"tokens/s after the first token, first token after {_med(top['ttft_s']):.2f} s (medians).")


def markdown(record: dict) -> list[str]:
    """The endpoint sections ([] for a record without endpoints)."""
    eps = record.get("endpoints") or []
    if not eps:
        return []
    out = ["## Endpoints", "",
           "Each OpenAI-compatible server, over all its requests (medians; p25\u2013p75 in brackets). Its "
           "rows in the per-category table pool its requests: tokens/s counts the tokens after the first "
           "over the time from the first streamed piece to the last, end to end all tokens over the whole "
           "requests (time to first token included); acceptance is from the counters the server reports.",
           "", "| endpoint | model | requests | tokens/s | time to first token | latency | tokens counted "
           "from | speculative counters from |", "|---|---|---:|---:|---:|---:|---|---|"]
    for e in eps:
        counted = ", ".join(e["counters_from"]) or "none reported"
        out.append(f"| {e['label']} ({e['url']}) | {e['model']} | {e['n_requests']} | "
                   f"{_span(e['tokens_per_second'], '.1f')} | {_span(e['ttft_s'], '.3f', ' s')} | "
                   f"{_span(e['latency_s'], '.2f', ' s')} | {', '.join(e['tokens_from']) or '–'} | "
                   f"{counted} |")
    out += [""] + latency_markdown(record.get("latency") or []) + method(record)
    return out


def _span(stat: dict | None, spec: str, unit: str = "") -> str:
    if not stat:
        return "\u2013"
    return f"{stat['median']:{spec}}{unit} [{stat['p25']:{spec}}\u2013{stat['p75']:{spec}}]"


def latency_markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["## Per category: time to first token and latency", "",
           "Per request, medians: an endpoint's time to its first streamed piece and to its last byte; a "
           "local configuration's latency is the target's prefill and the decoding (its first token is "
           "not timed apart: \u2013).", "",
           "| category | configuration | requests | tokens/request | time to first token | latency |",
           "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        cat = f"**{r['category']}**" if r["category"] == ALL else r["category"] or "(none)"
        out.append(f"| {cat} | {r['config']} | {r['n_requests']} | {r['tokens_per_request']:.1f} | "
                   f"{_fmt(_med(r['ttft_s']), '.3f', ' s')} | {_fmt(_med(r['latency_s']), '.2f', ' s')} |")
    return out + [""]


def method(record: dict) -> list[str]:
    eps = record.get("endpoints") or []
    st = record["settings"]
    order = ("after the local configurations' rounds, in rounds of their own" if record["results"]
             else "in rounds")
    route = ("the chat endpoint (the prompt's messages)" if st.get("chat")
             else "the completions endpoint (the prompt's text)")
    return ["How the endpoints were measured:", "",
            f"- {len(eps)} endpoint{'s' * (len(eps) != 1)}, {order}: each (prompt, repeat) asks every "
            "endpoint once, one request at a time, in an order that moves on by one each round; one warm-up "
            f"request of {st['warmup_tokens']} tokens per endpoint (\"Hello\") is discarded. A server that "
            "keeps prompt caches answers a repeated prompt sooner (repeats after the first).",
            f"- Each request streamed through {route}, the same sampling settings and seeds as the local "
            f"runs, max_tokens {st['max_tokens']}; "
            "the server applies its own defaults to what specmac does not send (top_k, min_p unless set).",
            "- Tokens: the server's usage (completion_tokens), else llama-server's timings, else the number "
            "of streamed chunks (one token each on most servers). Speculative counters: specmac's "
            "usage.speculative, llama-server's timings (draft_n, draft_n_accepted), or vLLM's /metrics "
            "counters read before and after each request.",
            "- Times include the network between this machine and the server: on another host they are what "
            "a client there sees, not the server's own.", ""]
