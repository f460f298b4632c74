"""``turnkit serve --engine vllm`` and ``turnkit generate --engine vllm`` as a user runs them: the command line in a
process group of its own (a terminal's foreground group), its stdout and stderr apart, through the official openai
client. What is checked here is what only the command line shows: vLLM's own defaults where no flag sets them, vLLM's
log kept off stdout, ``--vllm-arg`` checked before any model is read, and Ctrl-C (SIGINT to the whole group, as a
terminal sends it) draining running streams instead of ending them through vLLM's engine process.

It runs in ``.venv-vllm`` (``./dev.sh vllm-test``; ``./dev.sh test`` under ``CI=true``); in ``.venv`` it skips. Two
vLLM starts (the server, and ``generate``'s), each a few minutes on 2 cores, are most of its time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed in this venv: tests/serve/test_serve_vllm_cli.py runs in .venv-vllm "
    "(./dev.sh vllm-setup, then ./dev.sh vllm-test)",
)

import httpx
from openai import OpenAI
from serve_harness import end_tokens_banned, free_port, process_alive, process_children, wait_until_up

#: vLLM's CPU build as the other vLLM modules run it: 1 GiB of key/value cache, threads not pinned to cores.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TOKENIZERS_PARALLELISM": "false"}
TURNKIT = (sys.executable, "-m", "turnkit.cli")


class _Server:
    def __init__(self, url: str, process: subprocess.Popen[bytes], stdout: Path, stderr: Path) -> None:
        self.url = url
        self.process = process
        self.stdout = stdout
        self.stderr = stderr
        self.client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory) -> Iterator[_Server]:
    """``turnkit serve --engine vllm`` on the embedded model with no --max-batch, in a session (and so a process
    group) of its own, as a terminal runs a command."""
    logs = tmp_path_factory.mktemp("vllm-cli")
    port = free_port()
    command = [
        *TURNKIT, "serve", "--engine", "vllm", "--model", str(smollm2_gguf), "--context", "2048", "--threads", "2",
        "--vllm-arg", "dtype=bfloat16", "--port", str(port), "--drain-seconds", "120",
    ]  # fmt: skip
    stdout, stderr = logs / "stdout", logs / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, **ENV}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_up(url, process, timeout=1200)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}; its stderr ends:\n{stderr.read_text(errors='replace')[-4000:]}") from None
        yield _Server(url, process, stdout, stderr)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()


def test_vllm_runs_with_its_own_batch_size_where_no_flag_sets_it(server):
    """No --max-batch: vLLM keeps its own ``max_num_seqs`` (as vLLM resolves it for this model and machine, 128 on
    CPU), turnkit's queue admits as many at once, and the start line and ``/health`` say so (it was 16 on every
    engine, so a burst of 100 chats waited in turnkit's queue or got 429s that vLLM's own server ran)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    (model,) = httpx.get(server.url + "/health").json()["models"]
    engine = model["engine"]
    config = AsyncEngineArgs(
        model=engine["model"], skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048
    ).create_engine_config()
    expected = int(config.scheduler_config.max_num_seqs)
    assert expected > 16
    assert engine["max_num_seqs"] == expected and "max_num_seqs" not in engine["args"]
    assert f"max_num_seqs {expected}" in server.stderr.read_text(errors="replace")


def test_vllms_log_stays_off_stdout(server):
    """vLLM logs to stdout by default; turnkit's server writes nothing there (its lines and vLLM's go to stderr)."""
    reply = server.client.chat.completions.create(
        model=httpx.get(server.url + "/health").json()["model"],
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].message.content is not None
    assert server.stdout.read_text(errors="replace") == ""
    err = server.stderr.read_text(errors="replace")
    assert "turnkit: serving" in err and "vllm" in err.lower()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--vllm-arg", "foo=1"), "--vllm-arg foo: vLLM's engine has no option 'foo'"),
        (("--vllm-arg", "enable_prefix_cachng=true"), "did you mean enable_prefix_caching"),
        (("--vllm-arg", "enable_prefix_caching=maybe"), '--vllm-arg enable_prefix_caching="maybe": not a value'),
        (("--vllm-arg", "max_num_seqs=4", "--max-batch", "8"), "set the same vLLM option: give one of them"),
        (("--vllm-arg", "max_model_len=1000", "--context", "2048"), "--vllm-arg max_model_len=1000 and --context"),
    ],
)
def test_a_wrong_vllm_arg_is_one_line_before_any_model_is_read(smollm2_gguf, tmp_path, flags, says):
    """An unknown name, a mistyped value, or an option given both as --vllm-arg and as the turnkit flag that sets
    it: one line, exit 2, and no model read (a path that is not there would be named otherwise)."""
    command = [*TURNKIT, "serve", "--engine", "vllm", "--model", str(smollm2_gguf), "--port", "0", *flags]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("turnkit: error:")]
    assert says in line
    assert "Traceback" not in result.stderr and "turnkit: reading" not in result.stderr


def test_generate_on_vllm_writes_the_reply_alone_to_stdout(smollm2_gguf, server):
    """``turnkit generate --engine vllm`` (vLLM on a loop of its own, no server): stdout is the reply and nothing
    else, the same greedy reply the server gives the same message; vLLM's log on stderr."""
    prompt = "What is the capital of France?"
    command = [
        *TURNKIT, "generate", "--engine", "vllm", "--model", str(smollm2_gguf), "--prompt", prompt,
        "--temperature", "0", "--max-tokens", "12", "--threads", "2",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    served = server.client.chat.completions.create(
        model=httpx.get(server.url + "/health").json()["model"],
        messages=[{"role": "user", "content": prompt}],
        max_tokens=12,
        temperature=0,
    )
    assert result.stdout.strip() == (served.choices[0].message.content or "").strip()


def test_ctrl_c_to_the_group_drains_running_streams(server, smollm2_gguf):
    """SIGINT to the whole process group (Ctrl-C in a terminal; systemd and ``timeout`` send SIGTERM the same way)
    while two streams run: both end as they would have (their whole budget, no error), the server exits 0 after
    them, with no traceback: vLLM's engine process, shielded from the group's signal, is stopped by turnkit after the
    drain. Before, the signal reached vLLM's engine too and both streams ended with "the server failed while
    generating" within seconds. Last in the module: it stops the server."""
    model = httpx.get(server.url + "/health").json()["model"]
    engines = [pid for pid in process_children(server.process.pid) if "EngineCore" in _command(pid)]
    assert engines, "vLLM's engine process is turnkit's child"
    assert {os.getpgid(pid) for pid in engines}.isdisjoint({os.getpgid(server.process.pid)})  # out of the group
    banned = end_tokens_banned(smollm2_gguf)  # each stream runs its whole budget, past the moment of the signal
    started = threading.Barrier(3)

    def stream(n: int) -> dict[str, Any]:
        chunks = server.client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Count from {n} to a thousand, one number per line."}],
            max_tokens=160,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            logit_bias=banned,
        )
        text, finish, usage, waited = "", None, None, False
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
                if text and not waited:
                    waited = True
                    started.wait(timeout=600)
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        return {"text": text, "finish": finish, "tokens": usage}

    with ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(stream, n) for n in (1, 500)]
        started.wait(timeout=600)
        os.killpg(server.process.pid, signal.SIGINT)
        results = [future.result(timeout=900) for future in streams]
    assert [(r["finish"], r["tokens"]) for r in results] == [("length", 160), ("length", 160)], results
    assert server.process.wait(timeout=300) == 0
    err = server.stderr.read_text(errors="replace")
    assert "SIGINT: draining" in err and "turnkit: stopped" in err
    assert "Traceback" not in err and "failed while generating" not in err
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(process_alive(pid) for pid in engines):
        time.sleep(0.5)
    assert not any(process_alive(pid) for pid in engines)  # turnkit stopped vLLM's engine process after the drain


def _command(pid: int) -> str:
    """A process's command line (vLLM names its engine process ``VLLM::EngineCore``), or '' once it is gone."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
