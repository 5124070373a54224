"""Prompt input for the CLI: the argument, a file or stdin, as UTF-8 text with a size cap; and the
chat template around it (run's default, chat's messages)."""

from __future__ import annotations

import os
import sys

from specmac.cli.app import UserError, one_line
from specmac.errors import SpecmacError

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
    """argv arrives decoded with the locale's encoding, undecodable bytes as lone surrogates
    (surrogateescape): back to the bytes typed, then strict UTF-8, so UTF-8 text is accepted under
    LC_ALL=C too (where the locale says ASCII) and invalid bytes are refused by offset."""
    try:
        data = os.fsencode(prompt)
    except UnicodeEncodeError:  # text that did not come from argv (tests, the API)
        data = prompt.encode("utf-8", "surrogateescape")
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


# --- the chat template --------------------------------------------------------------------

TEMPLATE = "the target's chat template"
RAW = "raw text (--raw)"
NO_TEMPLATE = "raw text (the target has no chat template)"


def templated(target, messages: list[dict]) -> str | None:
    """``messages`` through the target's chat template, ready for the assistant's turn; None where
    the target has no template. A template that refuses the messages (e.g. one without a system
    role, given --system) is a user error."""
    try:
        return target.apply_chat_template(messages)
    except SpecmacError as e:
        if e.param != "chat":
            raise
        return None
    except Exception as e:  # the template's own raise_exception: ValueError (llama.cpp) or jinja2's
        if not isinstance(e, ValueError) and not type(e).__module__.startswith("jinja2"):
            raise
        raise UserError(f"the target's chat template refuses this conversation: {one_line(str(e))}") from None


def run_prompt(target, prompt: str, chat: bool | None, system: str | None) -> tuple[str, str]:
    """`run`'s prompt and how it was formed: the chat template where the target has one (chat
    None, the default), required (chat True: --chat), or the text as it is (chat False: --raw)."""
    if chat is False:
        return prompt, RAW  # --system with --raw is refused before the models load
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    text = templated(target, [*messages, {"role": "user", "content": prompt}])
    if text is not None:
        return text, TEMPLATE
    if chat:
        raise UserError(f"--chat: the target ({target.name}) has no chat template: drop --chat to send "
                        "the text as it is")
    if system is not None:
        raise UserError("--system needs a chat template, and the target has none: drop --system")
    return prompt, NO_TEMPLATE


# --- streaming text --------------------------------------------------------------------------
