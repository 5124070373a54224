"""What the CLI prints: prompt input, streamed coloured text, the stats block, verify's table and
verdict, the backends list. Kept out of cli.py so that it stays parse-call-render."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import click

from specmac.api import Pair
from specmac.core.loop import Event
from specmac.core.policy import AdaptiveK, FixedK, KPolicy
from specmac.core.runstats import RunStats
from specmac.core.sampling import SamplingParams
from specmac.errors import BrokenBackend, SpecmacError

LEGEND = {"accepted": "accepted draft", "corrected": "target correction", "bonus": "bonus token"}
STYLE = {"accepted": "green", "corrected": "red", "bonus": "cyan", "target": None}
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


# --- input ---------------------------------------------------------------------------------

MAX_PROMPT_BYTES = 8 << 20  # far beyond any context window; /dev/zero must not fill the memory


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """PROMPT, else --prompt-file (``-`` = stdin), else piped stdin; empty is a user error. Text is
    strict UTF-8 (an error names the byte offset), at most MAX_PROMPT_BYTES, without a leading BOM."""
    if prompt is not None and prompt_file:
        raise SpecmacError("give the prompt as an argument or with --prompt-file, not both")
    if prompt_file == "-" or (prompt is None and not prompt_file and not sys.stdin.isatty()):
        prompt = _read_stdin()
    elif prompt_file:
        prompt = _read_text(prompt_file)
    elif prompt is not None:
        prompt = _check_argv(prompt)
    if prompt and prompt[0] == "\ufeff":
        prompt = prompt[1:]  # a byte-order mark is no part of the text
    if not prompt:
        raise SpecmacError("the prompt is empty: pass PROMPT, --prompt-file FILE, or pipe text in")
    return prompt


def _check_argv(prompt: str) -> str:
    """argv arrives with undecodable bytes as lone surrogates (surrogateescape): refuse them."""
    try:
        data = prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        offset = len(prompt[: e.start].encode("utf-8", "surrogateescape"))
        raise SpecmacError(f"PROMPT is not UTF-8 text (byte {offset}): pass UTF-8 text") from None
    return _decode(data, "PROMPT")


def _decode(data: bytes, what: str) -> str:
    if len(data) > MAX_PROMPT_BYTES:
        raise SpecmacError(f"{what} is larger than {MAX_PROMPT_BYTES >> 20} MiB, more than any context "
                           "window holds: give a shorter text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecmacError(f"{what} is not UTF-8 text (byte {e.start}): convert it to UTF-8") from None


def _read_stdin() -> str:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes underneath (tests)
        return _decode(sys.stdin.read(MAX_PROMPT_BYTES + 1).encode("utf-8", "surrogateescape"), "stdin")
    return _decode(stream.read(MAX_PROMPT_BYTES + 1), "stdin")


def read_prediction(path: str) -> str:
    """--prediction FILE: strict UTF-8 like a prompt file, without a leading BOM."""
    text = _read_text(path, "--prediction")
    return text[1:] if text[:1] == "\ufeff" else text


def _read_text(path: str, flag: str = "--prompt-file") -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
    except FileNotFoundError:
        raise SpecmacError(f"{flag} {path} does not exist: check the path") from None
    except OSError as e:
        raise SpecmacError(f"cannot read {flag} {path}: {e.strerror}") from None
    return _decode(data, f"{flag} {path}")


# --- streaming text --------------------------------------------------------------------------

class TextStream:
    """Writes the text of a growing id list as it becomes printable, coloured by token kind.

    Decodes only a short window (ids[prefix:]) per token, so the cost stays linear: text is held
    back while it ends in an incomplete UTF-8 sequence, and the window's first token gives the
    tokenizer the context it needs to decode leading spaces correctly.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], color: bool, out=None) -> None:
        self.decode, self.color = decode, color
        self.out = out
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] is the context already printed

    def push(self, ids: Sequence[int], kinds: Sequence[str]) -> None:
        for t, kind in zip(ids, kinds):
            self.ids.append(t)
            before = self.decode(self.ids[self.prefix : self.read])
            text = self.decode(self.ids[self.prefix :])
            if len(text) > len(before) and not text.endswith("\ufffd"):
                self._write(text[len(before) :], kind)
                self.prefix, self.read = self.read, len(self.ids)
        self._flush()

    def finish(self, all_ids: Sequence[int]) -> None:
        """Print whatever ``all_ids`` holds beyond what was shown (ids pushed or still held back)."""
        missing = list(all_ids[len(self.ids) :])
        self.ids.extend(missing)
        before = self.decode(self.ids[self.prefix : self.read])
        text = self.decode(self.ids[self.prefix :])
        if len(text) > len(before):
            self._write(text[len(before) :], "target")
        self._flush()

    def _write(self, text: str, kind: str) -> None:
        style = STYLE[kind] if self.color else None
        click.echo(click.style(text, fg=style) if style else text, nl=False, file=self.out,
                   color=self.color or None)

    def _flush(self) -> None:
        (self.out or sys.stdout).flush()


# --- signals ---------------------------------------------------------------------------------

@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while the final output is written, so that it is never cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# --- run -------------------------------------------------------------------------------------

def generate_events(pair: Pair, ids: list[int], on_event: Callable[[Event], None] | None = None,
                    **kw) -> tuple[list[Event], bool]:
    """Run the loop, collecting events; -> (events, interrupted). Ctrl-C stops it cleanly
    (the loop's ``finally`` leaves both caches consistent)."""
    events: list[Event] = []
    try:
        for event in pair.stream(ids, **kw):
            events.append(event)  # one step, so what was printed and what is counted agree
            if on_event is not None:
                on_event(event)
    except KeyboardInterrupt:
        return events, True
    return events, False


def summarize(events: list[Event], k: KPolicy | None, speculative: bool,
              interrupted: bool) -> tuple[RunStats, dict]:
    fixed = k.k if isinstance(k, FixedK) else None
    stats = RunStats(k=fixed if fixed is not None or k is None else getattr(k, "label", "auto"))
    for e in events:
        stats.add(e)
    if interrupted:
        stats.finish_reason = "interrupted"
    d = stats.to_dict(speculative)
    if not speculative:
        d["k"] = None  # no drafts were asked for
    elif fixed is not None:  # one number per draft position, even if never reached
        d["per_position_acceptance"] = (d["per_position_acceptance"] + [None] * fixed)[:fixed]
    return stats, d


def run(pair: Pair, prompt: str, *, params: SamplingParams, k: KPolicy, max_tokens: int, seed: int,
        baseline: bool, as_json: bool, color: bool, meta: dict, prediction: str | None = None) -> int:
    """Stream one generation (and optionally the baseline); return the exit status."""
    ids = pair.encode(prompt)
    out = TextStream(pair.target.decode, color)
    predicted = pair.prediction_drafter(prediction) if prediction is not None else None
    speculative = pair.speculative or predicted is not None
    need_legend = [color and speculative]

    def show(event: Event) -> None:
        if need_legend[0]:  # on the first event: the loop's own checks (prompt length) have passed
            click.echo(legend(), err=True)
            need_legend[0] = False
        out.push(event.tokens, event.kinds)

    t0 = time.perf_counter()
    events, interrupted = generate_events(pair, ids, None if as_json else show, params=params,
                                          max_tokens=max_tokens, k=k, seed=seed, prediction=predicted)
    wall = time.perf_counter() - t0
    token_ids = [t for e in events for t in e.tokens]
    stats, sd = summarize(events, k, speculative, interrupted)
    result = {"prompt": prompt, "n_prompt_tokens": len(ids), "text": pair.target.decode(token_ids),
              "token_ids": token_ids, **sd, "wall_seconds": wall, "sampling": params.to_dict(),
              "seed": seed, **pair.info(), **meta}
    if predicted is not None:
        result["prediction"] = {**predicted.usage(), "prediction_tokens": len(predicted.pred)}
    if isinstance(k, AdaptiveK):  # what it learned and the K it chose
        result["k_policy"] = k.info()
    if baseline and not interrupted:
        base_events, interrupted = generate_events(pair.baseline(), ids, params=params,
                                                   max_tokens=max_tokens, seed=seed)
        _, bd = summarize(base_events, None, False, interrupted)
        result["baseline"] = bd
        b, s = bd["tokens_per_second"], stats.tokens_per_second
        result["speedup"] = s / b if (b and s and not interrupted) else None
    with sigint_deferred():
        if as_json:
            click.echo(json.dumps(result, indent=2, default=str))
        else:
            out.finish(token_ids)
            click.echo("")
            for line in stats_block(result, speculative):
                click.echo(line, err=True)
    return EXIT_INTERRUPTED if interrupted else 0


def legend() -> str:
    return "legend: " + "  ".join(click.style(text, fg=STYLE[kind]) for kind, text in LEGEND.items())


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 'es' if noun.endswith('s') else 's'}"


def _pct(part: float, total: float) -> str:
    return f"{part / total:.0%}" if total > 0 else "-"


def stats_block(r: dict, speculative: bool) -> list[str]:
    """The compact summary printed after the text (see README, "What the stats mean")."""
    tps = r["tokens_per_second"]
    lines = [f"{_n(r['n_tokens'], 'token')} in {r['seconds']:.2f} s = "
             f"{'-' if tps is None else f'{tps:.1f}'} tokens/s  "
             f"(prompt {_n(r['n_prompt_tokens'], 'token')}, {_n(r['n_target_passes'], 'target pass')}, "
             f"finish: {r['finish_reason']})"]
    if speculative:
        rate, tpp = r["acceptance_rate"], r["tokens_per_target_pass"]
        lines.append(f"acceptance {'-' if rate is None else f'{rate:.1%}'}  "
                     f"tokens per target pass {'-' if tpp is None else f'{tpp:.2f}'}  (k={r['k']})")
        per = " ".join("-" if a is None else f"{a:.2f}" for a in r["per_position_acceptance"])
        lines.append(f"per-position acceptance: {per or '-'}")
        history = r.get("k_policy", {}).get("k_history")
        if history:
            counts = sorted(Counter(history).items())
            lines.append("K per step: " + ", ".join(f"{_n(n, 'step')} at {k}" for k, n in counts)
                         + ("  (0 = no drafts: no K was predicted to beat the target alone, or the "
                            "last token of --max-tokens)" if counts[0][0] == 0 else ""))
        policy = r.get("k_policy", {})
        if policy.get("calibrated"):
            how = ("kept from an earlier run" if policy.get("calibration_cached") else
                   "measured before the first token, kept for later runs")
            lines.append(f"pass costs for K: {how} ({policy['calibration_s']:.2f} s, not counted)")
    ts, total = r["time_split"], r["seconds"]
    lines.append(f"time: draft {_pct(ts['draft'], total)}  verify {_pct(ts['verify'], total)}  "
                 f"other {_pct(ts['other'], total)}  (prompt prefill {r['prefill_seconds']:.2f} s, "
                 "not counted)")
    if "prediction" in r:
        pr = r["prediction"]
        lines.append(f"prediction: {pr['accepted_prediction_tokens']} of {pr['prediction_tokens']} tokens "
                     f"accepted, {pr['rejected_prediction_tokens']} rejected")
    if "baseline" in r:
        b, sp = r["baseline"], r["speedup"]
        btps = b["tokens_per_second"]
        lines.append(f"baseline (target only): {b['n_tokens']} tokens, "
                     f"{'-' if btps is None else f'{btps:.1f}'} tokens/s  ->  speedup "
                     f"{'n/a' if sp is None else f'{sp:.2f}x'}")
    if r["finish_reason"] == "interrupted":
        lines.append("interrupted: the text above is what was generated before Ctrl-C")
    return lines


# --- verify ----------------------------------------------------------------------------------

KINDS = ("accepted", "corrected", "bonus", "target")


def verify(pair: Pair, *, params: SamplingParams, k: int, tokens: int, length: int, seed: int,
           as_json: bool) -> None:
    from specmac.lossless.harness import two_sample_check

    kw = dict(params=params, n_tokens=tokens, k=k, length=length, seed=seed)
    if as_json or not sys.stderr.isatty():
        res = two_sample_check(pair, **kw)
    else:
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("sampling speculative and target-only", total=2 * tokens)
            res = two_sample_check(pair, **kw, progress=lambda n: bar.advance(task, n))
    res.update(pair.info())
    res["verdict"] = verdict(res)
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
        return
    for line in verify_table(res):
        click.echo(line)
    click.echo("")
    click.echo(res["verdict"])


def verify_table(res: dict) -> list[str]:
    kinds = res.get("n_by_kind", {})
    decisive = res.get("decisive_test", "-")
    rows = [("decisive test", f"{decisive}: chi-square {res['chi2']:.1f} on {res['dof']} dof "
                              f"({res['n_categories']} categories)"),
            ("p-value", f"{res['p_value']:.3g} (Holm-adjusted over {res.get('n_tests', 1)} tests)"),
            ("sequences per method", f"{res['n_samples_per_method']} x {res['positions']} tokens "
                                     f"({res['n_tokens_per_method']} tokens generated)"),
            ("tokens tested", ", ".join(f"{kinds[x]} {x}" for x in KINDS if x in kinds)
                              + f"; {kinds.get('end', 0)} sequences ended early"),
            ("min detectable TV", f"{res['min_detectable_tv']:.3f} per (context, position) "
                                  "(80% power, 5% family-wise)"),
            ("greedy agreement", f"{res['greedy_agreement']:.0%} of {len(res['contexts'])} contexts, "
                                 f"{res['greedy_tokens']} tokens each")]
    width = max(len(r[0]) for r in rows)
    out = [f"{name:<{width}}  {value}" for name, value in rows]
    if res.get("per_position"):
        out += ["", "position  p-value  min TV  accepted corrected  bonus target"]
        for r in res["per_position"]:
            kd = r.get("kinds", {})
            out.append(f"{r['test'].split()[1]:>8}  {r['p_value']:7.3f}  {r['min_detectable_tv']:6.3f}  "
                       f"{kd.get('accepted', 0):8d} {kd.get('corrected', 0):9d} {kd.get('bonus', 0):6d} "
                       f"{kd.get('target', 0):6d}")
    return out


def verdict(res: dict) -> str:
    """Plain language: the outcome, what the tests would have caught and what they cannot see."""
    from specmac.lossless.greedy import summary

    p, tv, n = res["p_value"], res["min_detectable_tv"], res["positions"]
    bad_greedy = [m for m in res.get("greedy_mismatches", []) if not m.get("near_tie")]
    if res["dof"] < 1:
        return ("NO VERDICT: every position fell into one category (rare tokens are pooled), so there "
                "is nothing to compare: raise --tokens or lower --temperature.")
    if p < 0.001 or bad_greedy:
        what = (f"speculative and target-only samples differ (p = {p:.2g}, {res.get('decisive_test')})"
                if p < 0.001 else "greedy speculative and target-only outputs part where no rounding can "
                                  "explain it")
        head = (f"FAIL: {what}: the output is not the target's distribution; check the vocabularies "
                "and `specmac probe-parallelism`.")
    elif p < 0.05:
        head = (f"INCONCLUSIVE: p = {p:.2g} is low but not alarming (1 honest run in 20 gets "
                "p < 0.05): rerun with another --seed or more --tokens.")
    else:
        head = f"PASS: no difference detected between speculative and target-only decoding (p = {p:.2g})."
    kinds = res.get("n_by_kind", {})
    tested = ("Tested: " + ", ".join(f"{kinds[x]} {x}" for x in KINDS if x in kinds)
              + " tokens; a sequence that stopped early (EOS) counts as 'end' at every later position."
              if kinds else "")
    can = (f"Can detect: with 80% power, a shift of total variation >= {tv:.3f} in the distribution of the "
           f"token at any one position 1..{n} after any one of the {len(res['contexts'])} contexts (one "
           "group on its own, not diluted over the mixture of groups; TV over the categories kept, rare "
           "tokens pooled), and shifts in the joint distribution of neighbouring tokens and of the first "
           "three tokens.")
    cannot = ("Cannot detect: smaller shifts, shifts among the pooled rare tokens, dependence between "
              "tokens further apart (the synthetic tests check joint distributions exactly), positions "
              f"after {n}, other contexts or sampling settings. More --tokens lowers the detectable TV "
              "by less than 1/sqrt(tokens), because rare tokens leave the pool and add categories.")
    lines = [head] + ([tested] if tested else []) + [can, cannot]
    if res["n_categories"] < 10 and res["dof"] >= 1:
        lines.append(f"Only {res['n_categories']} categories in the decisive test: raise --tokens, or "
                     "sample a narrower distribution (lower --temperature, --top-k), so that more tokens "
                     "count on their own.")
    for m in res.get("greedy_mismatches", []):
        lines.append(f"Greedy, context {m['context'] + 1}: {summary(m)}.")
    return "\n".join(lines)


# --- backends --------------------------------------------------------------------------------

def backend_rows() -> list[dict]:
    """One row per registered backend: installed?, library and version, devices, or why not."""
    from specmac.backends import backend_class, library_version, registry

    rows = []
    for name, entry in registry().items():
        row = {"name": name, "entry": entry, "installed": False, "library": None, "version": None,
               "devices": [], "problem": None}
        try:
            cls = backend_class(name)
            row.update(installed=True, library=cls.library, version=library_version(cls.library),
                       devices=list(cls.devices()))
        except BrokenBackend as e:  # listed with the reason, never a crash of the listing itself
            row.update(problem=str(e), broken=True)
        except SpecmacError as e:
            row["problem"] = str(e)
        rows.append(row)
    return rows


def list_backends(as_json: bool) -> None:
    rows = backend_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = (f"{r['library']} {r['version']}  devices: {', '.join(r['devices'])}"
                 if r["installed"] else f"{'broken' if r.get('broken') else 'not installed'}: {r['problem']}")
        click.echo(f"{r['name']:<{width}}  {state}")
    click.echo("drafters without a model: ngram (prompt lookup), none (target only)")
