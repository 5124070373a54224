"""``specmac models``: what the converted-model cache holds, and clearing it."""

from __future__ import annotations

import click

from specmac.cli.app import UserError, emit_json, main


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _rows() -> list[dict]:
    from specmac.backends.conversion import cache

    rows = [{"name": entry.name, "path": str(entry), "bytes": cache.entry_bytes(entry),
             "what": meta.get("what"), "source": meta.get("source"),
             "source_sha256": meta.get("source_sha256"), "created_utc": meta.get("created_utc")}
            for entry, meta in cache.entries()]
    rows += [{"name": p.name, "path": str(p), "bytes": cache.entry_bytes(p), "what": "unfinished conversion",
              "source": None, "source_sha256": None, "created_utc": None} for p in cache.leftovers()]
    return rows


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@click.pass_context
def models(ctx, as_json):
    """Converted models in the cache ($SPECMAC_CACHE/converted or ~/.cache/specmac/converted): each
    GGUF turned into a folder for torch/mlx, folder turned into a GGUF, or GGUF requantised, made
    once and reused. With no subcommand, list them."""
    if ctx.invoked_subcommand is not None:
        return
    from specmac.backends.conversion import cache

    rows = _rows()
    if as_json:
        emit_json({"cache": str(cache.cache_root()), "entries": rows})
        return
    if not rows:
        click.echo(f"no converted models in {cache.cache_root()}")
        return
    for r in rows:
        source = f"from {r['source']} (sha256 {r['source_sha256'][:12]})" if r["source"] else ""
        click.echo(f"{_size(r['bytes']):>9}  {r['name']}\n           {r['what']} {source}".rstrip())
    total = sum(r["bytes"] for r in rows)
    click.echo(f"{_size(total)} in {len(rows)} entries under {cache.cache_root()}")


@models.command()
@click.argument("names", nargs=-1)
@click.option("--all", "clear_all", is_flag=True, help="Remove every entry.")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def clear(names, clear_all, as_json):
    """Remove entries by NAME (as `specmac models` lists them), or all of them with --all; they
    are made again when next needed."""
    from specmac.backends.conversion import cache

    if not names and not clear_all:
        raise UserError("say what to remove: entry names (see `specmac models`) or --all")
    rows = {r["name"]: r for r in _rows()}
    unknown = [n for n in names if n not in rows]
    if unknown:
        raise UserError(f"no cache entry named {', '.join(unknown)}: `specmac models` lists them")
    chosen = list(rows) if clear_all else list(dict.fromkeys(names))
    for name in chosen:
        cache.remove(cache.cache_root() / name)
    freed = sum(rows[n]["bytes"] for n in chosen)
    if as_json:
        emit_json({"removed": chosen, "bytes": freed})
    else:
        click.echo(f"removed {len(chosen)} entries ({_size(freed)}) from {cache.cache_root()}")
