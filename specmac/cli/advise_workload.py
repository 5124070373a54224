"""advise's workload in the CLI: which prompts (--prompt, --prompts FILE, or the packaged workload),
whether through the chat template, and the per-category tables of its reports."""

from __future__ import annotations

import click

from specmac.cli.app import UserError

TOP = 3  # configurations of the best group shown per category without --by-category


def advise_prompts(prompts: tuple[str, ...], prompts_path: str | None, turns: str,
                   chat: bool | None) -> tuple[list, bool | None, dict]:
    """(prompts, chat, what they are): --prompt texts, a --prompts file (compare's formats) or, with
    neither, the packaged workload with the chat template where the target has one (--no-chat:
    plain text; --chat: the template, refused where a target has none)."""
    from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts

    if prompts and prompts_path:
        raise UserError("give --prompt TEXT or --prompts FILE, not both")
    if prompts:
        return list(prompts), bool(chat), {"source": "--prompt", "chat": bool(chat)}
    path = prompts_path or PACKAGED_WORKLOAD
    items = read_prompts(path, None, turns)
    chat = chat if prompts_path is None else bool(chat)  # None: the template where the target has one
    return items, chat, {"source": path, "turns": turns, "chat": "auto" if chat is None else chat}


def prompts_line(r: dict) -> str:
    """What the acceptance was measured on, in one line."""
    ref, asked = r["reference"], r.get("prompts", {})
    cats = [c for c in ref.get("categories", []) if c["category"]]
    what = [f"{ref['prompts']} prompts" + (f", {len(cats)} categories" if cats else "")]
    if ref.get("chat"):
        what.append("through the target's chat template")
    elif asked.get("chat") == "auto":
        what.append("plain text: the target has no chat template")
    if ref.get("cut"):
        what.append(f"{ref['cut']} cut to their last {ref['cut_to']} tokens to fit the context window")
    if ref.get("unanswered"):
        what.append(f"the target wrote nothing after {', '.join(ref['unanswered'])}")
    return f"prompts: {asked.get('source', 'given')} ({'; '.join(what)})"


def _name(e: dict) -> str:
    return (f"{e['draft_label']} \u2192 {e['target_label']}, K = {e['k']}" if e["k"]
            else f"plain {e['target_label']}")


def _table(rows: list[tuple[str, dict]], ref: dict, overall: dict) -> None:
    sizes = {c["category"]: c for c in ref["categories"]}
    click.echo(f"  {'category':<20} {'prompts':>7} {'tokens':>6} {'tok/s':>9} {'speedup':>8} {'α':>5} "
               f"{'tokens/pass':>11} {'best K':>6}")
    for cat, c in rows:
        a = f"{c['alpha']:.2f}" if c["alpha"] is not None else "-"
        click.echo(f"  {cat or '(none)':<20} {sizes[cat]['prompts']:>7} {sizes[cat]['tokens']:>6} "
                   f"{c['predicted_tokens_per_second']:>9.1f} {c['predicted_speedup']:>7.2f}x {a:>5} "
                   f"{c['tokens_per_pass']:>11.2f} {c['best_k']:>6}")
    a = f"{overall['alpha']:.2f}" if overall.get("alpha") is not None else "-"
    click.echo(f"  {'overall (by tokens)':<20} {ref['prompts']:>7} {ref['tokens']:>6} "
               f"{overall['predicted_tokens_per_second']:>9.1f} {overall['predicted_speedup']:>7.2f}x {a:>5} "
               f"{overall['tokens_per_pass']:>11.2f}")


def print_ranking_categories(r: dict, every: bool) -> None:
    """Per category, for the top configurations of the best group (``every``: all speculative
    configurations of every group), and which configuration each category is best with."""
    ref = r["reference"]
    if len(ref.get("categories", [])) < 2 or not r["ranking"]:
        return
    first = r["ranking"][0]["group"]
    # a hybrid predicted as its lookup alone would repeat the lookup's table
    shown = [e for e in r["ranking"] if e["k"] and (every or e["group"] == first)
             and (every or e.get("model_started") is not False)]
    for e in shown if every else shown[:TOP]:
        click.echo(f"\nper category: {_name(e)} (speedup over {e['baseline']})")
        _table(list(e["by_category"].items()), ref, e)
    mine = [e for e in r["ranking"] if e["group"] == first]
    click.echo(f"\nbest per category in {first} (each at the category's own best K):")
    for c in ref["categories"]:
        cat = c["category"]
        top = max(mine, key=lambda e: e["by_category"][cat]["best_k_tokens_per_second"])
        b = top["by_category"][cat]
        click.echo(f"  {cat or '(none)':<20} {_name({**top, 'k': b['best_k']})}  "
                   f"{b['best_k_tokens_per_second']:.1f} tok/s {b['best_k_speedup']:.2f}x")


def print_pair_categories(r: dict) -> None:
    """The one pairing's prediction per category at its best K."""
    ref = r["reference"]
    if len(ref.get("categories", [])) < 2:
        return
    click.echo(f"\nper category at K = {r['best_k']} (best K per category beside it):")
    row = r["table"][r["best_k"] - 1]
    overall = {"predicted_tokens_per_second": 1e3 / r["target_only_ms_per_token"] * row["predicted_speedup"],
               "predicted_speedup": row["predicted_speedup"], "alpha": r["alpha"],
               "tokens_per_pass": row["tokens_per_pass"]}
    _table(list(r["by_category"].items()), ref, overall)
