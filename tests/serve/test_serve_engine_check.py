"""The llama.cpp engine's start check: a library that cannot run on this machine stops ``turnkit serve`` and
``turnkit generate`` at start, with one line saying what to do, instead of killing the server on the first token.

A llama.cpp library built for instructions this CPU refuses (a native build using AMX, say) cannot be made on this
machine, so the child process is made to die the same way: a directory put first on ``PYTHONPATH`` holds a fake
``llama_cpp`` package whose import sends its own process SIGILL (or fails, or hangs). The server's own process never
imports it before the check, or the test itself would die by that signal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest
from repo_paths import REPO
from serve_harness import free_port, turnkit_serve

from turnkit.errors import EngineError
from turnkit.serve.engines import EngineOptions, load_backend
from turnkit.serve.engines import llama_check as engine

TURNKIT = [sys.executable, "-m", "turnkit.cli"]

SIGILL = "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n"
BROKEN = "raise RuntimeError('a broken build')\n"
HANGS = "import time\ntime.sleep(600)\n"
SPINS = "while True:\n    pass\n"
#: a child slower than the check's limit on the clock (over 5 s against 2), as on a busy machine, but running all along
#: (a few CPU ticks every half second), then done
SLOW = (
    "import sys, time\n"
    "for _ in range(10):\n"
    "    time.sleep(0.5)\n"
    "    start = time.process_time()\n"
    "    while time.process_time() - start < 0.03:\n"
    "        pass\n"
    "sys.exit(0)\n"
)


def _pinned() -> str:
    """The llama-cpp-python version pyproject.toml pins (the portable command reinstalls that one)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [entry for entry in extras["llama"] if entry.startswith("llama-cpp-python==")]
    return pin


def _fake_library(folder: Path, body: str) -> dict[str, str]:
    """A ``llama_cpp`` package in ``folder`` whose import runs ``body``; the environment that puts it first."""
    (folder / "llama_cpp").mkdir(parents=True)
    (folder / "llama_cpp" / "__init__.py").write_text(body)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}


def _assert_one_line_failure(result: subprocess.CompletedProcess, cause: str) -> None:
    """Exit 2, and stderr's only error line names the cause and both ways out: the portable build's exact command
    (this Python's pip, no cache, the pinned version) and ``--engine torch``."""
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("turnkit: error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    line = errors[0]
    assert "start check" in line and cause in line
    command = f'CMAKE_ARGS="-DGGML_NATIVE=OFF" {sys.executable} -m pip install --no-cache-dir --force-reinstall'
    assert command in line and _pinned() in line and "--engine torch" in line


def test_serve_stops_at_start_when_the_library_dies_by_sigill(smollm2_gguf, tmp_path):
    env = _fake_library(tmp_path, SIGILL)
    port = free_port()
    command = [*TURNKIT, "serve", "--model", str(smollm2_gguf), "--engine", "llama.cpp", "--threads", "1"]
    result = subprocess.run(
        [*command, "--port", str(port)], capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL
    )
    _assert_one_line_failure(result, "killed by SIGILL: the llama.cpp library uses CPU instructions this machine")
    assert "serving" not in result.stderr and "playground" not in result.stderr


def test_generate_stops_before_generating_when_the_library_dies_by_sigill(smollm2_gguf, tmp_path):
    env = _fake_library(tmp_path, SIGILL)
    command = [*TURNKIT, "generate", "--model", str(smollm2_gguf), "--threads", "1", "--prompt", "Hi"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    _assert_one_line_failure(result, "killed by SIGILL")
    assert result.stdout == ""


def test_a_lazy_server_survives_the_library_and_answers_503(smollm2_gguf, tmp_path, monkeypatch):
    """With ``--lazy`` the check runs on the first request: the child dies, the server does not."""
    env = _fake_library(tmp_path, SIGILL)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    with turnkit_serve("--model", str(smollm2_gguf), "--engine", "llama.cpp", "--threads", "1", "--lazy") as (url, _):
        body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 503
        assert "killed by SIGILL" in response.json()["error"]["message"]
        assert httpx.get(url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        (SIGILL, "killed by SIGILL: the llama.cpp library uses CPU instructions this machine refuses"),
        (BROKEN, "exited with status 1 (its last words: RuntimeError: a broken build)"),
    ],
    ids=["sigill", "exits"],
)
def test_load_backend_raises_one_line_engine_error(smollm2_gguf, tmp_path, monkeypatch, body, cause):
    """The Python API path: ``load_backend`` (which ``ModelRegistry`` and the commands use) runs the same check."""
    monkeypatch.setattr(engine, "_PASSED", set())
    monkeypatch.setenv("PYTHONPATH", _fake_library(tmp_path, body)["PYTHONPATH"])
    with pytest.raises(EngineError) as error:
        load_backend(smollm2_gguf, engine="llama.cpp", options=EngineOptions(threads=1))
    message = str(error.value)
    assert cause in message and "\n" not in message
    assert "--no-cache-dir --force-reinstall --no-deps" in message and "--engine torch" in message


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        (HANGS, "it ran not at all for 2 s (asleep or blocked: a hang, not a busy machine)"),
        (SPINS, "it used 2 s of CPU without finishing (a busy loop)"),
    ],
    ids=["asleep", "spins"],
)
def test_a_child_that_hangs_is_stopped_at_the_timeout(smollm2_gguf, tmp_path, monkeypatch, body, cause):
    """The limit counts the child's CPU time: one asleep for good is stopped after that many seconds without a tick,
    one in a busy loop after that many seconds of CPU."""
    monkeypatch.setattr(engine, "_PASSED", set())
    monkeypatch.setenv("PYTHONPATH", _fake_library(tmp_path, body)["PYTHONPATH"])
    with pytest.raises(EngineError, match=re.escape(cause)):
        engine.check_library(smollm2_gguf, timeout=2)


def test_a_slow_child_is_not_stopped_for_slowness(smollm2_gguf, tmp_path, monkeypatch):
    """A child that takes longer than the limit on the clock but runs all along (a busy machine: the check timed out at
    62 s under load 9 when its limit was on the clock) passes."""
    monkeypatch.setattr(engine, "_PASSED", set())
    monkeypatch.setenv("PYTHONPATH", _fake_library(tmp_path, SLOW)["PYTHONPATH"])
    engine.check_library(smollm2_gguf, timeout=2)
    assert len(engine._PASSED) == 1


def test_the_real_library_passes_once_per_process(smollm2_gguf, monkeypatch):
    pytest.importorskip("llama_cpp")
    monkeypatch.setattr(engine, "_PASSED", set())
    engine.check_library(smollm2_gguf)
    assert len(engine._PASSED) == 1
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")  # a second check would still pass; it is not run at all
    engine.check_library(smollm2_gguf)
    assert len(engine._PASSED) == 1
