"""The documentation's test harness: the site's strict build, and the examples of README.md and docs/, collected from
the Markdown and run as a reader would run them.

The convention (docs/contributing.md, "The documentation"):

* a ``python`` or ``bash`` fence runs; every other fence does not, and a fence with no language or with another name
  for Python or a shell is refused, so an example cannot escape by its label;
* a page's blocks run in order in one scratch folder (with a copy of ``examples/``); its Python blocks share one
  interpreter, its bash blocks run in ``bash -e`` with the virtual environment's ``bin`` first on ``PATH``;
* an ``output`` fence right after a block is what the block must print on standard output (``...`` stands for any
  text);
* ``<!-- docs-test: skip: REASON -->``, ``<!-- docs-test: exit N -->`` and ``<!-- docs-test: server -->`` right before
  a block change how it runs.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from repo_paths import REPO
from serve_harness import free_port, wait_until_up

ROOT = REPO

RUNS = {"python", "bash"}
#: Fences that never run: command synopses and file contents, and the expected output itself.
SHOWN = {"text", "output", "toml", "json", "yaml", "jinja"}
#: Names under which a shell or Python example would silently not run.
REFUSED = {"", "sh", "shell", "console", "zsh", "py", "python3", "pycon", "ipython"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
#: ``<!-- docs-test: WORD[: TEXT| N] -->``
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(?P<word>[a-z]+)(?P<text>.*?)-->", re.DOTALL)
#: How long one block may run, and how long a server may take to answer /health. A block's limit counts the CPU
#: seconds of its processes (and seconds on end in which they use none), not the clock: on a busy machine a training
#: example took more than 300 s of the clock and finished; a runaway or a hang is stopped all the same (:class:`Watch`).
BLOCK_TIMEOUT = 300
SERVER_TIMEOUT = 240


class Watch:
    """Whether a block's process, with its children, is stuck rather than slow: it used ``limit`` CPU seconds, or no
    CPU at all for ``limit`` seconds on end. Without ``/proc``: ``limit`` seconds on the clock."""

    def __init__(self, pid: int, limit: float = BLOCK_TIMEOUT) -> None:
        self.pid, self.limit = pid, limit
        self.started = self.moved = time.monotonic()
        self.first = self.last = self.cpu()

    def stuck(self) -> bool:
        now, cpu = time.monotonic(), self.cpu()
        if cpu is None or self.first is None:
            return now - self.started >= self.limit
        if self.last is None or cpu > self.last:
            self.last, self.moved = cpu, now
        return cpu - self.first >= self.limit or now - self.moved >= self.limit

    def cpu(self) -> float | None:
        """CPU seconds of the process and its live descendants, and of the children it has waited for."""
        try:
            stats = {}
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    except (OSError, IndexError):
                        continue
                    stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
        except OSError:
            return None
        if self.pid not in stats:
            return None
        tree, total, grew = {self.pid}, 0, True
        while grew:
            grew = False
            for pid, (parent, _) in stats.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            total += stats[pid][1]
        return total / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


_STUCK = f"the example ran past {BLOCK_TIMEOUT} s of CPU, or used none for {BLOCK_TIMEOUT} s on end"


class DocsExampleError(AssertionError):
    """An example that failed, with the page and line, so the message points at the Markdown to fix."""


@dataclass
class Block:
    page: Path
    line: int  # of the first line of code
    language: str
    code: str
    expected: str | None = None
    skip: str | None = None
    exit_status: int = 0
    server: bool = False

    @property
    def where(self) -> str:
        return f"{_shown_path(self.page)}:{self.line}"


@dataclass
class Fence:
    line: int  # of the opening fence
    info: str
    body: str
    directives: list[tuple[str, str]] = field(default_factory=list)

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""


def _shown_path(page: Path) -> str:
    try:
        return str(page.relative_to(ROOT))
    except ValueError:
        return str(page)


def fences(page: Path) -> list[Fence]:
    """Every fenced block of a Markdown page, with the ``docs-test`` directives in the comment right before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Fence] = []
    pending: list[tuple[str, str]] = []
    comment: list[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if comment is not None:
            comment.append(line)
            if "-->" in line:
                pending.extend(_directives("\n".join(comment)))
                comment = None
            i += 1
            continue
        if line.lstrip().startswith("<!--"):
            if "-->" in line:
                pending.extend(_directives(line))
            else:
                comment = [line]
            i += 1
            continue
        match = _FENCE.match(line)
        if match is None:
            if line.strip():
                pending = []  # a directive belongs to the block right after it, nothing in between
            i += 1
            continue
        indent, marker = match.group("indent"), match.group("fence")
        start, body = i, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(marker) and lines[i].strip().strip(marker[0]) == ""):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i >= len(lines):
            raise DocsExampleError(f"{_shown_path(page)}:{start + 1}: the fence is never closed")
        found.append(Fence(start + 1, match.group("info").strip(), "\n".join(body), pending))
        pending = []
        i += 1
    return found


def _directives(comment: str) -> list[tuple[str, str]]:
    return [(m.group("word"), m.group("text").strip().lstrip(":").strip()) for m in _DIRECTIVE.finditer(comment)]


def collect(page: Path) -> list[Block]:
    """The runnable blocks of a page, each with its expected output and directives; refuses what would not run by
    mistake (a fence without a language, a shell under another name, an output block after nothing, a skip without a
    reason, an unknown directive)."""
    blocks: list[Block] = []
    previous: Block | None = None
    for fence in fences(page):
        where = f"{_shown_path(page)}:{fence.line}"
        language = fence.language
        if language in REFUSED:
            raise DocsExampleError(
                f"{where}: a fence {language or 'without a language'!r}: examples are ```python or ```bash (they run), "
                f"anything else is one of {sorted(SHOWN)}"
            )
        if language == "output":
            if previous is None or previous.expected is not None:
                raise DocsExampleError(f"{where}: an output block must follow a python or bash block")
            previous.expected = fence.body
            continue
        if language not in RUNS:
            if language not in SHOWN:
                raise DocsExampleError(
                    f"{where}: unknown fence language {language!r} (runs: {sorted(RUNS)}; shown: {sorted(SHOWN)})"
                )
            previous = None
            continue
        block = Block(page, fence.line + 1, language, fence.body)
        for word, text in fence.directives:
            if word == "skip":
                if not text:
                    raise DocsExampleError(
                        f"{where}: a skipped example must say why (<!-- docs-test: skip: REASON -->)"
                    )
                block.skip = " ".join(text.split())
            elif word == "exit":
                if not text or not text.isdigit():
                    raise DocsExampleError(f"{where}: <!-- docs-test: exit N --> needs a status")
                block.exit_status = int(text)
            elif word == "server":
                block.server = True
            else:
                raise DocsExampleError(f"{where}: unknown directive docs-test: {word}")
        if block.server and (language != "bash" or not block.code.strip().startswith("turnkit serve")):
            raise DocsExampleError(f"{where}: a server block is one `turnkit serve ...` command line")
        blocks.append(block)
        previous = block
    return blocks


def build_site(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the docs under ``root`` into ``site``, as ``./dev.sh docs`` runs it."""
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, not a warning
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True, timeout=600)


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# -- comparing output ---------------------------------------------------------------------------------------------


def _normalised(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def output_matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected``, line endings and trailing spaces aside; ``...`` in ``expected`` is any text."""
    want, got = _normalised(expected), _normalised(actual)
    if "..." not in want:
        return want == got
    pattern = ".*?".join(re.escape(part) for part in want.split("..."))
    return re.fullmatch(pattern, got, re.DOTALL) is not None


# -- running a page -----------------------------------------------------------------------------------------------

_WORKER = r"""
import contextlib, io, json, os, sys, traceback
channel = os.fdopen(os.dup(1), "w")
log = os.open(os.environ["DOCS_WORKER_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 1)
os.dup2(log, 2)
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    out, err, error = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile("\n" * (request["line"] - 1) + request["code"], request["page"], "exec"), namespace)
        except BaseException:
            error = traceback.format_exc()
    channel.write(json.dumps({"stdout": out.getvalue(), "stderr": err.getvalue(), "error": error}) + "\n")
    channel.flush()
"""


class PythonSession:
    """One interpreter for a page's Python blocks: later blocks see earlier blocks' names, as in a notebook."""

    def __init__(self, folder: Path, environment: dict[str, str]) -> None:
        self.log = folder.parent / f"{folder.name}-python.log"
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            cwd=folder,
            env={**environment, "DOCS_WORKER_LOG": str(self.log)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line)

    def run(self, block: Block) -> tuple[int, str, str]:
        assert self.process.stdin is not None
        request = {"code": block.code, "page": _shown_path(block.page), "line": block.line}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        watch = Watch(self.process.pid)
        while True:
            try:
                answer = json.loads(self.answers.get(timeout=1))
                break
            except queue.Empty:
                if watch.stuck():
                    raise DocsExampleError(f"{block.where}: {_STUCK}") from None
        error = answer["error"]
        return (1 if error else 0), answer["stdout"], answer["stderr"] + (error or "")

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def environment() -> dict[str, str]:
    """What a reader's shell has: the virtual environment's ``bin`` first on ``PATH`` (``turnkit``, ``python``)."""
    bin_folder = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": bin_folder + os.pathsep + os.environ.get("PATH", ""),
        "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",  # no model hub on these machines: fail at once rather than after retries
        "NO_COLOR": "1",
    }


class PageRun:
    """The state of one page's run: its scratch folder, its Python session, its servers and their ports."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.environment = environment()
        self.python: PythonSession | None = None
        self.servers: list[subprocess.Popen[bytes]] = []
        self.ports: dict[str, str] = {}

    def localised(self, code: str) -> str:
        """The documented ports (8000) replaced by the ones this run's servers listen on."""
        for documented, actual in self.ports.items():
            code = re.sub(rf"(localhost|127\.0\.0\.1):{documented}\b", rf"\g<1>:{actual}", code)
        return code

    def run(self, block: Block) -> tuple[int, str, str]:
        code = self.localised(block.code)
        if block.server:
            self.start_server(block, code)
            return 0, "", ""
        if block.language == "python":
            if self.python is None:
                self.python = PythonSession(self.folder, self.environment)
            return self.python.run(Block(block.page, block.line, "python", code))
        process = subprocess.Popen(
            ["bash", "-e", "-c", code],
            cwd=self.folder,
            env=self.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        watch = Watch(process.pid)
        while True:
            try:
                stdout, stderr = process.communicate(timeout=1)  # retried without losing output
                return process.returncode, stdout, stderr
            except subprocess.TimeoutExpired:
                if watch.stuck():
                    process.kill()
                    process.communicate()
                    raise DocsExampleError(f"{block.where}: {_STUCK}") from None

    def start_server(self, block: Block, code: str) -> None:
        port = str(free_port())
        documented = re.search(r"--port[ =](\d+)", code)
        self.ports[documented.group(1) if documented else "8000"] = port
        command = re.sub(r"--port[ =]\d+", f"--port {port}", code) if documented else f"{code.strip()} --port {port}"
        log = self.folder.parent / f"{self.folder.name}-server-{port}.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.folder,
                env=self.environment,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopping it stops what it started (Ray's too)
            )
        self.servers.append(process)
        try:
            wait_until_up(f"http://127.0.0.1:{port}", timeout=SERVER_TIMEOUT)
        except (TimeoutError, RuntimeError) as exc:
            raise DocsExampleError(f"{block.where}: `{command}` did not come up ({exc}):\n{_tail(log)}") from None
        if process.poll() is not None:
            raise DocsExampleError(f"{block.where}: `{command}` exited:\n{_tail(log)}")

    def close(self) -> None:
        if self.python is not None:
            self.python.close()
        for process in self.servers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # the group is the server's own (start_new_session)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@contextmanager
def page_run(folder: Path) -> Iterator[PageRun]:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    run = PageRun(folder)
    try:
        yield run
    finally:
        run.close()


def run_page(page: Path, folder: Path) -> list[str]:
    """Run every example of ``page`` in order; raises ``DocsExampleError`` at the first that fails. Returns what was
    skipped, with why."""
    skipped: list[str] = []
    with page_run(folder) as run:
        for block in collect(page):
            if block.skip:
                skipped.append(f"{block.where}: {block.skip}")
                continue
            status, stdout, stderr = run.run(block)
            if status != block.exit_status:
                raise DocsExampleError(
                    f"{block.where}: the {block.language} example exited with status {status}, not "
                    f"{block.exit_status}\n--- code\n{block.code}\n--- stdout\n{stdout}\n--- stderr\n{stderr[-4000:]}"
                )
            if block.expected is not None and not output_matches(block.expected, stdout):
                raise DocsExampleError(
                    f"{block.where}: the {block.language} example printed something else than its output block\n"
                    f"--- code\n{block.code}\n--- expected\n{block.expected}\n--- printed\n{stdout}\n"
                    f"--- stderr\n{stderr[-2000:]}"
                )
    return skipped
