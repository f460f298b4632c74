"""Real agent clients against ``turnkit serve``: OpenAI's Codex CLI (``codex exec``, a custom provider with
``wire_api = "responses"``) and Anthropic's Claude Code (``claude -p`` with ``ANTHROPIC_BASE_URL``), headless, on the
embedded model with a tool-capable template. A 135M model's answer is not judged; the protocol is: each exchange
completes, the client reports no error, and it prints the reply the server generated.

The clients come from npm, pinned, installed once into turnkit's cache folder. Nothing may phone home: telemetry,
error reports and update checks are switched off (the machine reaches only package registries anyway).

* Claude Code's npm package is a wrapper whose install script copies in a native binary from its platform package
  (``@anthropic-ai/claude-code-linux-x64``, from the same registry) and which wants node 22; npm 11 does not run
  install scripts it was not told to trust, so the test runs the platform package's binary itself (it needs no node).
* Web search is a hosted tool this server cannot run: Codex is told not to offer it (``web_search = "disabled"``).
* The prompts these clients send are 9k (Codex) and 12k (Claude Code) tokens, past SmolLM2's 8,192. The test serves
  with ``--context 32768`` when ``turnkit serve`` has that flag; without it, it asks each client for a smaller prompt
  with the client's own settings (Codex: ``model_instructions_file``; Claude Code: ``--tools Bash --system-prompt``),
  and says so in the test's log.
* Claude Code runs with ``--tools Bash`` and a short ``--system-prompt`` (a 2k-token prompt): its whole prompt (12k
  tokens) costs minutes to read on CPU, and the long prompt is Codex's part of this test. It asks for 32,000 reply
  tokens, and a 135M model may use them all; the test caps them with Claude Code's own setting
  (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``). A reply cut at that cap is a completed exchange (the server says
  ``max_tokens``, and Claude Code asks to continue, as it does against Anthropic's API) that Claude Code reports as an
  error of its own (``max_output_tokens``): the test accepts that one, and checks that the server cut those replies at
  the cap. The answer to a request past the context, in Anthropic's words, is ``test_serve_messages``'s.
* The server reads prompts on every core (``--prefill-threads``): the tests run one at a time, and a 9k-token prompt
  takes two minutes on one thread.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serve_harness import TOOL_MODEL, turnkit_serve

from turnkit.cache import cache_dir

pytestmark = pytest.mark.slow

CODEX = "@openai/codex@0.169.0"
CLAUDE = "@anthropic-ai/claude-code@2.1.328"
PROMPT = "Say hello in one short sentence."
QUIET = {  # no telemetry, error reports, update checks or other traffic
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


@pytest.fixture(scope="module")
def clients() -> Path:
    """The two CLIs installed from npm into the cache folder (once), pinned."""
    npm = shutil.which("npm")
    assert npm is not None, "npm is needed to install the agent CLIs (node 20 and npm)"
    folder = cache_dir() / "agent-clis" / f"{CODEX.rsplit('@', 1)[1]}-{CLAUDE.rsplit('@', 1)[1]}"
    if not (folder / "node_modules" / ".bin" / "codex").exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--ignore-scripts", CODEX, CLAUDE],
            check=True,
            timeout=900,
            capture_output=True,
        )
    return folder / "node_modules"


def _context_flag() -> list[str]:
    """``--context 32768`` when ``turnkit serve`` has it."""
    helptext = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return ["--context", "32768"] if "--context" in helptext else []


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    context = _context_flag()
    with turnkit_serve(*TOOL_MODEL, *context, "--prefill-threads", str(os.cpu_count() or 1), name="serve-agents") as (
        url,
        log,
    ):
        yield url, log, bool(context)


def _replies(log: Path) -> list[str]:
    """The server's log lines of finished streamed chat replies (every API logs its sessions the same way)."""
    return [line for line in log.read_text().splitlines() if " chat-stream prompt=" in line]


def _run(
    command: list[str], env: dict[str, str], folder: Path, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """A client run headless in ``folder``, no input; with ``check``, it must exit 0."""
    done = subprocess.run(
        command, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
    )
    assert not check or done.returncode == 0, done.stdout + done.stderr
    return done


def test_codex_exec_over_the_responses_api(clients, server, tmp_path):
    url, log, long_context = server
    home = tmp_path / "codex-home"
    home.mkdir()
    settings = [
        'model = "smollm2"',
        'model_provider = "turnkit"',
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
    ]
    if not long_context:
        print("no --context on turnkit serve: Codex runs with a short model_instructions_file")
        instructions = tmp_path / "instructions.md"
        instructions.write_text("You are a coding agent. Answer briefly.\n")
        settings.append(f'model_instructions_file = "{instructions}"')
    settings += [
        "[model_providers.turnkit]",
        'name = "turnkit"',
        f'base_url = "{url}/v1"',
        'wire_api = "responses"',
        'env_key = "TURNKIT_API_KEY"',
        # a 9k-token prompt read by one CPU thread of a busy machine can take minutes before the first event, past
        # Codex's 300 s idle limit; a failure is reported, not retried
        "stream_idle_timeout_ms = 1800000",
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "[analytics]",
        "enabled = false",
        "[otel]",
        'exporter = "none"',
    ]
    (home / "config.toml").write_text("\n".join(settings) + "\n")
    env = {**os.environ, **QUIET, "CODEX_HOME": str(home), "HOME": str(home), "TURNKIT_API_KEY": "unused"}
    before = len(_replies(log))
    done = _run([str(clients / ".bin" / "codex"), "exec", "--skip-git-repo-check", "--json", PROMPT], env, tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("type") in ("error", "turn.failed")], done.stdout
    messages = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert messages and messages[-1].strip(), done.stdout
    assert len(_replies(log)) > before


def test_claude_print_over_the_messages_api(clients, server, tmp_path):
    url, log, _ = server
    binary = clients / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert binary.exists(), f"Claude Code's native binary for this platform is not at {binary}"
    home = tmp_path / "claude-home"
    home.mkdir()
    cap = 512
    env = {
        **os.environ,
        **QUIET,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "unused",
        "API_TIMEOUT_MS": "1800000",  # the prompt's reading may take minutes on a busy machine
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(cap),
    }
    smaller = ["--tools", "Bash", "--system-prompt", "You are a helpful assistant."]
    before = len(_replies(log))
    command = [str(binary), "-p", PROMPT, "--model", "smollm2", "--output-format", "json", *smaller]
    done = _run(command, env, tmp_path, check=False)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    replies = _replies(log)[before:]
    assert replies, done.stdout + done.stderr
    if result["is_error"]:  # only a reply cut at the cap, which the server cut there and called max_tokens
        assert result.get("api_error") == "max_output_tokens", result
        assert all(f"completion={cap} " in line and "finish=length" in line for line in replies), replies
    else:
        assert done.returncode == 0 and result["subtype"] == "success", result
        assert result["result"].strip(), result
    assert result["usage"]["output_tokens"] >= 1, result
