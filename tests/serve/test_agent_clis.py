"""Real agent clients against ``turnkit serve``: OpenAI's Codex CLI (``codex exec``, a custom provider with
``wire_api = "responses"``) and Anthropic's Claude Code (``claude -p`` with ``ANTHROPIC_BASE_URL``), headless, on the
embedded model with a tool-capable template. A 135M model's answer is not judged; the protocol is: each exchange
completes, the client reports no error, and it prints the reply the server generated.

What runs is what the serve guide says, read from its section "Coding agents: Codex CLI and Claude Code"
(:func:`recipe`): its ``turnkit serve`` line (given a free port), Codex's ``config.toml`` and both commands, as
written. The test adds only what a headless run on a test machine needs, never a setting that changes what the server
is asked: ``--skip-git-repo-check --json`` for Codex, ``--output-format json`` for Claude Code, the settings below.

The clients come from npm, pinned, installed once into turnkit's cache folder. Nothing may phone home: telemetry,
error reports and update checks are switched off (the machine reaches only package registries anyway).

* Claude Code's npm package is a wrapper whose install script copies in a native binary from its platform package
  (``@anthropic-ai/claude-code-linux-x64``, from the same registry) and which wants node 22; npm 11 does not run
  install scripts it was not told to trust, so the test runs the platform package's binary itself (it needs no node).
* Codex runs with the guide's config, which leaves web search as Codex's default has it: offered, as the hosted
  ``web_search`` tool. The server leaves it out of the prompt; the test checks the log says so.
* The prompts these clients send are 9k (Codex) and 12k (Claude Code) tokens, past SmolLM2's 8,192: the guide's
  server line has ``--context 32768``.
* Claude Code runs with ``--tools Bash`` and a short ``--system-prompt`` (a 2k-token prompt), as the guide writes it:
  its whole prompt (12k tokens) costs minutes to read on CPU, and the long prompt is Codex's part of this test. It
  asks for 32,000 reply tokens, and a 135M model may use them all; the test caps them with Claude Code's own setting
  (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``). A reply cut at that cap is a completed exchange (the server says
  ``max_tokens``, and Claude Code asks to continue, as it does against Anthropic's API) that Claude Code reports as an
  error of its own (``max_output_tokens``): the test accepts that one, and checks that the server cut those replies at
  the cap. The answer to a request past the context, in Anthropic's words, is ``test_serve_messages``'s.
* The test settings: no telemetry or update checks; Codex waits up to 30 minutes for a first event (a 9k-token prompt
  read by one CPU thread of a busy machine can take minutes, past Codex's 300 s) and retries nothing, so a failure is
  reported; Claude Code waits as long (``API_TIMEOUT_MS``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_examples import fences
from repo_paths import REPO
from serve_harness import turnkit_serve

from turnkit.cache import cache_dir

pytestmark = pytest.mark.slow

CODEX = "@openai/codex@0.169.0"
CLAUDE = "@anthropic-ai/claude-code@2.1.328"
GUIDE = REPO / "docs" / "guides" / "serve.md"
SECTION = "## Coding agents: Codex CLI and Claude Code"
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


@dataclass(frozen=True)
class Command:
    """A shell line of the guide: its ``NAME=value`` assignments and the command's words."""

    env: dict[str, str]
    argv: list[str]


@dataclass(frozen=True)
class Recipe:
    """The guide's agent section: ``turnkit serve``'s arguments, Codex's ``config.toml``, and the two commands."""

    serve: list[str]
    codex_config: str
    codex: Command
    claude: Command


def recipe() -> Recipe:
    """The guide's section "Coding agents" as written: its server block, its ``toml`` block and the bash block with
    the ``codex`` and ``claude`` lines (a line may go on after a backslash)."""
    lines = GUIDE.read_text(encoding="utf-8").splitlines()
    assert SECTION in lines, f"{GUIDE} has no section {SECTION!r}"
    start = lines.index(SECTION) + 1
    end = next((i + 1 for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines) + 1)
    section = [fence for fence in fences(GUIDE) if start < fence.line < end]
    (server,) = [fence for fence in section if ("server", "") in fence.directives]
    (config,) = [fence for fence in section if fence.language == "toml"]
    (commands,) = [fence for fence in section if fence.language == "bash" and "codex exec" in fence.body]
    serve = shlex.split(server.body)
    assert serve[:2] == ["turnkit", "serve"] and "--port" not in serve, server.body
    shell = [_command(line) for line in commands.body.replace("\\\n", " ").splitlines() if line.strip()]
    (codex,) = [command for command in shell if command.argv[0] == "codex"]
    (claude,) = [command for command in shell if command.argv[0] == "claude"]
    return Recipe(serve[2:], config.body + "\n", codex, claude)


def _command(line: str) -> Command:
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return Command(env, words)


def _here(text: str, url: str) -> str:
    """The guide's ``127.0.0.1:8000`` (or ``localhost:8000``) as the test server's address."""
    return re.sub(r"http://(127\.0\.0\.1|localhost):8000\b", url, text)


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    agents = recipe()
    with turnkit_serve(*agents.serve, name="serve-agents") as (url, log):
        yield url, log, agents


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
    url, log, agents = server
    home = tmp_path / "codex-home"
    home.mkdir()
    config = _here(agents.codex_config, url)
    provider = tomllib.loads(config)["model_providers"][tomllib.loads(config)["model_provider"]]
    assert provider["wire_api"] == "responses" and provider["base_url"] == url + "/v1", config
    tables = [line for line in config.splitlines() if line.startswith("[")]
    assert tables[-1] == "[model_providers.turnkit]", "the test's provider settings follow the guide's provider table"
    settings = [
        "check_for_update_on_startup = false",
        config,
        # the provider's: a 9k-token prompt read by one CPU thread of a busy machine can take minutes before the first
        # event, past Codex's 300 s idle limit; a failure is reported, not retried
        "stream_idle_timeout_ms = 1800000",
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "[analytics]",
        "enabled = false",
        "[otel]",
        'exporter = "none"',
    ]
    (home / "config.toml").write_text("\n".join(settings) + "\n")
    assert "web_search" not in config  # Codex's default: web search offered
    env = {**os.environ, **QUIET, **agents.codex.env, "CODEX_HOME": str(home), "HOME": str(home)}
    codex, command, *words = agents.codex.argv
    assert command == "exec", agents.codex.argv
    before, dropped = len(_replies(log)), len(_dropped(log))
    done = _run([str(clients / ".bin" / codex), "exec", "--skip-git-repo-check", "--json", *words], env, tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("type") in ("error", "turn.failed")], done.stdout
    messages = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert messages and messages[-1].strip(), done.stdout
    assert len(_replies(log)) > before
    assert any(" web_search (a hosted tool" in line for line in _dropped(log)[dropped:]), log.read_text()[-4000:]


def _dropped(log: Path) -> list[str]:
    """The server's log lines of requests served without the built-in tools they offered."""
    return [line for line in log.read_text().splitlines() if "served without the built-in tools" in line]


def test_claude_print_over_the_messages_api(clients, server, tmp_path):
    url, log, agents = server
    binary = clients / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert binary.exists(), f"Claude Code's native binary for this platform is not at {binary}"
    home = tmp_path / "claude-home"
    home.mkdir()
    cap = 512
    env = {
        **os.environ,
        **QUIET,
        **{name: _here(value, url) for name, value in agents.claude.env.items()},
        "HOME": str(home),
        "API_TIMEOUT_MS": "1800000",  # the prompt's reading may take minutes on a busy machine
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(cap),
    }
    assert env["ANTHROPIC_BASE_URL"] == url, agents.claude.env
    before = len(_replies(log))
    command = [str(binary), *agents.claude.argv[1:], "--output-format", "json"]
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
