"""``specmac verify --endpoint URL --against URL``: is a server's speculation lossless? Both servers
get the same prompts (``specmac.lossless.endpoint`` does the work); exit status 1 on FAIL."""

from __future__ import annotations

import sys

import click

from specmac.cli.app import UserError, sampling_params
from specmac.cli.profile import given
from specmac.cli.render import show_verdict, tenths

# verify's flags that describe a local pair: a server chooses its own model, draft and K
LOCAL = {"target": "--target", "draft": "--draft", "target_model": "--target-model",
         "draft_model": "--draft-model", "target_opt": "--target-opt", "draft_opt": "--draft-opt",
         "k_text": "--k", "tokens": "--tokens", "exact": "--exact", "sampler": "--sampler"}


def check(endpoint: str | None, against: str | None) -> None:
    if against and not endpoint:
        raise UserError("--against names the server to compare --endpoint with: add --endpoint URL (the "
                        "server whose speculation is checked)")
    if endpoint and not against:
        raise UserError("--endpoint needs --against URL: the server to compare it with (the same model "
                        "without speculation)")
    for name, flag in LOCAL.items():
        if given(name):
            raise UserError(f"{flag} describes a local pair: with --endpoint the servers choose their own "
                            f"model, draft and K; drop {flag}")


def verify_endpoints(endpoint: str, against: str, *, length: int | None, sequences: int | None,
                     tolerance: float | None, as_json: bool, kw: dict) -> None:
    from specmac.compare import client
    from specmac.lossless import endpoint as ep

    check(endpoint, against)
    params = sampling_params(kw)
    a, b = client.parse(endpoint, "endpoint"), client.parse(against, "against")
    try:
        client.connect(a)
        client.connect(b)
        n, sampled = sequences or ep.DEFAULT_SEQUENCES, not params.greedy
        length = length or (ep.DEFAULT_LENGTH if sampled else ep.GREEDY_TOKENS)
        planned = ep.planned_tv(n, length, len(ep.DEFAULT_CONTEXTS)) if sampled else None
        if planned is not None and not as_json:
            click.echo(f"Power: {n} sequences per context from each server ({len(ep.DEFAULT_CONTEXTS)} "
                       f"contexts, {length} tokens each) catch, with 80% power, a shift of total variation "
                       f">= {planned:.3f} at one position after one context (where it has two categories; "
                       "more need more).")
        tol = ep.TOLERANCE if tolerance is None else tolerance
        res = ep.greedy_check(a, b, max_tokens=ep.GREEDY_TOKENS if sampled else length, tolerance=tol)
        if sampled:
            tick = None if as_json else tenths(2 * n * len(ep.DEFAULT_CONTEXTS), "requests")
            res["sampled"] = ep.sampled_check(a, b, client.sampling_fields(params), n=n, length=length,
                                              seed=kw["seed"], progress=tick)
    finally:
        client.close([a, b])
    res |= {"endpoint": a.public(), "against": b.public(), "sampling": params.to_dict()}
    text, failed = ep.verdict(res)
    res["verdict"] = text
    show_verdict(res, [] if as_json else ep.lines(res), as_json)
    sys.exit(1 if failed else 0)
