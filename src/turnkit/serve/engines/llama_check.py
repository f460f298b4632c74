"""The llama.cpp engine's start check: prove, in a child process, that the library runs on this machine.

A llama.cpp library built for instructions this CPU refuses (a native build from another machine, or
a native wheel pip reused from its cache: pip's wheel cache does not key on ``CMAKE_ARGS``) loads and reports nothing
wrong, then dies with SIGILL on the first token, taking the whole server with it. :func:`check_library` therefore
generates one token in a child process first (``load_backend`` runs it before every llama.cpp load), and a child that
dies, fails or hangs becomes one :class:`~turnkit.errors.EngineError` saying what to do.

A busy machine is not a broken library: the check never fails for slowness alone. Its limit counts the child's own
CPU time (``/proc``), not the clock: a child that gets a sliver of a core behind other work (0.4 s of work took 62 s
at load 9 on 2 cores) keeps going as long as it runs at all, and is stopped only when it spins past the limit in CPU
seconds, or runs not at all (asleep or blocked, no CPU tick) for that many seconds on end. Where ``/proc`` is not
there, the limit is on the clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from turnkit.errors import EngineError

__all__ = ["check_library", "portable_install_command"]

#: The child of :func:`check_library`: llama-cpp-python's low-level API only (no turnkit import, so it starts fast),
#: a 32-token prompt in one batch (the batched matrix kernels prompts use), then one generated token (the one-row
#: kernels of decoding). Exit 3: llama.cpp ran but refused the model or the context, which the real load reports.
_CHILD = r"""
import ctypes, sys
path, threads, batch_threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import llama_cpp as ll
@ll.llama_log_callback
def quiet(level, text, user_data):
    pass
ll.llama_log_set(quiet, ctypes.c_void_p(0))
ll.llama_backend_init()
model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
if not model:
    sys.exit(3)
params = ll.llama_context_default_params()
params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 256, 64, 64, 1
params.n_threads, params.n_threads_batch = threads, batch_threads
params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
params.no_perf = True
ctx = ll.llama_init_from_model(model, params)
if not ctx:
    sys.exit(3)
n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
batch = ll.llama_batch_init(64, 0, 1)
def decode(tokens, start):
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
    batch.n_tokens = len(tokens)
    status = ll.llama_decode(ctx, batch)
    if status:
        sys.exit(f"llama_decode failed with status {status}")
    logits = ll.llama_get_logits_ith(ctx, len(tokens) - 1)
    return max(range(n_vocab), key=lambda i: logits[i])
token = decode([i % n_vocab for i in range(32)], 0)
decode([token], 32)
print("ok", flush=True)
"""

#: Checks passed in this process, by model file (path, size, modification time) and threads: a model unloaded and
#: loaded again, in the same process with the same library, is not checked twice. Nothing is kept across runs.
_PASSED: set[tuple[str, int, int, int, int]] = set()


def portable_install_command() -> str:
    """The exact command that replaces this environment's llama-cpp-python by the portable build of the same version,
    compiled afresh (``--no-cache-dir``: pip's cache does not key on ``CMAKE_ARGS``, so a native wheel cached once would
    be reused)."""
    from importlib import metadata

    try:
        package = f"llama-cpp-python=={metadata.version('llama-cpp-python')}"
    except metadata.PackageNotFoundError:
        package = "llama-cpp-python"
    return (
        f'CMAKE_ARGS="-DGGML_NATIVE=OFF" {sys.executable} -m pip install --no-cache-dir --force-reinstall --no-deps '
        f"{package}"
    )


def check_library(
    path: str | Path, *, threads: int = 1, prefill_threads: int | None = None, timeout: float | None = None
) -> None:
    """Prove that llama.cpp runs on this machine: load ``path`` and generate one token in a child process
    (``python -c``, not a fork of this one), where a library that crashes cannot take the server down.

    The child loads the model as the engine does, memory-mapped: the file's pages come from the page cache, shared
    with the load that follows, so the check costs a Python start, llama-cpp-python's import, a 32-token prompt and
    one token (0.35-0.4 s for the embedded model on a shared 2-core machine, 0.15 s of it the import; a large model's
    weights are read once, by whichever load comes first). ``threads`` and ``prefill_threads`` are the engine's.

    ``timeout`` (default: a minute, plus a second for every 50 MB of the file) is counted in the child's CPU seconds,
    and in seconds on end without a CPU tick: a hung child is stopped, a slow one on a busy machine is waited for.

    Raises:
        EngineError: the child was killed by a signal (SIGILL: the library uses CPU instructions this machine refuses),
            exited with an error, used ``timeout`` seconds of CPU without finishing, or ran not at all for ``timeout``
            seconds; the message is one line with the portable build's exact command, or ``--engine torch``.
    """
    path = Path(path)
    stat = path.stat()
    batch_threads = prefill_threads or threads
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, threads, batch_threads)
    if key in _PASSED:
        return
    if timeout is None:
        timeout = 60.0 + stat.st_size / 50e6
    advice = f"rebuild it portable with {portable_install_command()}, or use --engine torch"
    what = f"the llama.cpp engine failed its start check (one token of {path.name} in a child process)"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(threads), str(batch_threads)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    stuck = _Watch(child.pid, timeout)
    wait = 0.02
    while True:
        try:
            _, stderr = child.communicate(timeout=wait)  # retried after a timeout without losing output
            break
        except subprocess.TimeoutExpired:
            wait = min(wait * 2, 0.5)
            if (why := stuck.verdict()) is not None:
                child.kill()
                child.communicate()
                raise EngineError(f"{what}: {why}; {advice}") from None
    if child.returncode in (0, 3):  # 3: llama.cpp ran and refused the file; the engine's own load says why
        _PASSED.add(key)
        return
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = f" (its last words: {said[-1]})" if said else ""
    if child.returncode < 0:
        number = -child.returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if number == signal.SIGILL:
            cause = "the llama.cpp library uses CPU instructions this machine refuses (a native build)"
        else:
            cause = "the llama.cpp library crashed (a build for another CPU, or a broken build)"
        raise EngineError(f"{what}: the child was killed by {name}: {cause}{last}; {advice}")
    raise EngineError(f"{what}: the child exited with status {child.returncode}{last}; {advice}")


class _Watch:
    """Whether a running child is stuck rather than slow: it used ``limit`` seconds of CPU (a busy loop), or no CPU at
    all for ``limit`` seconds on end (asleep, blocked: a hang). Without ``/proc``: ``limit`` seconds on the clock."""

    def __init__(self, pid: int, limit: float) -> None:
        self._stat = Path(f"/proc/{pid}/stat")
        self._limit = limit
        self._started = self._moved = time.monotonic()
        self._cpu = 0.0

    def verdict(self) -> str | None:
        """None while the child may go on; else why it is stopped, for the error line."""
        now = time.monotonic()
        cpu = self._cpu_seconds()
        if cpu is None:
            if now - self._started >= self._limit:
                return f"it did not finish in {self._limit:.0f} s"
            return None
        if cpu > self._cpu:
            self._cpu, self._moved = cpu, now
        if cpu >= self._limit:
            return f"it used {self._limit:.0f} s of CPU without finishing (a busy loop)"
        if now - self._moved >= self._limit:
            return f"it ran not at all for {self._limit:.0f} s (asleep or blocked: a hang, not a busy machine)"
        return None

    def _cpu_seconds(self) -> float | None:
        """The child's user and system CPU time, all its threads; None where ``/proc`` cannot tell."""
        try:
            fields = self._stat.read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, IndexError, ValueError):
            return None


#: Clock ticks a second, the unit of ``/proc``'s CPU times.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
