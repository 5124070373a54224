"""``specmac models``: what the converted-model cache holds, converting a GGUF into it, and clearing
it. A broken cache (a malformed sidecar, a link, a stray file, an entry that cannot be read or
removed) is listed as what it is, and cleared as far as it can be, saying what was and was not
removed."""

from __future__ import annotations

from pathlib import Path

import click

from specmac.backends.conversion.convert import HF_DTYPES
from specmac.cli.app import DISK_FULL, UserError, emit_json, main


def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _text(value) -> str | None:
    return None if value is None else str(value)


def _rows() -> list[dict]:
    """One row per thing in the cache folder; ``problem`` says why one is not a usable entry."""
    from specmac.backends.conversion import cache

    rows = []
    try:
        found = list(cache.scan())
    except OSError as e:
        raise UserError(f"cannot read the model cache {cache.cache_root()} ({e.strerror}): point "
                        "SPECMAC_CACHE at a readable folder") from None
    for entry, meta in found:
        row = {"name": entry.name, "path": str(entry), "bytes": cache.entry_bytes(entry), "what": None,
               "source": None, "source_sha256": None, "created_utc": None, "problem": None}
        if meta is cache.LEFTOVER:
            row["what"] = "unfinished conversion"
        elif isinstance(meta, dict):
            row.update({k: _text(meta.get(k)) for k in ("what", "source", "source_sha256", "created_utc")})
        else:
            row["what"], row["problem"] = f"not usable: {meta}", meta
        rows.append(row)
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
        source = f"from {r['source']} (sha256 {(r['source_sha256'] or '?')[:12]})" if r["source"] else ""
        click.echo(f"{_size(r['bytes']):>9}  {r['name']}\n           {r['what'] or '?'} {source}".rstrip())
    total = sum(r["bytes"] or 0 for r in rows)
    click.echo(f"{_size(total)} in {len(rows)} entries under {cache.cache_root()}")
    bad = [r for r in rows if r["problem"]]
    if bad:
        click.echo(f"{len(bad)} not usable (`specmac models clear NAME` removes one): "
                   + "; ".join(f"{r['name']}: {r['problem']}" for r in bad), err=True)


@models.command()
@click.argument("names", nargs=-1)
@click.option("--all", "clear_all", is_flag=True, help="Remove every entry.")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def clear(names, clear_all, as_json):
    """Remove entries by NAME (as `specmac models` lists them), or all of them with --all; they
    are made again when next needed. A link is removed as a link (what it points to stays)."""
    from specmac.backends.conversion import cache

    if not names and not clear_all:
        raise UserError("say what to remove: entry names (see `specmac models`) or --all")
    rows = {r["name"]: r for r in _rows()}
    unknown = [n for n in names if n not in rows]
    if unknown:
        raise UserError(f"no cache entry named {', '.join(unknown)}: `specmac models` lists them")
    removed, failed = [], {}
    for name in (list(rows) if clear_all else list(dict.fromkeys(names))):
        try:
            cache.remove(cache.cache_root() / name)
            removed.append(name)
        except OSError as e:
            failed[name] = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
    freed = sum(rows[n]["bytes"] or 0 for n in removed)
    if as_json:
        emit_json({"removed": removed, "bytes": freed, "not_removed": failed})
    else:
        click.echo(f"removed {len(removed)} entries ({_size(freed)}) from {cache.cache_root()}"
                   + (f": {', '.join(removed)}" if removed else ""))
    if failed:
        raise UserError(f"could not remove {len(failed)} of {len(removed) + len(failed)}: "
                        + "; ".join(f"{n}: {why}" for n, why in failed.items()))


@models.command()
@click.argument("file", type=click.Path(path_type=Path), metavar="FILE.gguf")
@click.option("--out", type=click.Path(path_type=Path), metavar="DIR",
              help="Also place the folder at DIR, a new or empty folder (hard links to the cached "
                   "files; a copy across file systems).")
@click.option("--dtype", type=click.Choice(HF_DTYPES), default="float32", show_default=True,
              help="Precision the GGUF's weights are dequantised to.")
@click.option("--json", "as_json", is_flag=True, help="Print the folder and its source as JSON.")
def convert(file, out, dtype, as_json):
    """Turn FILE.gguf into a Hugging Face folder (config, safetensors weights, tokenizer), made once
    in the cache, where torch and mlx find it when given the GGUF; prints the folder's path. Needs
    pip install 'specmac[convert]'."""
    from specmac.backends.conversion import convert as conversion
    from specmac.files import place_folder

    source = conversion.check_gguf(file)
    if out is not None:
        _check_out(out)
    folder, meta = conversion.gguf_to_hf(source, dtype)
    linked = None
    if out is not None:
        try:
            linked = place_folder(folder, out)
        except OSError as e:
            if e.errno in DISK_FULL:
                raise
            raise UserError(f"cannot place the folder at --out {out} ({e.strerror or e}): it is made, "
                            f"in {folder}") from None
    if as_json:
        emit_json({"path": str(folder), "out": None if out is None else str(out),
                   **{k: meta.get(k) for k in ("what", "source", "source_sha256", "created_utc")}})
        return
    click.echo(f"{folder}\n  {meta.get('what')} from {meta.get('source')} "
               f"(sha256 {str(meta.get('source_sha256'))[:12]})")
    if out is not None:
        click.echo(f"  {'linked' if linked else 'copied'} into {out}")


def _check_out(out: Path) -> None:
    """--out is a new or an empty folder: checked before converting, so a mistake costs nothing."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"--out {out} is {'a link' if out.is_symlink() else 'not a folder'}: give a new "
                        "or empty folder")
    try:
        full = out.is_dir() and any(out.iterdir())
    except OSError as e:
        raise UserError(f"cannot read --out {out} ({e.strerror}): give a new or empty folder") from None
    if full:
        raise UserError(f"--out {out} is not empty: give a new or empty folder (nothing is written over "
                        "other files)")
