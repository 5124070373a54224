"""compare's --endpoint: parse, reach every server before anything is written, measure with
progress lines (``specmac.compare.endpoint`` does the work)."""

from __future__ import annotations

from collections.abc import Callable

import click

from specmac.compare import client


def parse(values: tuple[str, ...]) -> list[client.Endpoint]:
    """Every --endpoint, checked as a URL (no request yet)."""
    return client.parse_all(values)


def connect(endpoints: list[client.Endpoint]) -> None:
    from specmac.compare.endpoint import connect_all

    connect_all(endpoints, say=lambda line: click.echo(f"compare: {line}", err=True))


def measure(record: dict | None, settings, endpoints: list[client.Endpoint], command: str,
            checkpoint: Callable[[dict], None], progress_lines: Callable) -> dict:
    """The endpoints' rounds after the local ones (``record``; None: endpoints alone), with
    ``progress_lines(total, n_lines)``'s lines (compare's PlainProgress)."""
    from specmac.compare import endpoint

    total = len(endpoints) * (1 + len(settings.prompts) * settings.repeats)
    click.echo(f"{len(endpoints)} endpoint{'s' * (len(endpoints) != 1)}, {len(settings.prompts)} prompts x "
               f"{settings.repeats} repeats", err=True)
    lines = progress_lines(total, max(len(endpoints), 4))
    try:
        return endpoint.run_endpoints(record or endpoint.empty_record(settings, command), endpoints, settings,
                                      progress=lines.tick, checkpoint=checkpoint)
    finally:
        client.close(endpoints)
