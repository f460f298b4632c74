"""turnkit's cache folder: downloaded models, converted tokenizers, GGUF metadata."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["build_folder", "cache_dir", "file_key"]


def cache_dir() -> Path:
    """``$TURNKIT_CACHE``, else ``~/.cache/turnkit``."""
    return Path(os.environ.get("TURNKIT_CACHE") or Path.home() / ".cache" / "turnkit")


def file_key(path: Path) -> str:
    """A key for what is derived from a file: its resolved path, size and modification time."""
    path = path.resolve()
    stat = path.stat()
    return hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:20]


def build_folder(target: Path, write: Callable[[Path], None]) -> Path:
    """Create the folder ``target`` by calling ``write(scratch)`` on a scratch folder and renaming it into place.

    Readers never see a half-written folder; when two processes build it at once, the first rename wins.
    """
    import tempfile

    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        write(Path(scratch))
        try:
            os.rename(scratch, target)
        except OSError:  # built by another process meanwhile
            pass
        else:
            os.mkdir(scratch)  # TemporaryDirectory removes its (now empty) name
    return target
