"""`specmac run`, `specmac verify` and `specmac backends`: attached to the main group on import."""

from __future__ import annotations

import sys

import click

from specmac.cli.app import (
    UserError,
    load_pair,
    main,
    pair_options,
    parse_k,
    sampling_options,
    sampling_params,
    use_color,
)
from specmac.cli.profile import given, profile_choice, profile_options
from specmac.cli.progress import Reporter
from specmac.cli.render import show_verdict
from specmac.core.planner import K_DEFAULT

# --- run ----------------------------------------------------------------------------------

@main.command()
@click.argument("prompt", required=False)
@pair_options
@sampling_options
@click.option("--k", "k_text", default=str(K_DEFAULT), show_default=True, metavar="K|auto",
              help="Draft tokens per step, or 'auto' (chosen every step by the cost model; "
                   "0 drafts when no K is predicted to pay, trying to draft within 3% of the run's time). "
                   "With --sampler rejection 'auto' is not reproducible (K depends on wall-clock "
                   "timings, so the same --seed can give other text); with --sampler coupled it is.")
@click.option("--remeasure", is_flag=True,
              help="With --k auto: measure the pass costs again instead of using the kept ones.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, metavar="N",
              help="Stop after N generated tokens (or at EOS, or at the context window).")
@click.option("--prompt-file", type=click.Path(dir_okay=False),
              help="Read the prompt from a file ('-' = stdin).")
@click.option("--prediction", "prediction_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Text expected back (OpenAI's Predicted Outputs: e.g. the file being edited), drafted "
                   "from where the output reaches it; with --draft, that draft drafts elsewhere.")
@click.option("--chat/--raw", " /--no-chat", "chat", default=None,
              help="The prompt as the user's message through the target's chat template (the default "
                   "where the target has one; --chat requires one), or the text as it is (--raw, to "
                   "continue a text or code).")
@click.option("--system", metavar="TEXT", help="A system message before the prompt (chat template only).")
@click.option("--baseline", is_flag=True, help="Also run plain decoding and print the speedup.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--color/--no-color", "color", default=None,
              help="Colour the tokens by origin (default: on a terminal, unless NO_COLOR is set).")
@profile_options
def run(prompt, k_text, remeasure, max_tokens, prompt_file, prediction_file, chat, system, baseline, as_json,
        color, profile_path, precision, **kw):
    """Generate from PROMPT (or --prompt-file, or stdin) with speculative decoding.

    The prompt goes through the target's chat template, as the user's message, where the target
    has one; --raw sends the text as it is (for a text or code to continue). On a terminal the
    text streams in colour: green tokens are accepted drafts, red ones the
    target's corrections, cyan ones bonus tokens. A stats block follows on stderr.
    """
    from specmac.cli import runner
    from specmac.cli.textin import TEMPLATE, read_prediction, read_prompt, run_prompt

    prompt = read_prompt(prompt, prompt_file)
    prediction = read_prediction(prediction_file) if prediction_file else None
    k = parse_k(k_text)  # everything is validated before any model loads
    choice = profile_choice(profile_path, precision, kw, k_text)
    if choice:  # a plain profile's "auto" is for predictions; without one, run's K (it drafts nothing)
        plain = choice.load["draft"] == "none" and not prediction_file and not given("k_text")
        kw, k = {**kw, "draft": choice.load["draft"]}, K_DEFAULT if plain else choice.k
    params = sampling_params(kw)
    if baseline and kw["draft"] == "none" and not prediction_file:
        raise UserError("--baseline compares speculative with plain decoding: add --draft BACKEND "
                        "(or --prediction FILE)")
    if k == "auto" and kw["draft"] == "none" and not prediction_file:
        raise UserError("--k auto chooses how many drafts to verify, and --draft none makes none: add "
                        "--draft BACKEND (or --draft ngram, or --prediction FILE), or drop --k")
    if remeasure and k != "auto":
        raise UserError("--remeasure re-measures the pass costs that --k auto uses: add --k auto or drop it")
    if system is not None and chat is False:
        raise UserError("--system is a message of the chat template, and --raw sends the text as it is: "
                        "drop --system, or drop --raw")
    # a long wait says what it does, how far it is and how long is left, on stderr (--json too)
    with Reporter() as report:
        with report.waiting("loading the models"):
            pair = choice.pair() if choice else load_pair(kw)
        if choice and not as_json:
            click.echo(choice.line, err=True)
        prompt, prompt_format = run_prompt(pair.target, prompt, chat, system)
        # "auto" times the pair's passes here, before the first token
        policy = pair.planner(k, remeasure=remeasure, notify=report.say, progress=report)
    code = runner.run(pair, prompt, params=params, k=policy, max_tokens=max_tokens, seed=kw["seed"],
                      baseline=baseline, as_json=as_json, color=use_color(color, as_json),
                      meta={"command": " ".join(["specmac", *sys.argv[1:]]),
                            "chat_template": prompt_format == TEMPLATE, "prompt_format": prompt_format,
                            **({"profile": {"file": profile_path, "group": choice.group, "line": choice.line}}
                               if choice else {})},
                      prediction=prediction)
    sys.exit(code)


# --- verify -------------------------------------------------------------------------------

@main.command()
@pair_options
@sampling_options(temperature=1.0)
@click.option("--k", "k_text", default=str(K_DEFAULT), show_default=True, metavar="K",
              help="Draft tokens per step ('auto' too with --exact).")
@click.option("--tokens", type=click.IntRange(min=1), default=None, metavar="N",
              help="Tokens generated per method (speculative and plain), rounded up to whole "
                   "sequences [default: 100000; a 1.5B model on a CPU wants ~10000].")
@click.option("--length", type=click.IntRange(min=2), default=None, metavar="N",
              help="Tokens per sequence; every position 1..N is tested [default: 2k+2, so drafts at "
                   "every position 1..k, corrections and bonus tokens of first and later steps occur; "
                   "32 with --exact].")
@click.option("--exact", is_flag=True,
              help="Seed-exact check instead of chi-square: --sequences sequences under the coupled "
                   "sampler, each compared token for token with its plain-decoding twin at the same "
                   "seed, every parting diagnosed. Exit status 1 on FAIL.")
@click.option("--sequences", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --exact: sequences compared [default: 24].")
@click.option("--turns", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --exact: the sequences as conversations of N turns each (a turn's prompt: "
                   "the last one's, half its answer and the context again), the speculative side "
                   "reusing what its caches hold, the plain side from empty caches [default: 1, "
                   "independent sequences].")
@click.option("--tolerance", type=click.FloatRange(min=0), default=None, metavar="LOGITS",
              help="With --exact: the batched-vs-serial difference on two flipped tokens accepted as "
                   "round-off [default: 0.1; llama.cpp's quantized kernels may need more, see "
                   "`specmac probe-parallelism`].")
@click.option("--endpoint", metavar="[LABEL=]URL",
              help="Check a server instead of a local pair: an OpenAI-compatible /v1 URL, compared with "
                   "--against on the same prompts (--sequences per context, --tolerance in logprobs; "
                   "docs/serve.md). Exit status 1 on FAIL.")
@click.option("--against", metavar="[LABEL=]URL",
              help="With --endpoint: the server it is compared with (the same model without speculation).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def verify(k_text, tokens, length, exact, sequences, turns, tolerance, endpoint, against, as_json, **kw):
    """Is the output still the target's? Chi-square tests per position, and greedy agreement.

    Each method (speculative, plain) generates independent continuations of --length
    tokens after a few fixed contexts. The distribution of the token at every position, of every
    two neighbouring tokens and of the first three tokens is compared between the methods (one
    two-sample chi-square each, summed over contexts, Holm-adjusted for the family). Accepted
    drafts, corrections and bonus tokens are all tested; the JSON counts them (n_by_kind). The
    verdict says how large a difference would have been caught. At temperature 0 the greedy
    sequences are compared, and a mismatch that is not a near-tie flip is a FAIL.

    With --exact, the coupled sampler makes every sequence a test of its own: a pipeline error
    (rewinds, caches, batching, alignment, bookkeeping) shows in a few sequences; the rejection
    rule itself is not tested (levels 1-2 of the proof do that).
    """
    from specmac.cli import runner
    from specmac.lossless.harness import DEFAULT_CONTEXTS, DEFAULT_TOKENS, default_length

    if endpoint or against:
        from specmac.cli.verify_endpoint import verify_endpoints

        if turns is not None:
            raise UserError("--turns belongs to the seed-exact check of a pair (--exact), not to --endpoint")

        return verify_endpoints(endpoint, against, length=length, sequences=sequences, tolerance=tolerance,
                                as_json=as_json, kw=kw)
    if kw["draft"] == "none":
        raise UserError("verify needs a draft: add --draft BACKEND (or --draft ngram)")
    k = parse_k(k_text)
    if exact:
        return _verify_exact(k, length, sequences, turns, tolerance, tokens, as_json, kw)
    for flag, value in (("--sequences", sequences), ("--turns", turns), ("--tolerance", tolerance)):
        if value is not None:
            raise UserError(f"{flag} belongs to the seed-exact check: add --exact, or drop {flag}")
    if not isinstance(k, int):
        raise UserError("verify needs a fixed --k (an integer >= 1)")
    length = length or default_length(k)
    tokens = tokens or DEFAULT_TOKENS
    if tokens < length * len(DEFAULT_CONTEXTS):
        raise UserError(f"--tokens {tokens} is too few for one sequence of {length} tokens per context "
                        f"({len(DEFAULT_CONTEXTS)} contexts): use --tokens {length * len(DEFAULT_CONTEXTS)} "
                        "or more")
    if tokens > MAX_VERIFY_TOKENS:
        raise UserError(f"--tokens {tokens} is out of range: use at most {MAX_VERIFY_TOKENS} per method (the "
                        f"default {DEFAULT_TOKENS} catches every planted bug on the synthetic pair)")
    params = sampling_params(kw)
    pair = load_pair(kw)
    long = _verify_estimate(pair, tokens, length, len(DEFAULT_CONTEXTS))
    runner.verify(pair, params=params, k=k, tokens=tokens, length=length, seed=kw["seed"],
                  as_json=as_json, progress_lines=long)


MAX_VERIFY_TOKENS = 10_000_000
MAX_VERIFY_HOURS = 24


def _verify_estimate(pair, tokens: int, length: int, n_contexts: int) -> bool:
    """Refuse a --length past the context window, and a run estimated (from one target pass timed
    now) to take more than MAX_VERIFY_HOURS; say the estimate of a run over a minute. -> whether
    it is that long (then progress is printed off a terminal too)."""
    from specmac.lossless.harness import DEFAULT_CONTEXTS
    from specmac.tuning.calibration import fresh_t1

    room = pair.target.n_ctx - max(len(pair.encode(c)) for c in DEFAULT_CONTEXTS)
    if length > room:
        raise UserError(f"--length {length} does not fit the target's context window ({pair.target.n_ctx} "
                        f"tokens, the longest context included): use --length {max(room, 2)} or less")
    per_seq = length * n_contexts
    total = 2 * -(-tokens // per_seq) * per_seq  # both methods, rounded up to whole sequences
    t1 = fresh_t1(pair.target)
    seconds = total * t1
    if seconds > MAX_VERIFY_HOURS * 3600:
        fit = int(MAX_VERIFY_HOURS * 3600 / (2 * t1))
        raise UserError(f"--tokens {tokens} would take about {_duration(seconds)} here ({total} tokens at "
                        f"~{t1 * 1e3:.2g} ms per target pass; at most {MAX_VERIFY_HOURS} h): use --tokens "
                        f"{fit} or fewer")
    if seconds > 60:
        click.echo(f"verify: about {_duration(seconds)} ({total} tokens at ~{t1 * 1e3:.2g} ms per target "
                   "pass)", err=True)
    return seconds > 60


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _verify_exact(k, length, sequences, turns, tolerance, tokens, as_json, kw) -> None:
    from specmac.lossless import exact

    if tokens is not None:
        raise UserError("--tokens belongs to the chi-square check: with --exact use --sequences N")
    if kw["temperature"] == 0:
        raise UserError("--exact compares samples at T > 0: use --temperature 1 (at 0 verify "
                        "compares greedy outputs without --exact)")
    params = sampling_params(kw)
    length, turns = length or exact.DEFAULT_LENGTH, turns or 1
    with Reporter() as report:
        with report.waiting("loading the models"):
            pair = load_pair(kw)
        longest = turns * (length + max(len(pair.encode(c)) for c in exact.DEFAULT_CONTEXTS))
        if turns > 1 and longest > pair.target.n_ctx:
            raise UserError(f"--turns {turns} of --length {length} make a conversation of up to {longest} "
                            f"tokens, past the target's context window ({pair.target.n_ctx}): use fewer "
                            "turns, a shorter --length or a larger --ctx-size")
        policy = pair.planner(k, notify=report.say, progress=report)
    res = exact.exact_check(pair, params=params, n_sequences=sequences or exact.DEFAULT_SEQUENCES,
                            length=length, k=policy, seed=kw["seed"],
                            tolerance=exact.TOLERANCE if tolerance is None else tolerance,
                            turns=turns)
    res["k"] = k
    res.update(pair.info())
    res["verdict"] = exact.verdict(res)
    show_verdict(res, [] if as_json else exact.lines(res), as_json)
    sys.exit(1 if res["n_failures"] else 0)


# --- backends -----------------------------------------------------------------------------

@main.command()
@click.option("--options", "options", is_flag=True,
              help="List each installed backend's --target-opt/--draft-opt keys with their defaults.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def backends(options, as_json):
    """List every registered backend: installed?, library version, devices."""
    from specmac.cli.render import list_backends, list_options

    (list_options if options else list_backends)(as_json)
