"""turnkit's cache folder: downloaded models, converted tokenizers, GGUF metadata."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["cache_dir", "file_key"]


def cache_dir() -> Path:
    """``$TURNKIT_CACHE``, else ``~/.cache/turnkit``."""
    return Path(os.environ.get("TURNKIT_CACHE") or Path.home() / ".cache" / "turnkit")


def file_key(path: Path) -> str:
    """A key for what is derived from a file: its resolved path, size and modification time."""
    path = path.resolve()
    stat = path.stat()
    return hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:20]
