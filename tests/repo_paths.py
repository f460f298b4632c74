"""Where the repository's files are, for the tests and the helpers beside them: one place, so a test module finds
``docs/``, ``src/`` or ``examples/`` the same at any depth under ``tests/`` (the modules sit in folders that mirror
``src/turnkit``'s packages, docs/contributing.md)."""

from __future__ import annotations

from pathlib import Path

#: The clone's root: pyproject.toml, src/, docs/, examples/, benchmarks/, tests/.
REPO = Path(__file__).resolve().parent.parent
#: The folder beside the clone that holds third-party data read in place (``tests/corpus.py`` reads its corpus).
SHARED = REPO.parent / "shared"
