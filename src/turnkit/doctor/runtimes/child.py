"""A long-lived child process spoken to in JSON lines: how the runtimes that are not Python are run.

One process per check (not one per render): ``@huggingface/jinja``'s node start and llama.cpp's program start cost
more than a render, and the corpus table renders tens of thousands of times. Each request is one line of JSON
(``{"template", "context"}``), each answer one line (``{"text"}`` or ``{"error"}``). A render that passes its time
limit, or a process that dies (a template that crashes the runtime), fails that render only: the process is killed
and started again for the next one.
"""

from __future__ import annotations

import json
import select
import subprocess
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from turnkit.doctor.runtimes.base import RENDER_TIMEOUT_S, Renderer, RenderFailure

__all__ = ["ChildRenderer", "LineProcess"]


class LineProcess:
    """``command`` started on first use, asked one JSON line at a time."""

    def __init__(self, command: Sequence[str], what: str) -> None:
        self.command = list(command)
        self.what = what
        self._process: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        return self._process

    def ask(self, template: str, context: dict[str, Any], timeout: float = RENDER_TIMEOUT_S) -> str | RenderFailure:
        """The render of ``template`` with ``context``, or the runtime's error."""
        process = self._start()
        assert process.stdin is not None and process.stdout is not None
        line = json.dumps({"template": template, "context": context}, ensure_ascii=False) + "\n"
        try:
            process.stdin.write(line.encode("utf-8"))
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], timeout)
            answer = process.stdout.readline() if ready else b""
        except (BrokenPipeError, OSError):
            answer = b""
        if not answer:
            return self._lost(process, timeout)
        reply = json.loads(answer)
        return reply["text"] if "text" in reply else RenderFailure(reply["error"])

    def _lost(self, process: subprocess.Popen[bytes], timeout: float) -> RenderFailure:
        """The process gave no answer: killed (past the time limit) or dead (the runtime crashed); restarted next."""
        alive = process.poll() is None
        process.kill()
        _, err = process.communicate()
        self._process = None
        if alive:
            return RenderFailure(f"{self.what} did not finish the render in {timeout:g} s (stopped)")
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {process.returncode}"]
        return RenderFailure(f"{self.what} crashed: {tail[0]}")

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.communicate()
            self._process = None


class ChildRenderer(Renderer):
    """A renderer whose runtime is a program spoken to in JSON lines: started on the first render, stopped by close."""

    #: How long one render may take before the process is killed (and started again for the next).
    timeout_s = RENDER_TIMEOUT_S

    def __init__(self) -> None:
        self._process: LineProcess | None = None

    @abstractmethod
    def command(self) -> list[str]:
        """The program and its arguments."""

    def render(self, template: str, context: dict[str, Any]) -> str | RenderFailure:
        if self._process is None:
            self._process = LineProcess(self.command(), self.version())
        return self._process.ask(template, context, self.timeout_s)

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None
