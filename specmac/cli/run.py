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

# --- run ----------------------------------------------------------------------------------

@main.command()
@click.argument("prompt", required=False)
@pair_options
@sampling_options
@click.option("--k", "k_text", default="4", show_default=True, metavar="K|auto",
              help="Draft tokens per step, or 'auto' (chosen every step by the cost model; "
                   "0 drafts when no K is predicted to pay, trying to draft within 3% of the run's time). "
                   "'auto' is not reproducible: K depends on "
                   "wall-clock timings, so the same --seed can give other text.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, metavar="N",
              help="Stop after N generated tokens (or at EOS, or at the context window).")
@click.option("--prompt-file", type=click.Path(dir_okay=False),
              help="Read the prompt from a file ('-' = stdin).")
@click.option("--prediction", "prediction_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Text expected back (OpenAI's Predicted Outputs: e.g. the file being edited), drafted "
                   "from where the output reaches it; with --draft, that draft drafts elsewhere.")
@click.option("--chat", is_flag=True, help="Apply the target's chat template, if it has one.")
@click.option("--baseline", is_flag=True, help="Also run target-only decoding and print the speedup.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--color/--no-color", "color", default=None,
              help="Colour the tokens by origin (default: on a terminal, unless NO_COLOR is set).")
def run(prompt, k_text, max_tokens, prompt_file, prediction_file, chat, baseline, as_json, color, **kw):
    """Generate from PROMPT (or --prompt-file, or stdin) with speculative decoding.

    On a terminal the text streams in colour: green tokens are accepted drafts, red ones the
    target's corrections, cyan ones bonus tokens. A stats block follows on stderr.
    """
    from specmac.cli import render as cli_render

    prompt = cli_render.read_prompt(prompt, prompt_file)
    prediction = cli_render.read_prediction(prediction_file) if prediction_file else None
    k = parse_k(k_text)  # everything is validated before any model loads
    params = sampling_params(kw)
    if baseline and kw["draft"] == "none" and not prediction_file:
        raise UserError("--baseline compares speculative with target-only decoding: add --draft BACKEND "
                        "(or --prediction FILE)")
    pair = load_pair(kw)
    policy = pair.policy(k, max_tokens)  # "auto" measures the pair's pass costs here, before the first token
    if chat:
        prompt = pair.target.apply_chat_template(prompt)
    code = cli_render.run(pair, prompt, params=params, k=policy, max_tokens=max_tokens, seed=kw["seed"],
                      baseline=baseline, as_json=as_json, color=use_color(color, as_json),
                      meta={"command": " ".join(["specmac", *sys.argv[1:]])}, prediction=prediction)
    sys.exit(code)


# --- verify -------------------------------------------------------------------------------

@main.command()
@pair_options
@sampling_options(temperature=1.0)
@click.option("--k", "k_text", default="4", show_default=True, metavar="K")
@click.option("--tokens", type=click.IntRange(min=1), default=None, metavar="N",
              help="Tokens generated per method (speculative and target-only), rounded up to whole "
                   "sequences [default: 100000; a 1.5B model on a CPU wants ~10000].")
@click.option("--length", type=click.IntRange(min=2), default=None, metavar="N",
              help="Tokens per sequence; every position 1..N is tested [default: 2k+2, so drafts at "
                   "every position 1..k, corrections and bonus tokens of first and later steps occur].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def verify(k_text, tokens, length, as_json, **kw):
    """Is the output still the target's? Chi-square tests per position, and greedy agreement.

    Each method (speculative, target-only) generates independent continuations of --length
    tokens after a few fixed contexts. The distribution of the token at every position, of every
    two neighbouring tokens and of the first three tokens is compared between the methods (one
    two-sample chi-square each, summed over contexts, Holm-adjusted for the family). Accepted
    drafts, corrections and bonus tokens are all tested; the JSON counts them (n_by_kind). The
    verdict says how large a difference would have been caught. At temperature 0 the greedy
    sequences are compared, and a mismatch that is not a near-tie flip is a FAIL.
    """
    from specmac.cli import render as cli_render
    from specmac.lossless.harness import DEFAULT_CONTEXTS, DEFAULT_TOKENS, default_length

    if kw["draft"] == "none":
        raise UserError("verify needs a draft: add --draft BACKEND (or --draft ngram)")
    k = parse_k(k_text)
    if not isinstance(k, int):
        raise UserError("verify needs a fixed --k (an integer >= 1)")
    length = length or default_length(k)
    tokens = tokens or DEFAULT_TOKENS
    if tokens < length * len(DEFAULT_CONTEXTS):
        raise UserError(f"--tokens {tokens} is too few for one sequence of {length} tokens per context "
                        f"({len(DEFAULT_CONTEXTS)} contexts): use --tokens {length * len(DEFAULT_CONTEXTS)} "
                        "or more")
    params = sampling_params(kw)
    pair = load_pair(kw)
    cli_render.verify(pair, params=params, k=k, tokens=tokens, length=length, seed=kw["seed"],
                      as_json=as_json)


# --- backends -----------------------------------------------------------------------------

@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def backends(as_json):
    """List every registered backend: installed?, library version, devices."""
    from specmac.cli import render as cli_render

    cli_render.list_backends(as_json)
