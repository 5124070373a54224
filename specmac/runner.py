"""What the CLI commands do, kept out of cli.py so that it stays parse-call-render."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from specmac.api import Pair
from specmac.drafters import Drafter
from specmac.errors import SpecmacError
from specmac.metrics import RunStats
from specmac.sampling import SamplingParams

LEGEND = {"accepted": "accepted draft", "corrected": "target correction",
          "bonus": "bonus token", "target": "target-only"}
STYLE = {"accepted": "green", "corrected": "red", "bonus": "cyan", "target": None}


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    if prompt is not None and prompt_file:
        raise SpecmacError("give the prompt as an argument or with --prompt-file, not both")
    if prompt_file:
        try:
            prompt = Path(prompt_file).read_text()
        except OSError as e:
            raise SpecmacError(f"cannot read --prompt-file {prompt_file}: {e.strerror}") from None
    elif prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if not prompt:
        raise SpecmacError("the prompt is empty: pass PROMPT, --prompt-file FILE, or pipe text in")
    return prompt


def apply_chat_template(target, prompt: str) -> str:
    template = getattr(target, "apply_chat_template", None)
    if template is None:
        raise SpecmacError(f"the {target.name} backend cannot apply a chat template: drop --chat")
    return template(prompt)


class TextStream:
    """Decodes the growing id list and writes only what is new (multi-byte chars held back)."""

    def __init__(self, decode, color: bool) -> None:
        self.decode, self.color = decode, color
        self.ids: list[int] = []
        self.shown = ""

    def push(self, ids: list[int], kinds: list[str]) -> None:
        for t, kind in zip(ids, kinds):
            self.ids.append(t)
            text = self.decode(self.ids)
            if text.endswith("\ufffd") or not text.startswith(self.shown):
                continue
            new, self.shown = text[len(self.shown):], text
            style = STYLE[kind] if self.color else None
            click.echo(click.style(new, fg=style) if style else new, nl=False)
        sys.stdout.flush()


def stats_block(stats: RunStats, speculative: bool) -> list[str]:
    s = stats.to_dict(speculative)
    tps = s["tokens_per_second"] or 0.0
    lines = [f"{s['n_tokens']} tokens in {s['seconds']:.2f} s, {tps:.1f} tokens/s"
             f" ({s['n_target_passes']} target passes, finish: {s['finish_reason']})"]
    if speculative:
        rate = s["acceptance_rate"]
        lines.append(f"acceptance {rate:.1%}" if rate is not None else "acceptance n/a (no drafts)")
        lines[-1] += f", {s['tokens_per_target_pass']:.2f} tokens per target pass (k={s['k']})"
        per = " ".join("-" if a is None else f"{a:.2f}" for a in s["per_position_acceptance"])
        lines.append(f"per-position acceptance: {per}")
    total = s["seconds"] or 1.0
    ts = s["time_split"]
    lines.append(f"time: draft {ts['draft'] / total:.0%}, verify {ts['verify'] / total:.0%}, "
                 f"other {ts['other'] / total:.0%}")
    return lines


def run(pair: Pair, prompt: str, *, params: SamplingParams, k, max_tokens: int, seed: int,
        baseline: bool, as_json: bool, color: bool, meta: dict) -> int:
    """Stream one generation (and optionally the baseline); return the exit status."""
    ids = pair.encode(prompt)
    stats = RunStats(k=k if isinstance(k, int) else "auto")
    out = TextStream(pair.target.decode, color)
    code, token_ids = 0, []
    t0 = time.perf_counter()
    try:
        for event in pair.stream(ids, params=params, max_tokens=max_tokens, k=k, seed=seed):
            stats.add(event)
            token_ids += event.tokens
            if not as_json:
                out.push(event.tokens, event.kinds)
    except KeyboardInterrupt:
        code = 130
        stats.finish_reason = "interrupted"
    wall = time.perf_counter() - t0
    result = {"prompt": prompt, "text": pair.target.decode(token_ids), "token_ids": token_ids,
              **stats.to_dict(pair.speculative), "wall_seconds": wall,
              "sampling": params.to_dict(), "seed": seed, **pair.info(), **meta}
    if baseline and code == 0:
        base = Pair(pair.target, Drafter()).generate(ids, params=params, max_tokens=max_tokens,
                                                     seed=seed)
        b = base.stats.tokens_per_second or 0.0
        result["baseline"] = base.stats.to_dict(speculative=False)
        result["speedup"] = (stats.tokens_per_second or 0.0) / b if b else None
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
        return code
    click.echo("")
    if color and pair.speculative:
        click.echo("legend: " + " ".join(click.style(v, fg=STYLE[k_]) for k_, v in LEGEND.items()
                                         if STYLE[k_]), err=True)
    for line in stats_block(stats, pair.speculative):
        click.echo(line, err=True)
    if "baseline" in result:
        b = result["baseline"]["tokens_per_second"] or 0.0
        sp = result["speedup"]
        click.echo(f"baseline (target only): {b:.1f} tokens/s, speedup "
                   f"{'n/a' if sp is None else f'{sp:.2f}x'}", err=True)
    return code


def verify(pair: Pair, *, params: SamplingParams, k: int, tokens: int, length: int, seed: int,
           as_json: bool) -> None:
    from rich.progress import Progress

    from specmac.proof import two_sample_check

    if as_json or not sys.stderr.isatty():
        res = two_sample_check(pair, params=params, n_tokens=tokens, k=k, length=length, seed=seed)
    else:
        with Progress(transient=True) as bar:
            task = bar.add_task("sampling both methods", total=tokens)
            res = two_sample_check(pair, params=params, n_tokens=tokens, k=k, length=length,
                                   seed=seed, progress=lambda n: bar.advance(task, n))
    res.update(pair.info())
    res["verdict"] = verdict(res)
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
        return
    rows = [("chi-square", f"{res['chi2']:.1f} on {res['dof']} dof"),
            ("p-value", f"{res['p_value']:.3g}"),
            ("samples per method", f"{res['n_samples_per_method']} x {length} tokens"),
            ("min detectable TV (80% power)", f"{res['min_detectable_tv']:.3f}"),
            ("greedy agreement", f"{res['greedy_agreement']:.0%} of {len(res['contexts'])} contexts")]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        click.echo(f"{name:<{width}}  {value}")
    click.echo(res["verdict"])


def verdict(res: dict) -> str:
    tv = res["min_detectable_tv"]
    if res["p_value"] < 0.01:
        head = (f"FAIL: speculative and target-only samples differ (p = {res['p_value']:.2g}); "
                "the output is not the target's distribution")
    else:
        head = (f"PASS: no difference detected (p = {res['p_value']:.2g}); a shift of total "
                f"variation >= {tv:.3f} over these {res['n_categories']} categories would have "
                "been caught 80% of the time, smaller ones might not")
    if res["greedy_agreement"] < 1:
        head += ("; greedy sequences differ in some contexts (batched vs serial round-off in low "
                 "precision; see probe-parallelism)")
    return head


def list_backends(as_json: bool) -> None:
    from specmac.backends import backend_class, library_version, missing_requirements, registry

    rows = []
    for name, target in registry().items():
        missing = missing_requirements(name)
        row = {"name": name, "entry": target, "installed": not missing, "library": None,
               "version": None, "devices": [], "missing": missing}
        if not missing:
            try:
                cls = backend_class(name)
                row.update(library=cls.library, version=library_version(cls.library),
                           devices=cls.devices())
            except SpecmacError as e:
                row.update(installed=False, missing=[str(e)])
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        state = (f"{r['library']} {r['version']}, devices: {', '.join(r['devices'])}"
                 if r["installed"] else f"not installed (pip install 'specmac[{r['name']}]')")
        click.echo(f"{r['name']:<10} {state}")
