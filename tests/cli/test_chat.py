"""`specmac chat` and the chat template of `specmac run`: a conversation's history through the
target's template, the caches reused from turn to turn, /reset, the end of input, Ctrl-C and
SIGTERM; run's template by default, --raw, --system, and the one-line refusals.

Most tests talk to "chatsynth", a plugin backend written here: the synthetic numpy model with a
chat template, so they need no framework; one test per real tokenizer (torch with the embedded
folder given a template, llama.cpp with the Qwen files where they are) checks the real path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac.cli import main
from tests.support.helpers import REPO, Case, assert_one_line_error, cli_env, skip_unless_installed

PLUGIN = '''
from specmac.backends import chat_messages
from specmac.backends.synthetic import SyntheticBackend


class ChatSynth(SyntheticBackend):
    """The synthetic model with a chat template: "role: content" lines, then the assistant's."""

    name = "chatsynth"

    def apply_chat_template(self, prompt):
        return "".join(f"{m['role']}: {m['content']}\\n" for m in chat_messages(prompt)) + "assistant: "
'''
CHAT = ("chat", "--target", "chatsynth", "--draft", "synthetic")
HF_TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")


def template(messages: list[tuple[str, str]]) -> str:
    """What ChatSynth's template makes of (role, content) pairs."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant: "


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("chatsynth")
    (root / "specmac_chatsynth.py").write_text(PLUGIN)
    info = root / "specmac_chatsynth-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specmac-chatsynth\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specmac.backends]\nchatsynth = specmac_chatsynth:ChatSynth\n")
    return root


@pytest.fixture
def plugin(site, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("SPECMAC_DEBUG", raising=False)


def invoke(args, stdin: str = "", code: int = 0):
    r = CliRunner().invoke(main, list(args), input=stdin)
    assert r.exit_code == code, r.output + r.stderr + repr(r.exception)
    return r


def turns(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


# --- the conversation --------------------------------------------------------------------------

def test_three_turns_keep_the_history_and_reuse_the_caches(plugin):
    r = invoke([*CHAT, "--temperature", "1", "--max-tokens", "12", "--json"],
               "hello there\nand then\nwhat next\n")
    t = turns(r.stdout)
    assert [x["turn"] for x in t] == [1, 2, 3]
    assert all(x["text"] and x["n_tokens"] >= 1 for x in t)
    said = [("user", "hello there"), ("assistant", t[0]["text"]), ("user", "and then"),
            ("assistant", t[1]["text"]), ("user", "what next")]
    assert t[0]["prompt"] == template(said[:1])
    assert t[1]["prompt"] == template(said[:3])  # turn 1's answer is in turn 2's prompt
    assert t[2]["prompt"] == template(said)
    # each turn's prompt begins with the last one's prompt and reply, which the caches still hold
    assert t[0]["cached_tokens"] == 0
    for before, now in zip(t, t[1:]):
        assert now["cached_tokens"] >= before["n_prompt_tokens"] + before["n_tokens"] - 1
        assert now["cached_tokens"] < now["n_prompt_tokens"]
    assert [x["seed"] for x in t] == [0, 1, 2]  # turn n samples with --seed + n - 1


def test_a_turn_equals_a_fresh_run_on_its_prompt(plugin, tmp_path):
    """The caches a turn reuses hold what a fresh pair would compute: the coupled sampler's text
    depends on the seed alone, so turn 3 equals `run --raw` on its prompt at its seed."""
    r = invoke([*CHAT, "--sampler", "coupled", "--temperature", "1", "--seed", "5", "--max-tokens", "16",
                "--json"], "one\ntwo\nthree\n")
    last = turns(r.stdout)[-1]
    (tmp_path / "prompt.txt").write_text(last["prompt"])
    fresh = json.loads(invoke(["run", "--target", "chatsynth", "--draft", "synthetic", "--raw", "--sampler",
                               "coupled", "--temperature", "1", "--seed", str(last["seed"]), "--max-tokens",
                               "16", "--json", "--prompt-file", str(tmp_path / "prompt.txt")]).stdout)
    assert last["cached_tokens"] > 0 and fresh["cached_tokens"] == 0
    assert fresh["token_ids"] == last["token_ids"]


def test_reset_forgets_the_conversation_but_keeps_the_system_message(plugin):
    r = invoke([*CHAT, "--temperature", "1", "--max-tokens", "8", "--system", "be brief", "--json"],
               "first question\n/reset\nsecond question\n")
    t = turns(r.stdout)
    assert len(t) == 2 and t[1]["turn"] == 1 and t[1]["seed"] == 0
    assert t[1]["prompt"] == template([("system", "be brief"), ("user", "second question")])
    assert t[1]["cached_tokens"] < len(template([("system", "be brief")]))  # the system message, at most


def test_text_mode_shows_each_turn_and_ends_at_exit(plugin):
    r = invoke([*CHAT, "--max-tokens", "6", "--no-color"], "hi\n\n/nosuch\nagain\n/exit\nnever read\n")
    err = r.stderr.splitlines()
    assert ">>> hi" in err and ">>> again" in err and ">>> never read" not in err
    stats = [line for line in err if line.startswith("[")]
    assert len(stats) == 2 and all("tokens/s; prompt" in s and "reused" in s for s in stats)
    assert int(re.search(r"(\d+) reused", stats[1]).group(1)) > 0
    assert any(line.startswith("unknown command /nosuch") for line in err)
    assert len(r.stdout.splitlines()) == 2  # one reply a line


def test_a_conversation_past_the_context_window_is_refused_and_the_session_goes_on(plugin):
    r = invoke([*CHAT, "--target-opt", "n_ctx=64", "--max-tokens", "4", "--json"],
               "short\n" + "x" * 80 + "\n/reset\nshort again\n")
    t = turns(r.stdout)
    assert len(t) == 2 and "x" * 80 not in t[1]["prompt"]
    assert "no longer fits: /reset starts a new one" in r.stderr


def test_chat_without_a_template_is_one_line(plugin):
    case = Case("chat-no-template", ("chat", "--target", "synthetic"),
                "the target (synthetic) has no chat template: use specmac run")
    r = CliRunner().invoke(main, list(case.args), input="hi\n")
    assert_one_line_error(case, r.exit_code, r.stdout, r.stderr)


@skip_unless_installed("gguf")
def test_chat_on_the_embedded_pair_says_it_has_no_template():
    r = CliRunner().invoke(main, ["chat", "--target", "gguf"], input="hi\n")
    assert r.exit_code == 2 and "has no chat template: use specmac run" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# --- a real process: end of input, Ctrl-C, SIGTERM -----------------------------------------------

# slow enough to interrupt (a pass sleeps 20 ms) and never at an end of its own (no EOS)
SLOW = ("--temperature", "1", "--max-tokens", "3000", "--target-opt", "latency_ms=20", "--target-opt",
        "eos_bias=-100", "--no-color")


def _spawn(site: Path, *args: str) -> subprocess.Popen:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return subprocess.Popen([sys.executable, "-m", "specmac", *CHAT, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


class Lines:
    """stderr's lines as they come (a reader thread), and a wait for one that matches."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, b"")), daemon=True).start()

    def wait(self, needle: str, count: int = 1, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while sum(needle in line.decode() for line in self.lines) < count:
            assert time.monotonic() < end, f"no {needle!r} within {timeout} s: {self.text()}"
            time.sleep(0.05)

    def text(self) -> str:
        return b"".join(self.lines).decode()


def _first_bytes(proc: subprocess.Popen, n: int = 5) -> None:
    got = bytearray()

    def read() -> None:
        while len(got) < n and (chunk := os.read(proc.stdout.fileno(), n - len(got))):
            got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    assert len(got) == n, "no reply streamed within 60 s"


@pytest.mark.skipif(sys.platform == "win32", reason="signals to a child need POSIX")
def test_ctrl_c_ends_the_reply_not_the_session_and_keeps_it(site):
    proc = _spawn(site, *SLOW)
    err = Lines(proc.stderr)
    try:
        proc.stdin.write(b"tell me\n")
        proc.stdin.flush()
        _first_bytes(proc)
        proc.send_signal(signal.SIGINT)  # mid-reply: the reply ends, the session goes on
        err.wait("interrupted: the reply so far stays in the conversation")
        proc.stdin.write(b"go on\n")
        proc.stdin.flush()
        err.wait(">>> go on")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        err.wait("interrupted: the reply so far stays in the conversation", count=2)
        time.sleep(0.5)  # out of the block that holds Ctrl-C while the reply's end is written
        proc.send_signal(signal.SIGINT)  # at the prompt of a pipe: the session ends
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stats = [line for line in err.text().splitlines() if line.startswith("[")]
    assert len(stats) == 2 and "Traceback" not in err.text()
    first = int(re.search(r"\[(\d+) tokens", stats[0]).group(1))
    prompt, reused = map(int, re.search(r"prompt (\d+) tokens, (\d+) reused", stats[1]).groups())
    assert reused >= len(template([("user", "tell me")])) + first - 1  # the cut reply is in the history


@pytest.mark.skipif(sys.platform == "win32", reason="signals to a child need POSIX")
def test_sigterm_ends_the_session(site):
    proc = _spawn(site, *SLOW)
    err = Lines(proc.stderr)
    try:
        proc.stdin.write(b"tell me\nand more\n")
        proc.stdin.flush()
        _first_bytes(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ">>> and more" not in err.text() and "Traceback" not in err.text()


def test_end_of_input_ends_a_real_process_with_status_0(site):
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    r = subprocess.run([sys.executable, "-m", "specmac", *CHAT, "--max-tokens", "5"], input=b"a\nb\nc\n",
                       capture_output=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    assert len(r.stdout.decode().splitlines()) == 3 and r.stderr.decode().count(" reused; ") == 3


# --- run: the template by default, --raw, --system -----------------------------------------------

def test_run_applies_the_template_by_default_and_raw_does_not(plugin):
    base = ["run", "--target", "chatsynth", "--max-tokens", "3", "--json", "hi"]
    chat = json.loads(invoke(base).stdout)
    assert chat["prompt"] == template([("user", "hi")]) and chat["chat_template"] is True
    assert chat["prompt_format"] == "the target's chat template"
    for flag in ("--raw", "--no-chat"):
        raw = json.loads(invoke([*base, flag]).stdout)
        assert raw["prompt"] == "hi" and raw["chat_template"] is False
        assert raw["prompt_format"] == "raw text (--raw)"
    assert json.loads(invoke([*base, "--chat"]).stdout)["prompt"] == chat["prompt"]
    system = json.loads(invoke([*base, "--system", "be brief"]).stdout)
    assert system["prompt"] == template([("system", "be brief"), ("user", "hi")])
    text = invoke(base[:-2] + ["hi"])
    assert "prompt: the target's chat template" in text.stderr.splitlines()


def test_run_without_a_template_is_raw_and_says_so():
    r = json.loads(invoke(["run", "--target", "synthetic", "--max-tokens", "3", "--json", "hi"]).stdout)
    assert r["prompt"] == "hi" and r["chat_template"] is False
    assert r["prompt_format"] == "raw text (the target has no chat template)"
    text = invoke(["run", "--target", "synthetic", "--max-tokens", "3", "hi"])
    assert "prompt: raw text (the target has no chat template)" in text.stderr.splitlines()


@pytest.mark.parametrize("case", [
    Case("system-with-raw", ("run", "--target", "synthetic", "--raw", "--system", "x", "hi"),
         "--system is a message of the chat template, and --raw sends the text as it is"),
    Case("system-without-template", ("run", "--target", "synthetic", "--system", "x", "hi"),
         "--system needs a chat template, and the target has none"),
    Case("chat-without-template", ("run", "--target", "synthetic", "--chat", "hi"),
         "--chat: the target (synthetic) has no chat template"),
], ids=lambda c: c.id)
def test_run_refusals_are_one_line(case, plugin):
    r = CliRunner().invoke(main, list(case.args), input="")
    assert_one_line_error(case, r.exit_code, r.stdout, r.stderr)


# --- real tokenizers ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def templated_folder(tmp_path_factory) -> Path:
    """The embedded target's Hugging Face folder with a chat template added."""
    from specmac import assets

    folder = tmp_path_factory.mktemp("tpl") / "target"
    shutil.copytree(assets.hf_dir("target"), folder)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": HF_TEMPLATE}))
    return folder


@skip_unless_installed("torch")
def test_torch_template_through_run_and_chat(templated_folder):
    from specmac import assets

    pair = ["--target", "torch", "--target-model", str(templated_folder), "--draft", "torch",
            "--draft-model", str(assets.hf_dir("draft"))]
    run = json.loads(invoke(["run", *pair, "--max-tokens", "3", "--json", "def f():"]).stdout)
    assert run["prompt"] == "<|endoftext|>user\ndef f():\n<|endoftext|>assistant\n" and run["chat_template"]
    t = turns(invoke(["chat", *pair, "--temperature", "1", "--max-tokens", "8", "--json"],
                     "def f():\nand g\n").stdout)
    assert f"assistant\n{t[0]['text']}\n<|endoftext|>user\nand g\n" in t[1]["prompt"]
    assert t[1]["cached_tokens"] >= t[0]["n_prompt_tokens"]


def _qwen() -> Path | None:
    from specmac.files import models_home

    path = models_home() / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    return path if path.is_file() else None


@skip_unless_installed("gguf")
@pytest.mark.skipif(_qwen() is None, reason="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf is not in "
                                            "$SPECMAC_MODELS (see ../shared/models/materialize.sh)")
def test_qwen_chat_three_turns():
    t = turns(invoke(["chat", "--target", "gguf", "--target-model", str(_qwen()), "--draft", "lookup",
                      "--max-tokens", "8", "--json"], "Say hi.\nSay bye.\nSay hi again.\n").stdout)
    assert len(t) == 3 and t[0]["prompt"].startswith("<|im_start|>system\n")
    assert t[0]["text"] in t[1]["prompt"] and t[1]["text"] in t[2]["prompt"]
    assert all(now["cached_tokens"] >= before["n_prompt_tokens"] for before, now in zip(t, t[1:]))
