"""``turnkit generate`` and ``turnkit chat`` end to end on the real embedded SmolLM2: generate as a subprocess, chat
through a pseudo-terminal (pexpect), where Ctrl-C is a real SIGINT from the terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pexpect
import pytest

TURNKIT = [sys.executable, "-m", "turnkit.cli"]
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def _generate(*flags: str) -> subprocess.CompletedProcess:
    command = [*TURNKIT, "generate", "--threads", "1", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=ENV)


def test_generate_streams_a_sensible_reply(smollm2_gguf):
    result = _generate("--prompt", "Say hello in Spanish.", "--max-tokens", "16", "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert "hola" in result.stdout.lower()
    # a system prompt, a family override and greedy decoding
    flags = ["--prompt", "What is 2+2?", "--max-tokens", "8", "--temperature", "0", "--family", "chatml"]
    greedy = _generate(*flags, "--system", "Answer briefly.")
    assert greedy.returncode == 0 and greedy.stdout.strip(), greedy.stderr


def test_generate_says_when_the_token_budget_cut_the_reply(smollm2_gguf):
    """The cut is said on stderr (stdout is the reply alone), on both engines (--engine), and the startup is quiet."""
    for engine in ("llama.cpp", "torch"):
        flags = ["--prompt", "Write a long story.", "--max-tokens", "4", "--temperature", "0", "--engine", engine]
        result = _generate(*flags)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() and "\ufffd" not in result.stdout
        assert "turnkit: cut: the reply reached --max-tokens 4 before it ended" in result.stderr
        assert "Loading" not in result.stderr and "%|" not in result.stderr, result.stderr  # no loading bars
    ended = _generate("--prompt", "What is 2+2?", "--max-tokens", "64", "--temperature", "0")
    assert ended.returncode == 0 and "4" in ended.stdout
    assert "cut:" not in ended.stderr and "Traceback" not in ended.stderr, ended.stderr


def test_generate_refuses_bad_flags_before_loading(smollm2_gguf):
    result = _generate("--prompt", "x", "--temperature", "5")
    assert result.returncode == 2
    assert "--temperature: temperature must be between 0.0 and 2.0" in result.stderr
    assert "Traceback" not in result.stderr
    missing = _generate("--prompt", "x", "--model", "/nonexistent.gguf")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    no_template = _generate("--prompt", "x", "--template", "/nonexistent.jinja")
    assert no_template.returncode == 2 and "does not exist" in no_template.stderr
    usage = subprocess.run([*TURNKIT, "generate", "--help"], capture_output=True, text=True).stdout
    help_text = " ".join(usage.split())
    assert "--threads N engine threads" in help_text and "torch threads" not in help_text


@pytest.fixture
def chat(smollm2_gguf):
    command = [*TURNKIT, "chat", "--threads", "1", "--max-tokens", "300", "--temperature", "0"]
    child = pexpect.spawn(command[0], command[1:], env=ENV, encoding="utf-8", timeout=300)
    child.expect_exact("Ctrl-C stops a reply)")
    child.expect_exact("> ")
    yield child
    if child.isalive():
        child.terminate(force=True)


def test_chat_keeps_history_resets_and_survives_ctrl_c(chat):
    chat.sendline("Say hello in Spanish.")
    chat.expect_exact("> ")
    assert "hola" in chat.before.lower()
    # the history holds both turns; /reset forgets them
    chat.sendline("/reset")
    chat.expect_exact("(history cleared: 2 messages)")
    chat.expect_exact("> ")
    # Ctrl-C while a long reply prints stops the reply, not the program
    chat.sendline("Write a very long story about a dragon and a knight.")
    chat.expect(r"knight\.\r\n\s*\w+")  # past the terminal's echo of the line: the reply has started
    chat.sendintr()
    chat.expect_exact("[stopped]")
    chat.expect_exact("> ")
    # the stopped turn stays in the history, and the next question is answered
    chat.sendline("Say hello in Spanish.")
    chat.expect_exact("> ")
    assert "hola" in chat.before.lower()
    chat.sendline("/reset")
    chat.expect_exact("(history cleared: 4 messages)")
    chat.expect_exact("> ")
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.wait()
    assert chat.exitstatus == 0


def test_render_and_encode_warn_when_the_template_ignores_tools(smollm2_gguf, tmp_path, capsys):
    from turnkit.cli import main

    conversation = tmp_path / "conversation.json"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    conversation.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}))
    assert main(["render", "--model", "default", str(conversation)]) == 0
    assert "does not show tools" in capsys.readouterr().err
    assert main(["render", "--family", "qwen2.5", str(conversation)]) == 0
    assert "does not show tools" not in capsys.readouterr().err
    main(["encode", "--model", "default", "--generation-prompt", str(conversation)])
    assert "does not show tools" in capsys.readouterr().err


def test_reasoning_is_shown_marked_and_kept_out_of_the_history(smollm2_hf_folder):
    """A reasoning model (a Qwen3 template, scripted replies through the real tokenizer): the reasoning streams
    marked before the answer, and only the answer joins the history."""
    import asyncio
    import io

    from corpus import template_text, tokenizer_with_markers

    from turnkit import ChatFormat
    from turnkit.serve import ReplayBackend
    from turnkit.serve.models import LoadedModel
    from turnkit.serve.modelspec import ModelSpec
    from turnkit.serve.sampling import NEUTRAL
    from turnkit.serve.terminal import Conversation

    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    fmt = ChatFormat.from_template(template_text("Qwen-Qwen3-0.6B.jinja"), tokenizer=tokenizer, eos_token="<|im_end|>")
    reply = fmt.tokenizer.encode("<think>\nTwo and two.\n</think>\n\nFour.<|im_end|>").ids
    model = LoadedModel(ModelSpec("qwen3", "x"), fmt, ReplayBackend(lambda prompt: reply, delay=0), NEUTRAL)
    conversation = Conversation(model)
    out = io.StringIO()
    content, finish = asyncio.run(conversation.reply("What is 2+2?", out))
    assert out.getvalue() == "(thinking) Two and two.\n\nFour." and (content, finish) == ("Four.", "stop")
    assert conversation.messages[-1] == {"role": "assistant", "content": "Four."}
