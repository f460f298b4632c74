"""What the server tests share: a free loopback port, waiting for a server to answer, and the real app served by
uvicorn in a thread (real HTTP, keep-alive connections included) for the tests that script the model's replies."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

# the tool the scripted replies call
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


#: ``turnkit serve`` arguments for the embedded model as agents need it: qwen2.5's template (hermes tool calls), the
#: embedded model's sampling defaults, llama.cpp on one thread (two threads crawl on a busy machine).
TOOL_MODEL = ("--model", "smollm2=default:qwen2.5", "--engine", "llama.cpp", "--threads", "1")


@contextmanager
def turnkit_serve(
    *arguments: str, name: str = "serve", env: dict[str, str] | None = None
) -> Iterator[tuple[str, Path]]:
    """``turnkit serve ARGUMENTS --port P`` as a subprocess (``env``: variables added to this one's environment), its
    output in a log file; yields (URL, log) once it answers ``/health``, and stops it on the way out."""
    with turnkit_serve_process(*arguments, name=name, env=env) as (url, _process, log):
        yield url, log


@contextmanager
def turnkit_serve_process(
    *arguments: str, name: str = "serve", env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """:func:`turnkit_serve`, yielding the process too (for a test that signals it); stopped on the way out unless the
    test ended it."""
    port = free_port()
    command = [sys.executable, "-m", "turnkit.cli", "serve", *arguments, "--port", str(port)]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"turnkit-{name}-{port}.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        yield url, process, log
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)


#: Ports handed out by :func:`free_port`: below Linux's ephemeral range (32768-60999), where the kernel never picks a
#: client connection's local port, in blocks of :data:`_BLOCK`: one for each pytest-xdist worker (``gw0``, ``gw1``
#: ...), the blocks of one test run placed by its process id, so that another run on the machine starts elsewhere.
_FIRST_PORT, _LAST_PORT, _BLOCK = 20000, 32000, 400
_handed: list[int] = []  # the ports this process handed out, in order


#: ``turnkit serve``'s flag that runs vLLM's engine eager (``enforce_eager``), as the vLLM tests run it (in process in
#: ``test_serve_vllm.py``, as ``--ray`` replicas, and the plugin's server with vLLM's own ``--enforce-eager``):
#: torch.compile adds about 15 CPU-seconds to each vLLM start from inductor's cache (52 s against 38 s on 2 cores),
#: and minutes to the first one on a machine without that cache (a fresh CI machine). Nothing turnkit does depends on
#: the mode, but bf16 greedy replies of the two can differ, so a test comparing replies runs both sides alike:
#: ``turnkit generate`` has no ``--vllm-arg``, so it and the server it is compared with (``test_serve_vllm_cli.py``)
#: run compiled.
VLLM_EAGER = ("--vllm-arg", "enforce_eager=true")


def free_port() -> int:
    """A loopback port free now and not handed out before by this process, for a server a test starts (which binds it
    a moment later). Ports come from this worker's own block, so parallel workers never race for one, and a client
    connection (which takes its local port from the ephemeral range) cannot take it in the meantime."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    run = os.getppid() if worker else os.getpid()  # a worker's parent is the run's controller
    index = int(worker.removeprefix("gw")) if worker and worker.removeprefix("gw").isdigit() else 0
    block = _FIRST_PORT + (run * 7 + index) % ((_LAST_PORT - _FIRST_PORT) // _BLOCK) * _BLOCK
    after = _handed[-1] - block + 1 if _handed else 0
    for step in range(_BLOCK):
        port = block + (after + step) % _BLOCK
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.append(port)
        return port
    with socket.socket() as sock:  # the whole block is taken (by another run): any free port
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(
    url: str, process: subprocess.Popen | None = None, timeout: float = 240, *, announced: Path | None = None
) -> None:
    """Wait until ``/health`` answers 200 and, with ``announced`` (the server's log), the server has said where its
    endpoint is: ``turnkit serve --ray`` answers through Serve's fallback proxy before HAProxy routes to the replicas
    (which it waits for before saying so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited: {process.stdout.read() if process.stdout else ''}")
        try:
            healthy = httpx.get(url + "/health", timeout=2).status_code == 200
            if healthy and (announced is None or "endpoint http" in announced.read_text(errors="replace")):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not come up")


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on loopback in a daemon thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def whole_and_streamed(client: Any, messages: list[dict[str, Any]], max_tokens: int = 24) -> tuple[Any, list[Any]]:
    """The same greedy request answered whole and streamed with usage, through the official client; checks that the
    stream spells the whole answer and ends with a usage chunk that counts the same tokens."""
    whole = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=max_tokens)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=messages,
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    return whole, chunks


def end_tokens_banned(model: Path) -> dict[str, float]:
    """A ``logit_bias`` that bans every id that ends the model's reply (its end-of-turn markers and EOS): a request
    with it runs until its client leaves, the server stops it, or ``max_tokens``. At temperature 1 a small model may
    otherwise end its reply before the moment a test waits for."""
    from turnkit import ChatFormat

    return {str(token): -100 for token in ChatFormat.from_pretrained(model).stop_ids}


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state, parent, ...), or None when it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def session_processes(session: int) -> list[int]:
    """The live processes of session ``session`` (a command started with ``start_new_session``: all it started that
    did not start a session of its own, wherever their process groups are)."""
    return _live_processes(_SESSION, session)


def process_children(parent: int) -> list[int]:
    """The live processes whose parent is ``parent``."""
    return _live_processes(_PARENT, parent)


#: Fields of ``/proc/PID/stat`` after the command's name (:func:`_proc_stat`).
_PARENT, _SESSION = 1, 3


def _live_processes(field: int, value: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        fields = _proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[field]) == value and fields[0] != "Z":
            found.append(int(entry.name))
    return found
