"""turnkit's cache folder (downloaded models, converted tokenizers, GGUF metadata) and atomic writes.

Every file or folder turnkit writes for others to read (the cache, prepared shards and their done-files) is written
under a scratch name and renamed into place, so a reader, or a rerun after a crash, never sees half of one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "build_folder", "cache_dir", "file_key", "write_atomically"]


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


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """A scratch path beside ``target`` to write to; renamed onto ``target`` when the block succeeds, removed if not.

    The scratch name is unique, so two processes writing the same target never write into each other's file.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its files are private (0600); this one gets the permissions the umask gives any new file.
    scratch = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.partial")
    try:
        yield scratch
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)


def write_atomically(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` so that readers see the old file or the whole new one, never a part."""
    with atomic_path(target) as scratch:
        scratch.write_bytes(data)
