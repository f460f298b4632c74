"""llama.cpp's own Jinja runtime (``common/jinja``: llama-server and the apps built on llama.cpp), as a tiny program.

Why a program and not llama-server's ``/apply-template``: the server needs a model loaded to start (a GGUF, the
weights mapped, a context allocated) and the whole of libllama and ggml built, minutes of compiling; the runtime is
six C++ files that depend on nothing but ``common/json.cpp``, ``common/unicode.cpp`` and nlohmann's header, and build
in under a minute (about 25 s of CPU, after the sdist's download, which pip's cache serves again).
``llama_cpp_render.cpp`` drives the runtime as ``common/chat.cpp``'s ``common_chat_template_direct_apply_impl`` does
(lexer, ``parse_from_tokens``, ``caps_get``, the content normalized to the template's caps, ``reasoning_effort``
applied, ``global_from_json``, ``runtime::execute``, ``gather_string_parts``), so the text is the runtime's. What it
leaves out is llama-server's per-family handling before the render (tool-call formats, polyfills), which is not the
Jinja runtime's doing.

The sources are the ones ``llama-cpp-python==0.3.36`` vendors (the version turnkit's llama.cpp engine pins): its
sdist, fetched with pip, of which only ``common/``, ``vendor/nlohmann`` and ``ggml/include`` are unpacked. :func:`build`
does it once into the cache folder (``python -m turnkit.doctor.runtimes setup``, which ``./dev.sh test`` runs).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from turnkit.cache import cache_dir
from turnkit.doctor.runtimes.child import ChildRenderer

__all__ = ["LLAMA_CPP_PYTHON", "LlamaCppRenderer", "build"]

#: The llama-cpp-python release whose vendored llama.cpp is built.
LLAMA_CPP_PYTHON = "0.3.36"
SOURCE = Path(__file__).with_name("llama_cpp_render.cpp")
#: What is unpacked of the sdist's ``vendor/llama.cpp``.
_PARTS = ("common/", "vendor/nlohmann/", "ggml/include/")
_UNITS = ("common/json.cpp", "common/unicode.cpp")


def binary() -> Path:
    """The built program (its folder is named by the pinned release and this module's C++ source)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return cache_dir() / "runtimes" / f"llama.cpp-{LLAMA_CPP_PYTHON}-{digest}" / "turnkit-llama-jinja"


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++; or CXX) to build llama.cpp's Jinja runtime")
    return compiler


def _sources(work: Path) -> Path:
    """llama.cpp's tree from the pinned sdist (pip's cache serves it again), the parts the runtime needs."""
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-binary", ":all:"]
    subprocess.run(
        [*pip, "--no-deps", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(tuple(prefix + p for p in _PARTS))]
        archive.extractall(work, members=members, filter="data")
    return work / prefix


def build() -> Path:
    """Build the program into the cache folder (nothing when it is there); its path."""
    target = binary()
    if target.is_file():
        return target
    compiler = _compiler()
    with tempfile.TemporaryDirectory(prefix="turnkit-llama-jinja-") as tmp:
        tree = _sources(Path(tmp))
        units = sorted(str(p) for p in (tree / "common" / "jinja").glob("*.cpp"))
        units += [str(tree / unit) for unit in _UNITS]
        out = Path(tmp) / "turnkit-llama-jinja"
        includes = [f"-I{tree / 'common'}", f"-I{tree / 'vendor'}", f"-I{tree / 'ggml' / 'include'}"]
        done = subprocess.run(
            [compiler, "-std=c++17", "-O2", *includes, *units, str(SOURCE), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"building llama.cpp's Jinja runtime failed: {done.stderr.strip()[-800:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out, target.with_suffix(".tmp"))
        target.with_suffix(".tmp").replace(target)
    return target


class LlamaCppRenderer(ChildRenderer):
    """llama.cpp's ``common/jinja`` runtime, in one long-lived child process."""

    name = "llama.cpp"
    served_by = "llama-server, llama-cli and apps built on llama.cpp"

    def missing(self) -> str | None:
        if not binary().is_file():
            return (
                f"llama.cpp's Jinja runtime (llama-cpp-python {LLAMA_CPP_PYTHON}'s sources) is not built "
                "(python -m turnkit.doctor.runtimes setup)"
            )
        return None

    def version(self) -> str:
        return f"llama.cpp's common/jinja from llama-cpp-python {LLAMA_CPP_PYTHON}"

    def command(self) -> list[str]:
        return [str(binary())]
