"""`specmac chat`: a conversation with the target on a terminal or from piped stdin, attached to
the main group on import.

Each turn sends the whole conversation through the target's chat template; the pair keeps the
sequence it last generated, so a turn processes only the tokens the previous turn did not hold.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable

import click

from specmac.cli.app import (
    UserError,
    load_pair,
    main,
    one_line,
    pair_options,
    parse_k,
    sampling_options,
    sampling_params,
    use_color,
)
from specmac.cli.profile import given, profile_choice, profile_options
from specmac.cli.progress import Reporter
from specmac.cli.textin import templated
from specmac.core.planner import K_DEFAULT
from specmac.errors import ContextOverflow

EXIT = ("/exit", "/quit", "/bye")
HELP = "/reset clears the conversation, /exit (or Ctrl-D) ends it; Ctrl-C ends a reply"
SEED_LIMIT = 2**63


# --- specmac chat ----------------------------------------------------------------------------

@main.command()
@pair_options
@sampling_options
@click.option("--k", "k_text", default=str(K_DEFAULT), show_default=True, metavar="K|auto",
              help="Draft tokens per step, or 'auto' (chosen every step by the cost model).")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=512, show_default=True, metavar="N",
              help="Stop a reply after N tokens (or at EOS, or at the context window).")
@click.option("--system", metavar="TEXT", help="A system message at the start of the conversation.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per turn (JSON Lines: the templated prompt, the reply, the stats).")
@click.option("--color/--no-color", "color", default=None,
              help="Colour the tokens by origin (default: on a terminal, unless NO_COLOR is set).")
@profile_options
def chat(k_text, max_tokens, system, as_json, color, profile_path, precision, **kw):
    """A conversation with the target (its chat template), a line per message from the terminal or stdin.

    Each turn sends the conversation so far; the caches keep what the last turn held, so a turn
    processes only its new tokens (the stats line after each reply says how many were reused).
    /reset clears the conversation; /exit or Ctrl-D (end of input) ends it; Ctrl-C ends the reply
    being written, which stays in the conversation. Turn n samples with seed --seed + n - 1.
    """
    from specmac.cli.render import legend

    k = parse_k(k_text)
    choice = profile_choice(profile_path, precision, kw, k_text)
    if choice:
        plain = choice.load["draft"] == "none" and not given("k_text")
        kw, k = {**kw, "draft": choice.load["draft"]}, K_DEFAULT if plain else choice.k
    params = sampling_params(kw)
    if k == "auto" and kw["draft"] == "none":
        raise UserError("--k auto chooses how many drafts to verify, and --draft none makes none: add "
                        "--draft BACKEND (or --draft lookup), or drop --k")
    with Reporter() as report:  # a long load or measurement says how far it is (run does the same)
        with report.waiting("loading the models"):
            pair = choice.pair() if choice else load_pair(kw)
        if choice and not as_json:
            click.echo(choice.line, err=True)
        first = [{"role": "system", "content": system}] if system is not None else []
        if templated(pair.target, [*first, {"role": "user", "content": "hi"}]) is None:
            raise UserError(f"the target ({pair.target.name}) has no chat template: use specmac run, which "
                            "sends the text as it is")
        policy = pair.planner(k, notify=report.say, progress=report)
    session = Session(pair, system, params=params, max_tokens=max_tokens, seed=kw["seed"], as_json=as_json,
                      color=use_color(color, as_json))
    session.policy = policy
    if session.color and pair.speculative:
        click.echo(legend(), err=True)
    terminal = sys.stdin.isatty()
    if terminal and not as_json:
        click.echo(f"specmac chat: {HELP}", err=True)
    sys.exit(session.loop(_reader(terminal, echo=not terminal and not as_json), terminal))


class Session:
    """The conversation (messages, system first), the pair it talks to and each turn's output."""

    def __init__(self, pair, system: str | None, *, params, max_tokens: int, seed: int, as_json: bool,
                 color: bool) -> None:
        self.pair, self.params, self.max_tokens, self.seed = pair, params, max_tokens, seed
        self.as_json, self.color = as_json, color
        self.system = [{"role": "system", "content": system}] if system is not None else []
        self.messages: list[dict] = list(self.system)
        self.turn = 0  # turns of this conversation (since the start or the last /reset)
        self.policy = None
        self.terminated = False  # SIGTERM: the session ends, not only the reply

    def loop(self, read: Callable[[], str | None], terminal: bool) -> int:
        """Read and answer until /exit or the end of input: -> the exit status. Ctrl-C at the
        prompt of a terminal starts a new line, as Python's REPL and ollama do; off a terminal (a
        script's pipe), and on SIGTERM, it ends the session (exit 130)."""
        self._catch_sigterm()
        while True:
            try:
                line = read()
            except KeyboardInterrupt:
                if self.terminated or not terminal:
                    raise
                click.echo("\n(/exit or Ctrl-D ends the chat)", err=True)
                continue
            if line is None:
                return 0
            text = line.strip()
            if not text:
                continue
            if text.lower() in EXIT:
                return 0
            if text.lower() == "/reset":
                self.messages, self.turn = list(self.system), 0
                self._note("(conversation cleared)")
                continue
            if text.lower() in ("/help", "/?"):
                self._note(HELP)
                continue
            if text.startswith("/") and text[1:].isalpha():
                self._note(f"unknown command {text}: {HELP}")
                continue
            self.reply(text)
            if self.terminated:
                raise KeyboardInterrupt

    def _note(self, line: str) -> None:
        if not self.as_json:
            click.echo(line, err=True)

    def _catch_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def terminate(_signum, _frame):
            self.terminated = True
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, terminate)

    def reply(self, text: str) -> None:
        """One turn: the user's message, the reply streamed, both kept (a reply cut by Ctrl-C too;
        a turn that wrote nothing, or whose conversation no longer fits, is dropped)."""
        from specmac.cli.runner import TextStream, generate_events, sigint_deferred, summarize

        pair = self.pair
        messages = [*self.messages, {"role": "user", "content": text}]
        out = TextStream(pair.target.decode, self.color)
        seed = (self.seed + self.turn) % SEED_LIMIT
        t0 = time.perf_counter()
        try:
            prompt = templated(pair.target, messages)
            ids = pair.encode(prompt)
            events, interrupted = generate_events(
                pair, ids, None if self.as_json else (lambda e: out.push(e.tokens, e.kinds)),
                params=self.params, max_tokens=self.max_tokens, k=self.policy, seed=seed)
        except KeyboardInterrupt:  # before the generation began (the template, the tokenizer)
            click.echo("", err=True)
            return
        except ContextOverflow as e:
            click.echo(f"specmac: {one_line(str(e))}; the conversation no longer fits: /reset starts a new "
                       "one", err=True)
            return
        with sigint_deferred():
            wall = time.perf_counter() - t0
            token_ids = [t for e in events for t in e.tokens]
            _, d = summarize(events, self.policy, pair.speculative, interrupted)
            if token_ids:
                self.messages = [*messages, {"role": "assistant", "content": pair.target.decode(token_ids)}]
                self.turn += 1
            self._show(out, token_ids, {"turn": self.turn, "seed": seed, "prompt": prompt,
                                        "n_prompt_tokens": len(ids)}, d, wall)

    def _show(self, out, token_ids: list[int], head: dict, d: dict, wall: float) -> None:
        from specmac.cli.render import turn_line

        if self.as_json:
            record = {**head, "text": self.pair.target.decode(token_ids), "token_ids": token_ids, **d,
                      "wall_seconds": wall}
            click.echo(json.dumps(record, default=str))
            return
        out.finish(token_ids)
        click.echo("")
        click.echo(turn_line(d, head["n_prompt_tokens"], self.pair.speculative), err=True)
        if d["finish_reason"] == "interrupted":
            click.echo("interrupted: the reply so far stays in the conversation" if token_ids else
                       "interrupted before the reply began: the message was dropped", err=True)


def _reader(terminal: bool, echo: bool) -> Callable[[], str | None]:
    """-> read(): the user's next message, None at the end of input. input() on a terminal (line
    editing where readline is there), else a line of stdin as strict UTF-8, shown on stderr after
    the prompt when ``echo`` (a piped conversation then reads as one)."""
    if terminal:
        try:
            import readline  # noqa: F401  (input() then edits the line and keeps a history)
        except ImportError:
            pass

        def ask() -> str | None:
            try:
                return input(">>> ")
            except EOFError:
                click.echo("", err=True)
                return None

        return ask
    stream = getattr(sys.stdin, "buffer", None)
    count = [0]

    def read() -> str | None:
        raw = stream.readline() if stream is not None else sys.stdin.readline()
        if not raw:
            return None
        count[0] += 1
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"stdin line {count[0]} is not UTF-8 text (byte {e.start}): convert it to "
                            "UTF-8") from None
        line = line.lstrip("\ufeff") if count[0] == 1 else line
        if echo and line.strip():
            click.echo(f">>> {line.rstrip()}", err=True)
        return line

    return read
